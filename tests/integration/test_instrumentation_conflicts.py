"""Removing instrumentation while someone else writes the same workload, on a real API server.

Right after a removal changes a Deployment's pod template, the Deployment controller writes the
Deployment too (its revision annotation): the handshake label must still be dropped, or a later
Lumigo would skip that workload when instrumenting existing ones.
"""

from __future__ import annotations

from typing import Any

from api import constants
from controller.lumigo.instrumentation import Instrumenter, Target
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from kube.kinds import DEPLOYMENTS
from kube.rest import Resource
from tests.support.workloads import workload
from webhook import pod_injection

JSON = dict[str, Any]


class OtherWriter(KubeClient):
    """The real client; and right after it reads the workload while the handshake label is on
    it, another writer updates that workload (`bumps` times), so its next write conflicts."""

    bumps = 0

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> JSON:
        obj = super().get(resource, name, namespace)
        labels = obj["metadata"].get("labels") or {}
        skip = labels.get(constants.LABEL_AUTO_TRACE) == constants.AUTO_TRACE_SKIP_NEXT_INJECTOR
        if skip and self.bumps > 0:
            self.bumps -= 1
            # A value no other writer sets: with a controller-manager running, the Deployment
            # controller may already have written revision "2", and a no-op patch would not
            # change the resourceVersion (no conflict to meet).
            bump = {"metadata": {"annotations": {"test.lumigo.io/bump": str(self.bumps)}}}
            super().merge_patch(resource, name, bump, namespace)
        return obj


class Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        self.reasons.append(reason)


def test_handshake_label_is_dropped_despite_a_concurrent_writer(
    cluster: LocalCluster, namespace: str
) -> None:
    client = OtherWriter.from_kubeconfig(cluster.kubeconfig)
    settings = pod_injection.InjectionSettings(operator_version="0.1.0")
    client.create(
        DEPLOYMENTS, pod_injection.inject(workload(DEPLOYMENTS, "shop"), settings), namespace
    )
    client.bumps = 2
    recorder = Events()
    instrumenter = Instrumenter(client, recorder, component="test")

    outcome = instrumenter.uninstrument(Target(DEPLOYMENTS, namespace, "shop"), "test")

    assert (outcome.changed, outcome.error) == (True, None)
    assert client.bumps == 0, "the concurrent writes happened"
    stored = client.get(DEPLOYMENTS, "shop", namespace)
    assert constants.LABEL_AUTO_TRACE not in (stored["metadata"].get("labels") or {})
    assert pod_injection.auto_trace_label(stored) is None
    assert "lumigo-injector" not in str(stored["spec"])
    assert recorder.reasons == ["LumigoRemovedInstrumentation"]
