"""The operator's alerts and dashboard (issue 17, item 7): the chart ships them behind values, every
expression parses as PromQL (promql-parser, the Rust parser of the Prometheus grammar), and every
metric they name is one the real operator process exports on /metrics (the telemetry proxy's
`otelcol_*` series aside, which only the alerts use)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from api import constants
from controller.runtime.kube import KubeClient
from controller.telemetry.agent import AgentTarget, agent_daemonset
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from tests.support.packaging import CHART, find, load_docs, render_chart

JSON = dict[str, Any]
RULES = CHART / "files" / "monitoring" / "lumigo-operator-rules.yaml"
DASHBOARD = CHART / "files" / "monitoring" / "lumigo-operator-dashboard.json"
ON = {"monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                     "grafanaDashboard": {"enabled": True}}}  # fmt: skip


def metric_names(node: Any) -> set[str]:
    """Metric names a parsed PromQL expression selects (by name or by a __name__ matcher)."""
    kind = type(node).__name__
    if kind == "MatrixSelector":
        return metric_names(node.vector_selector)
    if kind == "VectorSelector":
        if node.name:
            return {node.name}
        return {f"~{m.value}" for m in node.matchers.matchers if m.name == "__name__"}
    names: set[str] = set()
    for attr in ("expr", "lhs", "rhs", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (int, float, str)):
            names |= metric_names(child)
    for arg in getattr(node, "args", None) or []:
        names |= metric_names(arg)
    return names


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def dashboard_exprs() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: t["expr"] for p in panels for t in p["targets"]}


def test_the_chart_ships_them_only_when_asked() -> None:
    kinds = {d["kind"] for d in load_docs(render_chart("lumigo", "lumigo-system"))}
    assert "PrometheusRule" not in kinds
    docs = load_docs(render_chart("lumigo", "lumigo-system", ON))
    rule = find(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    dashboard = find(docs, "ConfigMap", "lumigo-lumigo-operator-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["lumigo-operator.json"]) == json.loads(
        DASHBOARD.read_text()
    )


def manager_args(docs: list[JSON]) -> list[str]:
    deployment = find(docs, "Deployment", "lumigo-lumigo-operator-controller-manager")
    (manager,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "manager"]  # fmt: skip
    return list(manager["args"])


def review_rules(docs: list[JSON]) -> list[JSON]:
    role = find(docs, "ClusterRole", "lumigo-lumigo-operator-manager-role")
    return [r for r in role["rules"]
            if {"tokenreviews", "subjectaccessreviews"} & set(r.get("resources", []))]  # fmt: skip


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels, and In expressions) selects `labels`."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions") or [])


def test_the_service_monitor_scrapes_secure_metrics_with_a_token() -> None:
    """Secure /metrics by default (issue 28 item 8): the manager may review tokens, the
    metrics-reader ClusterRole is shipped, and the ServiceMonitor scrapes over HTTPS with
    Prometheus's token; `metrics.secure: false` makes all of it plain."""
    monitor = {"monitoring": {"serviceMonitor": {
        "enabled": True, "labels": {"release": "prom"},
        "readerServiceAccount": {"name": "prometheus", "namespace": "monitoring"}}}}  # fmt: skip
    docs = load_docs(render_chart("lumigo", "lumigo-system"))
    assert "ServiceMonitor" not in {d["kind"] for d in docs}
    assert "--metrics-secure=true" in manager_args(docs)
    assert [r["verbs"] for r in review_rules(docs)] == [["create"], ["create"]]
    reader = find(docs, "ClusterRole", "lumigo-lumigo-operator-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]

    docs = load_docs(render_chart("lumigo", "lumigo-system", monitor))
    (endpoint,) = find(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    # It selects the metrics Services of both the manager and the webhook (whose metrics the
    # alerts use), and only Services with a `metrics` port are scraped.
    selected = [
        s["metadata"]["name"] for s in docs if s["kind"] == "Service"
        and selects(find(docs, "ServiceMonitor")["spec"]["selector"], s["metadata"]["labels"])
        and any(port["name"] == endpoint["port"] for port in s["spec"]["ports"])
    ]  # fmt: skip
    assert sorted(selected) == [
        "lumigo-lumigo-operator-controller-manager-metrics-service",
        "lumigo-lumigo-operator-webhook-metrics-service",
    ]
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    binding = find(docs, "ClusterRoleBinding", "lumigo-lumigo-operator-metrics-reader")
    assert binding["roleRef"]["name"] == reader["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    ]

    docs = load_docs(render_chart("lumigo", "lumigo-system",
                                  {**monitor, "metrics": {"secure": False}}))  # fmt: skip
    assert "--metrics-secure=false" in manager_args(docs)
    assert review_rules(docs) == []
    (endpoint,) = find(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "http"
    assert "bearerTokenFile" not in endpoint


def test_every_alert_is_valid_promql_with_a_severity_and_a_summary() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = [r for g in groups for r in g["rules"]]
    assert {a["alert"] for a in alerts} >= {
        "LumigoOperatorWebhookCertificateExpiresSoon", "LumigoOperatorReconcileErrors",
        "LumigoOperatorWebhookSlow", "LumigoOperatorWebhookErrors",
        "LumigoTelemetryProxyExportFailures", "LumigoOperatorDown", "LumigoOperatorNoLeader",
        "LumigoTelemetryProxyDown",
    }  # fmt: skip
    for alert in alerts:
        promql_parser.parse(alert["expr"])  # raises on a syntax error
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}, alert["alert"]
        assert alert["annotations"]["summary"], alert["alert"]
        if "for" in alert:
            assert re.fullmatch(r"\d+[smh]", alert["for"]), alert["alert"]
    # The no-leader alert names the manager's Lease.
    assert f'name="{constants.LEADER_ELECTION_ID}"' in rule_exprs()["LumigoOperatorNoLeader"]
    with pytest.raises(ValueError):  # the parser does reject bad PromQL
        promql_parser.parse("sum by (le (rate(x[5m]))")


def test_every_dashboard_query_is_valid_promql() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    for title, expr in exprs.items():
        assert metric_names(promql_parser.parse(expr)), title


@pytest.fixture(scope="module")
def exported(cluster: LocalCluster, kube: KubeClient, crd: Path) -> set[str]:
    """The metric families the real operator process exports, as sample names."""
    op = OperatorProcess(cluster, kube).setup()
    op.start().wait_ready()
    try:
        wait_until(lambda: op.probe("/metrics")[0] == 200, 30, "/metrics")
        text = op.probe("/metrics")[1]
    finally:
        op.teardown()
    names: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"]:
            name, kind = parts[2], parts[3]
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
            names |= {name + s for s in suffixes.get(kind, [""])}
            names.add(name)
    return names


def test_every_metric_the_dashboard_and_alerts_name_is_exported(exported: set[str]) -> None:
    queries = {**dashboard_exprs(), **rule_exprs()}
    missing = {}
    for where, expr in queries.items():
        for name in metric_names(promql_parser.parse(expr)):
            if name.startswith("~otelcol_") or name.startswith("otelcol_"):
                continue  # the telemetry proxy's own metrics (its :8888), alerts only
            if name == "up":
                continue  # Prometheus's own series for each scrape target
            if name not in exported:
                missing[where] = name
    assert not missing, f"not exported by the operator: {missing}"
    # The dashboard names nothing of the proxy's.
    assert not any(
        n.lstrip("~").startswith("otelcol_")
        for expr in dashboard_exprs().values()
        for n in metric_names(promql_parser.parse(expr))
    )


def test_the_pod_monitor_scrapes_both_collectors_on_their_metrics_port() -> None:
    """monitoring.podMonitor: the telemetry proxy's pods (the chart's) and the cluster agent's
    (the operator's DaemonSet) expose the collector's own metrics on a container port named
    `metrics`; the PodMonitor selects both, and nothing else."""
    docs = load_docs(render_chart("lumigo", "lumigo-system"))
    assert "PodMonitor" not in {d["kind"] for d in docs}
    values = {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    docs = load_docs(render_chart("lumigo", "lumigo-system", values))
    monitor = find(docs, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    proxy = find(docs, "Deployment", "lumigo-lumigo-operator-telemetry-proxy")
    target = AgentTarget("lumigo-system", "agent", proxy["metadata"]["name"], "token")
    agent = agent_daemonset(target, proxy, "digest")
    pods = [proxy["spec"]["template"], agent["spec"]["template"]]
    for pod in pods:
        assert selects(monitor["spec"]["selector"], pod["metadata"]["labels"]), pod["metadata"]
        ports = [p["name"] for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        assert endpoint["port"] in ports
    others = [d["spec"]["template"]["metadata"]["labels"] for d in docs
              if d["kind"] in ("Deployment", "StatefulSet") and d is not proxy]  # fmt: skip
    assert others
    assert not any(selects(monitor["spec"]["selector"], labels) for labels in others)


def alert(name: str) -> JSON:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return next(r for g in groups for r in g["rules"] if r["alert"] == name)


def expected_firing(name: str, **labels: str) -> JSON:
    """What promtool should see firing: the rule's labels and its annotations, templated."""
    rule = alert(name)
    annotations = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
                   for k, v in rule["annotations"].items()}  # fmt: skip
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def test_prometheus_loads_the_shipped_rules_and_the_down_alerts_wait_their_for(
    tmp_path: Path,
) -> None:
    """The rule file as shipped, in Prometheus's own tools (Debian's promtool): it loads, and
    with the scrape series of a manager that stops answering at minute 3 LumigoOperatorDown is
    pending, not firing, until its 10 minutes have passed; a manager that answers without the
    Lease fires LumigoOperatorNoLeader after 5. (The node test provokes the first for real,
    with its `for` scaled down.)"""
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                           text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    manager = 'up{service="lumigo-lumigo-operator-controller-manager-metrics-service"}'
    leader = 'leader_election_master_status{name="1447aab8.lumigo.io"}'
    cases = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": manager, "values": "1 1 1 0x20"},
                             {"series": leader, "values": "1x3 0x20"}],
            "alert_rule_test": [
                {"eval_time": "12m", "alertname": "LumigoOperatorDown", "exp_alerts": []},
                {"eval_time": "13m", "alertname": "LumigoOperatorDown",
                 "exp_alerts": [expected_firing("LumigoOperatorDown")]},
                {"eval_time": "8m", "alertname": "LumigoOperatorNoLeader", "exp_alerts": []},
                {"eval_time": "9m", "alertname": "LumigoOperatorNoLeader",
                 "exp_alerts": [expected_firing("LumigoOperatorNoLeader")]},
            ],
        }],
    }  # fmt: skip
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(yaml.safe_dump(cases))
    result = subprocess.run(["promtool", "test", "rules", str(test_file)], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
