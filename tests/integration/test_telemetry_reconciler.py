"""The proxy configuration reconciler against a real API server.

It renders from the Lumigo informer, writes a Secret (never a ConfigMap) and rolls the proxy
Deployment through a pod-template annotation, only when the rendered content changes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

from controller.lumigo.resources import LUMIGOES
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.telemetry.config import Origin, ProxySettings
from controller.telemetry.proxy_reconciler import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_KEY,
    ProxyTarget,
    TelemetryProxyReconciler,
    config_hash,
)
from controller.telemetry.restart import OLM_MANAGED_LABEL
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import CONFIGMAPS, DEPLOYMENTS, NAMESPACES, PODS, SECRETS
from kube.rest import ApiError
from tests.support.lumigo import create_lumigo, create_token_secret, random_token, set_active
from tests.support.workloads import one_container_deployment

PROXY = "lumigo-telemetry-proxy"
PROXY_SECRET = "lumigo-telemetry-proxy-config"
JSON = dict[str, Any]


@pytest.fixture
def monitored(cluster: LocalCluster, crd: object) -> Iterator[str]:
    """The namespace with the Lumigo (the `namespace` fixture plays the operator's)."""
    name = f"t-monitored-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def informer(kube: KubeClient, monitored: str) -> Iterator[Informer]:
    """Lumigoes of the monitored namespace only, so other tests' objects cannot interfere."""
    lumigoes = Informer(kube, Selection(LUMIGOES, namespace=monitored))
    lumigoes.start()
    try:
        assert lumigoes.wait_for_sync(30)
        yield lumigoes
    finally:
        lumigoes.stop()


def proxy_deployment(kube: KubeClient, namespace: str) -> None:
    body = one_container_deployment(PROXY, "otelcol:test", container="otelcol")
    kube.create(DEPLOYMENTS, body, namespace)


def stored_config(kube: KubeClient, namespace: str) -> tuple[str, str]:
    """(config text, Secret resourceVersion)."""
    secret = kube.get(SECRETS, PROXY_SECRET, namespace)
    text = base64.b64decode(secret["data"][CONFIG_KEY]).decode()
    return text, secret["metadata"]["resourceVersion"]


def rollout_hash(kube: KubeClient, namespace: str) -> str | None:
    deployment = kube.get(DEPLOYMENTS, PROXY, namespace)
    annotations = deployment["spec"]["template"]["metadata"].get("annotations") or {}
    return annotations.get(CONFIG_HASH_ANNOTATION)


def receivers(text: str) -> set[str]:
    return set(yaml.safe_load(text)["receivers"])


def make(kube: KubeClient, informer: Informer, namespace: str) -> TelemetryProxyReconciler:
    return TelemetryProxyReconciler(
        kube,
        informer,
        ProxyTarget(namespace, PROXY_SECRET, PROXY),
        ProxySettings(origin=Origin(cluster_name="it")),
        resync_period=1.0,
    )


def _cached(informer: Informer, namespace: str, uid: str) -> bool:
    """The Lumigo with this UID is cached, with a status."""
    obj = informer.get(namespace, "lumigo") or {}
    return obj.get("metadata", {}).get("uid") == uid and bool(obj.get("status"))


def wait_in_cache(informer: Informer, namespace: str, check: object) -> None:
    def seen() -> bool:
        obj = informer.get(namespace, "lumigo")
        return bool(obj is not None and callable(check) and check(obj))

    wait_until(seen, 30, "the informer to see the Lumigo change")


def test_config_lives_in_a_secret_and_rolls_the_proxy_only_on_change(
    kube: KubeClient,
    informer: Informer,
    namespace: str,
    monitored: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    token = random_token()
    proxy_deployment(kube, namespace)
    create_token_secret(kube, monitored, token)
    create_lumigo(kube, monitored)
    set_active(kube, monitored)
    wait_in_cache(informer, monitored, lambda o: bool(o.get("status")))
    reconciler = make(kube, informer, namespace)

    assert reconciler.sync() is True
    text, version = stored_config(kube, namespace)
    assert f"k8s_objects/{monitored}" in receivers(text)
    assert f"LumigoToken {token}" in text
    first_hash = rollout_hash(kube, namespace)
    assert first_hash == config_hash(text)
    owner = kube.get(SECRETS, PROXY_SECRET, namespace)["metadata"]["ownerReferences"][0]
    assert owner["uid"] == kube.get(DEPLOYMENTS, PROXY, namespace)["metadata"]["uid"]
    generation = kube.get(DEPLOYMENTS, PROXY, namespace)["metadata"]["generation"]

    # The token is in no ConfigMap of the cluster and in no log line.
    configmaps, _ = kube.list(CONFIGMAPS)
    assert token not in json.dumps(configmaps)
    assert token not in caplog.text

    # Nothing changed: nothing written, nothing restarted.
    assert reconciler.sync() is False
    assert stored_config(kube, namespace)[1] == version
    assert kube.get(DEPLOYMENTS, PROXY, namespace)["metadata"]["generation"] == generation

    # A change the configuration does not depend on changes nothing either.
    kube.merge_patch(LUMIGOES, "lumigo", {"metadata": {"labels": {"team": "a"}}}, monitored)
    wait_in_cache(informer, monitored, lambda o: o["metadata"].get("labels", {}).get("team"))
    assert reconciler.sync() is False
    assert stored_config(kube, namespace)[1] == version

    # kubeEvents disabled: the namespace's events pipeline goes, the proxy rolls once; the
    # namespace stays a proxy tenant (its tracers' token is accepted, with its own exporter).
    patch = {"spec": {"infrastructure": {"kubeEvents": {"enabled": False}}}}
    kube.merge_patch(LUMIGOES, "lumigo", patch, monitored)
    wait_in_cache(
        informer,
        monitored,
        lambda o: o["spec"]["infrastructure"]["kubeEvents"]["enabled"] is False,
    )
    assert reconciler.sync() is True
    text, _ = stored_config(kube, namespace)
    assert f"k8s_objects/{monitored}" not in receivers(text)
    config = yaml.safe_load(text)
    assert f"otlp_http/ns-{monitored}" not in config["exporters"]
    assert config["extensions"]["bearertokenauth/tenants"]["tokens"] == [token]
    tenant = config["exporters"][f"otlp_http/tenant-{monitored}"]
    assert tenant["headers"] == {"Authorization": f"LumigoToken {token}"}
    assert rollout_hash(kube, namespace) == config_hash(text) != first_hash
    assert kube.get(DEPLOYMENTS, PROXY, namespace)["metadata"]["generation"] == generation + 1


def test_inactive_lumigo_and_unusable_token_are_left_out_until_fixed(
    kube: KubeClient, informer: Informer, namespace: str, monitored: str
) -> None:
    proxy_deployment(kube, namespace)
    create_lumigo(kube, monitored)
    wait_in_cache(informer, monitored, lambda o: True)
    reconciler = make(kube, informer, namespace)

    reconciler.sync()  # not active yet
    assert f"k8s_objects/{monitored}" not in receivers(stored_config(kube, namespace)[0])

    set_active(kube, monitored)  # active, but its Secret does not exist
    wait_in_cache(informer, monitored, lambda o: bool(o.get("status")))
    reconciler.sync()
    assert f"k8s_objects/{monitored}" not in receivers(stored_config(kube, namespace)[0])

    token = random_token()
    create_token_secret(kube, monitored, token + "\n")  # `echo` without -n: a trailing newline
    assert reconciler.sync() is True  # Secrets are not watched: the next (re)sync picks it up
    text = stored_config(kube, namespace)[0]
    assert f"k8s_objects/{monitored}" in receivers(text)
    exporter = yaml.safe_load(text)["exporters"][f"otlp_http/ns-{monitored}"]
    assert exporter["headers"]["Authorization"] == f"LumigoToken {token}"


def test_loop_follows_changes_and_stops_collection_on_deletion(
    kube: KubeClient, informer: Informer, namespace: str, monitored: str
) -> None:
    proxy_deployment(kube, namespace)
    create_token_secret(kube, monitored, random_token())
    create_lumigo(kube, monitored, finalizers=["tests.lumigo.io/hold"])
    controller = make(kube, informer, namespace).controller()
    controller.start()
    try:

        def collected() -> bool:
            try:
                text = stored_config(kube, namespace)[0]
            except Exception:
                return False
            return f"k8s_objects/{monitored}" in receivers(text)

        set_active(kube, monitored)
        wait_until(collected, 30, "the namespace to be collected")
        assert rollout_hash(kube, namespace) == config_hash(stored_config(kube, namespace)[0])

        # Deleting: the object still exists (finalizer) but collection stops at once.
        kube.delete(LUMIGOES, "lumigo", monitored)
        wait_until(lambda: not collected(), 30, "collection to stop on deletion")
        wait_until(
            lambda: rollout_hash(kube, namespace) == config_hash(stored_config(kube, namespace)[0]),
            30,
            "the proxy to roll to the new configuration",
        )
        # An ordinary runtime controller: its passes show in the reconcile metrics.
        labels = {"controller": "telemetry-proxy", "result": "requeue_after"}
        assert (REGISTRY.get_sample_value("controller_runtime_reconcile_total", labels) or 0) > 0
    finally:
        controller.stop()
        with contextlib.suppress(ApiError):
            kube.merge_patch(LUMIGOES, "lumigo", {"metadata": {"finalizers": None}}, monitored)


def test_missing_proxy_deployment_is_not_an_error(
    kube: KubeClient, informer: Informer, namespace: str, monitored: str
) -> None:
    reconciler = make(kube, informer, namespace)
    assert reconciler.sync() is True  # the Secret is written; there is nothing to roll
    text, _ = stored_config(kube, namespace)
    assert "otlp" in yaml.safe_load(text)["receivers"]
    assert reconciler.sync() is False
    # Once the Deployment exists, the next pass rolls it to the stored configuration.
    proxy_deployment(kube, namespace)
    assert reconciler.sync() is True
    assert rollout_hash(kube, namespace) == config_hash(text)


def test_once_the_proxy_is_deleted_its_configuration_is_never_written_again(
    kube: KubeClient, informer: Informer, namespace: str, monitored: str
) -> None:
    """An uninstall deletes the proxy Deployment, the garbage collector the Secret it owns; a
    pass in between (the operator still has its RBAC for a moment) must not create the Secret
    again, with no owner: the tenants' tokens would outlive the proxy. Seen in CI."""
    proxy_deployment(kube, namespace)
    reconciler = make(kube, informer, namespace)
    assert reconciler.sync() is True
    kube.delete(DEPLOYMENTS, PROXY, namespace)
    kube.delete(SECRETS, PROXY_SECRET, namespace)  # what the garbage collector does
    assert reconciler.sync() is False
    assert kube.get_or_none(SECRETS, PROXY_SECRET, namespace) is None
    # A proxy installed again gets its configuration, owned by it.
    proxy_deployment(kube, namespace)
    assert reconciler.sync() is True
    (owner,) = kube.get(SECRETS, PROXY_SECRET, namespace)["metadata"]["ownerReferences"]
    assert owner["uid"] == kube.get(DEPLOYMENTS, PROXY, namespace)["metadata"]["uid"]


def test_a_namespace_created_again_is_collected_under_its_new_uid(
    full_cluster: LocalCluster, kube: KubeClient, informer: Informer, namespace: str, monitored: str
) -> None:
    """Issue 15, defect 8: namespace UIDs were cached forever by name, so a namespace deleted
    and created again kept being reported under the UID of the one that is gone."""

    def activate() -> str:
        create_token_secret(kube, monitored, random_token())
        uid = create_lumigo(kube, monitored)["metadata"]["uid"]
        set_active(kube, monitored)
        wait_until(
            lambda: _cached(informer, monitored, uid),
            30,
            "the active Lumigo cached",
        )
        return str(kube.get(NAMESPACES, monitored)["metadata"]["uid"])

    reconciler = make(kube, informer, namespace)
    first_uid = activate()
    reconciler.sync()
    assert first_uid in stored_config(kube, namespace)[0]

    full_cluster.kubectl("delete", "namespace", monitored, "--timeout=120s")
    wait_until(lambda: kube.get_or_none(NAMESPACES, monitored) is None, 120, "namespace gone")
    full_cluster.kubectl("create", "namespace", monitored)
    second_uid = activate()
    assert second_uid != first_uid

    reconciler.sync()
    text = stored_config(kube, namespace)[0]
    assert second_uid in text
    assert first_uid not in text


def proxy_pods(kube: KubeClient, namespace: str) -> list[JSON]:
    pods, _ = kube.list(PODS, namespace, label_selector=f"app={PROXY}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def ready_pod_uids(kube: KubeClient, namespace: str) -> set[str]:
    return {
        p["metadata"]["uid"]
        for p in proxy_pods(kube, namespace)
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    }


def test_under_olm_the_proxy_pods_are_restarted_and_its_template_is_left_alone(
    full_cluster: LocalCluster, kube: KubeClient, informer: Informer, namespace: str, monitored: str
) -> None:
    """OLM undoes pod-template changes to the Deployments it installed (and with them a config
    rollout, half-way); under OLM the operator deletes the outdated pods one by one instead."""
    body = one_container_deployment(PROXY, "otelcol:test", container="otelcol")
    body["metadata"]["labels"] = {OLM_MANAGED_LABEL: "true"}
    body["spec"]["replicas"] = 2
    kube.create(DEPLOYMENTS, body, namespace)
    wait_until(lambda: len(ready_pod_uids(kube, namespace)) == 2, 60, "2 ready proxy pods")
    before = ready_pod_uids(kube, namespace)
    template = kube.get(DEPLOYMENTS, PROXY, namespace)["spec"]["template"]

    create_token_secret(kube, monitored, random_token())
    create_lumigo(kube, monitored)
    set_active(kube, monitored)
    wait_in_cache(informer, monitored, lambda o: bool(o.get("status")))
    controller = make(kube, informer, namespace).controller()
    controller.start()
    try:
        # Every pod that existed when the configuration was written is replaced ...
        wait_until(
            lambda: (
                len(ready_pod_uids(kube, namespace)) == 2
                and not ready_pod_uids(kube, namespace) & before
            ),
            90,
            "both proxy pods replaced",
        )
        assert f"k8s_objects/{monitored}" in receivers(stored_config(kube, namespace)[0])
        # ... by deleting them, never by changing the pod template (OLM would undo it).
        deployment = kube.get(DEPLOYMENTS, PROXY, namespace)
        assert deployment["spec"]["template"] == template
        assert deployment["metadata"]["generation"] == 1
        # An unchanged configuration restarts nothing more.
        settled = ready_pod_uids(kube, namespace)
        version = stored_config(kube, namespace)[1]
        time.sleep(5)  # several passes of the 1 s resync
        assert ready_pod_uids(kube, namespace) == settled
        assert stored_config(kube, namespace)[1] == version
    finally:
        controller.stop()


def test_workloads_opted_in_by_label_without_a_lumigo_are_tenants_with_their_token(
    kube: KubeClient, informer: Informer, namespace: str, monitored: str
) -> None:
    """The proxy accepts only the tokens it knows: a workload labelled lumigo.auto-trace=true in
    a namespace without a Lumigo sends with the token its labels name, so that token is one."""
    token, other = random_token(), random_token()
    create_token_secret(kube, monitored, token)
    create_token_secret(kube, monitored, other, name="team-token")
    deployments = Informer(kube, Selection(DEPLOYMENTS, namespace=monitored))
    deployments.start()
    try:
        assert deployments.wait_for_sync(30)
        reconciler = TelemetryProxyReconciler(
            kube,
            informer,
            ProxyTarget(namespace, PROXY_SECRET, PROXY),
            ProxySettings(origin=Origin(cluster_name="it")),
            workloads={"Deployment": deployments},
        )
        reconciler.sync()
        assert token not in stored_config(kube, namespace)[0]

        for name, labels in (
            ("opted-in", {"lumigo.auto-trace": "true"}),
            ("team", {"lumigo.auto-trace": "true", "lumigo.token-secret": "team-token"}),
            ("opted-out", {"lumigo.auto-trace": "false", "lumigo.token-secret": "nope"}),
        ):
            body = one_container_deployment(name, "python:3.12")
            body["metadata"]["labels"] = labels
            kube.create(DEPLOYMENTS, body, monitored)
        wait_until(lambda: len(deployments.store.list()) == 3, 30, "the Deployments cached")
        assert reconciler.sync() is True
        config = yaml.safe_load(stored_config(kube, namespace)[0])
        assert sorted(config["extensions"]["bearertokenauth/tenants"]["tokens"]) == sorted(
            [token, other]
        )
        assert f"logs/ns-{monitored}" not in config["service"]["pipelines"]  # no events

        # Once the namespace has its own Lumigo (lumigo-credentials), its token decides.
        create_lumigo(kube, monitored)
        set_active(kube, monitored)
        wait_in_cache(informer, monitored, lambda o: bool(o.get("status")))
        assert reconciler.sync() is True
        config = yaml.safe_load(stored_config(kube, namespace)[0])
        assert config["extensions"]["bearertokenauth/tenants"]["tokens"] == [token]
    finally:
        deployments.stop()
