"""Small helpers for node-tier tests: create pods from dicts, wait for them, read their logs."""

from __future__ import annotations

import json
import time
from typing import Any

from envtest.cluster import LocalCluster
from envtest.ociimage import BUSYBOX_IMAGE

__all__ = ["BUSYBOX_IMAGE", "apply", "container", "get", "logs", "pod", "wait_pod"]

# Pods that need nothing but a shell: the static busybox image imported into the node.
RESTRICTED_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 1500,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    """A busybox container running `script` with sh."""
    return {
        "name": name,
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",  # imported, never pulled
        "command": ["sh", "-c", script],
        **extra,
    }


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": containers, "terminationGracePeriodSeconds": 0, **spec},
    }


def apply(cluster: LocalCluster, namespace: str, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))


def get(cluster: LocalCluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "-n", namespace, kind, name, "-o", "json")))


def wait_pod(
    cluster: LocalCluster,
    namespace: str,
    name: str,
    *,
    phases: tuple[str, ...] = ("Running",),
    timeout: float = 90,
    ready: bool = False,
) -> dict[str, Any]:
    """Poll until the pod is in one of `phases` (and Ready, if asked); on timeout, fail with the
    pod's status and events, which say why (an image, a mount, a security context...)."""
    deadline = time.monotonic() + timeout
    obj: dict[str, Any] = {}
    while time.monotonic() < deadline:
        obj = get(cluster, namespace, "pod", name)
        status = obj.get("status", {})
        is_ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions", [])
        )
        if status.get("phase") in phases and (is_ready or not ready):
            return obj
        time.sleep(0.2)
    events = cluster.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name}",
        check=False,
    )
    raise AssertionError(
        f"pod {namespace}/{name} not {'/'.join(phases)} after {timeout:.0f}s:\n"
        f"{json.dumps(obj.get('status', {}), indent=1)}\n{events}"
    )


def logs(cluster: LocalCluster, namespace: str, name: str, container: str | None = None) -> str:
    args = ["logs", "-n", namespace, name] + (["-c", container] if container else [])
    return cluster.kubectl(*args)
