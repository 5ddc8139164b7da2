"""The chart's `egress` values (issue 34, item 2): the forward proxy, NO_PROXY and the extra CAs
reach exactly the pods that export out of the cluster (the telemetry proxy and the watchdog; the
cluster agent copies the proxy's, tests/unit/test_cluster_agent_config.py), never the manager,
the webhook or the hooks, which only talk to the API server. Proven end to end through a real
forward proxy in tests/node/test_cluster_collection.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.packaging import load_docs, render_chart

EGRESS = {
    "egress": {
        "httpsProxy": "http://proxy.corp.example:3128",
        "noProxy": [".corp.example", "10.20.0.0/16"],
        "caBundle": {"configMap": "corp-ca", "key": "bundle.pem"},
    }
}
EGRESS_ENV = {"HTTPS_PROXY", "NO_PROXY", "SSL_CERT_DIR"}


def pods(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Every pod spec the chart renders, by its object's name."""
    found = {}
    for doc in load_docs(render_chart("lumigo", "lumigo-system", values)):
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            found[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            found[doc["metadata"]["name"]] = doc["spec"]
    return found


def egress_env(spec: dict[str, Any]) -> dict[str, str]:
    return {
        e["name"]: e.get("value", "")
        for c in spec["containers"]
        for e in c.get("env") or []
        if e["name"] in EGRESS_ENV
    }


def test_the_exporting_pods_get_the_proxy_the_no_proxy_list_and_the_ca_and_no_other_pod_does() -> (
    None
):
    rendered = pods(EGRESS | {"lumigoToken": {"value": "t_0123456789abcdef01234"},
                              "monitoredNamespaces": [{"namespace": "apps"}]})  # fmt: skip
    exporting = {"lumigo-lumigo-operator-telemetry-proxy", "lumigo-lumigo-operator-watchdog"}
    for name in exporting:
        env = egress_env(rendered[name])
        assert env["HTTPS_PROXY"] == "http://proxy.corp.example:3128"
        no_proxy = env["NO_PROXY"].split(",")
        # The API server (its Service IP, expanded by the kubelet), Services, loopback: direct.
        assert no_proxy[:3] == ["$(KUBERNETES_SERVICE_HOST)", ".svc", ".cluster.local"]
        assert {"localhost", "127.0.0.1", ".corp.example", "10.20.0.0/16"} <= set(no_proxy)
        assert env["SSL_CERT_DIR"] == "/etc/lumigo/egress-ca"
        (volume,) = [v for v in rendered[name]["volumes"] if v["name"] == "egress-ca"]
        assert volume["configMap"] == {
            "name": "corp-ca",
            "items": [{"key": "bundle.pem", "path": "ca.crt"}],
        }
        mounts = [m for c in rendered[name]["containers"] for m in c.get("volumeMounts") or []]
        assert {
            "name": "egress-ca",
            "mountPath": "/etc/lumigo/egress-ca",
            "readOnly": True,
        } in mounts
    others = set(rendered) - exporting
    assert "lumigo-lumigo-operator-controller-manager" in others
    assert "lumigo-lumigo-operator-quickstart-hook" in others
    for name in others:
        assert not egress_env(rendered[name]), name
        assert all(v["name"] != "egress-ca" for v in rendered[name].get("volumes") or []), name


def test_without_egress_values_nothing_changes() -> None:
    for name, spec in pods(None).items():
        assert not egress_env(spec), name


def test_a_secret_holds_the_ca_too_and_naming_both_is_refused_with_what_to_fix() -> None:
    values = {"egress": {"caBundle": {"secret": "corp-ca"}}}
    proxy = pods(values)["lumigo-lumigo-operator-telemetry-proxy"]
    (volume,) = [v for v in proxy["volumes"] if v["name"] == "egress-ca"]
    assert volume["secret"]["secretName"] == "corp-ca"
    assert egress_env(proxy) == {"SSL_CERT_DIR": "/etc/lumigo/egress-ca"}  # no proxy: direct
    both = {"egress": {"caBundle": {"secret": "a", "configMap": "b"}}}
    with pytest.raises(AssertionError, match="name a ConfigMap or a Secret, not both"):
        render_chart("lumigo", "lumigo-system", both)
    for bad in ({"httpsProxy": "proxy.corp:3128"}, {"noProxy": ["a b"]}, {"proxy": "x"}):
        with pytest.raises(AssertionError, match="/egress"):
            render_chart("lumigo", "lumigo-system", {"egress": bad})
