"""Tenant isolation in the telemetry proxy's rendered configuration (issue 28, items 5 and 6).

Every tenant is hostile: a pod may send any Authorization value and any resource attribute. The
proxy must only accept the tokens of the active Lumigoes, keep each tenant's queue apart, and
never let what a client says about itself name a pod of another namespace.
"""

from __future__ import annotations

import re
from typing import Any

from controller.telemetry.config import MonitoredNamespace, ProxySettings, build

TOKEN_A = "t_0123456789abcdef01234"
TOKEN_B = "t_fedcba9876543210fedcb"
JSON = dict[str, Any]


def ns(name: str, token: str = TOKEN_A, kube_events: bool = True) -> MonitoredNamespace:
    return MonitoredNamespace(name, f"uid-{name}", token, kube_events=kube_events)


def proxy_processors(config: JSON, signal: str = "traces") -> list[str]:
    return list(config["service"]["pipelines"][signal]["processors"])


def test_the_receiver_accepts_only_the_tokens_of_active_lumigoes() -> None:
    config = build([ns("shop", TOKEN_A), ns("billing", TOKEN_B)], ProxySettings())
    http = config["receivers"]["otlp"]["protocols"]["http"]
    auth_id = http["auth"]["authenticator"]
    auth = config["extensions"][auth_id]
    assert auth_id.startswith("bearertokenauth")
    assert auth["scheme"] == "LumigoToken"
    assert sorted(auth["tokens"]) == sorted([TOKEN_A, TOKEN_B])
    assert auth_id in config["service"]["extensions"]


def test_no_batching_or_queue_is_keyed_by_what_a_client_sends() -> None:
    """The lifetime cardinality limit of a batcher keyed by Authorization let 1,000 forged
    tokens refuse every new tenant; one shared queue let one tenant fill it for everyone."""
    config = build([ns("shop", TOKEN_A), ns("billing", TOKEN_B)], ProxySettings())
    for processor in config["processors"].values():
        assert "metadata_keys" not in processor
        assert "metadata_cardinality_limit" not in processor
    for exporter in config["exporters"].values():
        assert exporter.get("auth") is None  # no header copied from the request
        assert "metadata_keys" not in str(exporter)


def test_each_token_gets_its_own_route_exporter_and_bounded_queue() -> None:
    settings = ProxySettings(tenant_queue_bytes=8 << 20)
    config = build([ns("shop", TOKEN_A), ns("billing", TOKEN_B)], settings)
    pipelines = config["service"]["pipelines"]
    for signal in ("traces", "logs"):
        router = pipelines[signal]["exporters"]
        assert router == [f"routing/{signal}"]
        table = config["connectors"][f"routing/{signal}"]["table"]
        assert "default_pipelines" not in config["connectors"][f"routing/{signal}"]
        routes = {r["condition"]: r["pipelines"] for r in table}
        assert all(r["context"] == "request" for r in table)
        for name, token in (("billing", TOKEN_B), ("shop", TOKEN_A)):
            assert routes[f'request["authorization"] == "LumigoToken {token}"'] == [
                f"{signal}/tenant-{name}"
            ]
            tenant = pipelines[f"{signal}/tenant-{name}"]
            assert tenant["receivers"] == [f"routing/{signal}"]
            assert tenant["exporters"] == [f"otlp_http/tenant-{name}"]
    for name, token in (("billing", TOKEN_B), ("shop", TOKEN_A)):
        exporter = config["exporters"][f"otlp_http/tenant-{name}"]
        assert exporter["headers"] == {"Authorization": f"LumigoToken {token}"}
        queue = exporter["sending_queue"]
        assert queue["sizer"] == "bytes"
        assert queue["queue_size"] == 8 << 20
        assert queue["batch"]["sizer"] == "items"


def test_namespaces_sharing_a_token_share_one_tenant() -> None:
    config = build([ns("b-shop"), ns("a-shop"), ns("billing", TOKEN_B)], ProxySettings())
    table = config["connectors"]["routing/traces"]["table"]
    assert len(table) == 2
    exporters = {k for k in config["exporters"] if k.startswith("otlp_http/tenant-")}
    assert exporters == {"otlp_http/tenant-a-shop", "otlp_http/tenant-billing"}


def test_without_any_active_lumigo_every_request_is_refused() -> None:
    config = build([], ProxySettings())
    auth = config["extensions"][
        config["receivers"]["otlp"]["protocols"]["http"]["auth"]["authenticator"]
    ]
    # The only token is one no HTTP header value can hold.
    assert all("\n" in t for t in auth["tokens"])
    for signal in ("traces", "logs"):
        assert config["service"]["pipelines"][signal]["exporters"] == ["nop"]


