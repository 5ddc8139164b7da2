"""A token Secret that cannot be read is not a missing Secret (issue 15, defect 2).

The read fails for real: the reconcilers run with a ServiceAccount whose RBAC lets it do
everything else they need but not GET Secrets, so the API server answers 403. Neither the Lumigo
controller nor the telemetry proxy may act on that as "the Secret is gone": the Lumigo stays
Active with its instrumented workloads listed (so the webhook keeps injecting), the proxy keeps
collecting the namespace, and the controller retries with backoff.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from api import constants
from controller.lumigo.instrumentation import Instrumenter
from controller.lumigo.lumigo_reconciler import LumigoReconciler
from controller.lumigo.resources import LUMIGOES
from controller.runtime.informer import Informer, Selection, metadata_projection
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Controller, ReconcileError
from controller.runtime.store import ObjectKey
from controller.telemetry.config import Origin, ProxySettings
from controller.telemetry.proxy_reconciler import ProxyTarget, TelemetryProxyReconciler
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, SECRETS
from kube.rest import ApiError
from tests.support.lumigo import create_lumigo, create_token_secret, random_token, set_active
from tests.support.workloads import workload
from webhook import pod_injection

JSON = dict[str, Any]
SETTINGS = pod_injection.InjectionSettings(operator_version="0.1.0")
KEY_NAME = "lumigo"


class Events:
    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        pass


def no_secrets_client(cluster: LocalCluster, namespace: str, path: Path) -> KubeClient:
    """A client for a ServiceAccount that may manage Lumigoes and Deployments but not read
    Secrets (a Role without them: every Secret GET is a real 403)."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "no-secrets", "namespace": namespace},
        "rules": [
            {
                "apiGroups": [constants.GROUP],
                "resources": ["lumigoes", "lumigoes/status"],
                "verbs": ["get", "list", "watch", "update", "patch"],
            },
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["*"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "no-secrets", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-secrets"},
        "subjects": [{"kind": "ServiceAccount", "name": "no-secrets", "namespace": namespace}],
    }
    cluster.kubectl("create", "serviceaccount", "no-secrets", "-n", namespace)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [role, binding]}))  # fmt: skip
    token = cluster.kubectl("create", "token", "no-secrets", "-n", namespace).strip()
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "no-secrets", "user": {"token": token}}]
    config["contexts"] = [{"name": "sa", "context": {"cluster": "local", "user": "no-secrets"}}]
    config["current-context"] = "sa"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    client = KubeClient.from_kubeconfig(path)
    # RBAC takes effect through the authorizer's cache: wait until the denial is what we get.
    wait_until(lambda: _secret_read_status(client, namespace) == 403, 30, "a 403 on Secrets")
    return client


def _secret_read_status(client: KubeClient, namespace: str) -> int:
    try:
        client.get_or_none(SECRETS, "lumigo-credentials", namespace)
    except ApiError as err:
        return err.code
    return 200


@pytest.fixture
def informers(kube: KubeClient, namespace: str, crd: object) -> Iterator[tuple[Informer, Informer]]:
    lumigoes = Informer(kube, Selection(LUMIGOES, namespace=namespace))
    deployments = Informer(
        kube,
        Selection(DEPLOYMENTS, namespace=namespace),
        transform=metadata_projection(),
        indexed_labels=(constants.LABEL_AUTO_TRACE,),
    )
    for informer in (lumigoes, deployments):
        informer.start()
    try:
        for informer in (lumigoes, deployments):
            assert informer.wait_for_sync(30), informer.last_error
        yield lumigoes, deployments
    finally:
        for informer in (lumigoes, deployments):
            informer.stop()


def reconciler(client: KubeClient, lumigoes: Informer, deployments: Informer) -> LumigoReconciler:
    return LumigoReconciler(
        client=client,
        lumigoes=lumigoes,
        workloads={"Deployment": deployments},
        instrumenter=Instrumenter(client, Events(), component="test"),
        settings_for=SETTINGS.for_spec,
        resync_period=1.0,
        error_requeue=1.0,
    )


