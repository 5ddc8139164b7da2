"""The watchdog against a real API server and an OTLP sink: what it reports of the operator's
namespace (pods, restarts, waiting reasons, Events, the pods' own metrics), once per change, and
nothing lost while the upstream is down; on the wire, the reference watchdog's identity and Event
records, with each Event's root owner walked through the API under the install's own RBAC
(config/watchdog), and what is known when an owner cannot be read."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.runtime.kube import KubeClient
from controller.telemetry.watchdog import (
    EVENTS_SCOPE,
    SCOPE,
    SERVICE_NAME,
    Watchdog,
    WatchdogSettings,
)
from envtest.cluster import ROOT, LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, EVENTS, NAMESPACES, PODS, REPLICASETS, SECRETS
from tests.support.otel import LogSeen, running_sink
from tests.support.packaging import service_account_kubeconfig

JSON = dict[str, Any]
TOKEN = "t_0123456789abcdef01234"
METRICS = """# TYPE otelcol_exporter_send_failed_log_records counter
otelcol_exporter_send_failed_log_records_total{exporter="otlp_http/lumigo"} 7
# TYPE otelcol_exporter_queue_size gauge
otelcol_exporter_queue_size{exporter="otlp_http/lumigo"} 3
# TYPE go_goroutines gauge
go_goroutines 40
# TYPE lumigo_webhook_certificate_expiry_timestamp_seconds gauge
lumigo_webhook_certificate_expiry_timestamp_seconds 1.8e9
"""


def pod(kube: KubeClient, namespace: str, name: str, component: str) -> JSON:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}},
        "spec": {"containers": [{"name": "otelcol", "image": "otelcol:test",
                                 "ports": [{"name": "metrics", "containerPort": 8888}]}]},
    }  # fmt: skip
    return kube.create(PODS, body, namespace)


def set_status(kube: KubeClient, namespace: str, name: str, *, ready: bool, restarts: int,
               waiting: str = "") -> None:  # fmt: skip
    state: JSON = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    container = {
        "name": "otelcol", "ready": ready, "restartCount": restarts, "image": "otelcol:test",
        "imageID": "", "state": state,
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1}} if restarts else {},
    }  # fmt: skip
    status = {
        "phase": "Running",
        "podIP": "10.9.9.9",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [container],
    }
    kube.merge_patch(PODS, name, {"status": status}, namespace, "status")


def watchdog(
    kube: KubeClient,
    namespace: str,
    url: str,
    scraped: list[str],
    as_client: KubeClient | None = None,
    secret: str = "cluster-token",
) -> Watchdog:
    """A watchdog whose token Secret exists (made by `kube`; the watchdog reads the API as
    `as_client`, by default `kube` too)."""
    if kube.get_or_none(SECRETS, secret, namespace) is None:
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
                "stringData": {"token": f" {TOKEN}\n"}}  # fmt: skip
        kube.create(SECRETS, body, namespace)
    settings = WatchdogSettings(
        namespace,
        f"{url}/v1/logs",
        secret,
        interval=1,
        metrics_interval=0,
        cluster_name="it",
        own_pod="watchdog-self",
    )

    def fetch(target: str) -> str:
        scraped.append(target)
        return METRICS

    return Watchdog(as_client or kube, settings, "9.9.9", fetch=fetch)


def uid_of(kube: KubeClient, namespace: str) -> str:
    return str(kube.get(NAMESPACES, namespace)["metadata"]["uid"])


def pod_records(logs: list[LogSeen], name: str) -> list[LogSeen]:
    return [r for r in logs if r.body.get("kind") == "pod" and r.body.get("pod") == name]


def test_a_crash_looping_pod_and_its_events_are_reported_once(
    kube: KubeClient, namespace: str
) -> None:
    proxy_uid = pod(kube, namespace, "proxy", "telemetry-proxy")["metadata"]["uid"]
    pod(kube, namespace, "watchdog-self", "watchdog")
    set_status(kube, namespace, "proxy", ready=False, restarts=4, waiting="CrashLoopBackOff")
    event = {
        "apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "BackOff",
        "message": "Back-off restarting failed container otelcol", "count": 4,
        "metadata": {"name": f"proxy.{uuid.uuid4().hex[:8]}"},
        "involvedObject": {"kind": "Pod", "name": "proxy", "namespace": namespace},
    }  # fmt: skip
    kube.create(EVENTS, event, namespace)
    scraped: list[str] = []
    with running_sink() as sink:
        dog = watchdog(kube, namespace, sink.url, scraped)
        dog.check()
        assert dog.flush()
        logs = sink.logs()
        (proxy,) = pod_records(logs, "proxy")
        assert not pod_records(logs, "watchdog-self"), "the watchdog leaves itself out"
        assert (proxy.scope, proxy.authorization) == (SCOPE, f"LumigoToken {TOKEN}")
        # Named as the reference's watchdog, with the cluster's and the namespace's identity.
        assert proxy.resource == {
            "service.name": SERVICE_NAME,
            "lumigo.k8s_operator.version": "9.9.9",
            "k8s.namespace.name": namespace,
            "k8s.namespace.uid": uid_of(kube, namespace),
            "k8s.cluster.uid": uid_of(kube, "kube-system"),
            "k8s.cluster.version": kube.request("GET", "/version")["gitVersion"],
            "k8s.cluster.name": "it",
        }
        body = proxy.body
        assert (body["component"], body["ready"], body["restarts"]) == ("telemetry-proxy", False, 4)
        (container,) = body["containers"]
        assert container["waitingReason"] == "CrashLoopBackOff"
        assert (container["lastTerminationReason"], container["lastExitCode"]) == ("Error", 1)
        assert scraped == ["http://10.9.9.9:8888/metrics"]
        assert body["metrics"] == {
            'otelcol_exporter_send_failed_log_records_total{exporter="otlp_http/lumigo"}': 7.0,
            'otelcol_exporter_queue_size{exporter="otlp_http/lumigo"}': 3.0,
            "lumigo_webhook_certificate_expiry_timestamp_seconds": 1.8e9,
        }
        # (In a cluster with a scheduler, the pods' own Events come too.)
        (backoff,) = [r for r in logs if r.scope == EVENTS_SCOPE
                      and r.body["reason"] == "BackOff"]  # fmt: skip
        assert backoff.resource == proxy.resource
        assert backoff.severity == "Warning"
        assert backoff.body["involvedObject"]["name"] == "proxy"
        assert backoff.body["message"] == "Back-off restarting failed container otelcol"
        # An ownerless pod is its own root, its UID read (the Event named none).
        assert backoff.body["rootOwnerReference"] == {
            "apiVersion": "v1", "kind": "Pod", "name": "proxy", "namespace": namespace,
            "uid": proxy_uid,
        }  # fmt: skip

        # Next pass: the same Event is not sent again; a recovered pod is INFO, with its restarts.
        set_status(kube, namespace, "proxy", ready=True, restarts=4)
        before = len(sink.logs())
        dog.check()
        assert dog.flush()
        new = sink.logs()[before:]
        assert not [r for r in new if r.scope == EVENTS_SCOPE and r.body["reason"] == "BackOff"]
        (recovered,) = pod_records(new, "proxy")
        assert recovered.body["ready"] is True


def test_records_wait_for_an_upstream_outage_to_end(kube: KubeClient, namespace: str) -> None:
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    with running_sink() as sink:
        dog = watchdog(kube, namespace, sink.url, [])
        with sink.outage():
            dog.check()
            assert not dog.flush()
            dog.check()
            assert not dog.flush()
        assert dog.flush()
        assert len(pod_records(sink.logs(), "manager")) == 2, "both passes, in order, after it"
        assert dog.flush(), "nothing left pending"
        assert len(pod_records(sink.logs(), "manager")) == 2


def test_without_the_token_secret_records_wait_for_it(kube: KubeClient, namespace: str) -> None:
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    with running_sink() as sink:
        settings = WatchdogSettings(namespace, f"{sink.url}/v1/logs", "created-later")
        dog = Watchdog(kube, settings, fetch=lambda _url: "")
        dog.check()
        assert not dog.flush()
        assert not sink.logs()
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "created-later"},
                  "stringData": {"token": TOKEN}}  # fmt: skip
        kube.create(SECRETS, secret, namespace)
        assert dog.flush()
        (record,) = pod_records(sink.logs(), "manager")
        assert record.authorization == f"LumigoToken {TOKEN}"


def test_records_the_upstream_refuses_for_good_are_dropped_not_resent(
    kube: KubeClient, namespace: str
) -> None:
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    with running_sink() as sink:
        sink.refused_tokens.add(TOKEN)  # 401, as for a wrong token
        dog = watchdog(kube, namespace, sink.url, [])
        dog.check()
        assert not dog.flush()
        assert sink.refused == 1
        assert dog.flush(), "nothing pending: the refused records were dropped"
        assert sink.refused == 1


# --- root owners, under the install's RBAC --------------------------------------------------


@pytest.fixture
def watchdog_account(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    """config/watchdog's ServiceAccount and RBAC, moved into the test's namespace (the name of
    lumigo-system, the install's namespace, replaced everywhere)."""
    # With the metrics-reader ClusterRole it is bound to (config/rbac, in the same install).
    text = "\n---\n".join(
        (ROOT / "config" / path).read_text()
        for path in ("watchdog/rbac.yaml", "rbac/metrics_reader_role.yaml")
    )
    docs = [d for d in yaml.safe_load_all(text.replace("lumigo-system", namespace)) if d]
    cluster_wide = [d for d in docs if d["kind"].startswith("Cluster")]
    for doc in cluster_wide:  # cluster-scoped names: one per test
        doc["metadata"]["name"] += f"-{namespace}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += f"-{namespace}"
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "lumigo-lumigo-operator-watchdog", "namespace": namespace},
    }
    cluster.kubectl("apply", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List",
                                      "items": [account, *docs]}))  # fmt: skip
    try:
        yield account["metadata"]["name"]
    finally:
        for doc in cluster_wide:
            cluster.kubectl("delete", doc["kind"], doc["metadata"]["name"], check=False)


