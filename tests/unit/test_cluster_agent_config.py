"""The cluster agent's collector configuration (controller.telemetry.agent_config) and flags."""

from __future__ import annotations

import argparse

import pytest
import yaml

from controller.options import parse_log_rules
from controller.telemetry.agent_config import (
    ROOT_OWNER_KIND,
    TOKEN_ENV,
    AgentSettings,
    InvalidLogRuleError,
    LogFileRule,
    MetricsSettings,
    build_agent,
    render_agent,
)
from controller.telemetry.config import Origin, ProxySettings

PODS = "/var/log/pods"


def receiver(settings: AgentSettings) -> dict[str, object]:
    return dict(build_agent(settings)["receivers"]["filelog"])


def test_every_container_is_read_but_the_operator_namespace() -> None:
    filelog = receiver(AgentSettings("lumigo-system"))
    assert filelog["include"] == [f"{PODS}/*_*_*/*/*.log"]
    assert filelog["exclude"] == [f"{PODS}/lumigo-system_*_*/*/*.log"]


def test_rules_become_globs_over_the_kubelet_layout() -> None:
    settings = AgentSettings(
        "ops",
        include=(LogFileRule("team-*"), LogFileRule("shop", "web-?")),
        exclude=(LogFileRule(container_pattern="istio-proxy"),),
        pods_dir="/data/pods/",
    )
    filelog = receiver(settings)
    assert filelog["include"] == [
        "/data/pods/shop_web-?_*/*/*.log",
        "/data/pods/team-*_*_*/*/*.log",
    ]
    assert filelog["exclude"] == [
        "/data/pods/*_*_*/istio-proxy/*.log",
        "/data/pods/ops_*_*/*/*.log",
    ]


@pytest.mark.parametrize(
    "pattern", ["", "a/b", "a_b", "{a,b}", "Team", "a b", "[ab]", "../x", "a\nb", "$(x)", "x" * 254]
)
def test_a_pattern_outside_names_and_wildcards_is_refused(pattern: str) -> None:
    with pytest.raises(InvalidLogRuleError, match="invalid namespacePattern"):
        LogFileRule(namespace_pattern=pattern)


def test_rules_from_json_default_missing_patterns_and_name_the_bad_key() -> None:
    assert LogFileRule.from_json({"podPattern": "web-*"}) == LogFileRule("*", "web-*", "*")
    with pytest.raises(InvalidLogRuleError, match="unknown keys \\['pod'\\]"):
        LogFileRule.from_json({"pod": "web"})
    with pytest.raises(InvalidLogRuleError, match="expected an object"):
        LogFileRule.from_json("web")
    with pytest.raises(InvalidLogRuleError, match="expected a string"):
        LogFileRule.from_json({"podPattern": 3})


