"""Kubernetes events and objects collection, end to end on a real API server.

Lumigoes -> the reconciler renders the configuration into its Secret -> the real collector runs
that configuration (as the rolled-out proxy pod would) -> OTLP logs at the upstream sink, each
with its namespace's token. Deleting the Lumigo rolls the proxy to a configuration without that
namespace, and collection stops.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.lumigo.resources import LUMIGOES
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.telemetry.config import (
    EVENTS_SCOPE,
    HEARTBEAT_SCOPE,
    OBJECTS_SCOPE,
    MonitoredNamespace,
    render,
)
from controller.telemetry.proxy_reconciler import CONFIG_KEY, ProxyTarget, TelemetryProxyReconciler
from controller.telemetry.redaction import LAST_APPLIED, REDACTED, Redaction
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import CRONJOBS, DEPLOYMENTS, EVENTS, JOBS, NAMESPACES, PODS, REPLICASETS, SECRETS
from tests.support.lumigo import create_lumigo, create_token_secret, random_token, set_active
from tests.support.otel import (
    LogSeen,
    MetricSeen,
    OTLPSink,
    local_settings,
    running_collector,
    running_sink,
)
from tests.support.workloads import one_container_deployment

JSON = dict[str, Any]
RUN_LABEL = "tests.lumigo.io/run"


@pytest.fixture
def sink() -> Iterator[OTLPSink]:
    with running_sink() as s:
        yield s


@pytest.fixture
def namespaces(cluster: LocalCluster, crd: object) -> Iterator[dict[str, str]]:
    """monitored, barrier (also monitored) and other (no Lumigo) namespaces."""
    suffix = uuid.uuid4().hex[:6]
    names = {role: f"t-events-{role}-{suffix}" for role in ("monitored", "barrier", "other")}
    for name in names.values():
        cluster.kubectl("create", "namespace", name)
    try:
        yield names
    finally:
        for name in names.values():
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def deployment(kube: KubeClient, namespace: str, name: str) -> None:
    kube.create(DEPLOYMENTS, one_container_deployment(name, "python:3.12"), namespace)


def crash_looping_pod(kube: KubeClient, namespace: str, name: str) -> None:
    """A Pod and the BackOff Event the kubelet posts when its container keeps failing."""
    pod = kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
        },
        namespace,
    )
    kube.create(
        EVENTS,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.backoff", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": pod["metadata"]["uid"],
                "fieldPath": "spec.containers{app}",
            },
            "reason": "BackOff",
            "type": "Warning",
            "message": "Back-off restarting failed container app in pod " + name,
            "source": {"component": "kubelet"},
            "count": 1,
        },
        namespace,
    )


def the_object(record: LogSeen) -> JSON:
    """The Kubernetes object a k8s_objects record carries (watch events wrap it)."""
    body = record.body
    if isinstance(body, str) and body.startswith("{"):
        body = json.loads(body)  # the heartbeat's: the Lumigo as a JSON string
    body = body if isinstance(body, dict) else {}
    obj = body.get("object", body)
    return obj if isinstance(obj, dict) else {}


def seen(sink: OTLPSink, kind: str, name: str) -> list[LogSeen]:
    return [
        r
        for r in sink.logs()
        if the_object(r).get("kind") == kind
        and (the_object(r).get("metadata") or {}).get("name") == name
    ]


def active_lumigoes(kube: KubeClient, tokens: dict[str, str]) -> Informer:
    """An active Lumigo with its token Secret in each namespace of `tokens`, and a started
    informer that sees only these Lumigoes."""
    run = uuid.uuid4().hex[:8]
    for ns, token in tokens.items():
        create_token_secret(kube, ns, token)
        create_lumigo(kube, ns)
        kube.merge_patch(LUMIGOES, "lumigo", {"metadata": {"labels": {RUN_LABEL: run}}}, ns)
        set_active(kube, ns)
    lumigoes = Informer(kube, Selection(LUMIGOES, label_selector=f"{RUN_LABEL}={run}"))
    lumigoes.start()
    wait_until(
        lambda: sum(1 for o in lumigoes.store.list() if o.get("status")) == len(tokens),
        30,
        "the active Lumigoes in the informer",
    )
    return lumigoes


def stored_config(kube: KubeClient, target: ProxyTarget) -> str:
    """The proxy configuration the reconciler stored in its Secret."""
    secret = kube.get(SECRETS, target.secret_name, target.namespace)
    return base64.b64decode(secret["data"][CONFIG_KEY]).decode()


def test_events_and_objects_collected_per_namespace_with_its_token(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    monitored, barrier, other = namespaces["monitored"], namespaces["barrier"], namespaces["other"]
    tokens = {monitored: random_token(), barrier: random_token()}
    lumigoes = active_lumigoes(kube, tokens)
    settings = local_settings(sink.url, namespace)
    target = ProxyTarget(namespace, "telemetry-proxy-config", "telemetry-proxy")
    reconciler = TelemetryProxyReconciler(kube, lumigoes, target, settings)
    try:
        assert reconciler.sync()
        first = tmp_path / "first"
        first.mkdir()
        with running_collector(
            stored_config(kube, target), first, settings.health_port, cluster.env()
        ):
            deployment(kube, monitored, "web")
            crash_looping_pod(kube, monitored, "web-crash")
            deployment(kube, other, "web-other")
            crash_looping_pod(kube, other, "web-other-crash")
            wait_until(
                lambda: (
                    seen(sink, "Deployment", "web") and seen(sink, "Event", "web-crash.backoff")
                ),
                90,
                "the Deployment and the BackOff Event of the monitored namespace at the sink",
            )
            event = seen(sink, "Event", "web-crash.backoff")[0]
            assert the_object(event)["reason"] == "BackOff"
            assert the_object(event)["involvedObject"]["name"] == "web-crash"

        records = sink.logs()
        assert records
        for record in records:
            ns = record.resource.get("k8s.namespace.name")
            obj_ns = (the_object(record).get("metadata") or {}).get("namespace")
            assert ns in tokens, f"record from an unmonitored namespace: {ns}"
            assert obj_ns == ns
            assert record.authorization == f"LumigoToken {tokens[ns]}"
        assert not seen(sink, "Deployment", "web-other")
        assert not seen(sink, "Event", "web-other-crash.backoff")

        # The Lumigo goes: the proxy rolls to a configuration without the namespace.
        kube.delete(LUMIGOES, "lumigo", monitored)
        wait_until(lambda: lumigoes.get(monitored, "lumigo") is None, 30, "the deletion")
        assert reconciler.sync()
        assert f"k8s_objects/{monitored}" not in stored_config(kube, target)
        before = len(sink.logs())
        second = tmp_path / "second"
        second.mkdir()
        with running_collector(
            stored_config(kube, target), second, settings.health_port, cluster.env()
        ):
            deployment(kube, monitored, "web-after-deletion")
            deployment(kube, barrier, "barrier")
            wait_until(
                lambda: seen(sink, "Deployment", "barrier"),
                90,
                "the barrier namespace's Deployment (collection still runs there)",
            )
        assert not seen(sink, "Deployment", "web-after-deletion")
        assert all(r.resource.get("k8s.namespace.name") == barrier for r in sink.logs()[before:])
    finally:
        lumigoes.stop()


def test_a_hostile_token_never_reaches_the_shared_proxy_configuration(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """A namespace admin's token that embeds collector expansion (`${env:…}`, an unknown scheme)
    is refused by validation, so it is never rendered; and even a value that did reach the
    renderer is sent literally, while every other namespace's pipeline keeps working."""
    run = uuid.uuid4().hex[:8]
    evil, good = namespaces["monitored"], namespaces["barrier"]
    good_token = random_token()
    hostile = random_token() + "${env:LUMIGO_TEST_LEAK}"
    for ns, token in ((evil, hostile), (good, good_token)):
        create_token_secret(kube, ns, token)
        create_lumigo(kube, ns)
        kube.merge_patch(LUMIGOES, "lumigo", {"metadata": {"labels": {RUN_LABEL: run}}}, ns)
        set_active(kube, ns)
    lumigoes = Informer(kube, Selection(LUMIGOES, label_selector=f"{RUN_LABEL}={run}"))
    lumigoes.start()
    settings = local_settings(sink.url, namespace)
    target = ProxyTarget(namespace, "telemetry-proxy-config", "telemetry-proxy")
    reconciler = TelemetryProxyReconciler(kube, lumigoes, target, settings)
    env = {**cluster.env(), "LUMIGO_TEST_LEAK": "leaked-value"}
    try:
        wait_until(
            lambda: sum(1 for o in lumigoes.store.list() if o.get("status")) == 2,
            30,
            "both active Lumigoes in the informer",
        )
        assert reconciler.sync()
        secret = kube.get(SECRETS, target.secret_name, namespace)
        stored = base64.b64decode(secret["data"][CONFIG_KEY]).decode()
        assert [ns.name for ns in reconciler.monitored_namespaces()] == [good]
        assert "${" not in stored
        assert f"k8s_objects/{evil}" not in stored

        # Defence in depth: values that reach the renderer anyway are never expanded, and an
        # unknown scheme in one namespace's value does not stop the shared configuration loading.
        uids = {ns: kube.get(NAMESPACES, ns)["metadata"]["uid"] for ns in (evil, good)}
        unknown_scheme = random_token() + "${nosuchscheme:x}"
        config = render(
            [
                MonitoredNamespace(evil, uids[evil], hostile),
                MonitoredNamespace(namespaces["other"], "", unknown_scheme),
                MonitoredNamespace(good, uids[good], good_token),
            ],
            settings,
        )
        deployment(kube, evil, "web-evil")
        deployment(kube, good, "web-good")
        with running_collector(config, tmp_path, settings.health_port, env):
            wait_until(
                lambda: (
                    seen(sink, "Deployment", "web-good") and seen(sink, "Deployment", "web-evil")
                ),
                90,
                "both namespaces' Deployments at the sink",
            )
        authorizations = {
            r.resource.get("k8s.namespace.name"): r.authorization for r in sink.logs()
        }
        assert authorizations[good] == f"LumigoToken {good_token}"
        assert authorizations[evil] == f"LumigoToken {hostile}"  # literal, not expanded
        assert all("leaked-value" not in r.authorization for r in sink.logs())
    finally:
        lumigoes.stop()


