"""A real Prometheus (Debian's `prometheus` package) that scrapes a test cluster the way the
Prometheus operator would: it reads the chart's ServiceMonitor, PodMonitor and PrometheusRule
objects from the API server and turns them into Prometheus's own configuration (Kubernetes
service discovery through the cluster's kubeconfig, label keep-rules from the monitors'
selectors, the operator's `namespace`/`service`/`pod`/`container` target labels).

Only the parts of the monitoring.coreos.com schema the chart uses are translated; anything else
in a monitor is an error here, so a chart change that this stand-in would ignore fails loudly.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

JSON = dict[str, Any]

# The monitoring.coreos.com kinds the chart renders, as schema-less CRDs: enough for the API
# server to store what `helm install` sends (the real operator's CRDs validate much more).
MONITORING_KINDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors",
                    "PrometheusRule": "prometheusrules"}  # fmt: skip
SCRAPE_INTERVAL = "5s"


def monitoring_crds() -> str:
    """The three CRDs as one kubectl List."""
    items = []
    for kind, plural in MONITORING_KINDS.items():
        schema = {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        }
        items.append({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "listKind": f"{kind}List",
                               "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": schema}]},
        })  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def _sanitized(label: str) -> str:
    """A Kubernetes label key as Prometheus's service discovery names it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _selector_rules(selector: JSON, meta: str) -> list[JSON]:
    """Keep-rules for a label selector (matchLabels, matchExpressions with In)."""
    rules = [{"source_labels": [f"{meta}_label_{_sanitized(k)}"], "regex": re.escape(v),
              "action": "keep"} for k, v in selector.get("matchLabels", {}).items()]  # fmt: skip
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] != "In":
            raise ValueError(f"selector operator {expr['operator']} is not translated")
        values = "|".join(re.escape(v) for v in expr["values"])
        rules.append({"source_labels": [f"{meta}_label_{_sanitized(expr['key'])}"],
                      "regex": f"(?:{values})", "action": "keep"})  # fmt: skip
    return rules


def _target_labels(service: bool) -> list[JSON]:
    """The labels the Prometheus operator gives every target (the chart's alerts use them)."""
    pairs = [("__meta_kubernetes_namespace", "namespace"),
             ("__meta_kubernetes_pod_name", "pod"),
             ("__meta_kubernetes_pod_container_name", "container")]  # fmt: skip
    if service:
        pairs += [("__meta_kubernetes_service_name", "service"),
                  ("__meta_kubernetes_service_name", "job")]  # fmt: skip
    return [{"source_labels": [source], "target_label": target} for source, target in pairs]


@dataclass(frozen=True)
class ScrapeAuth:
    """How the ServiceMonitor's `bearerTokenFile` is honoured here: a token file on this host."""

    token_file: Path


def scrape_config(monitor: JSON, kubeconfig: Path, auth: ScrapeAuth) -> list[JSON]:
    """One scrape job per endpoint of a ServiceMonitor or PodMonitor."""
    kind, meta, spec = monitor["kind"], monitor["metadata"], monitor["spec"]
    service = kind == "ServiceMonitor"
    endpoints = spec["endpoints"] if service else spec["podMetricsEndpoints"]
    sd_meta = "__meta_kubernetes_service" if service else "__meta_kubernetes_pod"
    port_label = ("__meta_kubernetes_endpoint_port_name" if service
                  else "__meta_kubernetes_pod_container_port_name")  # fmt: skip
    jobs = []
    for index, endpoint in enumerate(endpoints):
        unknown = set(endpoint) - {"port", "path", "scheme", "interval", "bearerTokenFile",
                                   "tlsConfig"}  # fmt: skip
        if unknown:
            raise ValueError(f"{kind} endpoint fields not translated: {sorted(unknown)}")
        job: JSON = {
            "job_name": f"{kind.lower()}/{meta['namespace']}/{meta['name']}/{index}",
            "scrape_interval": SCRAPE_INTERVAL,  # the tests' pace, not the monitor's 30 s
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "kubernetes_sd_configs": [{
                "role": "endpoints" if service else "pod",
                "kubeconfig_file": str(kubeconfig),
                "namespaces": {"names": [meta["namespace"]]},
            }],
            "relabel_configs": [
                *_selector_rules(spec["selector"], sd_meta),
                {"source_labels": [port_label], "regex": re.escape(endpoint["port"]),
                 "action": "keep"},
                *_target_labels(service),
            ],
        }  # fmt: skip
        if "bearerTokenFile" in endpoint:
            job["authorization"] = {"type": "Bearer", "credentials_file": str(auth.token_file)}
        if endpoint.get("tlsConfig", {}).get("insecureSkipVerify"):
            job["tls_config"] = {"insecure_skip_verify": True}
        jobs.append(job)
    return jobs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A running Prometheus server on loopback, and the few HTTP API calls the tests need."""

    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path}: {body}")
        return body["data"]

    def targets(self) -> list[JSON]:
        return list(self.api("targets?state=active")["activeTargets"])

    def alerts(self) -> list[JSON]:
        return list(self.api("alerts")["alerts"])

    def rules(self) -> list[JSON]:
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]

    def query(self, expr: str) -> list[JSON]:
        return list(self.api(f"query?query={urllib.parse.quote(expr)}")["result"])


@contextlib.contextmanager
def running_prometheus(workdir: Path, scrape_configs: list[JSON],
                       rule_groups: list[JSON]) -> Iterator[Prometheus]:  # fmt: skip
    """Prometheus with these jobs and rule groups (checked by promtool first), on a free
    loopback port; stopped and its data removed afterwards."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("no prometheus binary: hack/install-system-deps installs Debian's")
    workdir.mkdir(parents=True, exist_ok=True)
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups}))
    config = workdir / "prometheus.yaml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "5s"},
        "rule_files": [str(rules)],
        "scrape_configs": scrape_configs,
    }))  # fmt: skip
    subprocess.run(["promtool", "check", "config", str(config)], check=True,
                   capture_output=True, text=True)  # fmt: skip
    port = _free_port()
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                server.api("status/buildinfo")
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((workdir / "prometheus.log").read_text()[-2000:]) from None
                time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(workdir / "data", ignore_errors=True)
