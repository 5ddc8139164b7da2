#!/usr/bin/env python3
"""What the webhook costs a user: time to create N Deployments through the real API server in
a namespace our webhook instruments vs a plain one.

A local control plane (etcd + kube-apiserver) calls our HTTPS server at https://127.0.0.1:<port>
through a MutatingWebhookConfiguration whose caBundle our certificate manager wrote (self mode).
kubectl (a Go client, like most users' tooling) creates the Deployments from one file, one POST
each; rounds alternate between the two namespaces and the medians are compared.
Prints the figures and writes bench/results/webhook_apiserver.json.

`--label-selector` registers the webhooks as the product does (namespaceSelector on the
operator.lumigo.io/monitored label, which only the instrumented namespace has) and, after the
alternating rounds, times the plain namespace again with no webhook registered at all: the plain
namespace with the webhook registered should cost exactly that (the API server never calls it).

`--go` has the API server call the Go-equivalent injector (bin/webhook-go: the same injection,
controller-runtime's server, no Event) instead, with the certificate our manager wrote: the cost
of this injection through this API server, whatever serves it.

    .venv/bin/python bench/webhook_apiserver.py [--count 500] [--rounds 3] [--label-selector]
        [--noop | --no-events | --go]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import webhook_servers
from prometheus_client import REGISTRY

from api import constants
from bench import benchkit
from controller.lumigo.resources import LUMIGOES, WORKLOADS_BY_KIND
from controller.runtime.events import AdmissionEvents, EventRecorder
from controller.runtime.informer import Informer, Selection, metadata_projection
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube import certs
from kube.http.server import AdmissionServer, ServerOptions
from kube.http.tls import ServingTLS
from kube.kinds import DEPLOYMENTS, SECRETS
from tests.conftest import CRD_FILE
from tests.integration.test_webhook_server_apiserver import (
    InformerLister,
    lumigo_body,
    make_active,
)
from tests.support import reviews, workloads
from tests.support.webhook_cluster import (
    SECRET,
    cert_stack,
    operator_configuration,
    policy,
    registered,
)
from webhook.inject_handler import InjectHandler
from webhook.lumigo_defaulter import MutateHandler
from webhook.pod_injection import InjectionSettings
from webhook.routes import admission_routes

ROOT = benchkit.ROOT

PATH = "/v1alpha1/inject"


class _Discard:
    def event(self, obj: Any, type: str, reason: str, message: str, component: str) -> None:
        return


def _noop(body: bytes, content_type: str) -> dict[str, Any]:
    uid = json.loads(body)["request"]["uid"]
    response = {"uid": uid, "allowed": True}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _served() -> float:
    value = REGISTRY.get_sample_value(
        "controller_runtime_webhook_requests_total", {"webhook": PATH, "code": "200"}
    )
    return value or 0.0


@contextlib.contextmanager
def go_webhook(kube: KubeClient, namespace: str, directory: Path) -> Iterator[int]:
    """bin/webhook-go serving the certificate our certificate manager wrote in `namespace` (the
    one the API server trusts): its port."""
    state = certs.decode(kube.get(SECRETS, SECRET, namespace)["data"])
    (directory / "tls.crt").write_bytes(state.serving.cert_pem)
    (directory / "tls.key").write_bytes(state.serving.key_pem)
    with webhook_servers.go_equivalent_server(directory) as port:
        yield port


def deployments_file(directory: Path, prefix: str, count: int) -> Path:
    items = []
    for i in range(count):
        obj = reviews.deployment(f"{prefix}-{i}")
        obj["metadata"].pop("namespace")
        obj["spec"]["replicas"] = 0
        items.append(obj)
    path = directory / f"{prefix}.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def timed_create(cluster: LocalCluster, namespace: str, path: Path) -> float:
    started = time.perf_counter()
    cluster.kubectl("create", "-n", namespace, "-f", str(path), "-o", "name")
    return time.perf_counter() - started


def _arguments() -> argparse.Namespace:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--noop",
        action="store_true",
        help="a webhook that only echoes the uid (the floor: what any webhook call costs here)",
    )
    parser.add_argument(
        "--no-events",
        action="store_true",
        help="drop the Added events instead of posting them (isolates the webhook's own cost)",
    )
    parser.add_argument(
        "--go",
        action="store_true",
        help="the API server calls the Go-equivalent injector (bin/webhook-go: the same "
        "injection, controller-runtime's server, no Event) with our certificate instead of ours",
    )
    parser.add_argument(
        "--label-selector",
        action="store_true",
        help="select namespaces by the operator.lumigo.io/monitored label, then time the plain"
        " namespace with no webhook registered",
    )
    return parser.parse_args()


def _admitted(kube: KubeClient, namespace: str, probe: dict[str, Any], args: Any) -> bool:
    """Whether a dry-run create in `namespace` went through the webhook under test."""
    before = _served()
    created = kube.request(
        "POST", DEPLOYMENTS.path(namespace), params={"dryRun": "All"}, body=probe, retry=False
    )
    if args.noop:
        return _served() > before
    if args.go and _served() > before:
        return False  # still ours
    return "lumigo-injector" in workloads.init_container_names(created)


@dataclass(frozen=True)
class Measured:
    times: dict[str, list[float]]
    unregistered: list[float]
    accepted: int
    admissions: float
    handler_seconds: float | None


def _report(args: Any, measured: Measured, load_before: tuple[float, float, float]) -> None:
    instrumented, plain = "bench-instrumented", "bench-plain"
    times, unregistered = measured.times, measured.unregistered
    accepted, admissions = measured.accepted, measured.admissions
    handler_seconds = measured.handler_seconds
    med = {ns: statistics.median(v) for ns, v in times.items()}
    ratio = med[instrumented] / med[plain]
    result: dict[str, Any] = {
        "benchmark": "webhook_apiserver",
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "handler": "noop" if args.noop else "go-controller-runtime" if args.go else "real",
        "events": not (args.no_events or args.go),
        "count": args.count,
        "rounds": args.rounds,
        "seconds": {"instrumented": times[instrumented], "plain": times[plain]},
        "median_seconds": {"instrumented": med[instrumented], "plain": med[plain]},
        "ratio": round(ratio, 3),
        "per_create_overhead_ms": round((med[instrumented] - med[plain]) / args.count * 1000, 3),
        "webhook_connections_accepted": accepted,
        "admissions_served": admissions,
        "server_side_mean_ms": round((handler_seconds or 0.0) / max(admissions, 1) * 1000, 3),
        "target_ratio": 1.3,  # issue 18
        "label_selector": args.label_selector,
        "plain_without_any_webhook_seconds": unregistered,
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before},
    }
    suffix = (
        ("_noop" if args.noop else "")
        + ("_go" if args.go else "")
        + ("_no_events" if args.no_events else "")
    )
    suffix += "_label_selector" if args.label_selector else ""
    benchkit.save(f"webhook_apiserver{suffix}", result)
    print(
        f"{args.count} Deployments via kubectl, median of {args.rounds}"
        f"{' (no-op webhook)' if args.noop else ''}"
        f"{' (the Go-equivalent injector)' if args.go else ''}"
        f"{' (events dropped)' if args.no_events else ''}: "
        f"instrumented {med[instrumented]:.2f} s, plain {med[plain]:.2f} s, ratio {ratio:.3f} "
        f"({result['per_create_overhead_ms']} ms per create)"
    )
    print(
        f"webhook: {admissions:.0f} admissions over {accepted} TLS connection(s), "
        f"server-side mean {result['server_side_mean_ms']} ms"
    )
    if unregistered:
        bare = statistics.median(unregistered)
        print(
            f"plain namespace with no webhook registered: {bare:.2f} s; with the label-selected"
            f" webhook registered: {med[plain]:.2f} s, ratio {med[plain] / bare:.3f}; "
            f"instrumented / no webhook {med[instrumented] / bare:.3f}"
        )


def _select_by_label(cluster: LocalCluster, config: dict[str, Any], namespace: str) -> None:
    """The webhooks select namespaces by the monitored label, which `namespace` gets."""
    monitored = {"matchLabels": {constants.LABEL_MONITORED: "true"}}
    for hook in config["webhooks"]:
        hook["namespaceSelector"] = monitored
    cluster.kubectl("label", "namespace", namespace, f"{constants.LABEL_MONITORED}=true")


def _call_go_instead(cluster: LocalCluster, configuration: str, go_port: int) -> None:
    """Point the registered webhook at the Go-equivalent injector."""
    go_url = f"https://127.0.0.1:{go_port}{PATH}"
    to_go = [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": go_url}]
    cluster.kubectl(
        "patch", "mutatingwebhookconfiguration", configuration, "--type=json",
        "-p", json.dumps(to_go),
    )  # fmt: skip


def _rounds(
    cluster: LocalCluster, directory: Path, args: Any, namespaces: tuple[str, str]
) -> dict[str, list[float]]:
    """Seconds of each round's kubectl create per namespace, alternating which goes first."""
    instrumented, plain = namespaces
    times: dict[str, list[float]] = {instrumented: [], plain: []}
    warm = deployments_file(directory, "warm", 50)
    for ns in (instrumented, plain):
        timed_create(cluster, ns, warm)
    for r in range(args.rounds):
        order = (instrumented, plain) if r % 2 == 0 else (plain, instrumented)
        for ns in order:
            path = deployments_file(directory, f"r{r}", args.count)
            times[ns].append(timed_create(cluster, ns, path))
    return times