def test_the_namespace_heartbeat_sends_each_lumigos_spec_and_status_with_its_token(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """Every heartbeat interval (2 s here, hourly by default) each monitored namespace's Lumigo
    goes upstream whole, spec and status, under scope lumigo-operator.namespace_heartbeat and
    with that namespace's token; a namespace without a Lumigo sends none."""
    monitored, barrier = namespaces["monitored"], namespaces["barrier"]
    tokens = {monitored: random_token(), barrier: random_token()}
    lumigoes = active_lumigoes(kube, tokens)
    settings = local_settings(sink.url, namespace, heartbeat_interval="2s")
    target = ProxyTarget(namespace, "telemetry-proxy-config", "telemetry-proxy")
    reconciler = TelemetryProxyReconciler(kube, lumigoes, target, settings)

    def heartbeats(ns: str) -> list[LogSeen]:
        return [
            r
            for r in sink.logs()
            if r.scope == HEARTBEAT_SCOPE and r.resource.get("k8s.namespace.name") == ns
        ]

    try:
        assert reconciler.sync()
        config = stored_config(kube, target)
        with running_collector(config, tmp_path, settings.health_port, cluster.env()):
            wait_until(
                lambda: all(len(heartbeats(ns)) >= 2 for ns in tokens),
                60,
                "two heartbeats of each monitored namespace",
            )
        for ns, token in tokens.items():
            for record in heartbeats(ns):
                assert record.authorization == f"LumigoToken {token}"
                # The reference's body: the Lumigo as a JSON string.
                assert isinstance(record.body, str), record.body
                lumigo = json.loads(record.body)
                assert lumigo["kind"] == "Lumigo"
                assert lumigo["metadata"]["namespace"] == ns
                assert lumigo["spec"]["lumigoToken"]["secretRef"]["name"]
                assert lumigo["status"]["conditions"]
                assert token not in str(record.body)  # the reference to the Secret only
        assert not [r for r in sink.logs() if r.scope == HEARTBEAT_SCOPE
                    and r.resource.get("k8s.namespace.name") not in tokens]  # fmt: skip
    finally:
        lumigoes.stop()


def test_the_proxy_sends_its_own_metrics_with_the_cluster_token_only(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """As the reference's `prometheus/collector-self-metrics`: with the cluster token's Secret in
    the proxy's namespace, the proxy scrapes its own `otelcol_*` series under the job
    lumigo-operator-self-metrics and sends them with that token, never with a tenant's."""
    tenant_token, cluster_token = random_token(), random_token()
    lumigoes = active_lumigoes(kube, {namespaces["monitored"]: tenant_token})
    create_token_secret(kube, namespace, cluster_token, name="cluster-credentials")
    settings = local_settings(sink.url, namespace, self_metrics_interval="2s")
    target = ProxyTarget(namespace, "telemetry-proxy-config", "telemetry-proxy")
    reconciler = TelemetryProxyReconciler(
        kube, lumigoes, target, settings, cluster_token=("cluster-credentials", "token")
    )

    def own() -> list[MetricSeen]:
        return [m for m in sink.metrics() if m.name.startswith("otelcol_")]

    try:
        assert reconciler.sync()
        with running_collector(
            stored_config(kube, target), tmp_path, settings.health_port, cluster.env()
        ):
            wait_until(
                lambda: (
                    {"otelcol_process_uptime", "otelcol_receiver_accepted_log_records"}
                    <= {m.name for m in own()}
                ),
                60,
                "the proxy's own uptime and receiver series at the sink",
            )
    finally:
        lumigoes.stop()
    metrics = sink.metrics()
    assert {m.authorization for m in own()} == {f"LumigoToken {cluster_token}"}
    # The scrape's own bookkeeping is not sent, as the reference's filter-prom-metrics.
    names = {m.name for m in metrics}
    assert not {"up", "scrape_duration_seconds", "scrape_samples_scraped"} & names, names
    assert not [m for m in metrics if tenant_token in m.authorization]
    for metric in own():
        # The reference's collector name, by which the backend recognises these series.
        assert metric.resource["service.name"] == "lumigo-collector"
        assert metric.resource["k8s.cluster.name"] == "local-test"
        assert metric.resource["lumigo.k8s_operator.version"]
    # Without the Secret the pipeline is gone: the proxy sends nothing of its own.
    kube.delete(SECRETS, "cluster-credentials", namespace)
    assert "metrics/self" not in render([], reconciler.rendering_settings())


def owned_pod(kube: KubeClient, namespace: str) -> tuple[JSON, JSON]:
    """A Deployment, a ReplicaSet it controls and a Pod of that ReplicaSet, made by hand (the
    cluster may run no controllers) so that no controller changes them: (deployment, pod)."""
    deploy = kube.create(DEPLOYMENTS, one_container_deployment("shop", "python:3.12"), namespace)

    def owner(obj: JSON, *, controller: bool) -> JSON:
        meta = obj["metadata"]
        return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                "uid": meta["uid"], "controller": controller}  # fmt: skip

    replicaset = kube.create(
        REPLICASETS,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            # Controlled by the Deployment (k8s_attributes follows only that link), with no
            # replicas: a Deployment controller, where one runs, leaves it as an old ReplicaSet.
            # (Its labels match the Deployment's selector, or that controller releases it.)
            "metadata": {
                "name": "shop-5d8f7c9b4",
                "labels": {"app": "shop", "hash": "5d8f7c9b4"},
                "ownerReferences": [owner(deploy, controller=True)],
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "shop", "hash": "5d8f7c9b4"}},
                "template": {
                    "metadata": {"labels": {"app": "shop", "hash": "5d8f7c9b4"}},
                    "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
                },
            },
        },
        namespace,
    )
    pod = kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            # Owned but not controlled, and outside its selector: a ReplicaSet controller, where
            # one runs, neither adopts nor deletes it (k8s_attributes follows any pod owner).
            "metadata": {
                "name": "shop-5d8f7c9b4-x2x2x",
                "labels": {"app": "shop-by-hand"},
                "ownerReferences": [owner(replicaset, controller=False)],
            },
            "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
        },
        namespace,
    )
    return deploy, pod


