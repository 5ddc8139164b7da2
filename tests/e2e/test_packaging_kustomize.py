"""`kubectl apply -k config/default` on the full local cluster.

The test that then applies the seed README's Lumigo (which needs the running operator behind the
defaulter webhook, failurePolicy Fail) belongs with the manager CLI: use the `kustomize_install`
fixture below, which removes everything it installed (the CRD aside) whatever happens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import LocalCluster, wait_until
from tests.e2e.packaging_support import (
    CRD_NAME,
    ROOT,
    deployment_available,
    exists,
    get_json,
    load_docs,
    namespace_gone,
)

NAMESPACE = "lumigo-system"
DEPLOYMENT = "lumigo-lumigo-operator-controller-manager"


def kustomize_build(cluster: LocalCluster) -> list[dict[str, Any]]:
    return load_docs(cluster.kubectl("kustomize", str(ROOT / "config" / "default")))


@pytest.fixture
def kustomize_install(full_cluster: LocalCluster) -> Iterator[list[dict[str, Any]]]:
    """config/default applied; afterwards every object but the (shared) CRD is deleted, and the
    namespace is waited for, so that the next install can use it again."""
    docs = kustomize_build(full_cluster)
    try:
        yield docs
    finally:
        rest = [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Namespace")]
        full_cluster.kubectl(
            "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            input="\n---\n".join(json.dumps(d) for d in rest), check=False,
        )  # fmt: skip
        namespace_gone(full_cluster, NAMESPACE)


def test_kubectl_apply_k_config_default(
    full_cluster: LocalCluster, kustomize_install: list[dict[str, Any]]
) -> None:
    cluster = full_cluster
    out = cluster.kubectl("apply", "-k", str(ROOT / "config" / "default"))
    for doc in kustomize_install:
        kind, name = doc["kind"], doc["metadata"]["name"]
        namespace = doc["metadata"].get("namespace")
        where = ["-n", namespace] if namespace else []
        assert exists(cluster, kind.lower(), name, *where), f"{kind} {name} was not created"
        assert f"/{name} " in out, f"kubectl did not report {kind} {name}"

    # The namespace enforces the restricted Pod Security Standard and the pod is admitted.
    namespace = get_json(cluster, "namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    wait_until(
        lambda: deployment_available(cluster, NAMESPACE, DEPLOYMENT), 120, "the manager Available"
    )
    crd = get_json(cluster, "crd", CRD_NAME)
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"

    # No key material anywhere: the operator (--cert-mode=self) creates and injects it.
    assert get_json(cluster, "secrets", "-n", NAMESPACE)["items"] == []
    for name in ("injector", "defaulter"):
        config = get_json(
            cluster,
            "mutatingwebhookconfiguration",
            f"lumigo-lumigo-operator-{name}-webhook-configuration",
        )
        assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])

    # A second apply is a no-op: nothing drifts (e.g. a defaulted field kubectl keeps re-setting).
    again = cluster.kubectl("apply", "-k", str(ROOT / "config" / "default"))
    changed = [line for line in again.splitlines() if not line.endswith(" unchanged")]
    assert changed == [], changed