def active_with_shop(obj: JSON | None) -> bool:
    status = (obj or {}).get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    names = [r["name"] for r in status.get("instrumentedResources") or []]
    return conditions.get("Active") == "True" and names == ["shop"]


def test_a_forbidden_secret_read_changes_nothing_and_is_retried(
    cluster: LocalCluster,
    kube: KubeClient,
    namespace: str,
    informers: tuple[Informer, Informer],
    tmp_path: Path,
) -> None:
    lumigoes, deployments = informers
    create_token_secret(kube, namespace, random_token())
    kube.create(
        DEPLOYMENTS, pod_injection.inject(workload(DEPLOYMENTS, "shop"), SETTINGS), namespace
    )
    create_lumigo(kube, namespace)
    key = ObjectKey(namespace, KEY_NAME)
    wait_until(lambda: lumigoes.get(namespace, KEY_NAME) is not None, 30, "the Lumigo cached")
    wait_until(lambda: deployments.get(namespace, "shop") is not None, 30, "the workload cached")

    # As the operator with its RBAC: Active, with the instrumented workload listed.
    healthy = reconciler(kube, lumigoes, deployments)
    wait_until(
        lambda: (
            healthy.reconcile(key) is not None
            and active_with_shop(lumigoes.get(namespace, KEY_NAME))
        ),
        30,
        "the Lumigo Active with its workload",
    )
    before = kube.get(LUMIGOES, KEY_NAME, namespace)

    # Now every Secret read fails with 403: one reconcile fails, and writes nothing.
    forbidden = no_secrets_client(cluster, namespace, tmp_path / "no-secrets.kubeconfig")
    blind = reconciler(forbidden, lumigoes, deployments)
    with pytest.raises(ReconcileError, match="cannot read the token secret"):
        blind.reconcile(key)
    assert kube.get(LUMIGOES, KEY_NAME, namespace) == before

    # Run by a controller: retried with backoff, still nothing written.
    name = f"secret-errors-{namespace}"
    controller = Controller(name, blind.reconcile)
    controller.for_(lumigoes)
    controller.start()
    try:

        def errors() -> float:
            labels = {"controller": name}
            return REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total", labels)

        wait_until(lambda: (errors() or 0) >= 3, 30, "the reconcile to be retried")
        assert controller.queue.num_requeues(key) >= 3
    finally:
        controller.stop()
    after = kube.get(LUMIGOES, KEY_NAME, namespace)
    assert after == before
    assert active_with_shop(after)


def test_a_forbidden_secret_read_keeps_the_proxy_configuration(
    cluster: LocalCluster,
    kube: KubeClient,
    namespace: str,
    informers: tuple[Informer, Informer],
    tmp_path: Path,
) -> None:
    lumigoes, _ = informers
    create_token_secret(kube, namespace, random_token())
    create_lumigo(kube, namespace)
    set_active(kube, namespace)
    wait_until(
        lambda: bool((lumigoes.get(namespace, KEY_NAME) or {}).get("status")),
        30,
        "the active Lumigo cached",
    )
    target = ProxyTarget(namespace, "proxy-config", "proxy")
    settings = ProxySettings(origin=Origin(cluster_name="it", cluster_uid="test"))
    assert TelemetryProxyReconciler(kube, lumigoes, target, settings).sync() is True
    stored = kube.get(SECRETS, target.secret_name, namespace)

    forbidden = no_secrets_client(cluster, namespace, tmp_path / "no-secrets.kubeconfig")
    with pytest.raises(ApiError) as failed:
        TelemetryProxyReconciler(forbidden, lumigoes, target, settings).sync()
    assert failed.value.code == 403
    again = kube.get(SECRETS, target.secret_name, namespace)
    assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
