"""The proxy configuration over a Secret's size (issue 28, item 9): the reconciler used to refuse
it and keep the previous one, so a deleted namespace's token went on exporting. Now the largest
configuration that fits is written (the namespaces whose Lumigo is newest are left out first), a
removed tenant is always dropped, and each left-out Lumigo says so in its status. Against a real
API server; the cap is made small so that a few namespaces exceed it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from controller.lumigo.resources import LUMIGOES
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.telemetry.config import Origin, ProxySettings, render
from controller.telemetry.proxy_reconciler import ProxyTarget, TelemetryProxyReconciler
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS
from tests.integration.test_telemetry_reconciler import (
    PROXY,
    PROXY_SECRET,
    proxy_deployment,
    stored_config,
)
from tests.support.lumigo import create_lumigo, create_token_secret, random_token, set_active

RUN = f"size-cap-{uuid.uuid4().hex[:6]}"
LABEL = "lumigo-test-size-cap"


@pytest.fixture
def namespaces(cluster: LocalCluster, crd: object) -> Iterator[list[str]]:
    names = [f"t-cap-{i}-{uuid.uuid4().hex[:5]}" for i in range(4)]
    for name in names:
        cluster.kubectl("create", "namespace", name)
    try:
        yield names
    finally:
        for name in names:
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def informer(kube: KubeClient, crd: object) -> Iterator[Informer]:
    """This test's Lumigoes only (labelled), so other tests' objects cannot interfere."""
    lumigoes = Informer(kube, Selection(LUMIGOES, label_selector=f"{LABEL}={RUN}"))
    lumigoes.start()
    try:
        assert lumigoes.wait_for_sync(30)
        yield lumigoes
    finally:
        lumigoes.stop()


def active_lumigo(kube: KubeClient, informer: Informer, namespace: str, token: str) -> None:
    create_token_secret(kube, namespace, token)
    create_lumigo(kube, namespace)
    kube.merge_patch(LUMIGOES, "lumigo", {"metadata": {"labels": {LABEL: RUN}}}, namespace)
    set_active(kube, namespace)
    wait_until(lambda: bool((informer.get(namespace, "lumigo") or {}).get("status")), 30,
               "the active Lumigo cached")  # fmt: skip


def left_out(kube: KubeClient, namespace: str) -> dict[str, str] | None:
    status = kube.get(LUMIGOES, "lumigo", namespace).get("status") or {}
    for condition in status.get("conditions") or []:
        if condition["type"] == "TelemetryLeftOut":
            return dict(condition)
    return None


def test_over_the_cap_the_largest_configuration_that_fits_is_written(
    kube: KubeClient, informer: Informer, namespace: str, namespaces: list[str]
) -> None:
    first, second, third, fourth = namespaces
    tokens = {ns: random_token() for ns in namespaces}
    proxy_deployment(kube, namespace)
    reconciler = TelemetryProxyReconciler(
        kube, informer, ProxyTarget(namespace, PROXY_SECRET, PROXY),
        ProxySettings(origin=Origin(cluster_name="it")), resync_period=1.0,
    )  # fmt: skip
    for ns in (first, second, third):
        active_lumigo(kube, informer, ns, tokens[ns])
    reconciler.sync()
    text, _ = stored_config(kube, namespace)
    assert all(f"LumigoToken {tokens[ns]}" in text for ns in (first, second, third))

    # A Secret that holds two namespaces' configuration, not three.
    two = reconciler.monitored_namespaces()[:2]
    reconciler.max_config_bytes = len(render(two, reconciler.rendering_settings()).encode()) + 16

    # Over the cap: the newest Lumigo's namespace is left out, and says so.
    reconciler.sync()
    text, _ = stored_config(kube, namespace)
    assert len(text.encode()) <= reconciler.max_config_bytes
    assert f"LumigoToken {tokens[first]}" in text
    assert f"LumigoToken {tokens[second]}" in text
    assert f"LumigoToken {tokens[third]}" not in text
    condition = left_out(kube, third)
    assert condition is not None
    assert condition["status"] == "True"
    assert condition["reason"] == "ProxyConfigurationTooLarge"
    assert left_out(kube, first) is None

    # The namespace deleted: its token goes at once, and the one left out comes in.
    kube.delete(LUMIGOES, "lumigo", first)
    wait_until(lambda: informer.get(first, "lumigo") is None, 30, "the deletion cached")
    reconciler.sync()
    text, _ = stored_config(kube, namespace)
    assert f"LumigoToken {tokens[first]}" not in text
    assert f"LumigoToken {tokens[second]}" in text
    assert f"LumigoToken {tokens[third]}" in text
    third_condition = left_out(kube, third)
    assert third_condition is not None
    assert third_condition["status"] == "False"

    # A new namespace over the cap is left out; those already in stay.
    active_lumigo(kube, informer, fourth, tokens[fourth])
    reconciler.sync()
    text, _ = stored_config(kube, namespace)
    assert f"LumigoToken {tokens[fourth]}" not in text
    assert f"LumigoToken {tokens[second]}" in text
    assert f"LumigoToken {tokens[third]}" in text
    fourth_condition = left_out(kube, fourth)
    assert fourth_condition is not None
    assert fourth_condition["status"] == "True"
    assert kube.get(DEPLOYMENTS, PROXY, namespace)  # the proxy is still there, rolled
