"""A real Prometheus (Debian's `prometheus` package) that scrapes a test cluster the way the
Prometheus operator would: it reads the chart's ServiceMonitor, PodMonitor and PrometheusRule
objects from the API server and turns them into Prometheus's own configuration (the monitors'
selectors and ports, the operator's `namespace`/`service`/`pod`/`container` target labels).
Debian's build has no Kubernetes service discovery: the targets are files this module rewrites
from the API every 2 s, which Prometheus reloads (`file_sd_configs`).

Only the parts of the monitoring.coreos.com schema the chart uses are translated; anything else
in a monitor is an error here, so a chart change that this stand-in would ignore fails loudly.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envtest.cluster import LocalCluster
from envtest.process import free_port

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


def label_selector(selector: JSON) -> str:
    """A LabelSelector (matchLabels, In expressions) in kubectl's `-l` syntax."""
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        if expr["operator"] != "In":
            raise ValueError(f"selector operator {expr['operator']} is not translated")
        terms.append(f"{expr['key']} in ({','.join(expr['values'])})")
    return ",".join(terms)


def _get(cluster: LocalCluster, *args: str) -> list[JSON]:
    items: list[JSON] = json.loads(cluster.kubectl("get", *args, "-o", "json"))["items"]
    return items


@dataclass(frozen=True)
class Monitor:
    """One endpoint of a ServiceMonitor or PodMonitor, and where its targets are written."""

    kind: str
    namespace: str
    selector: str
    endpoint: JSON
    targets_file: Path

    def targets(self, cluster: LocalCluster) -> list[JSON]:
        """Its targets now, with the labels the Prometheus operator gives them (the chart's
        alerts use `service`, `pod` and `container`)."""
        port, found = self.endpoint["port"], []
        if self.kind == "PodMonitor":
            for pod in _get(cluster, "pods", "-n", self.namespace, "-l", self.selector):
                ip = pod["status"].get("podIP")
                for c in pod["spec"]["containers"]:
                    for p in c.get("ports") or []:
                        if ip and p.get("name") == port:
                            found.append({"targets": [f"{ip}:{p['containerPort']}"], "labels": {
                                "namespace": self.namespace, "pod": pod["metadata"]["name"],
                                "container": c["name"]}})  # fmt: skip
            return found
        for service in _get(cluster, "services", "-n", self.namespace, "-l", self.selector):
            name = service["metadata"]["name"]
            slices = _get(cluster, "endpointslices", "-n", self.namespace, "-l",
                          f"kubernetes.io/service-name={name}")  # fmt: skip
            for piece in slices:
                numbers = [p["port"] for p in piece.get("ports") or [] if p.get("name") == port]
                for endpoint, number in ((e, n) for e in piece.get("endpoints") or []
                                         for n in numbers):  # fmt: skip
                    pod = (endpoint.get("targetRef") or {}).get("name", "")
                    found += [{"targets": [f"{ip}:{number}"], "labels": {
                        "namespace": self.namespace, "service": name, "job": name, "pod": pod}}
                        for ip in endpoint["addresses"]]  # fmt: skip
        return found


@dataclass(frozen=True)
class ScrapeAuth:
    """How the ServiceMonitor's `bearerTokenFile` is honoured here: a token file on this host."""

    token_file: Path


def scrape_jobs(monitor: JSON, auth: ScrapeAuth, workdir: Path) -> list[tuple[JSON, Monitor]]:
    """One scrape job per endpoint of a ServiceMonitor or PodMonitor. Debian builds Prometheus
    without Kubernetes service discovery, so targets come from files (`file_sd_configs`) that
    `running_prometheus` keeps current from the API, as the discovery would."""
    kind, meta, spec = monitor["kind"], monitor["metadata"], monitor["spec"]
    endpoints = spec["endpoints"] if kind == "ServiceMonitor" else spec["podMetricsEndpoints"]
    jobs = []
    for index, endpoint in enumerate(endpoints):
        unknown = set(endpoint) - {"port", "path", "scheme", "interval", "bearerTokenFile",
                                   "tlsConfig"}  # fmt: skip
        if unknown:
            raise ValueError(f"{kind} endpoint fields not translated: {sorted(unknown)}")
        name = f"{kind.lower()}/{meta['namespace']}/{meta['name']}/{index}"
        source = Monitor(kind, meta["namespace"], label_selector(spec["selector"]), endpoint,
                         workdir / f"{name.replace('/', '_')}.json")  # fmt: skip
        job: JSON = {
            "job_name": name,
            "scrape_interval": SCRAPE_INTERVAL,  # the tests' pace, not the monitor's 30 s
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
            "file_sd_configs": [{"files": [str(source.targets_file)], "refresh_interval": "5s"}],
        }  # fmt: skip
        if "bearerTokenFile" in endpoint:
            job["authorization"] = {"type": "Bearer", "credentials_file": str(auth.token_file)}
        if endpoint.get("tlsConfig", {}).get("insecureSkipVerify"):
            job["tls_config"] = {"insecure_skip_verify": True}
        jobs.append((job, source))
    return jobs


def _write_targets(cluster: LocalCluster, monitors: list[Monitor]) -> None:
    for monitor in monitors:
        staged = monitor.targets_file.with_suffix(".tmp")
        staged.write_text(json.dumps(monitor.targets(cluster)))
        staged.replace(monitor.targets_file)  # atomic: Prometheus never reads half a file


@contextlib.contextmanager
def _discovering(cluster: LocalCluster, monitors: list[Monitor]) -> Iterator[None]:
    """Rewrite every monitor's targets file every 2 s while inside (written once before)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(2):
            with contextlib.suppress(Exception):  # a transient API error: next round
                _write_targets(cluster, monitors)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


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
def running_prometheus(cluster: LocalCluster, workdir: Path, jobs: list[tuple[JSON, Monitor]],
                       rule_groups: list[JSON]) -> Iterator[Prometheus]:  # fmt: skip
    """Prometheus with these jobs and rule groups (checked by promtool first), on a free
    loopback port, its targets kept current; stopped and its data removed afterwards."""
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
        "scrape_configs": [job for job, _ in jobs],
    }))  # fmt: skip
    monitors = [monitor for _, monitor in jobs]
    _write_targets(cluster, monitors)
    check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True,
                           text=True)  # fmt: skip
    if check.returncode != 0:
        raise RuntimeError(f"promtool check config: {check.stdout}{check.stderr}")
    port = free_port()
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
        with _discovering(cluster, monitors):
            yield server
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(workdir / "data", ignore_errors=True)
