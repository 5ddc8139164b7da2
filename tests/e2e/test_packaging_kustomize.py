"""`kubectl apply -k config/default` on the full local cluster, then the seed README's YAML.

kwok runs no containers, so for the README flow the manager runs as a local process with the
installed Deployment's args and env and the installed ServiceAccount's token (so the install's
RBAC is what it has), and the installed webhook configurations point at it with `url:`.
The `kustomize_install` fixture removes everything it installed (the shared CRD aside) whatever
happens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api import constants
from controller.cli import _parser
from controller.lumigo.resources import LUMIGOES
from controller.options import run_options
from controller.runtime.kube import KubeClient
from controller.telemetry.proxy_reconciler import CONFIG_HASH_ANNOTATION
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import CONFIGMAPS, DEPLOYMENTS, EVENTS, SECRETS
from tests.support.checks import clean, is_active
from tests.support.packaging import (
    CRD_NAME,
    OPERATOR_SA,
    ROOT,
    denied,
    deployment_available,
    exists,
    get_json,
    installed_operator,
    is_injected,
    load_docs,
    namespace_gone,
    telemetry_proxy_requests,
    telemetry_reconciler_requests,
)
from tests.support.workloads import workload

NAMESPACE = "lumigo-system"
FULLNAME = "lumigo-lumigo-operator"
DEPLOYMENT = f"{FULLNAME}-controller-manager"
PROXY = f"{FULLNAME}-telemetry-proxy"
SAMPLE = ROOT / "config" / "samples" / "operator_v1alpha1_lumigo.yaml"
SAMPLE_TOKEN = "t_123456789012345678901"


def kustomize_build(cluster: LocalCluster) -> list[dict[str, Any]]:
    return load_docs(cluster.kubectl("kustomize", str(ROOT / "config" / "default")))


@pytest.fixture
def kustomize_install(full_cluster: LocalCluster) -> Iterator[list[dict[str, Any]]]:
    """config/default applied; afterwards every object but the (shared) CRD is deleted, and the
    namespace is waited for, so that the next install can use it again."""
    docs = kustomize_build(full_cluster)
    if exists(full_cluster, "namespace", NAMESPACE):  # another test's, still terminating
        phase = get_json(full_cluster, "namespace", NAMESPACE)["status"]["phase"]
        if phase == "Terminating":
            namespace_gone(full_cluster, NAMESPACE)
    try:
        yield docs
    finally:
        rest = [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Namespace")]
        full_cluster.kubectl(
            "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            input="\n---\n".join(json.dumps(d) for d in rest), check=False,
        )  # fmt: skip
        namespace_gone(full_cluster, NAMESPACE)


def test_kubectl_apply_k_config_default(
    full_cluster: LocalCluster, kustomize_install: list[dict[str, Any]]
) -> None:
    cluster = full_cluster
    out = cluster.kubectl("apply", "-k", str(ROOT / "config" / "default"))
    for doc in kustomize_install:
        kind, name = doc["kind"], doc["metadata"]["name"]
        namespace = doc["metadata"].get("namespace")
        where = ["-n", namespace] if namespace else []
        assert exists(cluster, kind.lower(), name, *where), f"{kind} {name} was not created"
        assert f"/{name} " in out, f"kubectl did not report {kind} {name}"

    # The namespace admits the cluster agent (privileged) and warns and audits at restricted,
    # which every other pod meets (tests/integration/test_component_pod_security.py).
    labels = get_json(cluster, "namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    wait_until(
        lambda: deployment_available(cluster, NAMESPACE, DEPLOYMENT), 120, "the manager Available"
    )
    # The telemetry proxy is part of the install: its pods are admitted too, and its Service
    # selects them.
    wait_until(lambda: deployment_available(cluster, NAMESPACE, PROXY), 120, "the proxy Available")
    service = get_json(cluster, "service", f"{PROXY}-service", "-n", NAMESPACE)
    selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
    assert get_json(cluster, "pods", "-n", NAMESPACE, "-l", selector)["items"]
    # Admissions: the webhook Deployment's pods, and only they, behind the webhook Service.
    webhook = f"{FULLNAME}-webhook"
    wait_until(lambda: deployment_available(cluster, NAMESPACE, webhook), 120, "the webhook")
    service = get_json(cluster, "service", f"{FULLNAME}-webhooks-service", "-n", NAMESPACE)
    selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
    selected = get_json(cluster, "pods", "-n", NAMESPACE, "-l", selector)["items"]
    assert selected
    assert {p["spec"]["serviceAccountName"] for p in selected} == {webhook}
    manager = get_json(cluster, "deployment", DEPLOYMENT, "-n", NAMESPACE)
    args = manager["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--telemetry-proxy-deployment={PROXY}" in args
    assert f"--telemetry-proxy-config-secret={PROXY}-config" in args
    assert "--deployment-method=Kustomize" in args
    # What the operator's reconciler and the proxy do is allowed to their ServiceAccounts.
    assert denied(cluster, NAMESPACE, OPERATOR_SA,
                  telemetry_reconciler_requests(NAMESPACE, FULLNAME)) == []  # fmt: skip
    assert denied(cluster, NAMESPACE, PROXY, telemetry_proxy_requests(NAMESPACE, FULLNAME)) == []
    crd = get_json(cluster, "crd", CRD_NAME)
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"

    # No key material anywhere: the operator (--cert-mode=self) creates and injects it.
    assert get_json(cluster, "secrets", "-n", NAMESPACE)["items"] == []
    for name in ("injector", "defaulter"):
        config = get_json(
            cluster,
            "mutatingwebhookconfiguration",
            f"lumigo-lumigo-operator-{name}-webhook-configuration",
        )
        assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])

    # A second apply is a no-op: nothing drifts (e.g. a defaulted field kubectl keeps re-setting).
    again = cluster.kubectl("apply", "-k", str(ROOT / "config" / "default"))
    changed = [line for line in again.splitlines() if not line.endswith(" unchanged")]
    assert changed == [], changed


def test_readme_overlay_names_the_cluster(cluster: LocalCluster, tmp_path: Path) -> None:
    """The README's kustomize overlay, as written there, gives the manager the cluster name."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("# my-overlay/kustomization.yaml\n", 1)[1].split("```", 1)[0]
    overlay = tmp_path / "my-overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(block)
    (tmp_path / "config").symlink_to(ROOT / "config")
    docs = load_docs(cluster.kubectl("kustomize", str(overlay)))
    (manager,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == DEPLOYMENT
    ]
    args = manager["spec"]["template"]["spec"]["containers"][0]["args"]
    opts = run_options(_parser().parse_args(["run", *args]))
    assert (opts.cluster_name, opts.deployment_method) == ("prod-eu-1", "Kustomize")
    # kube-state-metrics, which the overlay adds, is one its agents' selector finds.
    (ksm,) = [d for d in docs if d["kind"] == "StatefulSet"]
    labels = ksm["spec"]["template"]["metadata"]["labels"]
    for requirement in opts.kube_state_metrics_selector.split(","):
        key, value = requirement.split("=")
        assert labels[key] == value, (requirement, labels)


