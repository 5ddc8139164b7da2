"""The Pod Security level each component needs (docs/security.md, issue 34 item 5), judged by the
real API server's PodSecurity admission on dry-run Pods: every pod the chart renders (every
optional component and hook on), the kustomize manifests and the OLM bundle run passes
`restricted`; the cluster agent's pod, which the operator creates, needs `privileged` (root and
hostPath: the node's pod logs, /proc, /sys), and `baseline` and `restricted` refuse it, saying
why. The kustomize namespace is labelled so that the agent can run, and warns and audits at
`restricted` for everything else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.runtime.kube import KubeClient
from controller.telemetry.agent import AgentTarget, agent_daemonset
from envtest.cluster import LocalCluster
from tests.integration.test_pod_security import admission_error
from tests.support.packaging import CHART, helm, load_docs, render_chart

JSON = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
EVERYTHING_ON = {
    "lumigoToken": {"value": "t_0123456789abcdef01234"},
    "monitoredNamespaces": [{"namespace": "default"}],
    "kubeStateMetrics": {"install": True},
    "watchdog": {"enabled": True},
    "uninstallHook": {"enabled": True},
}


def pod_specs(docs: list[JSON]) -> dict[str, JSON]:
    specs: dict[str, JSON] = {}
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            specs[name] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            specs[name] = doc["spec"]
    return specs


def helm_pods() -> dict[str, JSON]:
    return pod_specs(load_docs(render_chart("lumigo", "lumigo-system", EVERYTHING_ON)))


def kustomize_pods(cluster: LocalCluster) -> dict[str, JSON]:
    return pod_specs(load_docs(cluster.kubectl("kustomize", str(ROOT / "config" / "default"))))


def olm_pods() -> dict[str, JSON]:
    csv = yaml.safe_load(
        (ROOT / "bundle" / "manifests" / "lumigo-operator.clusterserviceversion.yaml").read_text()
    )
    return {
        f"CSV/{d['name']}": d["spec"]["template"]["spec"]
        for d in csv["spec"]["install"]["spec"]["deployments"]
    }


def agent_pod() -> JSON:
    docs = load_docs(render_chart("lumigo", "lumigo-system"))
    name = "lumigo-lumigo-operator-telemetry-proxy"
    proxy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
    target = AgentTarget("lumigo-system", "agent", proxy["metadata"]["name"], "token",
                         node_exporter_image="quay.io/prometheus/node-exporter:v1.8.2")  # fmt: skip
    pod: JSON = agent_daemonset(target, proxy, "digest", logs=True, metrics=True)["spec"][
        "template"
    ]["spec"]
    return pod


def without_service_account(spec: JSON) -> JSON:
    """The ServiceAccounts exist only in an install; Pod Security does not look at them."""
    return {k: v for k, v in spec.items() if k != "serviceAccountName"}


@pytest.mark.parametrize("install", ["helm", "kustomize", "olm"])
def test_every_pod_of_each_install_passes_restricted(
    install: str, cluster: LocalCluster, kube: KubeClient, pss_namespaces: dict[str, str]
) -> None:
    pods = {"helm": helm_pods, "olm": olm_pods}.get(install, lambda: kustomize_pods(cluster))()
    restricted = pss_namespaces["restricted"]
    assert len(pods) >= (5 if install == "helm" else 3), sorted(pods)
    refused = {
        name: error
        for name, spec in pods.items()
        if (error := admission_error(kube, restricted, without_service_account(spec)))
    }
    assert refused == {}


def test_the_cluster_agent_needs_privileged_and_the_others_say_why(
    kube: KubeClient, pss_namespaces: dict[str, str]
) -> None:
    spec = without_service_account(agent_pod())
    assert admission_error(kube, pss_namespaces["privileged"], spec) is None
    for level in ("baseline", "restricted"):
        error = admission_error(kube, pss_namespaces[level], spec)
        assert error is not None, level
        assert "hostPath" in error, error
    assert "runAsNonRoot != true" in (
        admission_error(kube, pss_namespaces["restricted"], spec) or ""
    )


def test_the_kustomize_namespace_lets_the_agent_run_and_warns_at_restricted(
    cluster: LocalCluster,
) -> None:
    docs = load_docs(cluster.kubectl("kustomize", str(ROOT / "config" / "default")))
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"


def test_helm_warns_when_its_namespace_would_refuse_the_agent(
    cluster: LocalCluster, crd: Path, pss_namespaces: dict[str, str]
) -> None:
    """`helm install` with cluster collection into a namespace whose level refuses the agent:
    NOTES.txt says so and how to fix it (a server-side dry run, so that `lookup` sees the
    namespace); into a privileged one, nothing. The session's CRD is kubectl's, not this
    release's: the chart leaves it alone here, as for a user who installed it first."""

    def notes(namespace: str) -> str:
        return helm(
            "install", "pss-notes", str(CHART), "--namespace", namespace, "--dry-run=server",
            "--set", "lumigoToken.value=t_0123456789abcdef01234", "--set", "crds.install=false",
            cluster=cluster,
        ).stdout  # fmt: skip

    warned = notes(pss_namespaces["restricted"])
    assert f'WARNING: namespace {pss_namespaces["restricted"]} enforces the "restricted"' in warned
    assert "pod-security.kubernetes.io/enforce=privileged" in warned
    assert "WARNING: namespace" not in notes(pss_namespaces["privileged"])
