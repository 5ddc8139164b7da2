"""The cluster agent reconciler against a real API server: the DaemonSet and its configuration
Secret are server-side applied from the proxy Deployment's choices, owned by it, rolled on a
configuration change, untouched when nothing changed, and deleted when the feature is off."""

from __future__ import annotations

import base64
from typing import Any

import yaml

from controller.runtime.kube import KubeClient
from controller.telemetry.agent import FIELD_MANAGER, AgentTarget, ClusterAgentReconciler
from controller.telemetry.agent_config import TOKEN_ENV, AgentSettings, LogFileRule, MetricsSettings
from controller.telemetry.config import Origin, ProxySettings
from controller.telemetry.proxy_reconciler import CONFIG_HASH_ANNOTATION, CONFIG_KEY
from kube.kinds import DAEMONSETS, DEPLOYMENTS, SECRETS
from tests.support.workloads import one_container_deployment

PROXY = "lumigo-telemetry-proxy"
AGENT = "lumigo-cluster-agent"
JSON = dict[str, Any]


def proxy(kube: KubeClient, namespace: str) -> JSON:
    """The proxy Deployment, and the token Secret cluster collection waits for."""
    if kube.get_or_none(SECRETS, "cluster-token", namespace) is None:
        token = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cluster-token"},
                 "stringData": {"key": "t_0123456789abcdef01234"}}  # fmt: skip
        kube.create(SECRETS, token, namespace)
    body = one_container_deployment(PROXY, "otelcol:test", container="otelcol")
    pod = body["spec"]["template"]["spec"]
    pod["serviceAccountName"] = "proxy-sa"
    pod["imagePullSecrets"] = [{"name": "registry"}]
    pod["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    pod["containers"][0]["imagePullPolicy"] = "Never"
    return kube.create(DEPLOYMENTS, body, namespace)


def make(
    kube: KubeClient, namespace: str, *, enabled: bool = True, node_exporter: str = "",
    **settings: Any,
) -> ClusterAgentReconciler:  # fmt: skip
    target = AgentTarget(namespace, AGENT, PROXY, "cluster-token", "key", "/logs/pods", "/state",
                         node_exporter_image=node_exporter)  # fmt: skip
    agent = AgentSettings(
        namespace, proxy=ProxySettings(origin=Origin(cluster_name="it")), **settings
    )
    return ClusterAgentReconciler(kube, target, agent, enabled)


def our_write(obj: JSON) -> JSON:
    """The operator's entry of the object's managed fields (its time is its last real write)."""
    (entry,) = [m for m in obj["metadata"]["managedFields"]
                if m["manager"] == FIELD_MANAGER and not m.get("subresource")]  # fmt: skip
    return dict(entry)


def config_of(kube: KubeClient, namespace: str) -> JSON:
    secret = kube.get(SECRETS, f"{AGENT}-config", namespace)
    loaded: JSON = yaml.safe_load(base64.b64decode(secret["data"][CONFIG_KEY]))
    return loaded


def test_the_agent_runs_the_proxys_image_as_its_owner_says(
    kube: KubeClient, namespace: str
) -> None:
    owner = proxy(kube, namespace)
    make(kube, namespace).sync()

    daemonset = kube.get(DAEMONSETS, AGENT, namespace)
    assert daemonset["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert daemonset["metadata"]["labels"]["lumigo.auto-trace"] == "false"
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["image"], container["imagePullPolicy"]) == ("otelcol:test", "Never")
    assert pod["serviceAccountName"] == "proxy-sa"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    env = {e["name"]: e for e in container["env"]}
    assert env[TOKEN_ENV]["valueFrom"]["secretKeyRef"] == {"name": "cluster-token", "key": "key"}
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert (paths["pod-logs"], paths["state"]) == ("/logs/pods", "/state")
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}

    secret = kube.get(SECRETS, f"{AGENT}-config", namespace)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    config = config_of(kube, namespace)
    assert config["receivers"]["filelog"]["exclude"] == [f"/var/log/pods/{namespace}_*_*/*/*.log"]


