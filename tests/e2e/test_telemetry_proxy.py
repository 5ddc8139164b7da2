"""The telemetry proxy (the real collector, our rendered config) between a tracer and upstream.

Two tracers: a real Flask app under the injector (the payload `make payload` builds, the env the
webhook adds, LUMIGO_ENDPOINT pointing at the proxy), and a plain OTLP/HTTP protobuf client that
sends two tenants' spans. Both connect from 127.0.0.1, so the pod they "run in" is a Pod object
whose status.podIP is 127.0.0.1, owned by a ReplicaSet owned by a Deployment: the proxy must find
it by the connection's address, as in a cluster.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.kube import KubeClient
from controller.telemetry.config import MonitoredNamespace, Origin, render
from envtest.cluster import LocalCluster
from envtest.process import free_port, wait_until
from kube.kinds import DEPLOYMENTS, NAMESPACES, PODS, REPLICASETS
from tests.support.injector import (
    PROGRAMS,
    base_env,
    flask_python,
    python_interpreters,
    running_app,
    webhook_env,
)
from tests.support.lumigo import random_token
from tests.support.otel import (
    OTLPSink,
    export_request,
    flood_with_forged_tokens,
    local_settings,
    running_collector,
    running_sink,
    send_traces,
    wait_until_pod_known,
)

JSON = dict[str, Any]


@pytest.fixture
def sink() -> Iterator[OTLPSink]:
    with running_sink() as s:
        yield s


def tenant(namespace: str, token: str) -> MonitoredNamespace:
    """A namespace with an active Lumigo (no events collection): the proxy accepts its token."""
    return MonitoredNamespace(namespace, f"uid-{namespace}", token, kube_events=False)


def owned(obj: JSON, owner: JSON) -> JSON:
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    return obj


def app_pod_on_loopback(
    kube: KubeClient, namespace: str, ip: str = "127.0.0.1", app: str = "checkout"
) -> dict[str, JSON]:
    """Deployment -> ReplicaSet -> Pod (podIP `ip`), as the controllers would leave them.

    With the full control plane running, the real controllers act on these objects too, so the
    order matters: the Deployment is paused (its controller creates no ReplicaSet of its own),
    and the Pod is Running before its ReplicaSet exists. The ReplicaSet controller then adopts it
    and, should it have created a Pending pod in the meantime, deletes that one rather than ours
    (it removes the least advanced pods first). No scheduler claims the Pod, so it is never bound
    and keeps the loopback address.
    """
    labels = {"app": app}
    template = {
        "metadata": {"labels": labels},
        "spec": {
            "schedulerName": "tests.lumigo.io/none",
            "containers": [{"name": "app", "image": "python:3.12"}],
        },
    }
    spec = {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}
    deployment = kube.create(
        DEPLOYMENTS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": app, "namespace": namespace},
            "spec": {**spec, "paused": True},
        },
        namespace,
    )
    deployment.setdefault("apiVersion", "apps/v1")
    deployment.setdefault("kind", "Deployment")
    pod_name = f"{app}-7c9d8-{uuid.uuid4().hex[:5]}"
    pod_body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels},
        "spec": template["spec"],
    }
    kube.create(PODS, pod_body, namespace)
    status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    kube.merge_patch(PODS, pod_name, {"status": status}, namespace, "status")
    rs_body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        # Labelled like the pods: the deployment controller (full control plane) would otherwise
        # release it from the Deployment.
        "metadata": {"name": f"{app}-7c9d8", "namespace": namespace, "labels": labels},
        "spec": spec,
    }
    replicaset = kube.create(REPLICASETS, owned(rs_body, deployment), namespace)
    replicaset.setdefault("apiVersion", "apps/v1")
    replicaset.setdefault("kind", "ReplicaSet")
    # What the ReplicaSet controller's adoption does; done here too for the minimal control plane.
    adopt = owned({"metadata": {}}, replicaset)
    pod = kube.merge_patch(PODS, pod_name, adopt, namespace)
    return {"deployment": deployment, "replicaset": replicaset, "pod": pod}


def test_spans_reach_upstream_enriched_with_their_own_authorization(
    cluster: LocalCluster, kube: KubeClient, namespace: str, sink: OTLPSink, tmp_path: Path
) -> None:
    objects = app_pod_on_loopback(kube, namespace)
    cluster_uid = kube.get(NAMESPACES, "kube-system")["metadata"]["uid"]
    settings = local_settings(sink.url, namespace, origin=Origin("local-test", cluster_uid))
    token_a, token_b = random_token(), random_token()
    # Two tenants; the pod is in token_a's namespace only.
    tenants = [tenant(namespace, token_a), tenant("elsewhere", token_b)]

    try:
        with running_collector(
            render(tenants, settings), tmp_path, settings.health_port, cluster.env()
        ):
            wait_until_pod_known(
                settings.otlp_port,
                sink,
                objects["pod"]["metadata"]["name"],
                f"LumigoToken {token_a}",
            )
            a, b = export_request("GET /a"), export_request("GET /b")
            assert send_traces(settings.otlp_port, a, f"LumigoToken {token_a}") == 200
            assert send_traces(settings.otlp_port, b, f"LumigoToken {token_b}") == 200
            wait_until(
                lambda: {s.name for s in sink.spans()} >= {"GET /a", "GET /b"},
                60,
                "both spans at the upstream sink",
            )
    finally:
        # No other test's proxy may match this loopback pod.
        kube.delete(PODS, objects["pod"]["metadata"]["name"], namespace)

    spans = {s.name: s for s in sink.spans()}
    # Tenancy per request: each batch keeps the Authorization it came with.
    assert spans["GET /a"].authorization == f"LumigoToken {token_a}"
    assert spans["GET /b"].authorization == f"LumigoToken {token_b}"
    # The pod is not in token_b's namespace: its data carries nothing of that pod.
    assert not any(key.startswith("k8s.pod.") for key in spans["GET /b"].resource)
    assert "k8s.namespace.name" not in spans["GET /b"].resource
    resource = spans["GET /a"].resource
    pod, rs, deployment = objects["pod"], objects["replicaset"], objects["deployment"]
    assert resource["service.name"] == "checkout"
    assert resource["k8s.namespace.name"] == namespace
    assert resource["k8s.pod.name"] == pod["metadata"]["name"]
    assert resource["k8s.pod.uid"] == pod["metadata"]["uid"]
    assert resource["k8s.replicaset.name"] == rs["metadata"]["name"]
    assert resource["k8s.replicaset.uid"] == rs["metadata"]["uid"]
    assert resource["k8s.deployment.name"] == "checkout"
    assert resource["k8s.deployment.uid"] == deployment["metadata"]["uid"]
    assert resource["k8s.cluster.uid"] == cluster_uid
    assert resource["k8s.cluster.name"] == "local-test"
    # The namespace's UID, as the reference's enricher sets it (the operator knows it).
    assert resource["k8s.namespace.uid"] == f"uid-{namespace}"
    assert "k8s.namespace.uid" not in spans["GET /b"].resource
    assert resource["lumigo.k8s_operator.version"] == "dev"


def test_injected_python_app_is_traced_through_the_proxy(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    namespace: str,
    sink: OTLPSink,
    injector_payload: Path,
    tmp_path: Path,
) -> None:
    objects = app_pod_on_loopback(kube, namespace)
    settings = local_settings(
        sink.url, namespace, origin=Origin("local-test", "uid-of-kube-system")
    )
    token = random_token()
    python = flask_python(python_interpreters()["3.11"])
    env = {
        **base_env(tmp_path),
        **webhook_env(
            injector_payload, f"http://127.0.0.1:{settings.otlp_port}/v1/traces", "app", token
        ),
    }
    config = render([tenant(namespace, token)], settings)
    try:
        with (
            running_collector(config, tmp_path, settings.health_port, cluster.env()),
            running_app([str(python), str(PROGRAMS / "flask_app.py")], env, tmp_path) as app,
        ):
            wait_until_pod_known(
                settings.otlp_port, sink, objects["pod"]["metadata"]["name"], f"LumigoToken {token}"
            )
            assert app.get("/hello")[0] == 200
            wait_until(
                lambda: any("/hello" in s.name for s in sink.spans()),
                90,
                f"the app's span at the upstream sink; app output:\n{app.output()[-2000:]}",
            )
    finally:
        kube.delete(PODS, objects["pod"]["metadata"]["name"], namespace)
    span = next(s for s in sink.spans() if "/hello" in s.name)
    assert span.authorization == f"LumigoToken {token}"
    assert span.resource["k8s.pod.name"] == objects["pod"]["metadata"]["name"]
    assert span.resource["k8s.deployment.name"] == "checkout"
    assert span.resource["k8s.deployment.uid"] == objects["deployment"]["metadata"]["uid"]
    assert span.resource["k8s.cluster.uid"] == "uid-of-kube-system"


def test_unreachable_upstream_does_not_break_the_proxy(
    cluster: LocalCluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """Upstream refuses connections: the proxy keeps accepting and says why in its logs."""
    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = local_settings(refused, namespace)
    token = random_token()
    config = render([tenant(namespace, token)], settings)
    with running_collector(config, tmp_path, settings.health_port, cluster.env()) as proxy:
        for i in range(3):
            status = send_traces(
                settings.otlp_port, export_request(f"op-{i}"), f"LumigoToken {token}"
            )
            assert status == 200  # queued for retry; the tracer is never blocked or failed
        wait_until(
            lambda: "connection refused" in proxy.log_text(),
            60,
            "the export failure in the proxy's log",
        )
        assert proxy.alive()
        assert proxy.healthy()
        assert token not in proxy.log_text()


FORGED_REQUESTS = 10_000


def test_forged_tokens_are_refused_and_never_block_a_tenant(
    cluster: LocalCluster, namespace: str, sink: OTLPSink, tmp_path: Path
) -> None:
    """10,000 requests with random tokens (a hostile pod) are refused with 401 and never reach
    upstream; a namespace whose tracers start sending during and after the flood (a tenant the
    proxy has never seen before) gets every span through. Before, the proxy batched by the
    Authorization header with a lifetime limit of 1,000 values: the flood made it refuse every
    new tenant until it restarted."""
    settings = local_settings(sink.url, namespace)
    token = random_token()
    config = render([tenant(namespace, token)], settings)
    legit: list[str] = []
    refused: list[int] = []
    done = threading.Event()

    def legitimate_tracer() -> None:
        i = 0
        while not done.is_set():
            name = f"legit-{i}"
            status = send_traces(settings.otlp_port, export_request(name), f"LumigoToken {token}")
            (legit if status == 200 else refused).append(status if status != 200 else i)
            i += 1
            time.sleep(0.02)

    with running_collector(config, tmp_path, settings.health_port, cluster.env()) as proxy:
        tracer = threading.Thread(target=legitimate_tracer)
        tracer.start()
        try:
            statuses = flood_with_forged_tokens(settings.otlp_port, FORGED_REQUESTS)
        finally:
            done.set()
            tracer.join()
        after = send_traces(settings.otlp_port, export_request("after"), f"LumigoToken {token}")
        expected = {f"legit-{i}" for i in legit} | {"after"}
        wait_until(
            lambda: expected <= {s.name for s in sink.spans()},
            60,
            "every legitimate span at the upstream sink",
        )
        assert proxy.alive()

    assert statuses == Counter({401: FORGED_REQUESTS})
    assert refused == []
    assert after == 200
    assert len(legit) > 0
    assert {s.authorization for s in sink.spans()} == {f"LumigoToken {token}"}


def test_a_tenant_that_fills_its_queue_is_refused_alone(
    cluster: LocalCluster, namespace: str, sink: OTLPSink, tmp_path: Path
) -> None:
    """Upstream is down: a noisy tenant fills its own bounded queue and is refused (its tracers
    drop data), while a quiet tenant's spans are still accepted, kept, and delivered once
    upstream is back. Before, one shared queue held every tenant's data."""
    settings = local_settings(sink.url, namespace, tenant_queue_bytes=256 << 10)
    noisy, quiet = random_token(), random_token()
    tenants = [tenant(namespace, noisy), tenant("quiet", quiet)]
    padding = {"padding": "x" * 16_384}
    with running_collector(
        render(tenants, settings), tmp_path, settings.health_port, cluster.env()
    ):
        with sink.outage():
            statuses = []
            for i in range(2_000):
                status = send_traces(
                    settings.otlp_port,
                    export_request(f"noisy-{i}", padding, spans=10),
                    f"LumigoToken {noisy}",
                )
                statuses.append(status)
                if status != 200:
                    break
            quiet_status = send_traces(
                settings.otlp_port, export_request("quiet", padding), f"LumigoToken {quiet}"
            )
        wait_until(
            lambda: "quiet" in {s.name for s in sink.spans()},
            120,
            "the quiet tenant's span at the upstream sink once it is back",
        )
    assert statuses[-1] != 200, "the noisy tenant's queue never filled"
    assert quiet_status == 200


