"""In the init-container mode a pod whose ephemeral-storage limit cannot hold the payload copy is
never instrumented: the kubelet would evict it (issue 28, item 9). Through the real API server,
the real operator process and its webhook: existing workloads (the controller), new ones and a
lowered limit (the webhook); each says why with a Warning event, and the Lumigo's status lists
them in `skippedResources`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS
from tests.support.checks import TOKEN, clean, has_event, instrumented, is_active, lumigo_yaml
from tests.support.checks import status as lumigo_status
from tests.support.lumigo import create_token_secret
from tests.support.workloads import workload

JSON = dict[str, Any]
CANNOT_ADD = "LumigoCannotAddInstrumentation"
WHY = "ephemeral-storage limit (100Mi) cannot hold the tracer payload"


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: KubeClient, crd: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, kube).setup()
    op.start().wait_ready()
    yield op
    op.teardown()


def deployment(name: str, limit: str) -> JSON:
    obj = workload(DEPLOYMENTS, name)
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"ephemeral-storage": limit}}
    return obj


def skipped(kube: KubeClient, ns: str) -> dict[str, str]:
    return {r["name"]: r["reason"] for r in lumigo_status(kube, ns).get("skippedResources", [])}


def test_a_pod_the_copy_would_get_evicted_is_never_instrumented(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    kube.create(DEPLOYMENTS, deployment("small", "100Mi"), ns)
    kube.create(DEPLOYMENTS, deployment("big", "1Gi"), ns)
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")

    # Existing workloads, by the controller.
    wait_until(lambda: instrumented(kube.get(DEPLOYMENTS, "big", ns)), 60, "big instrumented")
    wait_until(lambda: "small" in skipped(kube, ns), 60, "small listed as skipped")
    assert WHY in skipped(kube, ns)["small"]
    assert clean(kube.get(DEPLOYMENTS, "small", ns))
    wait_until(lambda: has_event(kube, ns, "small", CANNOT_ADD, WHY), 30, "the controller's event")
    assert has_event(kube, ns, "small", CANNOT_ADD, "controller, acting on behalf of")

    # A new one, by the webhook: created without anything of ours.
    created = kube.create(DEPLOYMENTS, deployment("new", "100Mi"), ns)
    assert clean(created)
    wait_until(lambda: has_event(kube, ns, "new", CANNOT_ADD, "injector webhook"), 30,
               "the webhook's event")  # fmt: skip
    wait_until(lambda: "new" in skipped(kube, ns), 60, "new listed as skipped")

    # An instrumented one whose limit is lowered: the webhook removes the instrumentation.
    def lower(obj: JSON) -> JSON:
        template = obj["spec"]["template"]["spec"]
        template["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "100Mi"
        return obj

    lowered = kube.update_with_retry(DEPLOYMENTS, "big", ns, lower)
    assert lowered is not None
    assert clean(lowered)
    wait_until(lambda: "big" in skipped(kube, ns), 60, "big listed as skipped")
    assert has_event(kube, ns, "big", CANNOT_ADD, WHY)
    # Still nothing of ours after more reconciles (the controller does not put it back).
    assert clean(kube.get(DEPLOYMENTS, "small", ns))
    assert clean(kube.get(DEPLOYMENTS, "big", ns))
