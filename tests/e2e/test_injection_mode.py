"""--injection-mode against the real API server: the forced image-volume mode mounts the
autotrace image, and `auto` asks the API server with a dry-run (kept, here: Kubernetes 1.36)
but stays with the init container while a Node cannot mount image volumes (the kwok node of
this cluster). Both with admission in worker processes, each deciding for itself. The real
node's `auto` (kubelet 1.36, containerd 2.2: the image volume) is in tests/node."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.jsonpatch import apply
from tests.e2e.test_admission_workers import admit, webhook_context
from tests.support import reviews
from tests.support.checks import TOKEN, is_active, lumigo_yaml
from tests.support.lumigo import create_token_secret


def injected_pod_spec(op: OperatorProcess, kube: KubeClient, cluster: LocalCluster) -> Any:
    """The pod spec of a Deployment admitted in a namespace with an active Lumigo, patched."""
    ns = op.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    context = webhook_context(kube, op)
    wait_until(lambda: bool(admit(op.webhook_port, context, ns, "probe").get("patch")), 30,
               "an injection")  # fmt: skip
    response = admit(op.webhook_port, context, ns, "real")
    patch = json.loads(base64.b64decode(str(response["patch"])))
    return apply(reviews.deployment("shop", ns), patch)["spec"]["template"]["spec"]


def operator_with(cluster: LocalCluster, kube: KubeClient, mode: str) -> OperatorProcess:
    flags = ("--webhook-workers=2", f"--injection-mode={mode}")
    op = OperatorProcess(cluster, kube, extra_args=flags).setup()
    op.start().wait_ready()
    return op


def test_the_forced_image_volume_mode_mounts_the_image_and_adds_no_init_container(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    op = operator_with(cluster, kube, "image-volume")
    try:
        spec = injected_pod_spec(op, kube, cluster)
        (volume,) = [v for v in spec["volumes"] if v["name"] == "lumigo-injector"]
        assert volume["image"]["pullPolicy"] == "IfNotPresent"
        assert not [c for c in spec.get("initContainers", []) if c["name"] == "lumigo-injector"]
        for container in spec["containers"]:
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == "lumigo-injector"]
            assert mount["subPath"] == "payload"
    finally:
        op.teardown()


@pytest.mark.usefixtures("crd")
def test_auto_asks_the_api_server_and_keeps_the_init_container_while_a_node_cannot(
    full_cluster: LocalCluster, kube: KubeClient
) -> None:
    op = operator_with(full_cluster, kube, "auto")
    try:
        spec = injected_pod_spec(op, kube, full_cluster)
        assert [c for c in spec["initContainers"] if c["name"] == "lumigo-injector"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "lumigo-injector"]
        assert "emptyDir" in volume
        log = op.log_tail(400)
        # The manager and both workers asked, and Kubernetes 1.36 keeps the field.
        assert log.count('"api_server_keeps_image_volumes": true') == 3, log
    finally:
        op.teardown()
