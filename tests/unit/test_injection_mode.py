"""--injection-mode=auto: which Nodes can mount the autotrace image as an `image` volume."""

from __future__ import annotations

from typing import Any

import pytest

from controller.lumigo.injection_mode import node_problem, nodes_problem, probe_pod


def node(name: str, kubelet: str, runtime: str) -> dict[str, Any]:
    info = {"kubeletVersion": kubelet, "containerRuntimeVersion": runtime}
    return {"metadata": {"name": name}, "status": {"nodeInfo": info}}


@pytest.mark.parametrize(
    ("kubelet", "runtime"),
    [
        ("v1.35.0", "containerd://2.2.0"),
        ("v1.36.5", "containerd://2.2.9"),
        ("v1.36.5", "containerd://v2.3.1"),
        ("v1.35.2-eks-abc", "cri-o://1.33.4"),
        ("v1.37.0", "cri-o://1.35.0"),
    ],
)
def test_nodes_that_mount_image_volumes_with_a_subpath(kubelet: str, runtime: str) -> None:
    assert node_problem(node("n", kubelet, runtime)) is None


@pytest.mark.parametrize(
    ("kubelet", "runtime", "says"),
    [
        ("v1.34.3", "containerd://2.2.0", "kubelet v1.34.3 (image volumes need >= 1.35)"),
        ("v1.36.5", "containerd://1.7.28", "runtime containerd 1.7.28"),
        ("v1.36.5", "containerd://2.1.4", "runtime containerd 2.1.4"),
        ("v1.36.5", "cri-o://1.32.0", "runtime cri-o 1.32.0"),
        ("v1.36.5", "docker://28.1.0", "runtime docker 28.1.0"),
        ("fake", "kwok-v0.8.0", "kubelet fake"),
        ("", "", "kubelet unknown"),
    ],
)
def test_nodes_that_cannot_are_named_with_the_reason(kubelet: str, runtime: str, says: str) -> None:
    problem = node_problem(node("old-1", kubelet, runtime))
    assert problem is not None
    assert problem.startswith("node old-1: ")
    assert says in problem


def test_one_old_node_or_no_node_at_all_means_the_init_container() -> None:
    good = node("new", "v1.36.5", "containerd://2.2.9")
    old = node("old", "v1.36.5", "containerd://1.7.28")
    assert nodes_problem([good, good]) is None
    assert nodes_problem([good, old, good]) == node_problem(old)
    assert nodes_problem([]) == "no nodes"


def test_the_probe_pod_is_restricted_and_mounts_the_payload_with_a_subpath() -> None:
    pod = probe_pod("registry.example.com/lumigo-autotrace:v1", "IfNotPresent")
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["volumeMounts"][0]["subPath"] == "payload"
    assert spec["volumes"] == [
        {
            "name": "payload",
            "image": {
                "reference": "registry.example.com/lumigo-autotrace:v1",
                "pullPolicy": "IfNotPresent",
            },
        }
    ]