def event_about(
    kube: KubeClient, namespace: str, obj: JSON, name: str, *, version: bool = False
) -> None:
    """An Event about `obj` (naming its resourceVersion with `version`), posted in `namespace`
    and naming `obj`'s own namespace, as whoever writes Events may."""
    meta = obj["metadata"]
    involved = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                "namespace": meta.get("namespace", namespace), "uid": meta["uid"]}  # fmt: skip
    if version:
        involved["resourceVersion"] = meta["resourceVersion"]
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
             "involvedObject": involved, "reason": "Test", "type": "Normal", "message": name,
             "source": {"component": "test"}, "count": 1}  # fmt: skip
    kube.create(EVENTS, event, namespace)


def test_events_carry_the_root_owner_of_their_object(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    monitored = namespaces["monitored"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    settings = local_settings(sink.url, namespace)
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    deploy, pod = owned_pod(kube, monitored)
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        event_about(kube, monitored, pod, "shop-pod.started")
        event_about(kube, monitored, deploy, "shop.scaled")
        wait_until(
            lambda: seen(sink, "Event", "shop-pod.started") and seen(sink, "Event", "shop.scaled"),
            90, "both Events at the sink",
        )  # fmt: skip
    deployment_ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop",
                      "namespace": monitored, "uid": deploy["metadata"]["uid"]}  # fmt: skip
    (about_pod,) = seen(sink, "Event", "shop-pod.started")
    assert the_object(about_pod)["rootOwnerReference"] == deployment_ref
    assert about_pod.resource["k8s.deployment.name"] == "shop"  # the pod's owner chain
    (about_deployment,) = seen(sink, "Event", "shop.scaled")
    assert the_object(about_deployment)["rootOwnerReference"] == deployment_ref
    # Other objects keep their body as it was.
    assert all("rootOwnerReference" not in the_object(r) for r in sink.logs()
               if the_object(r).get("kind") != "Event")  # fmt: skip


# Issue 29 item 1: what reaches the backend as the reference sends it.


def records_of(sink: OTLPSink, scope: str, kind: str, name: str) -> list[JSON]:
    """The bodies of `scope`'s records that are the object `kind`/`name` itself (no watch
    envelope around it)."""
    return [
        r.body
        for r in sink.logs()
        if r.scope == scope
        and isinstance(r.body, dict)
        and r.body.get("kind") == kind
        and (r.body.get("metadata") or {}).get("name") == name
    ]


def reference(obj: JSON) -> JSON:
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
            "namespace": meta["namespace"], "uid": meta["uid"]}  # fmt: skip


