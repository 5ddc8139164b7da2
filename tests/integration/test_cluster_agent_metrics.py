"""The cluster agent's node-exporter scrape in the real collector (the project's build running the
rendered `metrics/infra` pipeline) against a Prometheus target and an OTLP sink (issue 29 item 4):
the reference's job name and `node` label; with `essentialOnly`, the essential entries are regular
expressions matched against whole names (Prometheus anchors the relabel regex), so
`kube_.+_labels` keeps `kube_deployment_labels`, `kube_pod_owner` does not keep
`kube_pod_owner_extra`, and `otelcol_exporter_*` (the reference's entry) keeps no
`otelcol_exporter_sent_spans`; node-exporter's process series are dropped as duplicates."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controller.telemetry.agent_config import (
    JOB_NODE_EXPORTER,
    AgentSettings,
    MetricsSettings,
    build_agent,
)
from controller.telemetry.config import ProxySettings
from localcluster import free_port, wait_until
from tests.support.otel import Collector, OTLPSink, running_sink

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
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exposition)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


@pytest.fixture
def sink() -> Iterator[OTLPSink]:
    with running_sink() as running:
        yield running


def infra_only(settings: AgentSettings) -> str:
    """The rendered configuration reduced to its `metrics/infra` pipeline and node-exporter job
    (the kubelet and kube-state-metrics targets do not exist here)."""
    config = build_agent(settings)
    infra = config["receivers"]["prometheus/infra"]["config"]
    infra["scrape_configs"] = [
        j for j in infra["scrape_configs"] if j["job_name"] == JOB_NODE_EXPORTER
    ]
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
