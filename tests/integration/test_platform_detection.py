"""OpenShift is recognised by the API server's serving `security.openshift.io` (issue 34, item 3),
on a real API server: without the group, `auto` keeps the reference's init container user; once a
CustomResourceDefinition of that group (OpenShift's SecurityContextConstraints, as its API server
serves them) is established, `auto` means no user of ours."""

from __future__ import annotations

import json

from api import constants
from controller.lumigo import platform
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.process import wait_until

SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
SCC_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "securitycontextconstraints.security.openshift.io"},
    "spec": {
        "group": "security.openshift.io",
        "scope": "Cluster",
        "names": {
            "plural": "securitycontextconstraints",
            "singular": "securitycontextconstraint",
            "kind": "SecurityContextConstraints",
            "listKind": "SecurityContextConstraintsList",
        },
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": SCHEMA}],
    },
}


def test_auto_picks_the_reference_user_on_kubernetes_and_none_on_openshift(
    cluster: LocalCluster, kube: KubeClient
) -> None:
    assert not platform.is_openshift(kube)
    assert platform.init_container_user(kube, "auto") == constants.INIT_USER_FSGROUP
    assert platform.init_container_user(kube, "unset") == constants.INIT_USER_UNSET
    cluster.kubectl("apply", "-f", "-", input=json.dumps(SCC_CRD))
    try:
        wait_until(lambda: platform.is_openshift(kube), 60, "security.openshift.io served")
        assert platform.init_container_user(kube, "auto") == constants.INIT_USER_UNSET
        # A forced choice is kept.
        assert platform.init_container_user(kube, "fsgroup") == constants.INIT_USER_FSGROUP
    finally:
        cluster.kubectl("delete", "crd", SCC_CRD["metadata"]["name"], "--wait=true")
        wait_until(lambda: not platform.is_openshift(kube), 60, "security.openshift.io gone")