def owned_by(owner: JSON, *, controller: bool = True) -> list[JSON]:
    return [{**{k: v for k, v in reference(owner).items() if k != "namespace"},
             "controller": controller}]  # fmt: skip


def cron_chain(kube: KubeClient, namespace: str) -> tuple[JSON, JSON, JSON]:
    """A suspended CronJob, a suspended Job it controls and a Pod of that Job, by hand (no
    controller creates or adopts anything here): (cronjob, job, pod)."""
    template = {"spec": {"restartPolicy": "Never",
                         "containers": [{"name": "app", "image": "python:3.12"}]}}  # fmt: skip
    cronjob = kube.create(
        CRONJOBS,
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
         "spec": {"schedule": "0 3 * * *", "suspend": True,
                  "jobTemplate": {"spec": {"template": template}}}},
        namespace,
    )  # fmt: skip
    job = kube.create(
        JOBS,
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": "nightly-29001", "ownerReferences": owned_by(cronjob)},
         "spec": {"suspend": True, "template": template}},
        namespace,
    )  # fmt: skip
    pod = kube.create(
        PODS,
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "nightly-29001-abcde",
                      "ownerReferences": owned_by(job, controller=False)},
         "spec": template["spec"]},
        namespace,
    )  # fmt: skip
    return cronjob, job, pod


