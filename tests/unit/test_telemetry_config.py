"""The collector configuration rendering: shape, determinism, tenant isolation, no `null`."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controller.telemetry.config import (
    COLLECTED_OBJECTS,
    HEARTBEAT_OBJECTS,
    HEARTBEAT_SCOPE,
    MonitoredNamespace,
    Origin,
    ProxySettings,
    build,
    render,
)
from controller.telemetry.redaction import Redaction

TOKEN_A = "t_0123456789abcdef01234"
TOKEN_B = "t_fedcba9876543210fedcb"


def ns(name: str, token: str = TOKEN_A) -> MonitoredNamespace:
    return MonitoredNamespace(name=name, uid=f"uid-{name}", token=token)


def walk(value: Any) -> list[Any]:
    out = [value]
    if isinstance(value, dict):
        for v in value.values():
            out += walk(v)
    elif isinstance(value, list):
        for v in value:
            out += walk(v)
    return out


def test_empty_set_renders_the_proxy_only_and_never_null() -> None:
    text = render([], ProxySettings())
    config = yaml.safe_load(text)
    assert "null" not in text
    assert None not in walk(config)
    assert set(config["service"]["pipelines"]) == {"traces", "logs"}
    assert not any(k.startswith("k8s_objects") for k in config["receivers"])
    assert "k8s_leader_elector" not in config["extensions"]


def test_proxy_enriches_then_routes_each_tenant_to_its_own_exporter() -> None:
    config = build([ns("shop")], ProxySettings(upstream_endpoint="http://sink.example:4318/"))
    http = config["receivers"]["otlp"]["protocols"]["http"]
    assert http["endpoint"] == "0.0.0.0:4318"
    assert http["include_metadata"] is True  # the router reads the request's Authorization
    exporter = config["exporters"]["otlp_http/tenant-shop"]
    assert exporter["endpoint"] == "http://sink.example:4318"
    for signal in ("traces", "logs"):
        processors = config["service"]["pipelines"][signal]["processors"]
        assert processors[0] == "memory_limiter"
        # k8s attributes need the connection's address: before routing.
        assert "k8s_attributes/proxy" in processors
        assert config["service"]["pipelines"][signal]["exporters"] == [f"routing/{signal}"]
    # The Node's provider ID, from the annotation the operator copies it into.
    assert config["processors"]["k8s_attributes/proxy"]["extract"]["annotations"] == [
        {"tag_name": "k8s.provider.id", "key": "operator.lumigo.io/provider-id", "from": "node"}
    ]


def test_each_namespace_gets_its_own_watch_exporter_and_token() -> None:
    config = build([ns("shop", TOKEN_A), ns("billing", TOKEN_B)], ProxySettings())
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {
        "traces", "logs", "logs/ns-billing", "logs/ns-shop",
        "traces/tenant-billing", "logs/tenant-billing", "traces/tenant-shop", "logs/tenant-shop",
    }  # fmt: skip
    for name, token in (("shop", TOKEN_A), ("billing", TOKEN_B)):
        receiver = config["receivers"][f"k8s_objects/{name}"]
        assert receiver["k8s_leader_elector"] == "k8s_leader_elector"
        # Each kind watched (what exists first), and listed every 10 minutes, as the reference.
        assert receiver["include_initial_state"] is True
        assert {(o["name"], o.get("group", "")) for o in receiver["objects"]} == set(
            COLLECTED_OBJECTS
        )
        assert all(o["namespaces"] == [name] and o["mode"] == "watch" for o in receiver["objects"])
        pulls = config["receivers"][f"k8s_objects/pull-{name}"]
        assert pulls["k8s_leader_elector"] == "k8s_leader_elector"
        kinds = {(o["name"], o.get("group", "")): o for o in pulls["objects"]}
        assert set(kinds) == {*COLLECTED_OBJECTS, HEARTBEAT_OBJECTS}
        for kind in COLLECTED_OBJECTS:
            assert kinds[kind]["mode"] == "pull"
            assert kinds[kind]["interval"] == "10m"
            assert kinds[kind]["namespaces"] == [name]
        exporter = config["exporters"][f"otlp_http/ns-{name}"]
        assert exporter["headers"] == {"Authorization": f"LumigoToken {token}"}
        assert pipelines[f"logs/ns-{name}"]["receivers"] == [
            f"k8s_objects/{name}",
            f"k8s_objects/pull-{name}",
        ]
        assert pipelines[f"logs/ns-{name}"]["exporters"] == [f"otlp_http/ns-{name}"]
    assert "k8s_leader_elector" in config["service"]["extensions"]


def test_logs_can_go_to_their_own_endpoint() -> None:
    logs = "https://logs.example.com/v1/logs"
    settings = ProxySettings(upstream_logs_endpoint=logs)
    exporters = build([ns("shop")], settings)["exporters"]
    assert exporters["otlp_http/tenant-shop"]["logs_endpoint"] == logs
    assert exporters["otlp_http/ns-shop"]["logs_endpoint"] == logs
    exporters = build([ns("shop")], ProxySettings())["exporters"]
    assert "logs_endpoint" not in exporters["otlp_http/tenant-shop"]


def test_output_is_deterministic_whatever_the_input_order() -> None:
    settings = ProxySettings(origin=Origin(cluster_name="prod", cluster_uid="abc"))
    a = render([ns("b"), ns("a"), ns("c")], settings)
    b = render([ns("c"), ns("b"), ns("a")], settings)
    assert a == b
    assert a.index("k8s_objects/a") < a.index("k8s_objects/b") < a.index("k8s_objects/c")


def test_a_namespace_listed_twice_keeps_the_first_token() -> None:
    config = build([ns("shop", TOKEN_A), ns("shop", TOKEN_B)], ProxySettings())
    headers = config["exporters"]["otlp_http/ns-shop"]["headers"]
    assert headers["Authorization"] == f"LumigoToken {TOKEN_A}"


def test_operator_attributes_skip_unknown_values() -> None:
    attrs = build([], ProxySettings(origin=Origin(cluster_name="", cluster_uid="u1")))[
        "processors"
    ]["resource/lumigo"]["attributes"]
    keys = [a["key"] for a in attrs]
    assert "k8s.cluster.name" not in keys
    assert {"k8s.cluster.uid", "lumigo.k8s_operator.version"} <= set(keys)


def test_token_is_not_in_the_repr() -> None:
    assert TOKEN_A not in repr(ns("shop"))


@pytest.mark.parametrize("endpoint", ["", "ga-otlp.example.com", "ftp://x", "https://"])
def test_bad_upstream_endpoint_is_refused_with_a_clear_message(endpoint: str) -> None:
    with pytest.raises(ValueError, match="invalid telemetry upstream endpoint"):
        ProxySettings(upstream_endpoint=endpoint)


def test_no_user_value_is_ever_expanded_by_the_collector() -> None:
    """Every `$` of a value reaches the collector as `$$` (its literal dollar), so a token or a
    cluster name holding `${env:…}`/`${file:…}` can neither read the proxy's environment or files
    nor, with an unknown scheme, stop the configuration shared by every namespace from loading."""
    hostile = "t_0123456789abcdef01234${env:HOME}"
    settings = ProxySettings(origin=Origin(cluster_name="prod-${file:/etc/passwd}"))
    text = render([ns("evil", hostile), ns("good", TOKEN_B)], settings)
    assert "${" not in text.replace("$${", "")
    config = yaml.safe_load(text)
    headers = config["exporters"]["otlp_http/ns-evil"]["headers"]
    assert headers == {"Authorization": "LumigoToken t_0123456789abcdef01234$${env:HOME}"}
    assert config["exporters"]["otlp_http/ns-good"]["headers"] == {
        "Authorization": f"LumigoToken {TOKEN_B}"
    }
    (cluster,) = [
        a
        for a in config["processors"]["resource/lumigo"]["attributes"]
        if a["key"] == "k8s.cluster.name"
    ]
    assert cluster["value"] == "prod-$${file:/etc/passwd}"


@pytest.mark.parametrize(
    ("given", "posted_to"),
    [
        # The chart's default logs_url is a bare host, like the traces url.
        (
            "https://ga-otlp.lumigo-tracer-edge.golumigo.com",
            "https://ga-otlp.lumigo-tracer-edge.golumigo.com/v1/logs",
        ),
        ("http://sink.example:4318/", "http://sink.example:4318/v1/logs"),
        ("https://logs.example.com/v1/logs", "https://logs.example.com/v1/logs"),
        ("https://logs.example.com/custom/path", "https://logs.example.com/custom/path"),
    ],
)
def test_a_bare_logs_host_gets_the_otlp_logs_path(given: str, posted_to: str) -> None:
    exporter = build([ns("shop")], ProxySettings(upstream_logs_endpoint=given))["exporters"]
    assert exporter["otlp_http/tenant-shop"]["logs_endpoint"] == posted_to
    assert exporter["otlp_http/ns-shop"]["logs_endpoint"] == posted_to


def test_each_namespace_heartbeat_pulls_its_lumigoes_and_leaves_with_its_own_token() -> None:
    config = build([ns("shop", TOKEN_A), ns("billing", TOKEN_B)], ProxySettings())
    pipelines = config["service"]["pipelines"]
    for name in ("shop", "billing"):
        receiver = config["receivers"][f"k8s_objects/pull-{name}"]
        assert receiver["k8s_leader_elector"] == "k8s_leader_elector"
        (pulled,) = [o for o in receiver["objects"] if o["name"] == "lumigoes"]
        assert pulled == {
            "name": "lumigoes", "group": "operator.lumigo.io", "mode": "pull", "interval": "1h",
            "namespaces": [name],
        }  # fmt: skip
        processors = pipelines[f"logs/ns-{name}"]["processors"]
        # the scope is set while each pull is still a batch of its own
        assert processors.index("transform/heartbeat") < processors.index("batch/events")
    statements = config["processors"]["transform/heartbeat"]["log_statements"]
    assert statements == [
        f'set(scope.name, "{HEARTBEAT_SCOPE}") where log.body["kind"] == "Lumigo"',
        # As the reference: the Lumigo as a JSON string.
        f'set(log.body, String(log.body)) where scope.name == "{HEARTBEAT_SCOPE}" '
        "and IsMap(log.body)",
    ]


@pytest.mark.parametrize("interval", ["", "1d", "0s", "1h; x", "10", "-1m", '1h"'])
def test_a_heartbeat_interval_that_is_not_a_duration_is_refused(interval: str) -> None:
    with pytest.raises(ValueError, match="invalid heartbeat interval"):
        ProxySettings(heartbeat_interval=interval)
    with pytest.raises(ValueError, match="invalid objects pull interval"):
        ProxySettings(objects_pull_interval=interval)


def test_events_get_their_root_owner_after_the_pods_owner_chain() -> None:
    ns = MonitoredNamespace("shop", "uid-1", "t_0123456789abcdef01234")
    config = build([ns], ProxySettings())
    processors = config["service"]["pipelines"]["logs/ns-shop"]["processors"]
    # The pod's UID is copied first, k8s_attributes adds its owners, then the reference is set.
    order = ["transform/event_pod", "k8s_attributes/events", "transform/root_owner_reference"]
    assert [p for p in processors if p in order] == order
    assert processors.index("transform/root_owner_reference") < processors.index("batch/events")
    statements = config["processors"]["transform/root_owner_reference"]["log_statements"]
    # First, the record whose reference the enricher set is marked: none below overrides it.
    assert statements[0] == (
        'set(log.cache["enriched"], true) where log.body["rootOwnerReference"] != nil'
    )
    assert all('log.cache["enriched"] == nil' in s for s in statements[1:])
    statements = statements[1:]
    kinds = [s.split('"kind": "')[1].split('"')[0] for s in statements[:-1]]
    assert kinds == [
        "Pod",
        "ReplicaSet",
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "Job",
        "CronJob",
    ]
    assert all('involvedObject"]["kind"] == "Pod"' in s for s in statements[:-1])
    itself = statements[-1]
    for kind in ("Deployment", "StatefulSet", "DaemonSet", "CronJob"):
        assert f'["kind"] == "{kind}"' in itself
    assert '"ReplicaSet"' not in itself
    assert '"Job"' not in itself


def test_events_and_objects_leave_as_the_objects_under_the_references_scopes() -> None:
    """Issue 29 item 1: a watch event's body {type, object} becomes the object; Events get
    scope lumigo-operator.k8s-events, the other objects lumigo-operator.k8s-objects, both with
    the operator's version; the heartbeat keeps its own scope. All before anything else reads
    the body (the enricher, redaction, the heartbeat, the root owner)."""
    settings = ProxySettings(origin=Origin(operator_version="1.2.3"))
    config = build([ns("shop", TOKEN_A)], settings)
    processors = config["service"]["pipelines"]["logs/ns-shop"]["processors"]
    assert processors[0] == "transform/k8s_objects"
    assert config["processors"]["transform/k8s_objects"]["log_statements"] == [
        'set(log.body, log.body["object"]) '
        'where log.body["type"] != nil and log.body["object"] != nil',
        'set(scope.name, "lumigo-operator.k8s-events") where log.body["kind"] == "Event"',
        'set(scope.name, "lumigo-operator.k8s-objects") '
        'where log.body["kind"] != "Event" and log.body["kind"] != "Lumigo"',
        'set(scope.version, "1.2.3") where scope.name == "lumigo-operator.k8s-events" '
        'or scope.name == "lumigo-operator.k8s-objects"',
    ]
    assert "lumigo_k8s_enricher" not in config["processors"]  # the upstream image has none


def test_the_enricher_is_rendered_only_for_an_image_that_has_it_before_redaction() -> None:
    settings = ProxySettings(k8s_enricher=True, redaction=Redaction(env_values=True))
    config = build([ns("shop", TOKEN_A), ns("billing", TOKEN_B)], settings)
    assert config["processors"]["lumigo_k8s_enricher"] == {
        "auth_type": "serviceAccount",
        "timeout": "2s",
        "cache_size": 4096,
        "cache_ttl": "1m",
        "events_scope": "lumigo-operator.k8s-events",
        "objects_scope": "lumigo-operator.k8s-objects",
    }
    for name in ("shop", "billing"):
        processors = config["service"]["pipelines"][f"logs/ns-{name}"]["processors"]
        # what it sends is redacted, and gets the namespace's attributes and token
        assert processors[:4] == [
            "transform/k8s_objects",
            "filter/events",  # no read for an Event that is not sent
            "lumigo_k8s_enricher",
            "transform/redact",
        ]


def test_only_events_about_the_seven_collected_kinds_with_a_uid_are_sent() -> None:
    """As the reference's field selectors: Events about a Pod, DaemonSet, Deployment,
    ReplicaSet, StatefulSet, CronJob or Job (with their apiVersion) that name a uid."""
    config = build([ns("shop", TOKEN_A)], ProxySettings())
    (condition,) = config["processors"]["filter/events"]["logs"]["log_record"]
    assert condition.startswith('log.body["kind"] == "Event" and not (')
    assert 'log.body["involvedObject"]["uid"] != nil' in condition
    assert 'log.body["involvedObject"]["uid"] != ""' in condition
    pairs = [("v1", "Pod"), ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"),
             ("apps/v1", "ReplicaSet"), ("apps/v1", "StatefulSet"), ("batch/v1", "CronJob"),
             ("batch/v1", "Job")]  # fmt: skip
    for api_version, kind in pairs:
        assert (
            f'(log.body["involvedObject"]["apiVersion"] == "{api_version}" and '
            f'log.body["involvedObject"]["kind"] == "{kind}")'
        ) in condition
    assert condition.count('log.body["involvedObject"]["kind"] == ') == len(pairs)
    processors = config["service"]["pipelines"]["logs/ns-shop"]["processors"]
    assert processors.index("filter/events") == processors.index("transform/k8s_objects") + 1


def test_the_proxy_sends_its_own_metrics_only_with_the_cluster_token() -> None:
    """As the reference's collector-self-metrics pipeline: the proxy's own series, scraped from
    its metrics port under the reference's job, leave with the cluster token; without one,
    nothing of its own leaves (and never with a tenant's token)."""
    assert "prometheus/self" not in build([ns("shop")], ProxySettings())["receivers"]
    settings = ProxySettings(
        self_metrics_token=TOKEN_B,
        upstream_metrics_endpoint="https://metrics.example.com",
        metrics_port=9999,
    )
    config = build([ns("shop", TOKEN_A)], settings)
    (job,) = config["receivers"]["prometheus/self"]["config"]["scrape_configs"]
    assert job["job_name"] == "lumigo-operator-self-metrics"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9999"]}]
    assert config["exporters"]["otlp_http/self"] == {
        "metrics_endpoint": "https://metrics.example.com/v1/metrics",
        "headers": {"Authorization": f"LumigoToken {TOKEN_B}"},
    }
    pipeline = config["service"]["pipelines"]["metrics/self"]
    assert pipeline["exporters"] == ["otlp_http/self"]
    assert pipeline["processors"][0] == "filter/self"  # scrape bookkeeping dropped first
    assert config["service"]["telemetry"]["resource"] == {"service.name": "lumigo-collector"}
    assert TOKEN_B not in repr(settings)
    # Only this pipeline carries the cluster token.
    for name, exporter in config["exporters"].items():
        if name != "otlp_http/self":
            assert TOKEN_B not in str(exporter)
