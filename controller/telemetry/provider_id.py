"""Copies each Node's cloud provider ID into an annotation that the collectors can read.

Traces, logs and metrics carry `k8s.provider.id`, the `spec.providerID` of the Node their pod
runs on (e.g. `aws:///eu-west-1a/i-0abc…`), as the reference's do. The upstream `k8s_attributes`
processor reads a Node's labels and annotations but not its spec, and a label cannot hold such a
value (`:` and `/`), so the operator keeps it in the annotation
`operator.lumigo.io/provider-id`, which the proxy and the agent extract. One small metadata patch
per Node over its life (a provider ID, once set, never changes); Nodes without one (bare metal,
kind) are left alone. `lumigo-operator uninstall` removes the annotations.

A controller keyed by Node name over an informer of projections (name, annotations, provider
ID), so a large cluster's Nodes cost a few hundred bytes each; leader only. A failed patch
raises and is retried with backoff; a Node deleted meanwhile is done.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from api.constants import ANNOTATION_PROVIDER_ID
from controller.lumigo.nodes import annotated, node_informer, provider_id, view
from controller.runtime.informer import Informer
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Controller, Manager, Result
from controller.runtime.store import ObjectKey
from kube.kinds import NODES
from kube.objects import JSON
from kube.rest import ApiError

log = logging.getLogger("lumigo.telemetry")


@dataclass(eq=False)
class NodeProviderIds:
    """Keeps `operator.lumigo.io/provider-id` equal to each Node's `spec.providerID`."""

    client: KubeClient
    nodes: Informer

    def reconcile(self, key: ObjectKey) -> Result:
        node = view(self.nodes.get("", key.name))
        if node is None:
            return Result()
        want, have = provider_id(node), annotated(node)
        if want == have or want is None:
            # A Node that lost its provider ID keeps the old annotation: spec.providerID is
            # immutable once set, so that only happens to a Node re-registered under the same
            # name, and its next provider ID will replace it.
            return Result()
        try:
            self.client.merge_patch(
                NODES, key.name, {"metadata": {"annotations": {ANNOTATION_PROVIDER_ID: want}}}
            )
        except ApiError as err:
            if err.not_found:
                return Result()
            raise
        log.info("node provider ID annotated", extra={"node": key.name, "provider_id": want})
        return Result()


def _changed(old: JSON | None, new: JSON) -> bool:
    before, after = view(old), view(new)
    return old is None or (provider_id(before), annotated(before)) != (
        provider_id(after),
        annotated(after),
    )


def add_node_provider_ids(manager: Manager, client: KubeClient) -> None:
    """Wire the informer and the controller into the manager."""
    nodes = node_informer(manager)
    controller = Controller("node-provider-ids", NodeProviderIds(client, nodes).reconcile)
    controller.for_(nodes, predicate=_changed)
    manager.add_controller(controller)


def remove_annotations(client: KubeClient) -> int:
    """Uninstall: drop the annotation from every Node that has it; the number changed."""
    changed = 0
    for node in client.list(NODES)[0]:
        if annotated(node) is None:
            continue
        try:
            client.merge_patch(
                NODES,
                node["metadata"]["name"],
                {"metadata": {"annotations": {ANNOTATION_PROVIDER_ID: None}}},
            )
        except ApiError as err:
            if err.not_found:
                continue
            raise
        changed += 1
    return changed