def test_the_install_rbac_lets_the_watchdog_scrape_the_operators_secure_metrics(
    cluster: LocalCluster, namespace: str, watchdog_account: str
) -> None:
    """config/watchdog binds its ServiceAccount to the metrics-reader ClusterRole, as the chart
    does: without it the kustomize (and OLM) watchdog's scrape of the manager is refused (403)."""
    who = f"--as=system:serviceaccount:{namespace}:{watchdog_account}"
    assert cluster.kubectl("auth", "can-i", "get", "/metrics", who, check=False).strip() == "yes"
    assert cluster.kubectl("auth", "can-i", "get", "/logs", who, check=False).strip() == "no"


def owned(kind: str, name: str, owner: JSON) -> JSON:
    """An owner reference without `controller`: no controller of the cluster adopts or manages
    these objects (and their labels match no selector)."""
    meta = owner["metadata"]
    api_version = owner.get("apiVersion") or ("v1" if owner["kind"] == "Pod" else "apps/v1")
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": meta["uid"]}


def deployment_body(name: str) -> JSON:
    """A Deployment of no replicas whose selector matches none of the test's objects."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "not-these"}},
                 "template": {"metadata": {"labels": {"app": "not-these"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }  # fmt: skip


def owner_event(kube: KubeClient, namespace: str, involved: JSON, reason: str) -> None:
    event = {
        "apiVersion": "v1", "kind": "Event", "type": "Normal", "reason": reason,
        "message": f"{reason} happened",
        "metadata": {"name": f"{reason.lower()}.{uuid.uuid4().hex[:8]}"},
        "involvedObject": involved, "source": {"component": "test", "host": "node-9"},
    }  # fmt: skip
    kube.create(EVENTS, event, namespace)


def test_an_events_root_owner_is_walked_through_the_api_under_the_install_rbac(
    cluster: LocalCluster, kube: KubeClient, namespace: str, watchdog_account: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Pod -> ReplicaSet -> Deployment, read as the watchdog's own ServiceAccount; an Event about
    a pod that is gone keeps the pod as its root; the identity reads are allowed too."""
    deployment = kube.create(DEPLOYMENTS, deployment_body("proxy"), namespace)
    replicaset = kube.create(REPLICASETS, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "proxy-5d8", "labels": {"rs": "mine"},
                     "ownerReferences": [owned("Deployment", "proxy", deployment)]},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"rs": "mine"}},
                 "template": {"metadata": {"labels": {"rs": "mine"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }, namespace)  # fmt: skip
    replicaset["apiVersion"] = "apps/v1"
    child = kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "proxy-5d8-x", "ownerReferences": [
            owned("ReplicaSet", "proxy-5d8", replicaset)]},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }, namespace)  # fmt: skip
    gone_uid = str(uuid.uuid4())
    owner_event(kube, namespace, {"kind": "Pod", "apiVersion": "v1", "name": "proxy-5d8-x",
                                  "namespace": namespace, "uid": child["metadata"]["uid"],
                                  "resourceVersion": child["metadata"]["resourceVersion"],
                                  "fieldPath": "spec.containers{c}"}, "Chained")  # fmt: skip
    owner_event(kube, namespace, {"kind": "Pod", "apiVersion": "v1", "name": "gone",
                                  "namespace": namespace, "uid": gone_uid}, "Gone")  # fmt: skip
    owner_event(kube, namespace, {"kind": "ReplicaSet", "apiVersion": "apps/v1",
                                  "name": "proxy-5d8", "namespace": namespace,
                                  "uid": replicaset["metadata"]["uid"]}, "Scaled")  # fmt: skip

    config = service_account_kubeconfig(cluster, namespace, watchdog_account,
                                        tmp_path / "kubeconfig")  # fmt: skip
    as_watchdog = KubeClient.from_kubeconfig(config)
    with running_sink() as sink:
        # The install's token Secret name: its Role may read that one only.
        dog = watchdog(kube, namespace, sink.url, [], as_watchdog, "lumigo-credentials")
        dog.check()
        assert dog.flush()
        events = {r.body["reason"]: r for r in sink.logs() if r.scope == EVENTS_SCOPE}

    root = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "proxy",
            "namespace": namespace, "uid": deployment["metadata"]["uid"]}  # fmt: skip
    assert events["Chained"].body["rootOwnerReference"] == root
    assert events["Scaled"].body["rootOwnerReference"] == root
    assert events["Chained"].body["involvedObject"] == {
        "kind": "Pod", "namespace": namespace, "name": "proxy-5d8-x",
        "uid": child["metadata"]["uid"], "apiVersion": "v1",
        "resourceVersion": child["metadata"]["resourceVersion"], "fieldPath": "spec.containers{c}",
    }  # fmt: skip
    assert events["Chained"].body["source"] == {"component": "test", "host": "node-9"}
    assert events["Chained"].severity == "Normal"
    # Deleted: what is known, the pod itself.
    assert events["Gone"].body["rootOwnerReference"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "gone", "namespace": namespace,
        "uid": gone_uid,
    }  # fmt: skip
    # The install's RBAC lets it read both UIDs.
    resource = events["Chained"].resource
    assert resource["k8s.cluster.uid"] == uid_of(kube, "kube-system")
    assert resource["k8s.namespace.uid"] == uid_of(kube, namespace)


