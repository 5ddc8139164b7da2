"""The telemetry proxy (the real collector, our rendered config) between a tracer and upstream.

Two tracers: a real Flask app under the injector (the payload `make payload` builds, the env the
webhook adds, LUMIGO_ENDPOINT pointing at the proxy), and a plain OTLP/HTTP protobuf client that
sends two tenants' spans. Both connect from 127.0.0.1, so the pod they "run in" is a Pod object
whose status.podIP is 127.0.0.1, owned by a ReplicaSet owned by a Deployment: the proxy must find
it by the connection's address, as in a cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.kube import KubeClient
from controller.runtime.resources import DEPLOYMENTS, NAMESPACES, PODS, REPLICASETS
from controller.telemetry.config import Origin, render
from localcluster import LocalCluster, free_port, wait_until
from tests.e2e.injector_helpers import (
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


def app_pod_on_loopback(kube: KubeClient, namespace: str) -> dict[str, JSON]:
    """Deployment -> ReplicaSet -> Pod (podIP 127.0.0.1), as the controllers would leave them.

    With the full control plane running, the real controllers act on these objects too, so the
    order matters: the Deployment is paused (its controller creates no ReplicaSet of its own),
    and the Pod is Running before its ReplicaSet exists. The ReplicaSet controller then adopts it
    and, should it have created a Pending pod in the meantime, deletes that one rather than ours
    (it removes the least advanced pods first). No scheduler claims the Pod, so it is never bound
    and keeps the loopback address.
    """
    labels = {"app": "checkout"}
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
            "metadata": {"name": "checkout", "namespace": namespace},
            "spec": {**spec, "paused": True},
        },
        namespace,
    )
    deployment.setdefault("apiVersion", "apps/v1")
    deployment.setdefault("kind", "Deployment")
    pod_name = f"checkout-7c9d8-{uuid.uuid4().hex[:5]}"
    pod_body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels},
        "spec": template["spec"],
    }
    kube.create(PODS, pod_body, namespace)
    status = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
    kube.merge_patch(PODS, pod_name, {"status": status}, namespace, "status")
    rs_body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        # Labelled like the pods: the deployment controller (full control plane) would otherwise
        # release it from the Deployment.
        "metadata": {"name": "checkout-7c9d8", "namespace": namespace, "labels": labels},
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

    try:
        with running_collector(render([], settings), tmp_path, settings.health_port, cluster.env()):
            wait_until_pod_known(settings.otlp_port, sink, objects["pod"]["metadata"]["name"])
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
    try:
        with (
            running_collector(render([], settings), tmp_path, settings.health_port, cluster.env()),
            running_app([str(python), str(PROGRAMS / "flask_app.py")], env, tmp_path) as app,
        ):
            wait_until_pod_known(settings.otlp_port, sink, objects["pod"]["metadata"]["name"])
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
    config = render([], settings)
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
