"""Least privilege, measured: every permission an install grants is one the code really uses.

A control plane of its own, with an audit log of the ServiceAccounts' requests (level Metadata),
runs the kustomize install's manager as its own ServiceAccount (so exactly the install's RBAC)
through a scenario that takes every path that talks to the API server: start-up (leader
election, the self-managed certificate, the webhook configurations' caBundle), the
telemetry-proxy configuration for two namespaces, the cluster agent applied then removed
(cluster logs on, then off), instrumenting existing workloads of all six
kinds, a new workload through the webhook, deleting a Lumigo, and then `lumigo-operator
uninstall` as the Helm pre-delete hook's own ServiceAccount with a Lumigo left to finalize.
Admissions are served by the install's webhook Deployment, run as its own ServiceAccount (issue
28 item 7: the process that parses untrusted reviews holds no power of the manager's): it is
audited, and checked, the same way.

What the API server recorded (verb, API group, resource/subresource, name, namespace) is the
truth. Helm, kustomize and the OLM bundle must grant each identity nothing beyond it (except the
entries of ALLOWED_UNUSED, each with why the scenario cannot exercise it) and deny nothing of it.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from api.constants import ANNOTATION_PROVIDER_ID
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DAEMONSETS, DEPLOYMENTS, JOBS, NODES, SECRETS
from tests.support.checks import TOKEN, clean, events_of, is_active, lumigo_yaml
from tests.support.packaging import (
    CRD_NAME,
    OPERATOR_SA,
    ROOT,
    installed_operator,
    load_docs,
    load_file,
    render_chart,
    service_account_kubeconfig,
)
from tests.support.workloads import KINDS, init_container_names, node_without_kubelet, workload

NAMESPACE = "lumigo-system"
RELEASE = "lumigo"  # Helm's names for this release are config/'s names
FULLNAME = f"{RELEASE}-lumigo-operator"
DEPLOYMENT = f"{FULLNAME}-controller-manager"
HOOK_SA = f"{FULLNAME}-uninstall-hook"
WEBHOOK_SA = f"{FULLNAME}-webhook"
CERT_SECRET = f"{FULLNAME}-lumigo-injector-webhook-certs"
SERVING_SECRET = f"{CERT_SECRET}-serving"
INJECTION_MODE_CONFIGMAP = f"{FULLNAME}-injection-mode"
PROXY_SECRET = f"{FULLNAME}-telemetry-proxy-config"
AGENT = f"{FULLNAME}-cluster-agent"
PROVIDER_NODE = "rbac-audit-cloud-node"
BUNDLE_MANIFESTS = ROOT / "bundle" / "manifests"
JSON = dict[str, Any]

MANAGER, HOOK, WEBHOOK = "manager", "uninstall hook", "webhook"
# (identity, verb, group, resource): why it is granted although the scenario never uses it.
ALLOWED_UNUSED: dict[tuple[str, str, str, str], str] = {
    (MANAGER, "get", "operator.lumigo.io", "lumigoes"): (
        "re-read of a Lumigo when its status write meets a 409 Conflict "
        "(KubeClient.update_with_retry); needs a concurrent writer at that instant"
    ),
    (MANAGER, "create", "apps", "daemonsets"): (
        "the server-side apply that creates the cluster agent's DaemonSet: the API server "
        "authorizes it as a `create` of that name but audits it as the `patch` it is"
    ),
    (MANAGER, "patch", "", "events"): (
        "a repeated event of the controller's own (its count patched): the scenario's repeated "
        "event is an admission's, posted by the webhook's identity since issue 28 item 7; the "
        "controller repeats one only across resyncs of a workload it keeps failing on"
    ),
    (MANAGER, "list", "", "events"): (
        "a StatefulSet's or DaemonSet's FailedCreate events, listed by UID only while the new pods "
        "of one the controller instrumented are refused by the API server; the scenario has no "
        "LimitRange or quota (tests/e2e/test_safe_rollouts.py exercises it)"
    ),
    (MANAGER, "update", "", "configmaps"): (
        "the published injection mode changes (--injection-mode-configmap) only when a Node "
        "with another runtime joins or leaves; the scenario's Nodes never change"
    ),
}
# Granted by the OLM bundle only (verb, group, resource, namespace): under OLM the operator restarts
# the telemetry proxy by deleting its outdated pods, because OLM undoes the pod-template rollout
# that the other installs use. The scenario runs the kustomize install, so it never needs them;
# tests/e2e/test_packaging_olm.py exercises them under a real OLM.
OLM_ONLY: dict[tuple[str, str, str, str], str] = {
    ("list", "", "pods", NAMESPACE): "finding the proxy's outdated pods",
    ("delete", "", "pods", NAMESPACE): "restarting them one by one",
}


@dataclass(frozen=True)
class Access:
    """One request as the API server's audit log records it."""

    verb: str
    group: str
    resource: str  # "lumigoes/status" for a subresource
    name: str  # "" for a create or a list/watch without a metadata.name selector
    namespace: str  # "" for cluster-scoped objects and all-namespace lists
    code: int

    def __str__(self) -> str:
        where = f" -n {self.namespace}" if self.namespace else ""
        name = f"/{self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{name}{where} -> {self.code}"