def test_a_namespace_without_kube_events_is_a_tenant_without_an_events_pipeline() -> None:
    config = build([ns("shop", kube_events=False)], ProxySettings())
    assert "traces/tenant-shop" in config["service"]["pipelines"]
    assert "logs/ns-shop" not in config["service"]["pipelines"]
    assert not any(k.startswith("k8s_objects") for k in config["receivers"])


def test_the_proxy_finds_the_pod_by_the_connection_only() -> None:
    config = build([ns("shop")], ProxySettings())
    processors = proxy_processors(config)
    (enrich,) = [p for p in processors if p.startswith("k8s_attributes")]
    assert config["processors"][enrich]["pod_association"] == [
        {"sources": [{"from": "connection"}]}
    ]


def test_client_supplied_identity_is_deleted_before_enrichment() -> None:
    config = build([ns("shop")], ProxySettings())
    for signal in ("traces", "logs"):
        processors = proxy_processors(config, signal)
        enrich = next(p for p in processors if p.startswith("k8s_attributes"))
        untrusted = next(p for p in processors if p.startswith("transform/untrusted"))
        assert processors.index(untrusted) < processors.index(enrich)
    statements = config["processors"]["transform/untrusted"]["trace_statements"]
    (pattern,) = re.findall(r'delete_matching_keys\(resource.attributes, "(.*)"\)', statements[0])
    regex = re.compile(pattern.replace("\\\\", "\\"))
    for key in (
        "k8s.pod.uid", "k8s.pod.ip", "k8s.pod.name", "k8s.namespace.name", "k8s.node.name",
        "k8s.deployment.uid", "k8s.deployment.name", "k8s.replicaset.uid", "k8s.daemonset.name",
        "k8s.statefulset.uid", "k8s.job.uid", "k8s.cronjob.name", "k8s.provider.id",
        "k8s.cluster.uid", "k8s.namespace.uid",
    ):  # fmt: skip
        assert regex.search(key), key
    for key in ("k8s.container.name", "service.name", "podname"):
        assert not regex.search(key), key
    assert config["processors"]["transform/untrusted"]["log_statements"] == statements


def test_enrichment_naming_another_namespace_than_the_tokens_is_removed() -> None:
    config = build([ns("b-shop"), ns("a-shop"), ns("billing", TOKEN_B)], ProxySettings())
    pipelines = config["service"]["pipelines"]
    assert pipelines["traces/tenant-a-shop"]["processors"] == ["transform/tenant-a-shop"]
    statements = config["processors"]["transform/tenant-a-shop"]["trace_statements"]
    assert any('"^(?:a-shop|b-shop)$"' in s for s in statements)
    assert config["processors"]["transform/tenant-a-shop"]["log_statements"] == statements
    billing = config["processors"]["transform/tenant-billing"]["trace_statements"]
    assert any('"^(?:billing)$"' in s for s in billing)


def test_events_find_their_pod_by_uid_and_only_in_their_own_namespace() -> None:
    """An Event is an object a namespace admin can create, involvedObject and all: the pod it
    names must be in the Event's namespace, or its owners stay off the record."""
    config = build([ns("shop")], ProxySettings())
    processors = config["service"]["pipelines"]["logs/ns-shop"]["processors"]
    enrich = next(p for p in processors if p.startswith("k8s_attributes"))
    assert config["processors"][enrich]["pod_association"] == [
        {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]}
    ]
    guard = "transform/only-shop"
    assert processors.index(enrich) < processors.index(guard)
    assert processors.index(guard) < processors.index("transform/root_owner_reference")
    statements = config["processors"][guard]["log_statements"]
    assert any('"^(?:shop)$"' in s for s in statements)
    # The receiver's namespace goes before k8s_attributes (which never overwrites), so the guard
    # sees the pod's own: a pod of another namespace named by uid keeps its owners off (issue 29).
    event_pod = config["processors"]["transform/event_pod"]["log_statements"]
    assert any(s.startswith('delete_key(resource.attributes, "k8s.namespace.name")')
               for s in event_pod)  # fmt: skip
    assert processors.index("transform/event_pod") < processors.index(enrich)


def test_the_namespace_uid_is_set_only_for_the_tokens_own_namespaces() -> None:
    config = build([ns("a-shop"), ns("billing", TOKEN_B)], ProxySettings())
    statements = config["processors"]["transform/tenant-a-shop"]["trace_statements"]
    guard = next(i for i, s in enumerate(statements) if s.startswith("delete_matching_keys"))
    (uid,) = [s for s in statements if "k8s.namespace.uid" in s]
    assert statements.index(uid) > guard
    assert '"uid-a-shop"' in uid
    assert '== "a-shop"' in uid
    billing = config["processors"]["transform/tenant-billing"]["log_statements"]
    assert not any("uid-a-shop" in s for s in billing)