def test_events_and_objects_arrive_as_the_objects_under_the_references_scopes(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """Events under scope lumigo-operator.k8s-events, the other objects under
    lumigo-operator.k8s-objects, each record's body the object itself (not the watch event
    {type, object} around it); the heartbeat keeps its scope."""
    monitored = namespaces["monitored"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    settings = local_settings(sink.url, namespace)
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        deployment(kube, monitored, "web")
        crash_looping_pod(kube, monitored, "web-crash")
        wait_until(
            lambda: (
                records_of(sink, OBJECTS_SCOPE, "Deployment", "web")
                and records_of(sink, OBJECTS_SCOPE, "Pod", "web-crash")
                and records_of(sink, EVENTS_SCOPE, "Event", "web-crash.backoff")
            ),
            90,
            "the Deployment, the Pod and the BackOff Event at the sink, each under its scope",
        )
    (event, *_) = records_of(sink, EVENTS_SCOPE, "Event", "web-crash.backoff")
    assert event["reason"] == "BackOff"
    assert event["involvedObject"]["name"] == "web-crash"
    assert "object" not in event
    scopes = {r.scope for r in sink.logs()}
    assert scopes <= {EVENTS_SCOPE, OBJECTS_SCOPE, HEARTBEAT_SCOPE}, scopes
    for record in sink.logs():
        assert isinstance(record.body, dict)
        assert set(record.body) != {"type", "object"}, record.body  # never the watch event
        assert (record.body["kind"] == "Event") is (record.scope == EVENTS_SCOPE)


def test_unchanged_objects_and_events_are_listed_again_every_pull_interval(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """Besides the watch, each namespace's objects and Events are listed at start and every pull
    interval (10 minutes by default, 3 s here), as the reference: an object nobody changes still
    arrives again, as the same version, so what a watch gap lost reaches the backend."""
    monitored = namespaces["monitored"]
    deployment(kube, monitored, "steady")
    crash_looping_pod(kube, monitored, "steady-crash")
    version = kube.get(EVENTS, "steady-crash.backoff", monitored)["metadata"]["resourceVersion"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    settings = local_settings(sink.url, namespace, objects_pull_interval="3s")
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        wait_until(
            lambda: (
                len(records_of(sink, OBJECTS_SCOPE, "Deployment", "steady")) >= 3
                and len(records_of(sink, EVENTS_SCOPE, "Event", "steady-crash.backoff")) >= 3
            ),
            60,
            "the Deployment and the Event listed three times",
        )
    # Nobody changed the Event: every record is the version it had before the collector started
    # (the Deployment's controller may still write its status, so its versions are not checked).
    events = records_of(sink, EVENTS_SCOPE, "Event", "steady-crash.backoff")
    assert {e["metadata"]["resourceVersion"] for e in events} == {version}
    for record in sink.logs():
        assert set(record.body) != {"type", "object"}, record.body  # pulled or watched: the object


def test_every_event_carries_its_farthest_owner_read_from_the_api(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """rootOwnerReference {apiVersion, kind, name, namespace, uid} on every Event: a Pod's and
    its ReplicaSet's is the Deployment, a Job's pod's and the Job's is the CronJob, a workload
    without owners is its own. An Event about an object that cannot be read (it does not exist)
    is sent all the same, with what it says."""
    monitored = namespaces["monitored"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    settings = local_settings(sink.url, namespace)
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    deploy, pod = owned_pod(kube, monitored)
    replicaset = kube.get(REPLICASETS, "shop-5d8f7c9b4", monitored)
    cronjob, job, job_pod = cron_chain(kube, monitored)
    gone = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "gone-7f9c", "namespace": monitored,
                         "uid": str(uuid.uuid4())}}  # fmt: skip
    expected = {
        "shop-pod.started": reference(deploy),
        "shop-rs.scaled": reference(deploy),
        "shop.scaled": reference(deploy),
        "nightly-pod.started": reference(cronjob),
        "nightly-job.completed": reference(cronjob),
        "nightly.saw": reference(cronjob),
        "gone.deleted": reference(gone),
    }
    about = {"shop-pod.started": pod, "shop-rs.scaled": replicaset, "shop.scaled": deploy,
             "nightly-pod.started": job_pod, "nightly-job.completed": job,
             "nightly.saw": cronjob, "gone.deleted": gone}  # fmt: skip
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        for name, obj in about.items():
            event_about(kube, monitored, obj, name)
        wait_until(
            lambda: all(records_of(sink, EVENTS_SCOPE, "Event", name) for name in about),
            90,
            "every Event at the sink",
        )
    roots = {name: records_of(sink, EVENTS_SCOPE, "Event", name)[0].get("rootOwnerReference")
             for name in about}  # fmt: skip
    assert roots == expected


def test_the_object_version_an_event_names_arrives_as_an_object_record(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """Every object version an Event refers to (involvedObject.resourceVersion) reaches the
    backend as a record of scope lumigo-operator.k8s-objects whose body is that version."""
    monitored = namespaces["monitored"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    settings = local_settings(sink.url, namespace)
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    deploy, pod = owned_pod(kube, monitored)
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        # A version written while the collector runs, then one it finds at its start.
        labelled = kube.merge_patch(
            PODS, pod["metadata"]["name"], {"metadata": {"labels": {"seen": "yes"}}}, monitored
        )
        event_about(kube, monitored, labelled, "shop-pod.labelled", version=True)
        # Read again: where a Deployment controller runs (the session's full mode), it has
        # written the Deployment's status since its creation, and a version superseded before
        # the collector started can be sent by nobody (a GET returns the current one).
        deploy = kube.get(DEPLOYMENTS, deploy["metadata"]["name"], monitored)
        deploy.setdefault("apiVersion", "apps/v1")
        deploy.setdefault("kind", "Deployment")
        event_about(kube, monitored, deploy, "shop.created", version=True)

        def version_sent(obj: JSON) -> bool:
            meta = obj["metadata"]
            return any(
                body["metadata"]["uid"] == meta["uid"]
                and body["metadata"]["resourceVersion"] == meta["resourceVersion"]
                for body in records_of(sink, OBJECTS_SCOPE, obj["kind"], meta["name"])
            )

        wait_until(
            lambda: version_sent(labelled) and version_sent(deploy),
            90,
            "the versions both Events name, as object records",
        )
    assert records_of(sink, EVENTS_SCOPE, "Event", "shop-pod.labelled")


def test_an_event_naming_another_namespaces_object_reads_nothing_there(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """Whoever can write Events in a monitored namespace writes their involvedObject too (the
    API only checks that its namespace is the Event's own): one naming, by name and uid, a pod
    that exists only in another namespace is sent, and nothing of that namespace is read or
    sent with it."""
    monitored, other = namespaces["monitored"], namespaces["other"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    settings = local_settings(sink.url, namespace)
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    their_deploy, their_pod = owned_pod(kube, other)
    their_replicaset = kube.get(REPLICASETS, "shop-5d8f7c9b4", other)
    meta = their_pod["metadata"]
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        event_about(kube, monitored, {**their_pod, "metadata": {**meta, "namespace": monitored}},
                    "theirs.ours", version=True)  # fmt: skip
        deployment(kube, monitored, "barrier")  # after both Events, in the same namespace
        wait_until(
            lambda: (
                records_of(sink, EVENTS_SCOPE, "Event", "theirs.ours")
                and records_of(sink, OBJECTS_SCOPE, "Deployment", "barrier")
            ),
            90,
            "the Event and the barrier Deployment at the sink",
        )
    # Read in the Event's own namespace, where no such pod is: the pod as the Event names it.
    as_named = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": monitored,
                "uid": meta["uid"]}  # fmt: skip
    (event,) = records_of(sink, EVENTS_SCOPE, "Event", "theirs.ours")
    assert event["rootOwnerReference"] == as_named
    sent = json.dumps([[r.body, r.resource] for r in sink.logs()])
    for obj in (their_deploy, their_replicaset):
        leaked = [[r.resource, r.body] for r in sink.logs() if obj["metadata"]["uid"] in
                  json.dumps([r.body, r.resource])]  # fmt: skip
        assert obj["metadata"]["uid"] not in sent, leaked
    assert all((r.body.get("metadata") or {}).get("namespace") == monitored for r in sink.logs())
    assert not records_of(sink, OBJECTS_SCOPE, "Pod", meta["name"])


def test_only_events_about_the_collected_kinds_naming_a_uid_are_sent(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    """As the reference: an Event about another kind (a ConfigMap) or naming no uid (as the
    operator's webhook posts) is not sent; one about a Pod is."""
    monitored = namespaces["monitored"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    settings = local_settings(sink.url, namespace)
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    _, pod = owned_pod(kube, monitored)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "settings", "uid": str(uuid.uuid4())}}  # fmt: skip
    no_uid = {**pod, "metadata": {**pod["metadata"], "uid": ""}}
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        event_about(kube, monitored, configmap, "settings.changed")
        event_about(kube, monitored, no_uid, "shop-pod.injected")
        event_about(kube, monitored, pod, "shop-pod.started")  # after both
        wait_until(
            lambda: records_of(sink, EVENTS_SCOPE, "Event", "shop-pod.started"),
            90,
            "the Event about the Pod at the sink",
        )
    assert not seen(sink, "Event", "settings.changed")
    assert not seen(sink, "Event", "shop-pod.injected")


SECRET = "s3cr3t-never-upstream"  # every literal env value and sensitive annotation below
SENSITIVE = "secrets.example.com/db-password"
REDACTING = Redaction(env_values=True, annotations=(r"secrets\.example\.com/.*",))


def container(name: str, *, port: int | None = None) -> JSON:
    return {
        "name": name,
        "image": "python:3.12",
        "env": [
            {"name": "DB_PASSWORD", "value": SECRET},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "token"}}},
        ],
        **({"ports": [{"containerPort": port}]} if port else {}),
    }


def pod_template(app: str) -> JSON:
    return {
        "metadata": {
            "labels": {"app": app},
            "annotations": {SENSITIVE: SECRET, "team": "payments"},
        },
        "spec": {"containers": [container("app", port=8080)], "restartPolicy": "OnFailure"},
    }


def sensitive_objects(cluster: LocalCluster, kube: KubeClient, namespace: str) -> None:
    """What teams really write: literal env values and a credential in an annotation, on a Pod
    (containers, initContainers, and an ephemeral container added later), a Pod with more
    containers than the per-container statements cover, a Deployment applied with kubectl (so
    it has a last-applied-configuration, env and all) and a CronJob."""
    metadata = {"name": "db-client", "annotations": {SENSITIVE: SECRET, "team": "payments"}}
    kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "initContainers": [container("migrate")],
                "containers": [container("app", port=8080), container("sidecar")],
            },
        },
        namespace,
    )
    debug = {**container("debugger"), "targetContainerName": "app"}

    def with_debugger(pod: JSON) -> JSON:
        pod["spec"]["ephemeralContainers"] = [debug]
        return pod

    # (The scheduler and the kubelet write the pod meanwhile: retry on conflict.)
    kube.update_with_retry(
        PODS, "db-client", namespace, with_debugger, subresource="ephemeralcontainers"
    )
    many = [container(f"c{i}", port=9000 + i) for i in range(10)]
    kube.create(
        PODS,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "many"},
         "spec": {"containers": many}},
        namespace,
    )  # fmt: skip
    deploy = one_container_deployment("web", "python:3.12")
    deploy["metadata"]["annotations"] = {SENSITIVE: SECRET}
    deploy["spec"]["template"] = pod_template("web")
    deploy["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(deploy))
    kube.create(
        CRONJOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "nightly"},
            "spec": {
                "schedule": "0 3 * * *",
                "jobTemplate": {
                    "metadata": {"annotations": {SENSITIVE: SECRET}},
                    "spec": {"template": pod_template("nightly")},
                },
            },
        },
        namespace,
    )


