"""The cluster agent's node-exporter scrape in the real collector (the project's build running the
rendered `metrics/infra` pipeline) against a Prometheus target and an OTLP sink (issue 29 item 4):
the reference's job name and `node` label; with `essentialOnly`, the essential entries are regular
expressions matched against whole names (Prometheus anchors the relabel regex), so
`kube_.+_labels` keeps `kube_deployment_labels`, `kube_pod_owner` does not keep
`kube_pod_owner_extra`, and `otelcol_exporter_*` (the reference's entry) keeps no
`otelcol_exporter_sent_spans`; node-exporter's process series are dropped as duplicates. With
the enricher, the kube-state-metrics scrape's owner series get the owner's `owner_uid`, read from
the real API server."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.runtime.kube import KubeClient
from controller.telemetry.agent_config import (
    JOB_KUBE_STATE_METRICS,
    JOB_NODE_EXPORTER,
    AgentSettings,
    MetricsSettings,
    build_agent,
)
from controller.telemetry.config import ProxySettings
from envtest.process import free_port, wait_until
from kube.kinds import CRONJOBS, DEPLOYMENTS, REPLICASETS
from tests.support.otel import Collector, OTLPSink, local_settings, running_sink
from tests.support.workloads import workload

EXPOSITION = b"""# TYPE kube_pod_owner gauge
kube_pod_owner{namespace="a",pod="p",owner_kind="ReplicaSet",owner_name="r"} 1
# TYPE kube_deployment_labels gauge
kube_deployment_labels{namespace="a",deployment="d"} 1
# TYPE kube_pod_owner_extra gauge
kube_pod_owner_extra 1
# TYPE node_memory_Active_bytes gauge
node_memory_Active_bytes 5
# TYPE node_memory_MemFree_bytes gauge
node_memory_MemFree_bytes 5
# TYPE otelcol_exporter_sent_spans counter
otelcol_exporter_sent_spans 3
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3
"""
KEPT = {"kube_pod_owner", "kube_deployment_labels", "node_memory_Active_bytes"}


class Exposition(http.server.BaseHTTPRequestHandler):
    body = EXPOSITION

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_: object) -> None:
        pass


@contextmanager
def serving(body: bytes) -> Iterator[int]:
    handler = type("Serving", (Exposition,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


@pytest.fixture
def target() -> Iterator[int]:
    with serving(EXPOSITION) as port:
        yield port


@pytest.fixture
def sink() -> Iterator[OTLPSink]:
    with running_sink() as running:
        yield running


def infra_only(settings: AgentSettings, job: str = JOB_NODE_EXPORTER, at: int = 0) -> str:
    """The rendered configuration reduced to its `metrics/infra` pipeline and one job (the
    kubelet targets do not exist here; kube-state-metrics' is the target at port `at`, in place
    of the discovery of its pods)."""
    config = build_agent(settings)
    infra = config["receivers"]["prometheus/infra"]["config"]
    infra["scrape_configs"] = [j for j in infra["scrape_configs"] if j["job_name"] == job]
    if job == JOB_KUBE_STATE_METRICS:
        (scrape,) = infra["scrape_configs"]
        del scrape["kubernetes_sd_configs"], scrape["relabel_configs"]
        scrape["static_configs"] = [{"targets": [f"127.0.0.1:{at}"]}]
    config["receivers"] = {"prometheus/infra": config["receivers"]["prometheus/infra"]}
    config["service"]["pipelines"] = {
        "metrics/infra": config["service"]["pipelines"]["metrics/infra"]
    }
    used = set(config["service"]["pipelines"]["metrics/infra"]["processors"])
    config["processors"] = {k: v for k, v in config["processors"].items() if k in used}
    config["extensions"].pop("file_storage")
    config["service"]["extensions"] = ["health_check"]
    config["exporters"]["otlp_http/lumigo"].pop("sending_queue")
    return yaml.safe_dump(config)


@pytest.mark.parametrize("essential_only", [True, False])
def test_node_exporter_series_and_the_essential_regular_expressions(
    essential_only: bool, target: int, sink: OTLPSink, tmp_path: Path
) -> None:
    proxy = ProxySettings(upstream_endpoint=sink.url, kube_auth="kubeConfig",
                          listen_host="127.0.0.1", health_port=free_port(),
                          metrics_port=free_port())  # fmt: skip
    metrics = MetricsSettings(
        enabled=True, interval="1s", essential_only=essential_only, node_exporter_port=target,
        kube_state_metrics_selector="",
    )  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "K8S_NODE_NAME": "node-1", "LUMIGO_CLUSTER_TOKEN": "t"}
    collector = Collector(infra_only(AgentSettings("ops", logs=False, metrics=metrics,
                                                   proxy=proxy)), tmp_path, proxy.health_port,
                          env).start()  # fmt: skip
    try:
        wait_until(lambda: {m.name for m in sink.metrics()} >= KEPT, 30, "the scraped series")
    finally:
        collector.stop()
    seen = sink.metrics()
    names = {m.name for m in seen}
    assert "process_cpu_seconds_total" not in names, "node-exporter's duplicate of the kubelet's"
    dropped = {"kube_pod_owner_extra", "node_memory_MemFree_bytes", "otelcol_exporter_sent_spans"}
    if essential_only:
        assert names == KEPT
    else:
        assert dropped <= names
    for metric in seen:
        assert metric.resource["service.name"] == JOB_NODE_EXPORTER
        assert metric.resource["k8s.node.name"] == "node-1"
        assert all(p["node"] == "node-1" for p in metric.points)
        assert metric.authorization == "LumigoToken t"


# The label naming the owned object, other than a pod.
OWNED = {"kube_replicaset_owner": "replicaset", "kube_job_owner": "job_name"}


def series(name: str, namespace: str, owned: str, kind: str, owner: str) -> str:
    """One kube-state-metrics owner series (its labels as v2 writes them)."""
    label = OWNED.get(name, "pod")
    return (f'{name}{{namespace="{namespace}",{label}="{owned}",owner_kind="{kind}",'
            f'owner_name="{owner}",owner_is_controller="true"}} 1\n')  # fmt: skip


def test_kube_state_metrics_owner_series_get_the_owners_uid(
    kube: KubeClient, cluster: Any, namespace: str, sink: OTLPSink, tmp_path: Path
) -> None:
    """kube_pod_owner, kube_replicaset_owner and kube_job_owner name an owner by kind, name and
    namespace: each point gets that object's `owner_uid` (as the reference's proxy sends it); an
    owner that does not exist, `<none>`, an unread kind (a static pod's Node) and another
    series with the same labels leave the point as it was."""
    created = [
        kube.create(r, workload(r, "web"), namespace) for r in (REPLICASETS, DEPLOYMENTS, CRONJOBS)
    ]
    uid = {o["kind"]: o["metadata"]["uid"] for o in created}
    ns = namespace
    exposition = "".join([
        series("kube_pod_owner", ns, "a", "ReplicaSet", "web"),
        series("kube_pod_owner", ns, "b", "ReplicaSet", "gone"),
        series("kube_pod_owner", ns, "c", "<none>", "<none>"),
        series("kube_pod_owner", ns, "d", "Node", "web"),
        series("kube_replicaset_owner", ns, "web", "Deployment", "web"),
        series("kube_job_owner", ns, "web-1", "CronJob", "web"),
        series("kube_pod_owner_extra", ns, "e", "ReplicaSet", "web"),
    ])  # fmt: skip
    proxy = local_settings(sink.url, namespace)
    metrics = MetricsSettings(enabled=True, interval="1s", essential_only=False)
    settings = AgentSettings("ops", logs=False, metrics=metrics, proxy=proxy)
    env = {**cluster.env(), "K8S_NODE_NAME": "node-1", "LUMIGO_CLUSTER_TOKEN": "t"}
    with serving(exposition.encode()) as port:
        config = infra_only(settings, JOB_KUBE_STATE_METRICS, port)
        collector = Collector(config, tmp_path, proxy.health_port, env).start()
        try:
            wait_until(lambda: len(owner_uids(sink)) >= 7, 30, "the owner series")
        finally:
            collector.stop()
    assert owner_uids(sink) == {
        ("kube_pod_owner", "a"): uid["ReplicaSet"],
        ("kube_pod_owner", "b"): None,
        ("kube_pod_owner", "c"): None,
        ("kube_pod_owner", "d"): None,
        ("kube_replicaset_owner", "web"): uid["Deployment"],
        ("kube_job_owner", "web-1"): uid["CronJob"],
        ("kube_pod_owner_extra", "e"): None,
    }
    assert all(m.resource["service.name"] == JOB_KUBE_STATE_METRICS for m in sink.metrics())


def owner_uids(sink: OTLPSink) -> dict[tuple[str, str], Any]:
    """(metric, owned object) -> the owner_uid its points carry (the last point's)."""
    return {(m.name, p[OWNED.get(m.name, "pod")]): p.get("owner_uid")
            for m in sink.metrics() for p in m.points}  # fmt: skip
