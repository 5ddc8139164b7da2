"""The chart's RBAC on the real API server: what the operator may and may not do.

The chart's rules are config/rbac's (test_packaging_helm checks they are equal), rendered here for
a release in the test's namespace; every check impersonates the ServiceAccount and asks the API
server itself, including the name-limited list/watch that the manager's certificate code and
leader election rely on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from envtest.cluster import LocalCluster
from tests.support.packaging import (
    OPERATOR_SA,
    denied,
    load_docs,
    render_chart,
    telemetry_proxy_requests,
    telemetry_reconciler_requests,
)

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@dataclass
class Rbac:
    cluster: LocalCluster
    namespace: str
    fullname: str

    def can(self, *args: str, sa: str = "lumigo-kubernetes-operator") -> bool:
        """`kubectl auth can-i` as the ServiceAccount."""
        out = self.cluster.kubectl(
            "auth", "can-i", *args, f"--as=system:serviceaccount:{self.namespace}:{sa}",
            check=False,
        )  # fmt: skip
        return out.strip().splitlines()[0] == "yes"

    def request(self, *args: str) -> str:
        """A real request as the operator: '' when allowed, else the error text."""
        out = self.cluster.kubectl(
            *args, f"--as=system:serviceaccount:{self.namespace}:lumigo-kubernetes-operator",
            "--request-timeout=5s", check=False,
        )  # fmt: skip
        return out if "Forbidden" in out or "forbidden" in out else ""


@pytest.fixture
def rbac(cluster: LocalCluster, crd: Path, namespace: str) -> Iterator[Rbac]:
    """The chart's ServiceAccounts and RBAC (hooks included) for a release in `namespace`; the
    CRD is installed so that kubectl can resolve `lumigoes`."""
    release = f"r{uuid.uuid4().hex[:5]}"
    docs = [d for d in load_docs(render_chart(release, namespace)) if d["kind"] in RBAC_KINDS]
    manifest = "\n---\n".join(json.dumps(d) for d in docs)
    cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        yield Rbac(cluster, namespace, f"{release}-lumigo-operator")
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=manifest, check=False)


def test_token_secrets_can_be_read_by_name_but_never_listed_or_watched(rbac: Rbac) -> None:
    assert rbac.can("get", "secrets/lumigo-credentials", "-n", "some-app")
    assert not rbac.can("list", "secrets", "-n", "some-app")
    assert not rbac.can("watch", "secrets", "-n", "some-app")
    assert not rbac.can("list", "secrets", "--all-namespaces")
    assert not rbac.can("update", "secrets/lumigo-credentials", "-n", "some-app")
    assert not rbac.can("delete", "secrets/lumigo-credentials", "-n", "some-app")


def test_the_certificate_secret_is_managed_by_name_in_the_own_namespace(rbac: Rbac) -> None:
    ns, cert = rbac.namespace, f"{rbac.fullname}-lumigo-injector-webhook-certs"
    assert rbac.can("create", "secrets", "-n", ns)
    assert rbac.can("update", f"secrets/{cert}", "-n", ns)
    assert not rbac.can("update", "secrets/someone-else", "-n", ns)
    assert not rbac.can("create", "secrets", "-n", "some-app")
    # A list/watch limited by a metadata.name field selector is authorized by the name...
    selector = f"metadata.name={cert}"
    assert rbac.request("get", "secrets", "-n", ns, "--field-selector", selector) == ""
    assert rbac.request("get", "secrets", "-n", ns, "--field-selector", selector,
                        "--watch", "--request-timeout=1s") == ""  # fmt: skip
    # ...and without it, refused.
    assert "forbidden" in rbac.request("get", "secrets", "-n", ns).lower()


def test_webhook_configurations_only_the_operators_own(rbac: Rbac) -> None:
    own = f"{rbac.fullname}-injector-webhook-configuration"
    assert rbac.can("patch", f"mutatingwebhookconfigurations/{own}")
    assert rbac.can(
        "get", f"mutatingwebhookconfigurations/{rbac.fullname}-defaulter-webhook-configuration"
    )
    assert not rbac.can("patch", "mutatingwebhookconfigurations/someone-else")
    assert not rbac.can("update", f"mutatingwebhookconfigurations/{own}"), "a JSON patch only"
    assert not rbac.can("create", "mutatingwebhookconfigurations")
    assert not rbac.can("delete", f"mutatingwebhookconfigurations/{own}")
    selector = f"metadata.name={own}"
    assert rbac.request("get", "mutatingwebhookconfigurations", "--field-selector", selector) == ""
    assert "forbidden" in rbac.request("get", "mutatingwebhookconfigurations").lower()


def test_the_webhook_identity_reads_its_serving_secret_and_writes_only_events(
    rbac: Rbac,
) -> None:
    """Issue 28 item 7: what `lumigo-operator webhook` (it parses untrusted reviews) may do."""
    ns, sa = rbac.namespace, f"{rbac.fullname}-webhook"
    certs = f"{rbac.fullname}-lumigo-injector-webhook-certs"
    assert rbac.can("get", f"secrets/{certs}-serving", "-n", ns, sa=sa)
    assert rbac.can("watch", f"secrets/{certs}-serving", "-n", ns, sa=sa)
    assert not rbac.can("get", f"secrets/{certs}", "-n", ns, sa=sa), "the CA key"
    assert not rbac.can("get", "secrets/lumigo-credentials", "-n", "some-app", sa=sa)
    assert not rbac.can("list", "secrets", "-n", ns, sa=sa)
    assert rbac.can("list", "lumigoes.operator.lumigo.io", "--all-namespaces", sa=sa)
    assert not rbac.can("patch", "lumigoes.operator.lumigo.io", "-n", "some-app", sa=sa)
    assert rbac.can("watch", f"configmaps/{rbac.fullname}-injection-mode", "-n", ns, sa=sa)
    assert not rbac.can("watch", "configmaps/other", "-n", ns, sa=sa)
    assert not rbac.can("update", f"configmaps/{rbac.fullname}-injection-mode", "-n", ns, sa=sa)
    assert rbac.can("create", "events", "-n", "some-app", sa=sa)
    assert rbac.can("patch", "events", "-n", "some-app", sa=sa)
    for kind in ("deployments.apps", "daemonsets.apps", "statefulsets.apps", "replicasets.apps",
                 "jobs.batch", "cronjobs.batch"):  # fmt: skip
        assert rbac.can("get", kind, "-n", "some-app", sa=sa), kind
        for verb in ("list", "watch", "update", "patch"):
            assert not rbac.can(verb, kind, "-n", "some-app", sa=sa), (verb, kind)
    own = f"{rbac.fullname}-injector-webhook-configuration"
    assert rbac.can("get", f"mutatingwebhookconfigurations/{own}", sa=sa)
    assert not rbac.can("patch", f"mutatingwebhookconfigurations/{own}", sa=sa)
    forbidden = [("patch", "nodes"), ("list", "nodes"), ("create", "pods"),
                 ("patch", "namespaces"), ("update", "leases.coordination.k8s.io")]  # fmt: skip
    for verb, what in forbidden:
        assert not rbac.can(verb, what, "-n", ns, sa=sa), (verb, what)


def test_secure_metrics_reviews_and_the_metrics_reader_role(rbac: Rbac) -> None:
    """The manager may send the reviews of its secure /metrics and nothing else of them; only a
    ServiceAccount bound to the shipped metrics-reader ClusterRole may get /metrics."""
    assert rbac.can("create", "tokenreviews.authentication.k8s.io")
    assert rbac.can("create", "subjectaccessreviews.authorization.k8s.io")
    assert not rbac.can("create", "localsubjectaccessreviews.authorization.k8s.io", "-n",
                        rbac.namespace)  # fmt: skip
    assert not rbac.can("get", "/metrics")  # the manager itself is no scraper
    assert not rbac.can("get", "/metrics", sa="prometheus")
    binding = f"{rbac.fullname}-test-reader"
    rbac.cluster.kubectl(
        "create", "clusterrolebinding", binding, f"--clusterrole={rbac.fullname}-metrics-reader",
        f"--serviceaccount={rbac.namespace}:prometheus",
    )  # fmt: skip
    try:
        assert rbac.can("get", "/metrics", sa="prometheus")
        assert not rbac.can("list", "pods", "-n", rbac.namespace, sa="prometheus")
    finally:
        rbac.cluster.kubectl("delete", "clusterrolebinding", binding, check=False)


def test_leader_election_lease_in_the_own_namespace_only(rbac: Rbac) -> None:
    ns = rbac.namespace
    assert rbac.can("create", "leases.coordination.k8s.io", "-n", ns)
    assert rbac.can("update", "leases.coordination.k8s.io/1447aab8.lumigo.io", "-n", ns)
    assert not rbac.can("update", "leases.coordination.k8s.io/other", "-n", ns)
    assert not rbac.can("create", "leases.coordination.k8s.io", "-n", "kube-system")


def test_pods_are_created_only_in_the_own_namespace_for_the_image_volume_dry_run(
    rbac: Rbac,
) -> None:
    """--injection-mode=auto's one dry-run create; nothing else about pods there."""
    ns = rbac.namespace
    assert rbac.can("create", "pods", "-n", ns)
    assert not rbac.can("create", "pods", "-n", "some-app")
    assert not rbac.can("create", "pods", "--all-namespaces")
    for verb in ("get", "update", "delete", "watch"):
        assert not rbac.can(verb, "pods", "-n", ns), verb