def test_seed_readme_yaml_after_kubectl_apply_k(
    full_cluster: LocalCluster,
    kube: KubeClient,
    kustomize_install: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    """The upstream README, word for word, on a kubectl install: the Secret and Lumigo apply
    (through the defaulter webhook, failurePolicy Fail), the Lumigo becomes Active and a new
    Deployment is stored injected; the operator runs with the install's own flags and RBAC."""
    cluster = full_cluster
    cluster.kubectl("apply", "-k", str(ROOT / "config" / "default"))
    with installed_operator(cluster, kube, NAMESPACE, DEPLOYMENT, tmp_path) as operator:
        app = operator.new_namespace()
        out = cluster.kubectl("apply", "-n", app, "-f", str(SAMPLE))
        assert "secret/lumigo-credentials created" in out
        assert "lumigo.operator.lumigo.io/lumigo created" in out
        wait_until(lambda: is_active(kube, app), 60, "the README's Lumigo Active")
        lumigo = kube.get(LUMIGOES, "lumigo", app)
        assert lumigo["spec"]["tracing"]["enabled"] is True, "the defaulter filled the defaults"

        created = kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, "shop"), app)
        assert is_injected(created)
        assert is_injected(kube.get(DEPLOYMENTS, "shop", app))
        env = {e["name"]: e for e in created["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["LUMIGO_ENDPOINT"]["value"] == (
            f"http://{PROXY}-service.{NAMESPACE}.svc.cluster.local/v1/traces"
        )
        assert env["LUMIGO_TRACER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "lumigo-credentials", "key": "token", "optional": True,
        }  # fmt: skip

        # The operator configured the installed proxy: its Secret, and the Deployment rolled to
        # that configuration's hash.
        def proxy_configured() -> bool:
            secret = kube.get_or_none(SECRETS, f"{PROXY}-config", NAMESPACE)
            proxy = kube.get(DEPLOYMENTS, PROXY, NAMESPACE)
            annotations = proxy["spec"]["template"]["metadata"].get("annotations") or {}
            return (
                secret is not None
                and annotations.get(CONFIG_HASH_ANNOTATION)
                == (secret["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])
            )

        wait_until(proxy_configured, 60, "the proxy configuration written and rolled out")

        # The token is in its Secret and the proxy's Secret only.
        seen = [kube.get(LUMIGOES, "lumigo", app), *kube.list(EVENTS, app)[0]]
        for namespace in (app, NAMESPACE):
            seen += kube.list(CONFIGMAPS, namespace)[0]
        assert SAMPLE_TOKEN not in json.dumps(seen)
        assert SAMPLE_TOKEN not in operator.log_text()

        # The kustomize uninstall path of the README: `lumigo-operator uninstall` first.
        result = operator.uninstall()
        assert result.returncode == 0, result.stdout + result.stderr
        assert kube.list(LUMIGOES, app)[0] == []
        shop = kube.get(DEPLOYMENTS, "shop", app)
        assert clean(shop), shop["metadata"]
        assert constants.LABEL_AUTO_TRACE not in (shop["metadata"].get("labels") or {})
        assert SAMPLE_TOKEN not in result.stdout + result.stderr + operator.log_text()