def test_an_unchanged_configuration_writes_nothing_and_a_change_rolls_the_agents(
    kube: KubeClient, namespace: str
) -> None:
    proxy(kube, namespace)
    make(kube, namespace).sync()
    before = kube.get(DAEMONSETS, AGENT, namespace)
    secret_before = kube.get(SECRETS, f"{AGENT}-config", namespace)

    make(kube, namespace).sync()  # a new process, same flags: no write at all
    # (The DaemonSet controller, where one runs, writes the status: compare our own write.)
    again = kube.get(DAEMONSETS, AGENT, namespace)
    assert again["metadata"]["generation"] == before["metadata"]["generation"]
    assert our_write(again) == our_write(before)
    assert (
        kube.get(SECRETS, f"{AGENT}-config", namespace)["metadata"]["resourceVersion"]
        == (secret_before["metadata"]["resourceVersion"])
    )

    make(kube, namespace, exclude=(LogFileRule("noisy"),)).sync()
    after = kube.get(DAEMONSETS, AGENT, namespace)
    old_hash = before["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    new_hash = after["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    assert old_hash != new_hash, "a new configuration rolls the agent pods"
    assert (
        "/var/log/pods/noisy_*_*/*/*.log"
        in config_of(kube, namespace)["receivers"]["filelog"]["exclude"]
    )


def test_turned_off_the_agent_and_its_configuration_are_deleted(
    kube: KubeClient, namespace: str
) -> None:
    proxy(kube, namespace)
    make(kube, namespace).sync()
    disabled = make(kube, namespace, enabled=False)
    disabled.sync()
    assert kube.get_or_none(DAEMONSETS, AGENT, namespace) is None
    assert kube.get_or_none(SECRETS, f"{AGENT}-config", namespace) is None
    disabled.sync()  # nothing left: no error


def test_without_the_proxy_deployment_nothing_is_created(kube: KubeClient, namespace: str) -> None:
    token = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cluster-token"},
             "stringData": {"key": "t_0123456789abcdef01234"}}  # fmt: skip
    kube.create(SECRETS, token, namespace)
    reconciler = make(kube, namespace)
    reconciler.sync()
    assert kube.get_or_none(DAEMONSETS, AGENT, namespace) is None
    proxy(kube, namespace)
    reconciler.sync()
    assert kube.get_or_none(DAEMONSETS, AGENT, namespace) is not None


def test_without_the_token_secret_nothing_is_created_until_it_exists(
    kube: KubeClient, namespace: str
) -> None:
    body = one_container_deployment(PROXY, "otelcol:test", container="otelcol")
    kube.create(DEPLOYMENTS, body, namespace)
    reconciler = make(kube, namespace)
    reconciler.sync()
    assert kube.get_or_none(DAEMONSETS, AGENT, namespace) is None, "its pods could not start"
    token = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cluster-token"},
             "stringData": {"key": "t_0123456789abcdef01234"}}  # fmt: skip
    kube.create(SECRETS, token, namespace)
    reconciler.sync()
    assert kube.get_or_none(DAEMONSETS, AGENT, namespace) is not None


def test_metrics_only_mounts_no_log_directory_and_reads_the_node_ip(
    kube: KubeClient, namespace: str
) -> None:
    proxy(kube, namespace)
    make(kube, namespace, logs=False, metrics=MetricsSettings(enabled=True),
         node_exporter="node-exporter:test").sync()  # fmt: skip
    pod = kube.get(DAEMONSETS, AGENT, namespace)["spec"]["template"]["spec"]
    assert "pod-logs" not in {v["name"] for v in pod["volumes"]}
    # node-exporter next to the collector, with the node's /proc, /sys and /, read-only.
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert (host["host-proc"], host["host-sys"], host["host-root"]) == ("/proc", "/sys", "/")
    collector, exporter = pod["containers"]
    assert exporter["image"] == "node-exporter:test"
    mounts = {m["name"]: m for m in exporter["volumeMounts"]}
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/hostfs/proc",
                                   "readOnly": True}  # fmt: skip
    assert all(m["readOnly"] for m in mounts.values())
    assert not [m for m in collector["volumeMounts"] if m["name"].startswith("host-")]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["K8S_NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    config = config_of(kube, namespace)
    assert set(config["service"]["pipelines"]) == {"metrics/kubelet", "metrics/infra",
                                                   "metrics/self"}  # fmt: skip
