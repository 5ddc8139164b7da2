"""The kube client against a real API server: verbs, pagination, errors, conflicts, retries."""

from __future__ import annotations

import threading
from typing import Any

import pykube
import pytest

from controller.runtime.kube import REST_REQUESTS, KubeClient
from envtest.cluster import LocalCluster
from kube.kinds import CONFIGMAPS, LEASES
from kube.rest import ApiError


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_crud_and_patch_verbs(kube: KubeClient, namespace: str) -> None:
    created = kube.create(CONFIGMAPS, configmap("a", x="1"), namespace)
    assert created["metadata"]["resourceVersion"]
    got = kube.get(CONFIGMAPS, "a", namespace)
    assert got["data"] == {"x": "1"}
    merged = kube.merge_patch(CONFIGMAPS, "a", {"data": {"y": "2", "x": None}}, namespace)
    assert merged["data"] == {"y": "2"}
    patched = kube.json_patch(
        CONFIGMAPS,
        "a",
        [{"op": "add", "path": "/metadata/labels", "value": {"k/v": "1"}}],
        namespace,
    )
    assert patched["metadata"]["labels"] == {"k/v": "1"}
    applied = kube.apply(
        CONFIGMAPS,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"z": "3"}},
        "test-manager",
        namespace,
    )
    assert applied["data"]["z"] == "3"
    got["data"] = {"only": "this"}
    with pytest.raises(ApiError) as stale:
        kube.replace(CONFIGMAPS, got, namespace)  # resourceVersion is stale by now
    assert stale.value.conflict
    assert kube.delete(CONFIGMAPS, "a", namespace) is not None
    assert kube.delete(CONFIGMAPS, "a", namespace) is None  # already gone is fine
    with pytest.raises(ApiError) as missing:
        kube.get(CONFIGMAPS, "a", namespace)
    assert missing.value.not_found
    assert kube.get_or_none(CONFIGMAPS, "a", namespace) is None


def test_list_paginates_and_returns_resource_version(kube: KubeClient, namespace: str) -> None:
    for i in range(23):
        kube.create(CONFIGMAPS, configmap(f"cm-{i:02d}"), namespace)
    items, rv = kube.list(CONFIGMAPS, namespace, limit=5)
    names = sorted(i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith("cm-"))
    assert names == [f"cm-{i:02d}" for i in range(23)]
    assert rv
    assert all(i["kind"] == "ConfigMap" for i in items)


def test_update_with_retry_reapplies_on_conflict(kube: KubeClient, namespace: str) -> None:
    kube.create(CONFIGMAPS, configmap("counter", n="0"), namespace)
    interfered = threading.Event()

    def bump(obj: dict[str, Any]) -> dict[str, Any]:
        if not interfered.is_set():
            # Someone else writes between our GET and our PUT: the PUT gets 409.
            interfered.set()
            kube.merge_patch(CONFIGMAPS, "counter", {"data": {"other": "yes"}}, namespace)
        obj["data"]["n"] = str(int(obj["data"]["n"]) + 1)
        return obj

    result = kube.update_with_retry(CONFIGMAPS, "counter", namespace, bump)
    assert result is not None
    assert result["data"] == {"n": "1", "other": "yes"}  # nobody's change was lost
    assert kube.update_with_retry(CONFIGMAPS, "counter", namespace, lambda o: None) is None


def test_status_errors_carry_code_and_reason(kube: KubeClient, namespace: str) -> None:
    kube.create(CONFIGMAPS, configmap("dup"), namespace)
    with pytest.raises(ApiError) as err:
        kube.create(CONFIGMAPS, configmap("dup"), namespace)
    assert err.value.already_exists
    with pytest.raises(ApiError) as invalid:
        kube.create(CONFIGMAPS, configmap("Not_A_Valid_Name"), namespace)
    assert invalid.value.code == 422
    assert "Not_A_Valid_Name" in invalid.value.message


def test_connection_errors_are_retried_then_raised(cluster: LocalCluster) -> None:
    config = pykube.KubeConfig.from_file(str(cluster.kubeconfig))
    config.cluster["server"] = "https://127.0.0.1:9"  # nothing listens on the discard port
    client = KubeClient(config, timeout=2, retry_attempts=3)
    failures = REST_REQUESTS.labels("<error>", "GET", client.host)
    before = failures._value.get()
    with pytest.raises(ApiError) as err:
        client.get(LEASES, "x", "default")
    assert err.value.code == 0
    assert err.value.retryable
    assert failures._value.get() - before == 3  # the first attempt and two retries


def test_a_client_per_thread(kube: KubeClient, namespace: str) -> None:
    sessions: set[int] = set()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            kube.create(CONFIGMAPS, configmap(f"t-{i}"), namespace)
            sessions.add(id(kube._http().session))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(sessions) == 8
    items, _ = kube.list(CONFIGMAPS, namespace)
    assert len([i for i in items if i["metadata"]["name"].startswith("t-")]) == 8