def test_flag_values_are_checked_when_parsed() -> None:
    assert parse_log_rules("") == ()
    assert parse_log_rules('[{"containerPattern": "envoy"}]') == (LogFileRule("*", "*", "envoy"),)
    for bad, message in (
        ("{", "not JSON"),
        ('{"podPattern": "x"}', "expected a JSON list"),
        ('[{"podPattern": "x/../y"}]', "invalid podPattern"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse_log_rules(bad)


def test_the_configuration_holds_no_token_only_a_reference_to_the_pod_env() -> None:
    config = build_agent(AgentSettings("ops"))
    exporter = config["exporters"]["otlp_http/lumigo"]
    assert exporter["headers"] == {"Authorization": f"LumigoToken ${{env:{TOKEN_ENV}}}"}
    text = render_agent(AgentSettings("ops"))
    assert text.count("${") == 1, "the token reference is the only expansion"


def test_user_strings_are_never_expanded_by_the_collector() -> None:
    origin = Origin(cluster_name="prod-${env:HOME}")
    config = build_agent(AgentSettings("ops", proxy=ProxySettings(origin=origin)))
    attributes = config["processors"]["resource/lumigo"]["attributes"]
    assert {"key": "k8s.cluster.name", "value": "prod-$${env:HOME}", "action": "upsert"} in (
        attributes
    )


def test_logs_go_to_the_logs_endpoint_with_a_disk_backed_queue() -> None:
    proxy = ProxySettings(
        upstream_endpoint="https://t.example", upstream_logs_endpoint="https://l.example"
    )
    config = build_agent(AgentSettings("ops", proxy=proxy))
    exporter = config["exporters"]["otlp_http/lumigo"]
    assert exporter["logs_endpoint"] == "https://l.example/v1/logs"
    assert exporter["sending_queue"]["storage"] == "file_storage"
    assert config["receivers"]["filelog"]["storage"] == "file_storage"
    only_traces = build_agent(
        AgentSettings("ops", proxy=ProxySettings(upstream_endpoint="https://t.example"))
    )
    assert (
        only_traces["exporters"]["otlp_http/lumigo"]["logs_endpoint"] == "https://t.example/v1/logs"
    )


def test_the_root_owner_is_the_farthest_owner_present() -> None:
    config = build_agent(AgentSettings("ops"))
    (block,) = config["processors"]["transform/root_owner"]["log_statements"]
    kinds = [s.split('"')[3] for s in block["statements"] if f'"{ROOT_OWNER_KIND}"' in s]
    # Later statements win: the nearest owner first, the CronJob above a Job last.
    assert kinds == [
        "Pod",
        "ReplicaSet",
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "Job",
        "CronJob",
    ]


def test_rendering_is_deterministic_yaml() -> None:
    settings = AgentSettings("ops", include=(LogFileRule("b"), LogFileRule("a")))
    assert render_agent(settings) == render_agent(settings)
    assert yaml.safe_load(render_agent(settings)) == build_agent(settings)


def test_kubelet_metrics_have_a_pipeline_of_their_own_with_the_same_enrichment() -> None:
    proxy = ProxySettings(upstream_endpoint="https://t.example")
    config = build_agent(AgentSettings("ops", logs=False, metrics=MetricsSettings(enabled=True),
                                       proxy=proxy))  # fmt: skip
    assert set(config["service"]["pipelines"]) == {"metrics/kubelet", "metrics/node",
                                                   "metrics/cluster"}  # fmt: skip
    assert "filelog" not in config["receivers"]
    pipeline = config["service"]["pipelines"]["metrics/kubelet"]
    assert pipeline["processors"][:2] == ["k8s_attributes", "transform/root_owner"]
    extract = config["processors"]["k8s_attributes"]["extract"]
    assert extract["annotations"][0]["tag_name"] == "k8s.provider.id"
    kubelet = config["receivers"]["kubeletstats"]
    assert kubelet["endpoint"] == "https://${env:K8S_NODE_IP}:10250"
    assert kubelet["collection_interval"] == "15s"
    exporter = config["exporters"]["otlp_http/lumigo"]
    assert exporter["metrics_endpoint"] == "https://t.example/v1/metrics"
    assert "logs_endpoint" not in exporter


def test_node_and_cluster_metrics_come_from_this_node_only() -> None:
    config = build_agent(AgentSettings("ops", logs=False, metrics=MetricsSettings(enabled=True)))
    pipelines, receivers = config["service"]["pipelines"], config["receivers"]
    # The node: hostmetrics over the host's /proc and /sys, cAdvisor of its own kubelet, both
    # labelled with the node's name (the pod enrichment would not apply).
    assert pipelines["metrics/node"]["receivers"] == ["hostmetrics", "prometheus/kubelet"]
    assert pipelines["metrics/node"]["processors"][0] == "resource/node"
    assert config["processors"]["resource/node"]["attributes"] == [
        {"key": "k8s.node.name", "value": "${env:K8S_NODE_NAME}", "action": "upsert"}
    ]
    assert receivers["hostmetrics"]["root_path"] == "/hostfs"
    (cadvisor,) = receivers["prometheus/kubelet"]["config"]["scrape_configs"]
    assert cadvisor["metrics_path"] == "/metrics/cadvisor"
    assert cadvisor["static_configs"] == [{"targets": ["${env:K8S_NODE_IP}:10250"]}]
    assert cadvisor["authorization"]["credentials_file"].endswith("serviceaccount/token")
    # kube-state-metrics: only the shards on this node (each scraped by one agent), its
    # metrics port only, its own labels kept, no pod enrichment.
    (ksm,) = receivers["prometheus/kube-state-metrics"]["config"]["scrape_configs"]
    (discovery,) = ksm["kubernetes_sd_configs"]
    assert discovery["selectors"] == [{
        "role": "pod", "label": "app.kubernetes.io/name=kube-state-metrics",
        "field": "spec.nodeName=${env:K8S_NODE_NAME}",
    }]  # fmt: skip
    assert ksm["relabel_configs"][0]["regex"] == "http-metrics"
    assert ksm["honor_labels"] is True
    assert "k8s_attributes" not in pipelines["metrics/cluster"]["processors"]


def test_no_kube_state_metrics_selector_means_no_cluster_scrape() -> None:
    metrics = MetricsSettings(enabled=True, kube_state_metrics_selector="")
    config = build_agent(AgentSettings("ops", metrics=metrics, host_root=""))
    assert "metrics/cluster" not in config["service"]["pipelines"]
    assert "prometheus/kube-state-metrics" not in config["receivers"]
    assert "root_path" not in config["receivers"]["hostmetrics"]


def test_essential_only_keeps_the_listed_names_and_nothing_else() -> None:
    metrics = MetricsSettings(enabled=True, essential_only=True, essential=("a.b", "c.d"),
                              upstream_endpoint="https://m.example/otlp/v1/metrics")  # fmt: skip
    config = build_agent(AgentSettings("ops", metrics=metrics))
    assert config["processors"]["filter/essential"]["metrics"]["metric"] == [
        'not (name == "a.b" or name == "c.d")'
    ]
    for pipeline in ("metrics/kubelet", "metrics/node", "metrics/cluster"):
        assert config["service"]["pipelines"][pipeline]["processors"][0] == "filter/essential"
    assert (
        "filter/essential"
        not in config["service"]["pipelines"]["logs/container-files"]["processors"]
    )
    exporter = config["exporters"]["otlp_http/lumigo"]
    assert exporter["metrics_endpoint"] == "https://m.example/otlp/v1/metrics"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("interval", "15", "invalid metrics frequency"),
        ("essential", ('a") or true or ("',), "invalid essential metric name"),
        ("kubelet_port", 0, "invalid kubelet port"),
        ("kube_state_metrics_selector", "a=b\n  x: y", "invalid kube-state-metrics selector"),
    ],
)
def test_bad_metrics_settings_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricsSettings(enabled=True, **{field: value})  # type: ignore[arg-type]
