"""Nodes' provider IDs copied into the annotation the collectors read (k8s.provider.id), against
a real API server: the operator's controller (controller.telemetry.provider_id) in a manager, and
the uninstall step that removes the annotations."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api.constants import ANNOTATION_PROVIDER_ID
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Manager, ManagerOptions
from controller.telemetry.provider_id import add_node_provider_ids, remove_annotations
from envtest.process import wait_until
from kube.kinds import NODES
from tests.support.workloads import node_without_kubelet

JSON = dict[str, Any]


def annotation(kube: KubeClient, name: str) -> str | None:
    node = kube.get_or_none(NODES, name) or {}
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PROVIDER_ID)
    return str(value) if value is not None else None


@pytest.fixture
def nodes(kube: KubeClient) -> Iterator[list[str]]:
    created: list[str] = []
    yield created
    for name in created:
        kube.delete(NODES, name)


def test_provider_ids_become_annotations_kept_level_and_removed_on_uninstall(
    kube: KubeClient, namespace: str, nodes: list[str]
) -> None:
    prefix = f"t-node-{uuid.uuid4().hex[:6]}"
    ids = {f"{prefix}-a": "aws:///eu-west-1a/i-0abc", f"{prefix}-b": "gce://p/europe-west1-b/vm-1",
           f"{prefix}-bare": None}  # fmt: skip
    for name, provider_id in ids.items():
        kube.create(NODES, node_without_kubelet(name, provider_id))
        nodes.append(name)
    manager = Manager(kube, ManagerOptions(
        namespace=namespace, leader_election=False, health_probe_bind_address="127.0.0.1:0",
        metrics_bind_address="localhost:0", graceful_shutdown_timeout=5,
    ))  # fmt: skip
    add_node_provider_ids(manager, kube)
    manager.start()
    try:
        for name in (f"{prefix}-a", f"{prefix}-b"):
            wait_until(lambda n=name: annotation(kube, n) == ids[n], 30, f"{name} annotated")
        assert annotation(kube, f"{prefix}-bare") is None, "a Node without a provider ID"

        # A Node that joins later; an annotation someone removed comes back.
        late = f"{prefix}-late"
        kube.create(NODES, node_without_kubelet(late, "azure:///subscriptions/s/vm-2"))
        nodes.append(late)
        wait_until(lambda: annotation(kube, late) == "azure:///subscriptions/s/vm-2", 30,
                   "the late Node annotated")  # fmt: skip
        kube.merge_patch(
            NODES, f"{prefix}-a", {"metadata": {"annotations": {ANNOTATION_PROVIDER_ID: None}}}
        )
        wait_until(lambda: annotation(kube, f"{prefix}-a") == ids[f"{prefix}-a"], 30,
                   "the removed annotation restored")  # fmt: skip
    finally:
        manager.stop()

    # `lumigo-operator uninstall`'s step: no annotation left, other metadata untouched.
    assert remove_annotations(kube) >= 3
    for name in nodes:
        assert annotation(kube, name) is None, name
        assert (kube.get_or_none(NODES, name) or {})["spec"].get("unschedulable") is True
