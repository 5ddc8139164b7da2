#!/usr/bin/env python3
"""Admission handler cost, in process: parse -> decide -> mutate -> diff -> serialise.

This is the CPU the HTTPS server spends per admission on top of TLS and HTTP, for a realistic
Deployment (3 containers with env, probes and resources, an init container, volumes, the API
server's defaults and managedFields, ~8 KB of JSON). Scenarios:

- `create-inject`: CREATE in a namespace with an Active Lumigo -> JSON patch + event;
- `update-unchanged`: UPDATE of the already-instrumented stored object -> no patch;
- `no-lumigo`: CREATE in a namespace without Lumigo -> allowed as is;
- `defaulter`: a Lumigo CREATE through /v1alpha1/mutate.

Each is timed per call (p50/p99) on one thread, and for `create-inject` also as throughput with
8 threads (the server's concurrency; the GIL makes this the 1-core ceiling in CPython).

Prints a table and writes bench/results/webhook_handler.json.

    .venv/bin/python bench/webhook_handler.py [--calls 5000]
"""

from __future__ import annotations

import copy
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import benchkit
from webhook import admission_review as admission
from webhook import pod_injection
from webhook.inject_handler import InjectHandler
from webhook.lumigo_defaulter import MutateHandler
from webhook.pod_injection import InjectionSettings

RESULTS = Path(__file__).resolve().parent / "results" / "webhook_handler.json"
JSON = dict[str, Any]


class Lister:
    def __init__(self, items: list[JSON]) -> None:
        self.items = items

    def list(self, namespace: str) -> list[JSON]:
        return self.items


class NullRecorder:
    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        pass


def container(name: str, command: list[str], limits: JSON) -> JSON:
    return {
        "name": name,
        "image": f"registry.example.com/shop/{name}:1.2.3",
        "command": command,
        "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
        "env": [
            {"name": "DB_URL", "value": "postgres://db.shop.svc:5432/shop"},
            {"name": "REDIS_URL", "value": "redis://redis.shop.svc:6379/0"},
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "shop", "key": "api-key"}}},
        ],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": limits},
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": 8000, "scheme": "HTTP"},
            "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        },
        "volumeMounts": [{"name": "config", "mountPath": "/etc/shop", "readOnly": True}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }  # fmt: skip


def deployment() -> JSON:
    """A Deployment as the API server sends it in an admission request (defaults filled in)."""
    limits = {"cpu": "1", "memory": "512Mi"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "shop",
            "namespace": "shop",
            "labels": {"app": "shop", "app.kubernetes.io/part-of": "shop", "tier": "web"},
            "annotations": {"deployment.kubernetes.io/revision": "3"},
            "managedFields": [
                {
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "apiVersion": "apps/v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                        f'k:{{"name":"{n}"}}': {".": {}, "f:env": {}, "f:image": {}}
                        for n in ("web", "worker", "metrics")}}}}},
                }
            ],
        },
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "shop"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}},
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
            "template": {
                "metadata": {"labels": {"app": "shop", "tier": "web"}},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "fsGroup": 2000},
                    "initContainers": [container("migrate", ["python", "migrate.py"], limits)],
                    "containers": [
                        container("web", ["gunicorn", "shop.wsgi"], limits),
                        container("worker", ["node", "worker.js"], limits),
                        container("metrics", ["/exporter"], {"cpu": "100m", "memory": "64Mi"}),
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": "shop"}}],
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 30,
                    "dnsPolicy": "ClusterFirst",
                    "schedulerName": "default-scheduler",
                },
            },
        },
    }  # fmt: skip


def review(obj: JSON, operation: str = "CREATE", kind: tuple[str, str, str] | None = None) -> bytes:
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = kind or (group, version, obj["kind"])
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": kind[0], "version": kind[1], "kind": kind[2]},
        "resource": {"group": kind[0], "version": kind[1], "resource": kind[2].lower() + "s"},
        "namespace": obj["metadata"]["namespace"],
        "name": obj["metadata"]["name"],
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:deployment-controller"},
        "object": obj,
        "oldObject": obj if operation == "UPDATE" else None,
        "dryRun": False,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def lumigo() -> JSON:
    now = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": "lumigo", "namespace": "shop", "creationTimestamp": now},
        "spec": {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}},
        "status": {"conditions": [{"type": "Active", "status": "True", "message": ""}]},
    }


def per_call(fn: Callable[[], bytes], calls: int) -> JSON:
    for _ in range(min(200, calls)):  # warm-up
        fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return {
        "calls": calls,
        "p50_ms": round(samples[len(samples) // 2] * 1000, 3),
        "p99_ms": round(samples[int(len(samples) * 0.99)] * 1000, 3),
        "mean_ms": round(statistics.fmean(samples) * 1000, 3),
        "per_second_1_thread": round(calls / sum(samples)),
    }


def threaded(fn: Callable[[], bytes], calls: int, threads: int) -> float:
    per_thread = calls // threads

    def work() -> None:
        for _ in range(per_thread):
            fn()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return per_thread * threads / (time.perf_counter() - start)


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()

    settings = InjectionSettings(operator_version="1.0.0")
    inject = InjectHandler(Lister([lumigo()]), NullRecorder(), settings)
    plain = InjectHandler(Lister([]), NullRecorder(), settings)
    defaulter = MutateHandler(Lister([]))
    obj = deployment()
    stored = pod_injection.inject(copy.deepcopy(obj), settings)
    create_body, update_body = review(obj), review(stored, "UPDATE")
    lumigo_body = review(
        {**lumigo(), "spec": {"lumigoToken": {"secretRef": {"name": "s", "key": "k"}}}}
    )
    ctype = "application/json"
    check = json.loads(admission.review(inject, create_body, ctype))["response"]
    assert check["allowed"], check
    assert "patch" in check, check
    assert "patch" not in json.loads(admission.review(inject, update_body, ctype))["response"]

    scenarios: dict[str, Callable[[], bytes]] = {
        "create-inject": lambda: admission.review(inject, create_body, ctype),
        "update-unchanged": lambda: admission.review(inject, update_body, ctype),
        "no-lumigo": lambda: admission.review(plain, create_body, ctype),
        "defaulter": lambda: admission.review(defaulter, lumigo_body, ctype),
    }
    results: JSON = {
        "request_bytes": {"create": len(create_body), "update": len(update_body)},
        "scenarios": {},
        "machine": {
            **benchkit.machine(),
            "processor": platform.processor() or platform.machine(),
            # The machine is shared: a high load average means inflated tails.
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
    }
    print(f"request body: {len(create_body)} bytes (CREATE), {len(update_body)} bytes (UPDATE)")
    print(f"{'scenario':<18}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'/s 1 thread':>13}")
    for name, fn in scenarios.items():
        figures = per_call(fn, args.calls)
        results["scenarios"][name] = figures
        print(
            f"{name:<18}{figures['p50_ms']:>9}{figures['p99_ms']:>9}{figures['mean_ms']:>9}"
            f"{figures['per_second_1_thread']:>13}"
        )
    rate = threaded(scenarios["create-inject"], args.calls, 8)
    results["scenarios"]["create-inject"]["per_second_8_threads"] = round(rate)
    print(f"create-inject with 8 threads: {rate:.0f}/s (GIL-bound: one core's worth)")
    benchkit.save(RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
