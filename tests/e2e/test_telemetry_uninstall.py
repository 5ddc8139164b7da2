"""Uninstalling the proxy takes the tokens with it.

The configuration Secret is the operator's, not the installer's (Helm or kubectl would leave it
behind), so the operator makes the proxy Deployment its owner: the garbage collector deletes it,
and the tokens in it, when the Deployment goes.
"""

from __future__ import annotations

from controller.lumigo.resources import LUMIGOES
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.telemetry.config import ProxySettings
from controller.telemetry.proxy_reconciler import ProxyTarget, TelemetryProxyReconciler
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, SECRETS

PROXY = "lumigo-telemetry-proxy"


def test_config_secret_is_garbage_collected_with_the_proxy(
    full_cluster: LocalCluster, crd: object, kube: KubeClient, namespace: str
) -> None:
    labels = {"app": PROXY}
    deployment = kube.create(
        DEPLOYMENTS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": PROXY, "namespace": namespace},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "otelcol", "image": "otelcol:test"}]},
                },
            },
        },
        namespace,
    )
    lumigoes = Informer(kube, Selection(LUMIGOES, namespace=namespace))
    lumigoes.start()
    target = ProxyTarget(namespace, f"{PROXY}-config", PROXY)
    try:
        assert lumigoes.wait_for_sync(30)
        TelemetryProxyReconciler(kube, lumigoes, target, ProxySettings()).sync()
    finally:
        lumigoes.stop()
    secret = kube.get(SECRETS, target.secret_name, namespace)
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Deployment", deployment["metadata"]["uid"])

    kube.delete(DEPLOYMENTS, PROXY, namespace, propagation="Background")
    wait_until(
        lambda: kube.get_or_none(SECRETS, target.secret_name, namespace) is None,
        60,
        "the garbage collector to delete the configuration Secret",
    )