def test_an_owner_it_may_not_read_ends_the_walk_at_what_is_known(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """A ServiceAccount that may read pods and Events but no ReplicaSet and no namespace: the
    Event still goes, its root the pod's owner as the pod names it (not the Deployment above
    it); the resource without the UIDs."""
    account = "bare-watchdog"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": account, "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["list", "get"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": account, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    sa = {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": {"name": account, "namespace": namespace}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [sa, role, binding]}))  # fmt: skip
    replicaset = kube.create(REPLICASETS, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "agent-rs", "labels": {"rs": "mine"}, "ownerReferences": [
            owned("Deployment", "agent", kube.create(DEPLOYMENTS, deployment_body("agent"),
                                                     namespace))]},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"rs": "mine"}},
                 "template": {"metadata": {"labels": {"rs": "mine"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }, namespace)  # fmt: skip
    rs_uid = replicaset["metadata"]["uid"]
    child = kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent-x", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "agent-rs", "uid": rs_uid}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }, namespace)  # fmt: skip
    owner_event(kube, namespace, {"kind": "Pod", "apiVersion": "v1", "name": "agent-x",
                                  "namespace": namespace,
                                  "uid": child["metadata"]["uid"]}, "Unreadable")  # fmt: skip
    config = service_account_kubeconfig(cluster, namespace, account, tmp_path / "kubeconfig")
    with running_sink() as sink:
        dog = watchdog(kube, namespace, sink.url, [], KubeClient.from_kubeconfig(config))
        dog.check()
        assert dog.flush()
        (event,) = [r for r in sink.logs() if r.scope == EVENTS_SCOPE
                    and r.body["reason"] == "Unreadable"]  # fmt: skip
    assert event.body["rootOwnerReference"] == {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "agent-rs", "namespace": namespace,
        "uid": rs_uid,
    }  # fmt: skip
    assert "k8s.cluster.uid" not in event.resource
    assert "k8s.namespace.uid" not in event.resource
    assert event.resource["service.name"] == SERVICE_NAME


def test_without_metrics_server_the_other_reports_go_on_and_it_logs_once(
    cluster: LocalCluster, kube: KubeClient, namespace: str, watchdog_account: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """This API server serves no metrics.k8s.io: read as the watchdog's own ServiceAccount
    (config/watchdog's RBAC lets it list pods.metrics.k8s.io, so the answer is 404, not 403),
    the resource-usage gauges are skipped, one line says so, and the pod reports keep coming,
    pass after pass, without a warning."""
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    caplog.set_level(logging.INFO, logger="lumigo.watchdog")
    config = service_account_kubeconfig(cluster, namespace, watchdog_account,
                                        tmp_path / "kubeconfig")  # fmt: skip
    as_watchdog = KubeClient.from_kubeconfig(config)
    with running_sink() as sink:
        dog = watchdog(kube, namespace, sink.url, [], as_client=as_watchdog,
                       secret="lumigo-credentials")  # fmt: skip
        dog.settings = dataclasses.replace(
            dog.settings, interval=0.2, metrics_endpoint=f"{sink.url}/v1/metrics", top_interval=0
        )
        stop = threading.Event()
        thread = threading.Thread(target=dog.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(lambda: len(pod_records(sink.logs(), "manager")) >= 4, 60,
                       "four passes of pod reports")  # fmt: skip
        finally:
            stop.set()
            thread.join(10)
        assert not [r for r in sink.requests if r.path == "/v1/metrics"]
    unavailable = [r for r in caplog.records if "metrics.k8s.io is not served" in r.getMessage()]
    assert len(unavailable) == 1, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_refused_resource_usage_read_is_tried_each_pass_and_stops_nothing(
    cluster: LocalCluster, kube: KubeClient, namespace: str, watchdog_account: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Without the RBAC rule for pods.metrics.k8s.io (403, not 'not served'): a warning each
    pass, tried again next interval, and the pod reports keep coming."""
    role = watchdog_account  # config/watchdog names its Role as its ServiceAccount
    rules = json.loads(cluster.kubectl("get", "role", role, "-n", namespace, "-o", "json"))["rules"]
    kept = [r for r in rules if "metrics.k8s.io" not in r.get("apiGroups", [])]
    assert len(kept) == len(rules) - 1, "config/watchdog grants pods.metrics.k8s.io"
    cluster.kubectl("patch", "role", role, "-n", namespace, "--type=merge",
                    "-p", json.dumps({"rules": kept}))  # fmt: skip
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    caplog.set_level(logging.INFO, logger="lumigo.watchdog")
    config = service_account_kubeconfig(cluster, namespace, watchdog_account,
                                        tmp_path / "kubeconfig")  # fmt: skip
    as_watchdog = KubeClient.from_kubeconfig(config)
    with running_sink() as sink:
        dog = watchdog(kube, namespace, sink.url, [], as_client=as_watchdog,
                       secret="lumigo-credentials")  # fmt: skip
        dog.settings = dataclasses.replace(
            dog.settings, interval=0.2, metrics_endpoint=f"{sink.url}/v1/metrics", top_interval=0
        )
        stop = threading.Event()
        thread = threading.Thread(target=dog.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(lambda: len(pod_records(sink.logs(), "manager")) >= 4, 60,
                       "four passes of pod reports")  # fmt: skip
        finally:
            stop.set()
            thread.join(10)
        assert not [r for r in sink.requests if r.path == "/v1/metrics"]
    refused = [r for r in caplog.records
               if "could not read the pods' resource usage" in r.getMessage()]  # fmt: skip
    assert len(refused) >= 3, "tried again each pass"
    assert not [r for r in caplog.records if "not served" in r.getMessage()]