def _check_injected(kube: KubeClient, args: Any, instrumented: str, plain: str) -> None:
    stored = kube.get(DEPLOYMENTS, "r0-0", instrumented)
    injected = "lumigo-injector" in workloads.init_container_names(stored)
    assert injected != args.noop
    plain_obj = kube.get(DEPLOYMENTS, "r0-0", plain)
    assert not workloads.init_container_names(plain_obj)


def _handlers(
    kube: KubeClient, args: Any, lister: InformerLister, deployments: Informer
) -> tuple[EventRecorder, dict[str, Any]]:
    """The started event recorder and the admission routes, wired as the operator wires them."""
    recorder = EventRecorder(
        kube, resources=WORKLOADS_BY_KIND,
        lookup=lambda kind, ns, name: deployments.get(ns, name) if kind == "Deployment"
        else None,
    )  # fmt: skip
    recorder.start()
    # Verified before posting, as the operator's admission events are.
    events: AdmissionEvents | _Discard = _Discard() if args.no_events else AdmissionEvents(recorder)
    routes = admission_routes(
        InjectHandler(lister, events, InjectionSettings(operator_version="0.1.0")),
        MutateHandler(lister),
    )
    if args.noop:
        routes[PATH] = _noop
    return recorder, routes


def main() -> int:
    args = _arguments()
    load_before = os.getloadavg()
    unregistered: list[float] = []
    with LocalCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        instrumented, plain = "bench-instrumented", "bench-plain"
        for ns in (instrumented, plain):
            cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{constants.CRD_NAME}"
        )
        lumigoes = Informer(kube, Selection(LUMIGOES))
        lumigoes.start()
        # As the operator wires it: UIDs of just-created workloads come from the informer cache.
        deployments = Informer(kube, Selection(DEPLOYMENTS), transform=metadata_projection())
        deployments.start()
        lister = InformerLister(lumigoes)
        recorder, routes = _handlers(kube, args, lister, deployments)
        tls = ServingTLS()
        server = AdmissionServer(routes, tls, ServerOptions(host="127.0.0.1", port=0))
        server.start()
        try:
            assert lumigoes.wait_for_sync(60)
            kube.create(LUMIGOES, lumigo_body(), instrumented)
            make_active(kube, instrumented, "lumigo")
            wait_until(
                lambda: bool(lister.list(instrumented)[0].get("status")), 30, "an Active Lumigo"
            )
            url = f"https://127.0.0.1:{server.port}{PATH}"
            config = operator_configuration("bench-webhook", instrumented, url.rsplit(PATH, 1)[0])
            if args.label_selector:
                _select_by_label(cluster, config, instrumented)
            with (
                contextlib.ExitStack() as stack_go,
                registered(kube, config) as name,
                cert_stack(kube, policy(instrumented), [name], tls=tls) as stack,
            ):
                stack.wait_ready()
                if args.go:
                    go_port = stack_go.enter_context(go_webhook(kube, instrumented, Path(tmp)))
                    _call_go_instead(cluster, name, go_port)
                probe = workloads.workload(DEPLOYMENTS, "probe")

                def active() -> bool:
                    return _admitted(kube, instrumented, probe, args)

                wait_until(active, 60, "the webhook to be active")
                times = _rounds(cluster, Path(tmp), args, (instrumented, plain))
                _check_injected(kube, args, instrumented, plain)
            if args.label_selector:  # the configuration is gone: no webhook at all now
                for r in range(args.rounds):
                    path = deployments_file(Path(tmp), f"u{r}", args.count)
                    unregistered.append(timed_create(cluster, plain, path))
            accepted = server.accepted
            admissions = _served()
            handler_seconds = REGISTRY.get_sample_value(
                "controller_runtime_webhook_latency_seconds_sum", {"webhook": PATH}
            )
        finally:
            server.stop()
            recorder.stop()
            lumigoes.stop()
    _report(args, Measured(times, unregistered, accepted, admissions, handler_seconds), load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