def test_a_client_cannot_claim_another_namespaces_pod(
    cluster: LocalCluster, kube: KubeClient, namespace: str, sink: OTLPSink, tmp_path: Path
) -> None:
    """A pod sends spans whose resource names another namespace's pod (its uid, ip, namespace,
    deployment, node): the proxy finds the sender by its connection's address and keeps nothing
    the client claimed. Before, k8s.pod.uid sent by the client picked the pod, and attributes
    the client set were never overwritten."""
    victim_ns = f"{namespace}-victim"
    cluster.kubectl("create", "namespace", victim_ns)
    attacker = app_pod_on_loopback(kube, namespace, ip="127.0.0.2", app="attacker")
    victim = app_pod_on_loopback(kube, victim_ns, ip="127.0.0.3", app="victim")
    settings = local_settings(sink.url, namespace)
    token, victim_token = random_token(), random_token()
    tenants = [tenant(namespace, token), tenant(victim_ns, victim_token)]
    victim_pod = victim["pod"]["metadata"]
    claims = {
        "k8s.pod.uid": victim_pod["uid"],
        "k8s.pod.ip": "127.0.0.3",
        "k8s.pod.name": victim_pod["name"],
        "k8s.namespace.name": victim_ns,
        "k8s.deployment.name": "victim",
        "k8s.deployment.uid": victim["deployment"]["metadata"]["uid"],
        "k8s.replicaset.uid": victim["replicaset"]["metadata"]["uid"],
        "k8s.node.name": "victim-node",
    }
    auth = f"LumigoToken {token}"
    try:
        with running_collector(
            render(tenants, settings), tmp_path, settings.health_port, cluster.env()
        ):
            attacker_pod = attacker["pod"]["metadata"]["name"]
            wait_until_pod_known(settings.otlp_port, sink, attacker_pod, auth, source="127.0.0.2")
            port = settings.otlp_port
            # From the attacker's own pod, and from an address no pod has.
            assert send_traces(port, export_request("from-pod", claims), auth, "127.0.0.2") == 200
            assert send_traces(port, export_request("no-pod", claims), auth, "127.0.0.4") == 200
            wait_until(
                lambda: {"from-pod", "no-pod"} <= {s.name for s in sink.spans()},
                60,
                "both spans at the upstream sink",
            )
    finally:
        kube.delete(PODS, attacker["pod"]["metadata"]["name"], namespace)
        kube.delete(PODS, victim_pod["name"], victim_ns)
        cluster.kubectl("delete", "namespace", victim_ns, "--wait=false", check=False)

    spans = {s.name: s for s in sink.spans()}
    own = spans["from-pod"].resource
    assert own["k8s.pod.name"] == attacker_pod
    assert own["k8s.pod.uid"] == attacker["pod"]["metadata"]["uid"]
    assert own["k8s.namespace.name"] == namespace
    assert own["k8s.deployment.name"] == "attacker"
    assert own.get("k8s.node.name", "") == ""  # the attacker's pod is not bound to a node
    unknown = spans["no-pod"].resource
    # Only what the proxy itself adds: the cluster.
    assert not [k for k in unknown if k.startswith("k8s.") and not k.startswith("k8s.cluster.")]
    for resource in (own, unknown):
        claimed = set(claims.values()) - {namespace}
        assert not claimed & {str(v) for v in resource.values()}, resource