def env_lists(spec: JSON) -> list[list[JSON]]:
    return [
        c.get("env", [])
        for name in ("containers", "initContainers", "ephemeralContainers")
        for c in spec.get(name) or []
    ]


@pytest.mark.parametrize("redacting", [True, False], ids=["redacting", "as-the-reference"])
def test_literal_env_values_and_chosen_annotations_leave_redacted_when_asked(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    namespaces: dict[str, str],
    sink: OTLPSink,
    tmp_path: Path,
    redacting: bool,
) -> None:
    """Issue 28 item 10, with the real collector: with redaction on, every literal env value
    (containers, init and ephemeral containers, pod templates, a CronJob's job template) and
    every annotation matching a pattern reaches the upstream as [REDACTED], and so does kubectl's
    last-applied-configuration whole; names, valueFrom references, other annotations and numbers
    are as they were.
    Off (the default, as the reference), the objects arrive whole."""
    monitored = namespaces["monitored"]
    uid = kube.get(NAMESPACES, monitored)["metadata"]["uid"]
    redaction = REDACTING if redacting else Redaction()
    settings = local_settings(sink.url, namespace, redaction=redaction)
    config = render([MonitoredNamespace(monitored, uid, random_token())], settings)
    with running_collector(config, tmp_path, settings.health_port, cluster.env()):
        sensitive_objects(cluster, kube, monitored)

        def arrived() -> bool:
            pods = seen(sink, "Pod", "db-client")
            return bool(
                any(the_object(p)["spec"].get("ephemeralContainers") for p in pods)
                and seen(sink, "Pod", "many")
                and seen(sink, "Deployment", "web")
                and seen(sink, "CronJob", "nightly")
            )

        wait_until(arrived, 90, "the Pods (one with its ephemeral container), the Deployment "
                   "and the CronJob at the sink")  # fmt: skip

    expected = REDACTED if redacting else SECRET
    pods = [the_object(p) for p in seen(sink, "Pod", "db-client")]
    pod = next(p for p in pods if p["spec"].get("ephemeralContainers"))
    many = the_object(seen(sink, "Pod", "many")[-1])
    deploy = the_object(seen(sink, "Deployment", "web")[-1])
    cronjob = the_object(seen(sink, "CronJob", "nightly")[-1])
    specs = {
        "pod": pod["spec"],
        "many": many["spec"],
        "deployment": deploy["spec"]["template"]["spec"],
        "cronjob": cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"],
    }
    for where, spec in specs.items():
        envs = env_lists(spec)
        assert len(envs) == {"pod": 4, "many": 10}.get(where, 1), where
        for env in envs:
            assert env[0] == {"name": "DB_PASSWORD", "value": expected}, where
            assert env[1] == {"name": "TOKEN", "valueFrom": {"secretKeyRef": {
                "name": "db", "key": "token"}}}, where  # fmt: skip
    # Numbers stay integers through the per-container rewrite. A list of more than 8 containers
    # goes through its JSON whole: its numbers come back as doubles (the documented price).
    port = specs["pod"]["containers"][0]["ports"][0]["containerPort"]
    assert port == 8080
    assert isinstance(port, int)
    assert [c["ports"][0]["containerPort"] for c in specs["many"]["containers"]] == [
        9000 + i for i in range(10)
    ]
    for found in (
        pod["metadata"]["annotations"],
        deploy["metadata"]["annotations"],
        deploy["spec"]["template"]["metadata"]["annotations"],
        cronjob["spec"]["jobTemplate"]["metadata"]["annotations"],
        cronjob["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"],
    ):
        assert found[SENSITIVE] == expected
    assert pod["metadata"]["annotations"]["team"] == "payments"
    applied = deploy["metadata"]["annotations"][LAST_APPLIED]
    if redacting:  # kubectl's copy of the applied object: its env values and annotations too
        assert applied == REDACTED
    else:
        applied_spec = json.loads(applied)["spec"]["template"]["spec"]
        assert env_lists(applied_spec)[0][0]["value"] == SECRET
    leaked = [r for r in sink.logs() if SECRET in json.dumps(r.body)]
    assert bool(leaked) is not redacting, [the_object(r)["metadata"]["name"] for r in leaked]
