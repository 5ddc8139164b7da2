"""The cluster agent's collector configuration (controller.telemetry.agent_config) and flags."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.options import parse_log_rules
from controller.telemetry.agent import AGENT_SCHEDULING_ANNOTATION, AgentTarget, agent_daemonset
from controller.telemetry.agent_config import (
    ESSENTIAL_METRICS,
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
ROOT = Path(__file__).resolve().parents[2]


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
    assert set(config["service"]["pipelines"]) == {"metrics/kubelet", "metrics/infra",
                                                   "metrics/self"}  # fmt: skip
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
    pipelines = config["service"]["pipelines"]
    # Every scrape labelled with the node's name (the pod enrichment would not apply).
    for name in ("metrics/infra", "metrics/self"):
        assert pipelines[name]["processors"][1] == "resource/node"
        assert "k8s_attributes" not in pipelines[name]["processors"]
    assert config["processors"]["resource/node"]["attributes"] == [
        {"key": "k8s.node.name", "value": "${env:K8S_NODE_NAME}", "action": "upsert"}
    ]
    jobs = scrape_jobs(config, "prometheus/infra")
    cadvisor = jobs["k8s-infra-metrics-cadvisor"]
    assert cadvisor["static_configs"] == [{"targets": ["${env:K8S_NODE_IP}:10250"]}]
    assert cadvisor["authorization"]["credentials_file"].endswith("serviceaccount/token")
    # kube-state-metrics: only the shards on this node (each scraped by one agent), its
    # metrics port only, its own labels kept.
    ksm = jobs["kube-state-metrics"]
    (discovery,) = ksm["kubernetes_sd_configs"]
    assert discovery["selectors"] == [{
        "role": "pod", "label": "app.kubernetes.io/name=kube-state-metrics",
        "field": "spec.nodeName=${env:K8S_NODE_NAME}",
    }]  # fmt: skip
    assert ksm["relabel_configs"][0]["regex"] == "http-metrics"
    assert ksm["honor_labels"] is True


def test_no_kube_state_metrics_selector_means_no_cluster_scrape() -> None:
    metrics = MetricsSettings(enabled=True, kube_state_metrics_selector="")
    config = build_agent(AgentSettings("ops", metrics=metrics))
    assert "kube-state-metrics" not in scrape_jobs(config, "prometheus/infra")


def test_essential_only_keeps_the_listed_names_and_nothing_else() -> None:
    metrics = MetricsSettings(enabled=True, essential_only=True, essential=("a.b", "c.d"),
                              upstream_endpoint="https://m.example/otlp/v1/metrics")  # fmt: skip
    config = build_agent(AgentSettings("ops", metrics=metrics))
    # (`$$`: the collector reads `$`.)
    assert config["processors"]["filter/essential"]["metrics"]["metric"] == [
        'not IsMatch(name, "^(?:a.b|c.d)$$")'
    ]
    assert config["service"]["pipelines"]["metrics/kubelet"]["processors"][0] == "filter/essential"
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
        ("essential", ('a") or true or ("',), "invalid essential metric pattern"),
        ("kubelet_port", 0, "invalid kubelet port"),
        ("kube_state_metrics_selector", "a=b\n  x: y", "invalid kube-state-metrics selector"),
    ],
)
def test_bad_metrics_settings_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricsSettings(enabled=True, **{field: value})  # type: ignore[arg-type]


# Issue 29 item 4: the reference's scrape jobs, names and essential regexes.
REFERENCE_JOBS = {
    "k8s-infra-metrics",
    "k8s-infra-metrics-cadvisor",
    "k8s-infra-metrics-resources",
    "kube-state-metrics",
    "prometheus-node-exporter",
}


def scrape_jobs(config: dict[str, object], receiver: str) -> dict[str, dict[str, object]]:
    receivers: dict[str, object] = config["receivers"]  # type: ignore[assignment]
    scrape = receivers[receiver]["config"]["scrape_configs"]  # type: ignore[index]
    return {job["job_name"]: job for job in scrape}


def test_infra_metrics_are_scraped_under_the_reference_job_names() -> None:
    config = build_agent(AgentSettings("ops", logs=False, metrics=MetricsSettings(enabled=True)))
    jobs = scrape_jobs(config, "prometheus/infra")
    assert set(jobs) == REFERENCE_JOBS
    kubelet = "${env:K8S_NODE_IP}:10250"
    for name, path in (("k8s-infra-metrics", "/metrics"),
                       ("k8s-infra-metrics-cadvisor", "/metrics/cadvisor"),
                       ("k8s-infra-metrics-resources", "/metrics/resource")):  # fmt: skip
        assert jobs[name]["metrics_path"] == path
        assert jobs[name]["static_configs"] == [{"targets": [kubelet]}]
        assert jobs[name]["scheme"] == "https"
    # The resource endpoint repeats three cAdvisor series: dropped there, as the reference does.
    (drop,) = jobs["k8s-infra-metrics-resources"]["metric_relabel_configs"]
    assert drop["action"] == "drop"
    assert set(drop["regex"].split("|")) == {
        "container_cpu_usage_seconds_total",
        "container_start_time_seconds",
        "container_memory_working_set_bytes",
    }
    # node-exporter, in the agent's own pod, labelled with the node's name (`node`).
    exporter = jobs["prometheus-node-exporter"]
    # Its process series repeat the kubelet's: dropped, as the reference does.
    (drop,) = exporter["metric_relabel_configs"]
    assert drop["action"] == "drop"
    assert "process_cpu_seconds_total" in drop["regex"].split("|")
    assert exporter["static_configs"] == [
        {"targets": ["127.0.0.1:9100"], "labels": {"node": "${env:K8S_NODE_NAME}"}}
    ]
    pipeline = config["service"]["pipelines"]["metrics/infra"]
    assert pipeline["receivers"] == ["prometheus/infra"]
    assert pipeline["processors"][0] == "filter/prometheus"
    # node-exporter replaces hostmetrics (OpenTelemetry names the reference never sends).
    assert "hostmetrics" not in config["receivers"]


def test_the_collectors_own_metrics_are_scraped_and_not_filtered_by_essential_names() -> None:
    metrics = MetricsSettings(enabled=True, essential_only=True, essential=("node_.+",))
    config = build_agent(AgentSettings("ops", logs=False, metrics=metrics))
    (job,) = scrape_jobs(config, "prometheus/self").values()
    assert job["job_name"] == "lumigo-operator-self-metrics"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:8888"]}]
    assert "metric_relabel_configs" not in job
    pipeline = config["service"]["pipelines"]["metrics/self"]
    assert pipeline["receivers"] == ["prometheus/self"]
    assert "filter/essential" not in pipeline["processors"]
    # Scrape bookkeeping and Go runtime series are never sent.
    (exclude,) = config["processors"]["filter/prometheus"]["metrics"]["metric"]
    assert 'IsMatch(name, "^(?:scrape_.+|up|go_.+' in exclude


def test_essential_names_are_anchored_regular_expressions_as_in_the_reference() -> None:
    names = ("kube_.+_labels", "kube_pod_owner", "otelcol_exporter_*", "node_cpu_seconds_total")
    metrics = MetricsSettings(enabled=True, essential_only=True, essential=names)
    config = build_agent(AgentSettings("ops", logs=False, metrics=metrics))
    joined = "kube_.+_labels|kube_pod_owner|otelcol_exporter_*|node_cpu_seconds_total"
    for name, job in scrape_jobs(config, "prometheus/infra").items():
        keep = job["metric_relabel_configs"][0]  # type: ignore[index]
        assert keep == {"source_labels": ["__name__"], "action": "keep", "regex": joined}, name
    # The other pipelines (the kubelet's summary) get the same match, anchored like Prometheus.
    (statement,) = config["processors"]["filter/essential"]["metrics"]["metric"]
    assert statement == f'not IsMatch(name, "^(?:{joined})$$")'
    pattern = re.compile(f"^(?:{joined})$")
    assert pattern.match("kube_deployment_labels")
    assert pattern.match("kube_pod_owner")
    assert not pattern.match("kube_pod_owner_extra")
    assert not pattern.match("kube_pod_info")
    assert not pattern.match("otelcol_exporter_sent_spans"), "anchored: `_*` repeats the `_`"


def test_the_default_essential_list_is_the_reference_list() -> None:
    assert len(ESSENTIAL_METRICS) == 39
    assert {"kube_.+_labels", "kube_pod_owner", "node_cpu_seconds_total",
            "node_memory_Active_bytes", "http_client_*",
            "lumigo_operator_pod_container_resource_usage_*"} <= set(ESSENTIAL_METRICS)  # fmt: skip
    values = yaml.safe_load((ROOT / "charts/lumigo-operator/values.yaml").read_text())
    metrics = values["clusterCollection"]["metrics"]
    assert tuple(metrics["essentialMetrics"]["names"]) == ESSENTIAL_METRICS
    assert metrics["essentialOnly"] is True


def test_kube_state_metrics_exports_the_labels_families() -> None:
    template = (ROOT / "charts/lumigo-operator/templates/kube-state-metrics.yaml").read_text()
    assert "--metric-labels-allowlist=" in template
    values = yaml.safe_load((ROOT / "charts/lumigo-operator/values.yaml").read_text())
    allow = values["kubeStateMetrics"]["metricLabelsAllowlist"]
    assert "pods=[pod,namespace]" in allow
    assert "deployments=[deployment,namespace]" in allow


@pytest.mark.parametrize("bad", ["(", "a b", 'a"b', "(?=x)", "a\nb", "", "x" * 201, "a\\"])
def test_a_bad_essential_pattern_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid essential metric pattern"):
        MetricsSettings(enabled=True, essential=(bad,))


def test_node_exporter_runs_in_the_agent_pod_read_only_and_on_loopback() -> None:
    target = AgentTarget("ops", "agent", "proxy", "token", node_exporter_image="ne:1")
    proxy = {"metadata": {"name": "proxy", "uid": "u"}, "spec": {"template": {"spec": {
        "containers": [{"name": "otelcol", "image": "otelcol:1"}]}}}}  # fmt: skip
    pod = agent_daemonset(target, proxy, "d", metrics=True)["spec"]["template"]["spec"]
    collector, exporter = pod["containers"]
    assert exporter["image"] == "ne:1"
    assert "--web.listen-address=127.0.0.1:9100" in exporter["args"]
    assert exporter["securityContext"]["runAsNonRoot"] is True
    assert all(m["readOnly"] for m in exporter["volumeMounts"])
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {hosts[m["name"]] for m in exporter["volumeMounts"]} == {"/proc", "/sys", "/"}
    assert not any(m["name"].startswith("host-") for m in collector["volumeMounts"])
    # Without node metrics (or without an image) there is no node-exporter.
    for t, metrics in ((target, False), (AgentTarget("ops", "agent", "proxy", "token"), True)):
        pod = agent_daemonset(t, proxy, "d", metrics=metrics)["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["containers"]] == ["otelcol"]


@pytest.mark.parametrize("enricher", [False, True])
def test_kube_state_metrics_owner_series_get_owner_uids_with_the_enricher(enricher: bool) -> None:
    """kube_pod_owner, kube_replicaset_owner and kube_job_owner get `owner_uid` (as the
    reference's proxy adds it) from lumigo_k8s_enricher, in the pipeline of the
    kube-state-metrics scrape only, and only when the image has it (`k8s_enricher`)."""
    proxy = ProxySettings(k8s_enricher=enricher, kube_auth="kubeConfig")
    config = build_agent(AgentSettings("ops", metrics=MetricsSettings(enabled=True), proxy=proxy))
    pipelines = config["service"]["pipelines"]
    assert "kube-state-metrics" in scrape_jobs(config, "prometheus/infra")
    for name, pipeline in pipelines.items():
        wanted = enricher and name == "metrics/infra"
        assert ("lumigo_k8s_enricher" in pipeline["processors"]) == wanted, name
    if not enricher:
        assert "lumigo_k8s_enricher" not in config["processors"]
        return
    infra = pipelines["metrics/infra"]["processors"]
    # After the filters (fewer points to look at), before the batch.
    assert infra.index("lumigo_k8s_enricher") > infra.index("filter/prometheus")
    assert infra.index("lumigo_k8s_enricher") < infra.index("batch")
    assert config["processors"]["lumigo_k8s_enricher"] == {
        "auth_type": "kubeConfig",
        "timeout": "2s",
        "cache_size": 4096,
        "cache_ttl": "1m",
        "events_scope": "lumigo-operator.k8s-events",
        "objects_scope": "lumigo-operator.k8s-objects",
    }


def test_the_agent_takes_its_own_placement_from_the_proxy_annotation_and_only_a_valid_one() -> None:
    """The chart's `tolerations.clusterAgent` / `nodeSelector.clusterAgent` (the reference's
    keys) reach the DaemonSet through the proxy Deployment's annotation; without it the agent
    keeps the proxy's tolerations, and a malformed part is ignored rather than applied."""
    target = AgentTarget("ops", "agent", "proxy", "token")
    mine = [{"key": "agent", "operator": "Exists"}]

    def agent_pod(annotation: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": "proxy", "uid": "u"}
        if annotation is not None:
            metadata["annotations"] = {AGENT_SCHEDULING_ANNOTATION: annotation}
        proxy = {"metadata": metadata, "spec": {"template": {"spec": {
            "containers": [{"name": "otelcol", "image": "otelcol:1"}],
            "tolerations": [{"key": "proxy", "operator": "Exists"}]}}}}  # fmt: skip
        spec: dict[str, Any] = agent_daemonset(target, proxy, "d")["spec"]["template"]["spec"]
        return spec

    borrowed = agent_pod(None)
    assert borrowed["tolerations"] == [{"key": "proxy", "operator": "Exists"}]
    assert "nodeSelector" not in borrowed
    own = agent_pod(json.dumps({"tolerations": mine, "nodeSelector": {"pool": "logs"}}))
    assert own["tolerations"] == mine
    assert own["nodeSelector"] == {"pool": "logs"}
    for bad in ("{not json", '"a string"', '{"tolerations": "x", "nodeSelector": {"a": 1}}'):
        pod = agent_pod(bad)
        assert pod["tolerations"] == [{"key": "proxy", "operator": "Exists"}], bad
        assert "nodeSelector" not in pod, bad


def test_the_agent_exports_through_the_proxys_egress_and_reaches_its_kubelet_directly() -> None:
    """The chart's `egress` is on the proxy's collector (HTTPS_PROXY, NO_PROXY, SSL_CERT_DIR and
    the CA volume): the agent's collector gets the same, plus its node's IP in NO_PROXY; other
    variables of the proxy (its GOMEMLIMIT, a user's extraEnv) stay the proxy's."""
    target = AgentTarget("ops", "agent", "proxy", "token")
    ca_volume = {"name": "egress-ca", "configMap": {"name": "corp-ca", "items": [
        {"key": "bundle.pem", "path": "ca.crt"}]}}  # fmt: skip
    collector = {
        "name": "otelcol",
        "image": "otelcol:1",
        "env": [
            {"name": "GOMEMLIMIT", "value": "400MiB"},
            {"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"},
            {"name": "NO_PROXY", "value": "$(KUBERNETES_SERVICE_HOST),.svc"},
            {"name": "SSL_CERT_DIR", "value": "/etc/lumigo/egress-ca"},
            {"name": "MINE", "value": "x"},
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/otelcol"},
            {"name": "egress-ca", "mountPath": "/etc/lumigo/egress-ca", "readOnly": True},
        ],
    }
    proxy = {"metadata": {"name": "proxy", "uid": "u"}, "spec": {"template": {"spec": {
        "containers": [collector], "volumes": [{"name": "config"}, ca_volume]}}}}  # fmt: skip
    pod = agent_daemonset(target, proxy, "d")["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["HTTPS_PROXY"] == "http://proxy.corp:3128"
    assert env["NO_PROXY"] == "$(KUBERNETES_SERVICE_HOST),.svc,$(K8S_NODE_IP)"
    assert env["SSL_CERT_DIR"] == "/etc/lumigo/egress-ca"
    assert "MINE" not in env
    assert env["GOMEMLIMIT"] != "400MiB"
    # $(K8S_NODE_IP) is expanded by the kubelet only from a variable defined before it.
    names = [e["name"] for e in agent["env"]]
    assert names.index("K8S_NODE_IP") < names.index("NO_PROXY")
    assert {"name": "egress-ca", "mountPath": "/etc/lumigo/egress-ca", "readOnly": True} in agent[
        "volumeMounts"
    ]
    assert ca_volume in pod["volumes"]
    # Without egress settings, none of it.
    collector["env"], collector["volumeMounts"] = [], []
    plain = agent_daemonset(target, proxy, "d")["spec"]["template"]["spec"]
    assert not {"HTTPS_PROXY", "NO_PROXY", "SSL_CERT_DIR"} & {
        e["name"] for e in plain["containers"][0]["env"]
    }
    assert all(v["name"] != "egress-ca" for v in plain["volumes"])
