"""Fixtures shared by the integration tier's modules."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from envtest.cluster import LocalCluster

LEVELS = ("restricted", "baseline", "privileged")


@pytest.fixture(scope="module")
def pss_namespaces(cluster: LocalCluster) -> Iterator[dict[str, str]]:
    """One namespace per Pod Security level, each enforcing it (latest version)."""
    suffix = uuid.uuid4().hex[:6]
    names = {level: f"t-pss-{level}-{suffix}" for level in LEVELS}
    for level, name in names.items():
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl(
            "label",
            "namespace",
            name,
            f"pod-security.kubernetes.io/enforce={level}",
            "pod-security.kubernetes.io/enforce-version=latest",
        )
    try:
        yield names
    finally:
        for name in names.values():
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