@dataclass(frozen=True)
class Grant:
    """One verb on one resource (and name) that a role gives a ServiceAccount."""

    verb: str
    group: str
    resource: str
    name: str | None  # None: any name
    namespace: str | None  # None: every namespace (a ClusterRoleBinding)
    source: str

    def allows(self, access: Access) -> bool:
        return (
            (self.verb, self.group, self.resource) == (access.verb, access.group, access.resource)
            and self.name in (None, access.name)
            and self.namespace in (None, access.namespace)
        )

    @property
    def narrowness(self) -> tuple[bool, bool]:
        return (self.name is not None, self.namespace is not None)

    def __str__(self) -> str:
        named = f"/{self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{named} ({self.source})"


def expand(rules: list[JSON], namespace: str | None, source: str) -> list[Grant]:
    return [
        Grant(verb, group, resource, name, namespace, source)
        for rule in rules
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for name in rule.get("resourceNames") or [None]
    ]


def grants_from_manifests(docs: list[JSON], sa: str) -> list[Grant]:
    """What the (Cluster)RoleBindings among `docs` give system:serviceaccount:<ns>:<sa>."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    grants: list[Grant] = []
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == sa
            and s.get("namespace", NAMESPACE) == NAMESPACE
            for s in binding["subjects"]
        ):
            continue
        ref = binding["roleRef"]
        role = roles[(ref["kind"], ref["name"])]
        scope = None if binding["kind"] == "ClusterRoleBinding" else NAMESPACE
        grants += expand(role["rules"], scope, f"{ref['kind']} {ref['name']}")
    return grants


def helm_docs() -> list[JSON]:
    return load_docs(render_chart(RELEASE, NAMESPACE))


def kustomize_docs(cluster: LocalCluster) -> list[JSON]:
    return load_docs(cluster.kubectl("kustomize", str(ROOT / "config" / "default")))


def csv_grants(sa: str) -> list[Grant]:
    """The bundle's: CSV clusterPermissions (cluster-wide), CSV permissions and the namespaced
    Roles shipped as bundle manifests (both in the install namespace)."""
    docs = [d for path in sorted(BUNDLE_MANIFESTS.glob("*.yaml")) for d in load_file(path)]
    (csv,) = [d for d in docs if d["kind"] == "ClusterServiceVersion"]
    install = csv["spec"]["install"]["spec"]
    grants: list[Grant] = []
    for kind, scope in (("clusterPermissions", None), ("permissions", NAMESPACE)):
        for entry in install.get(kind) or []:
            if entry["serviceAccountName"] == sa:
                grants += expand(entry["rules"], scope, f"CSV {kind}")
    return grants + grants_from_manifests(docs, sa)


# --- the recorded scenario ----------------------------------------------------------------


@dataclass
class Usage:
    manager: list[Access]
    hook: list[Access]
    webhook: list[Access]


def accesses(events: list[JSON], user: str) -> list[Access]:
    found = set()
    for event in events:
        ref = event.get("objectRef")
        if event["user"]["username"] != user or ref is None:
            continue  # another identity, or a non-resource URL (discovery, /version)
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        code = int((event.get("responseStatus") or {}).get("code") or 0)
        found.add(Access(
            event["verb"], ref.get("apiGroup", ""), resource, ref.get("name", ""),
            ref.get("namespace", ""), code,
        ))  # fmt: skip
    return sorted(found, key=str)


@pytest.fixture(scope="module")
def audited_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(audit=True) as cluster:
        yield cluster


def proxy_config_text(kube: KubeClient) -> str:
    secret = kube.get_or_none(SECRETS, PROXY_SECRET, NAMESPACE)
    data = (secret or {}).get("data") or {}
    return "".join(base64.b64decode(v).decode() for v in data.values())


def instrumented(obj: JSON) -> bool:
    """Injected by the installed operator (whatever its version), CronJobs included."""
    label = (obj["metadata"].get("labels") or {}).get("lumigo.auto-trace", "")
    return label.startswith("lumigo-operator.v") and "lumigo-injector" in init_container_names(obj)


def warning_count(kube: KubeClient, namespace: str) -> int:
    """The count of the operator's Warning event about `misconfigured` (0: none yet)."""
    warnings = [e for e in events_of(kube, namespace, "misconfigured") if e["type"] == "Warning"]
    return sum(int(e.get("count") or 1) for e in warnings) if len(warnings) == 1 else 0