def test_workloads_and_lumigoes(rbac: Rbac) -> None:
    """The manager's ClusterRole, checked against what the operator does in
    test_rbac_least_privilege: workloads are written back whole (update, never patch), Jobs are
    only read, Lumigoes are never created, deleted or updated by the operator."""
    for resource in ("deployments.apps", "daemonsets.apps", "replicasets.apps",
                     "statefulsets.apps", "cronjobs.batch", "jobs.batch"):  # fmt: skip
        assert rbac.can("list", resource, "--all-namespaces"), resource
        assert rbac.can("watch", resource, "--all-namespaces"), resource
        assert rbac.can("get", resource, "-n", "some-app"), resource
        writable = resource != "jobs.batch"  # immutable: the operator reports, never writes
        assert rbac.can("update", resource, "-n", "some-app") == writable, resource
        assert not rbac.can("patch", resource, "-n", "some-app"), resource
        assert not rbac.can("delete", resource, "-n", "some-app"), resource
        assert not rbac.can("create", resource, "-n", "some-app"), resource
    lumigoes = "lumigoes.operator.lumigo.io"
    assert rbac.can("watch", lumigoes, "--all-namespaces")
    assert rbac.can("patch", lumigoes, "-n", "a"), "the finalizer"
    assert rbac.can("update", lumigoes, "--subresource=status", "-n", "a")
    assert not rbac.can("patch", lumigoes, "--subresource=status", "-n", "a")
    assert not rbac.can("update", lumigoes, "--subresource=finalizers", "-n", "a")
    for verb in ("create", "delete", "update"):
        assert not rbac.can(verb, lumigoes, "-n", "a"), verb
    assert rbac.can("get", "namespaces/some-app")
    assert not rbac.can("list", "namespaces")
    assert not rbac.can("watch", "namespaces")
    assert rbac.can("create", "events", "-n", "some-app")
    assert rbac.can("patch", "events", "-n", "some-app"), "repeated events are aggregated"
    assert not rbac.can("delete", "events", "-n", "some-app")
    assert not rbac.can("create", "pods", "-n", "some-app")
    assert not rbac.can("create", "customresourcedefinitions.apiextensions.k8s.io")


