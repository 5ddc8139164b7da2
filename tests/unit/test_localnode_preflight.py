"""The real node fails clearly: every missing component is named with the command that
installs it, and turning the node tier off is said in the test summary, never silent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envtest.node import components as node_components

ROOT = Path(__file__).resolve().parents[2]


def test_every_missing_node_component_is_named_with_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(node_components, "BIN", tmp_path)
    monkeypatch.setattr(node_components, "SYSTEM_BIN_DIRS", ())
    monkeypatch.setattr(node_components, "CNI_DIRS", (tmp_path / "cni",))
    monkeypatch.setenv("PATH", str(tmp_path))

    components, missing = node_components.find_components()

    assert components is None
    text = "\n".join(missing)
    for built in (
        "kubelet",
        "kube-proxy",
        "coredns",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
    ):
        assert f"{built} (run `hack/install-tools node`)" in text
    for tool, package in (("runc", "runc"), ("nft", "nftables")):
        assert f"{tool} (Debian package {package}: run `hack/install-system-deps`)" in text
    assert "CNI plugins bridge, host-local, loopback, portmap" in text
    with pytest.raises(node_components.NodeError) as err:
        node_components.require(components, missing)
    assert "the real node cannot run on this machine" in str(err.value)
    assert "LUMIGO_NODE=off" in str(err.value)


def test_turning_the_node_tier_off_is_said_in_the_summary() -> None:
    env = dict(os.environ, LUMIGO_NODE="off")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/node",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 5, proc.stdout + proc.stderr  # nothing run: all deselected
    assert "node tier: off (LUMIGO_NODE=off):" in proc.stdout
    assert "node tests not run; LUMIGO_NODE=on runs them" in proc.stdout