def all_instrumented(kube: KubeClient, namespace: str) -> bool:
    return all(instrumented(kube.get(r, r.plural, namespace)) for r in KINDS if r is not JOBS)


def start_lumigo(cluster: LocalCluster, kube: KubeClient, namespace: str) -> None:
    secret = {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lumigo-credentials"},
        "stringData": {"token": TOKEN},
    }  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(secret))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, namespace), 60, f"the Lumigo of {namespace} Active")


def run_scenario(cluster: LocalCluster, workdir: Path) -> None:
    kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
    cluster.kubectl("apply", "-k", str(ROOT / "config" / "default"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
    # The pre-delete hook's own ServiceAccount and RBAC, as Helm creates them before the Job.
    hook_rbac = [
        d for d in helm_docs()
        if d["metadata"]["name"] == HOOK_SA and d["kind"] != "Job"
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in hook_rbac))

    # Cluster collection on (the OLM way: an env var), so the agent DaemonSet is applied once
    # its token Secret exists.
    cluster.kubectl("set", "env", "-n", NAMESPACE, f"deployment/{DEPLOYMENT}",
                    "--containers=manager", "LUMIGO_CLUSTER_LOGS=true")  # fmt: skip
    token = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lumigo-credentials"},
             "stringData": {"token": TOKEN}}  # fmt: skip
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(token))

    # A Node with a cloud provider ID: the operator annotates it, the uninstall hook un-annotates.
    kube.create(NODES, node_without_kubelet(PROVIDER_NODE, "aws:///eu-west-1a/i-0rbac"))

    with installed_operator(cluster, kube, NAMESPACE, DEPLOYMENT, workdir) as operator:
        # A scrape of the secure /metrics: the manager reviews the scraper's token and access.
        status, body = operator.probe("/metrics")
        assert status == 200, body
        wait_until(lambda: kube.get_or_none(DAEMONSETS, AGENT, NAMESPACE), 60, "the agent")
        wait_until(lambda: ANNOTATION_PROVIDER_ID in (
            kube.get(NODES, PROVIDER_NODE)["metadata"].get("annotations") or {}
        ), 60, "the Node's provider-ID annotation")  # fmt: skip
        first, second = operator.new_namespace(), operator.new_namespace()
        # Existing workloads of every kind: the controller instruments them (Jobs are
        # immutable: an event instead).
        for namespace in (first, second):
            for resource in KINDS:
                kube.create(resource, workload(resource, resource.plural), namespace)
            # No controller-manager runs here: report the Deployment rolled out, as it would, so
            # the operator checks its pods' health before instrumenting it (pods: list).
            rolled = kube.get(DEPLOYMENTS, DEPLOYMENTS.plural, namespace)
            rolled["status"] = {"observedGeneration": rolled["metadata"]["generation"]}
            kube.replace(DEPLOYMENTS, rolled, namespace, subresource="status")
            start_lumigo(cluster, kube, namespace)
            wait_until(partial(all_instrumented, kube, namespace), 60, "instrumented")
            # One namespace at a time: the proxy's configuration Secret is created for the
            # first, then updated for the second.
            wait_until(lambda ns=namespace: ns in proxy_config_text(kube), 60, "proxy configured")
        # New workloads go through the webhook (an injected Job stays labelled: the removal
        # passes below meet it and report it).
        assert instrumented(kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, "new"), first))
        assert instrumented(kube.create(JOBS, workload(JOBS, "new-job"), second))
        # One of every kind more: the webhook's Added event about each is posted once a GET
        # finds the object (the webhook's identity may `get` each kind, nothing more).
        for resource in KINDS:
            created = kube.create(resource, workload(resource, f"new-{resource.plural}"), second)
            assert instrumented(created), resource.plural
        wait_until(lambda: all(
            events_of(kube, second, f"new-{resource.plural}") for resource in KINDS
        ), 30, "the webhook's event about every new workload")  # fmt: skip
        # The CA key stays with the manager: the Secret the webhook serves from has none, and
        # whatever is added there is removed (the manager rewrites it from its own state).
        served = kube.get(SECRETS, SERVING_SECRET, NAMESPACE)
        assert set(served["data"]) == {"tls.crt", "tls.key", "ca-bundle.crt"}
        assert "ca.key" in kube.get(SECRETS, CERT_SECRET, NAMESPACE)["data"]
        tampered = {"data": {"ca.key": base64.b64encode(b"planted").decode()}}
        kube.merge_patch(SECRETS, SERVING_SECRET, tampered, NAMESPACE)
        wait_until(lambda: kube.get(SECRETS, SERVING_SECRET, NAMESPACE)["data"] == served["data"],
                   30, "the serving Secret restored by the manager")  # fmt: skip
        assert operator.webhook is not None
        status, body = operator.webhook.probe("/metrics")
        assert status == 200, body

        # A workload the webhook cannot instrument (opted in by label, with an invalid Secret
        # name): a Warning event on its creation, the same event again on its next change, which
        # the recorder aggregates (a PATCH of the event's count).
        third = operator.new_namespace()
        labels = {"lumigo.auto-trace": "true", "lumigo.token-secret": "Not_A_Secret_Name"}
        kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, "misconfigured", labels), third)
        wait_until(lambda: warning_count(kube, third) == 1, 30, "the Warning event")
        kube.merge_patch(
            DEPLOYMENTS, "misconfigured", {"metadata": {"annotations": {"x": "y"}}}, third
        )
        wait_until(lambda: warning_count(kube, third) == 2, 30, "the Warning event repeated")

        # Deleting a Lumigo: the finalizer removes the instrumentation, then itself.
        kube.delete(LUMIGOES, "lumigo", first)
        wait_until(lambda: not kube.list(LUMIGOES, first)[0], 60, "the Lumigo of first gone")
        for resource in KINDS:
            if resource is not JOBS:
                assert clean(kube.get(resource, resource.plural, first)), resource.plural

        # Cluster collection turned off (logs and metrics): the restarted operator deletes the
        # agent.
        operator.stop()
        for var in operator.container["env"]:
            if var["name"] == "LUMIGO_CLUSTER_LOGS":
                var["value"] = "false"
        operator.container["args"].append("--no-cluster-metrics")
        operator.start().wait_ready()
        wait_until(lambda: not kube.get_or_none(DAEMONSETS, AGENT, NAMESPACE), 60, "no agent")

        # The Helm pre-delete hook, operator gone: it deletes the second Lumigo, finalizes it
        # itself after its timeout, and strips every labelled workload.
        operator.stop()
        kubeconfig = service_account_kubeconfig(
            cluster, NAMESPACE, HOOK_SA, workdir / "hook.kubeconfig"
        )
        result = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "lumigo-operator"), "uninstall",
             f"--kubeconfig={kubeconfig}", "--timeout=2s"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert "finalized 1 here" in result.stdout, result.stdout
        assert "the provider-ID annotation from 1 Node(s)" in result.stdout, result.stdout
        assert kube.list(LUMIGOES, second)[0] == []
        for resource in KINDS:
            if resource is not JOBS:
                assert clean(kube.get(resource, resource.plural, second)), resource.plural


