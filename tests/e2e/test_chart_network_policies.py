"""The chart's NetworkPolicies (issue 34, item 1), as rendered: off by default; on, every pod
of the release (the cluster agent's, which the operator creates, included) is isolated by the
base policy, and each opening names a port the component really listens on. Enforced on the real
node by kube-network-policies in tests/node/test_cluster_collection.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from controller.telemetry.agent import AgentTarget, agent_daemonset
from tests.e2e.test_monitoring import selects
from tests.support.packaging import (
    CHART,
    ROOT,
    find,
    helm,
    load_docs,
    load_file,
    render_chart,
    tool,
)

JSON = dict[str, Any]
ON = {"networkPolicy": {"enabled": True}}
FULL = {**ON, "clusterCollection": {"logs": {"enabled": True}},
        "kubeStateMetrics": {"install": True},
        "lumigoToken": {"value": "t_123456789012345678901"}}  # fmt: skip


def templates(docs: list[JSON]) -> dict[str, JSON]:
    """Every pod template of the release, by object name, with the agent's DaemonSet's."""
    found = {d["metadata"]["name"]: d["spec"]["template"] for d in docs
             if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")}  # fmt: skip
    proxy = find(docs, "Deployment", "lumigo-lumigo-operator-telemetry-proxy")
    target = AgentTarget("lumigo-system", "agent", proxy["metadata"]["name"], "token")
    found["cluster-agent"] = agent_daemonset(target, proxy, "digest")["spec"]["template"]
    return found


def kubectl_kustomize(directory: Path) -> list[JSON]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(directory)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return load_docs(out)


def policies(docs: list[JSON]) -> dict[str, JSON]:
    return {d["metadata"]["name"].removeprefix("lumigo-lumigo-operator-"): d["spec"]
            for d in docs if d["kind"] == "NetworkPolicy"}  # fmt: skip


def ports(template: JSON) -> dict[str, int]:
    return {p.get("name", str(p["containerPort"])): p["containerPort"]
            for c in template["spec"]["containers"] for p in c.get("ports") or []}  # fmt: skip


def test_none_by_default_and_the_base_policy_isolates_every_pod_of_the_release() -> None:
    assert not policies(load_docs(render_chart("lumigo", "lumigo-system")))
    docs = load_docs(render_chart("lumigo", "lumigo-system", FULL))
    found = policies(docs)
    assert set(found) == {"base", "webhook", "telemetry-proxy", "exporters", "metrics"}
    base = found["base"]
    assert base["policyTypes"] == ["Ingress", "Egress"]
    pods = templates(docs)
    assert {"cluster-agent", "lumigo-lumigo-operator-kube-state-metrics"} <= set(pods)
    for name, template in pods.items():
        assert selects(base["podSelector"], template["metadata"]["labels"]), name
    # Only our pods: an application in the namespace keeps its own policies.
    assert not selects(base["podSelector"], {"app": "shop"})


def test_each_opening_is_a_port_the_component_listens_on() -> None:
    docs = load_docs(render_chart("lumigo", "lumigo-system", FULL))
    found, pods = policies(docs), templates(docs)
    webhook = pods["lumigo-lumigo-operator-webhook"]
    assert selects(found["webhook"]["podSelector"], webhook["metadata"]["labels"])
    assert found["webhook"]["ingress"][0]["ports"][0]["port"] in ports(webhook).values()
    proxy = pods["lumigo-lumigo-operator-telemetry-proxy"]
    assert selects(found["telemetry-proxy"]["podSelector"], proxy["metadata"]["labels"])
    assert found["telemetry-proxy"]["ingress"][0]["ports"][0]["port"] == ports(proxy)["otlp-http"]
    exporters = [n for n, t in pods.items() if selects(found["exporters"]["podSelector"],
                                                       t["metadata"]["labels"])]  # fmt: skip
    assert sorted(exporters) == ["cluster-agent", "lumigo-lumigo-operator-watchdog"]
    # Every component with metrics has them on a port the metrics policy names.
    named = {p["port"] for p in found["metrics"]["ingress"][0]["ports"]}
    for name, template in pods.items():
        if name != "lumigo-lumigo-operator-watchdog":
            assert named & set(ports(template)), (name, ports(template))


def test_addresses_and_peers_are_configurable_and_typos_refused() -> None:
    values = {"networkPolicy": {
        "enabled": True,
        "apiServer": {"cidrs": ["10.0.0.5/32"], "ports": [6443]},
        "upstream": {"cidrs": ["192.0.2.0/24"], "ports": [8443]},
        "telemetryFrom": [{"namespaceSelector": {"matchLabels": {"lumigo": "on"}}}],
    }}  # fmt: skip
    found = policies(load_docs(render_chart("lumigo", "lumigo-system", values)))
    api = found["base"]["egress"][-1]
    assert api == {"to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}],
                   "ports": [{"protocol": "TCP", "port": 6443}]}  # fmt: skip
    assert found["telemetry-proxy"]["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
            "ports": [{"protocol": "TCP", "port": 8443}],
        }
    ]
    assert (
        found["telemetry-proxy"]["ingress"][0]["from"] == values["networkPolicy"]["telemetryFrom"]
    )
    for typo in ("networkPolicy.enable=true", "networkPolicy.upstream.cidrs[0]=everywhere"):
        result = helm("template", "x", str(CHART), "--set", typo, check=False)
        assert result.returncode != 0, typo
        assert "networkPolicy" in result.stderr, typo


@pytest.mark.parametrize("name", ["base", "webhook", "telemetry-proxy", "exporters", "metrics"])
def test_each_policy_is_valid_for_the_api(name: str) -> None:
    """Shapes the API server would refuse: a peer with neither selector nor ipBlock, a port
    without protocol."""
    spec = policies(load_docs(render_chart("lumigo", "lumigo-system", ON)))[name]
    for rule in spec.get("ingress", []) + spec.get("egress", []):
        for peer in rule.get("from", []) + rule.get("to", []):
            assert set(peer) & {"ipBlock", "namespaceSelector", "podSelector"}, peer
        for port in rule.get("ports", []):
            assert port["protocol"] in ("TCP", "UDP"), port


def test_the_kustomize_copy_is_the_charts_and_selects_the_kustomize_pods() -> None:
    """config/network-policy (opt-in for kustomize installs) has the chart's policies, and they
    select the pods of the kustomize layout, whose labels differ from the chart's."""
    chart = policies(load_docs(render_chart("lumigo", "lumigo-system", ON)))
    copy = load_file(ROOT / "config" / "network-policy" / "network-policies.yaml")
    assert policies(copy) == chart
    rendered = kubectl_kustomize(ROOT / "config" / "default")
    rendered += kubectl_kustomize(ROOT / "config" / "kube-state-metrics")
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in rendered
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")}  # fmt: skip
    assert len(pods) >= 5, sorted(pods)
    for name, template in pods.items():
        assert selects(chart["base"]["podSelector"], template["metadata"]["labels"]), name
    webhook = pods["lumigo-lumigo-operator-webhook"]["metadata"]["labels"]
    assert selects(chart["webhook"]["podSelector"], webhook)
    proxy = pods["lumigo-lumigo-operator-telemetry-proxy"]["metadata"]["labels"]
    assert selects(chart["telemetry-proxy"]["podSelector"], proxy)