def test_uninstall_hook_can_strip_workloads_but_read_no_secret(rbac: Rbac) -> None:
    hook = f"{rbac.fullname}-uninstall-hook"
    lumigoes = "lumigoes.operator.lumigo.io"
    assert rbac.can("list", lumigoes, "--all-namespaces", sa=hook)
    assert rbac.can("delete", lumigoes, "-n", "a", sa=hook)
    assert rbac.can("patch", lumigoes, "-n", "a", sa=hook), "the finalizer, operator gone"
    for verb in ("get", "watch", "update", "create"):
        assert not rbac.can(verb, lumigoes, "-n", "a", sa=hook), verb
    assert rbac.can("list", "deployments.apps", "--all-namespaces", sa=hook)
    assert rbac.can("update", "deployments.apps", "-n", "a", sa=hook)
    assert rbac.can("update", "cronjobs.batch", "-n", "a", sa=hook)
    assert not rbac.can("update", "jobs.batch", "-n", "a", sa=hook)
    assert not rbac.can("patch", "deployments.apps", "-n", "a", sa=hook)
    assert not rbac.can("list", "namespaces", sa=hook), "workloads are listed cluster-wide"
    assert rbac.can("create", "events", "-n", "a", sa=hook)
    assert not rbac.can("get", "secrets", "-n", "a", sa=hook)
    assert not rbac.can("delete", "deployments.apps", "-n", "a", sa=hook)


def test_the_operator_may_configure_and_roll_the_telemetry_proxy(rbac: Rbac) -> None:
    ns, proxy = rbac.namespace, f"{rbac.fullname}-telemetry-proxy"
    needs = telemetry_reconciler_requests(ns, rbac.fullname)
    assert denied(rbac.cluster, ns, OPERATOR_SA, needs) == []
    # The configuration Secret by name, in the own namespace only.
    assert not rbac.can("update", "secrets/someone-else", "-n", ns)
    assert not rbac.can("delete", f"secrets/{proxy}-config", "-n", ns)
    assert not rbac.can("update", f"secrets/{proxy}-config", "-n", "some-app")
    # Not even a list of it: the reconciler GETs it.
    selector = f"metadata.name={proxy}-config"
    listed = rbac.request("get", "secrets", "-n", ns, "--field-selector", selector)
    assert "forbidden" in listed.lower()


def test_the_telemetry_proxy_reads_objects_but_no_secret(rbac: Rbac) -> None:
    ns, proxy = rbac.namespace, f"{rbac.fullname}-telemetry-proxy"
    assert denied(rbac.cluster, ns, proxy, telemetry_proxy_requests(ns, rbac.fullname)) == []
    assert not rbac.can("get", "secrets", "-n", ns, sa=proxy)
    assert not rbac.can("list", "secrets", "--all-namespaces", sa=proxy)
    assert not rbac.can("get", f"secrets/{proxy}-config", "-n", ns, sa=proxy), "mounted, not read"
    for resource in ("pods", "deployments.apps", "jobs.batch", "events"):
        assert not rbac.can("create", resource, "-n", "some-app", sa=proxy), resource
        assert not rbac.can("update", resource, "-n", "some-app", sa=proxy), resource
    assert not rbac.can("create", "leases.coordination.k8s.io", "-n", "kube-system", sa=proxy)
    # The heartbeat lists the Lumigo resources; nothing more of them.
    for verb in ("get", "watch", "update", "patch", "delete"):
        assert not rbac.can(verb, "lumigoes.operator.lumigo.io", "-n", "some-app", sa=proxy), verb