@pytest.fixture(scope="module")
def usage(audited_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Usage:
    run_scenario(audited_cluster, tmp_path_factory.mktemp("rbac-audit"))
    events = audited_cluster.audit_events()
    return Usage(
        manager=accesses(events, f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}"),
        hook=accesses(events, f"system:serviceaccount:{NAMESPACE}:{HOOK_SA}"),
        webhook=accesses(events, f"system:serviceaccount:{NAMESPACE}:{WEBHOOK_SA}"),
    )


# --- the checks ---------------------------------------------------------------------------


def unused(grants: list[Grant], used: list[Access], identity: str) -> list[str]:
    """Grants that allowed none of the requests. A request allowed by several grants counts for
    the narrowest (a named one over any name, one namespace over all): a cluster-wide `patch
    deployments` is not needed because the proxy's Role lets the operator patch its Deployment.
    """
    needed: set[Grant] = set()
    for access in used:
        allowing = [g for g in grants if g.allows(access)]
        if allowing:
            narrowest = max(g.narrowness for g in allowing)
            needed |= {g for g in allowing if g.narrowness == narrowest}
    return sorted({
        str(g) for g in grants
        if g not in needed and (identity, g.verb, g.group, g.resource) not in ALLOWED_UNUSED
    })  # fmt: skip


def report(extra: list[str], used: list[Access]) -> str:
    return "\n".join(["  " + e for e in extra] + ["requests made:"] + ["  " + str(a) for a in used])


def self_cert_only(access: Access) -> bool:
    """The OLM bundle runs --cert-mode=files: OLM owns the certificate and the webhooks."""
    return access.resource == "mutatingwebhookconfigurations" or (
        access.resource == "secrets" and access.name in (CERT_SECRET, SERVING_SECRET)
    )


def test_the_scenario_was_never_forbidden(usage: Usage) -> None:
    """The kustomize RBAC the manager and the webhook ran with, and Helm's hook RBAC, allowed
    everything."""
    assert usage.manager, "no request of the operator's ServiceAccount was recorded"
    assert usage.hook, "no request of the uninstall hook's ServiceAccount was recorded"
    assert usage.webhook, "no request of the webhook's ServiceAccount was recorded"
    forbidden = [str(a) for a in usage.manager + usage.hook + usage.webhook if a.code == 403]
    assert forbidden == []


def webhook_grants(packaging: str, cluster: LocalCluster) -> list[Grant]:
    if packaging == "olm":
        return csv_grants(WEBHOOK_SA)
    docs = kustomize_docs(cluster) if packaging == "kustomize" else helm_docs()
    return grants_from_manifests(docs, WEBHOOK_SA)


@pytest.mark.parametrize("packaging", ["kustomize", "helm", "olm"])
def test_the_webhook_is_granted_exactly_what_it_uses(
    usage: Usage, audited_cluster: LocalCluster, packaging: str
) -> None:
    """Issue 28 item 7: admission is served under an identity of its own, granted exactly what
    `lumigo-operator webhook` used (OLM: without the self-managed certificate's objects)."""
    grants = webhook_grants(packaging, audited_cluster)
    assert grants, f"{packaging} has no webhook identity: admission runs as the manager"
    needed = usage.webhook
    if packaging == "olm":
        needed = [a for a in needed if not self_cert_only(a)]
    denied = sorted({str(a) for a in needed if not any(g.allows(a) for g in grants)})
    assert denied == [], f"{packaging} denies what the webhook does"
    extra = unused(grants, needed, WEBHOOK)
    assert not extra, f"{packaging} grants the webhook more than it used:\n" + report(
        extra, usage.webhook
    )


@pytest.mark.parametrize("packaging", ["kustomize", "helm", "olm"])
def test_the_webhook_can_write_nothing_but_events_nor_read_the_ca_key(
    audited_cluster: LocalCluster, packaging: str
) -> None:
    """What an attacker who takes over a webhook process gets: reads of Lumigo objects, of its
    own serving Secret, its webhook configurations and the injection mode; a `get` of
    workloads; Events. Never a write to a workload, a Node or a Namespace, never the CA key."""
    grants = webhook_grants(packaging, audited_cluster)
    allowed = {
        ("create", "events"), ("patch", "events"),
        # Secure /metrics: a scraper's token and access are reviewed (create-only, not stored).
        ("create", "tokenreviews"), ("create", "subjectaccessreviews"),
    }  # fmt: skip
    writes = {(g.verb, g.resource) for g in grants if g.verb not in ("get", "list", "watch")}
    assert writes <= allowed, sorted(writes - allowed)
    secrets = {g.name for g in grants if g.resource == "secrets"}
    assert secrets <= {SERVING_SECRET}, secrets
    listed = {g.resource for g in grants if g.verb in ("list", "watch") and g.name is None}
    assert listed == {"lumigoes"}, listed


@pytest.mark.parametrize("packaging", ["kustomize", "helm", "olm"])
def test_the_manager_is_granted_exactly_what_it_uses(
    usage: Usage, audited_cluster: LocalCluster, packaging: str
) -> None:
    if packaging == "olm":
        grants = csv_grants(OPERATOR_SA)
        olm_only = [g for g in grants if (g.verb, g.group, g.resource, g.namespace) in OLM_ONLY]
        assert len(olm_only) == len(OLM_ONLY), "the bundle no longer grants what OLM_ONLY says"
        grants = [g for g in grants if g not in olm_only]
        needed = [a for a in usage.manager if not self_cert_only(a)]
    else:
        docs = kustomize_docs(audited_cluster) if packaging == "kustomize" else helm_docs()
        grants = grants_from_manifests(docs, OPERATOR_SA)
        needed = usage.manager
    assert grants
    denied = sorted({str(a) for a in needed if not any(g.allows(a) for g in grants)})
    assert denied == [], f"{packaging} denies what the operator does"
    extra = unused(grants, usage.manager, MANAGER)
    assert not extra, f"{packaging} grants the operator more than it used:\n" + report(
        extra, usage.manager
    )


def test_the_uninstall_hook_is_granted_exactly_what_it_uses(usage: Usage) -> None:
    grants = grants_from_manifests(helm_docs(), HOOK_SA)
    assert grants
    extra = unused(grants, usage.hook, HOOK)
    assert not extra, "the hook's RBAC grants more than `lumigo-operator uninstall` used:\n" + (
        report(extra, usage.hook)
    )


def test_the_allow_list_is_not_stale() -> None:
    """Each entry is still granted; otherwise remove it."""
    for identity, verb, group, resource in ALLOWED_UNUSED:
        sa = OPERATOR_SA if identity == MANAGER else HOOK_SA
        grants = grants_from_manifests(helm_docs(), sa)
        key = (verb, group, resource)
        assert any((g.verb, g.group, g.resource) == key for g in grants), key
