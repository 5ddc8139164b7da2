"""The webhook handlers against a real kube-apiserver (called directly, not over HTTPS).

What only the real API server can tell: that the patch the inject handler answers is accepted for
each of the six kinds, that the object it stores is injected, that re-injecting the *stored*
object (with the server's defaults filled in) is a no-op — otherwise every update of a workload
would be patched again and emit an event — that removal gives back an object the server accepts,
and that the ReplicaSet controller can create pods from an injected template.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from api import constants
from envtest.cluster import KubectlError, LocalCluster
from envtest.process import wait_until
from kube.jsonpatch import apply
from webhook import pod_injection
from webhook.admission_review import AdmissionResponse, parse_review
from webhook.inject_handler import InjectHandler
from webhook.lumigo_defaulter import MutateHandler
from webhook.pod_injection import InjectionSettings

JSON = dict[str, Any]
SETTINGS = InjectionSettings(operator_version="0.1.0-test", injector_image="example/injector:1")
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


class ApiLister:
    """The Lumigo lister backed by the real API server (the manager backs it with a cache)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def list(self, namespace: str) -> list[JSON]:
        path = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}"
        items: list[JSON] = self.cluster.request(path)["items"]
        return items


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str]] = []

    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        self.recorded.append((type, reason))


def kubectl_json(cluster: LocalCluster, *args: str, obj: JSON | None = None) -> JSON:
    out = cluster.kubectl(*args, "-o", "json", input=json.dumps(obj) if obj else None)
    result: JSON = json.loads(out)
    return result


def admission_body(obj: JSON, operation: str = "CREATE") -> bytes:
    group, _, version = obj["apiVersion"].rpartition("/")
    request = {
        "uid": "e2a7b5c4-0000-4000-8000-000000000001",
        "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "namespace": obj["metadata"]["namespace"],
        "name": obj["metadata"]["name"],
        "operation": operation,
        "object": obj,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def patch_of(response: AdmissionResponse) -> list[JSON]:
    payload = response.review()["response"]
    if "patch" not in payload:
        return []
    ops: list[JSON] = json.loads(base64.b64decode(payload["patch"]))
    return ops


def creatable(obj: JSON) -> JSON:
    """A dry-run result turned back into something `kubectl create` accepts."""
    out = json.loads(json.dumps(obj))
    for key in SERVER_FIELDS:
        out["metadata"].pop(key, None)
    out.pop("status", None)
    if out["kind"] == "Job":  # the selector and these labels are generated from the Job's uid
        out["spec"].pop("selector", None)
        labels = out["spec"]["template"]["metadata"]["labels"]
        for key in ("controller-uid", "job-name"):
            labels.pop(key, None)
            labels.pop(f"batch.kubernetes.io/{key}", None)
    return out


LIMITS = {"limits": {"cpu": "100m", "memory": "64Mi"}}
FROM_CONFIG_MAP = {"configMapKeyRef": {"name": "preload", "key": "libs", "optional": True}}


def template(app: str, restart: str | None = None, **extra: Any) -> JSON:
    """Three containers (two with their own LD_PRELOAD), an init container, all Guaranteed."""
    spec: JSON = {
        "securityContext": {"runAsNonRoot": True, "fsGroup": 2000},
        "containers": [
            {
                "name": "web",
                "image": "example/shop:1",
                "env": [
                    {"name": "LD_PRELOAD", "valueFrom": FROM_CONFIG_MAP},
                    {"name": "PORT", "value": "8000"},
                ],
                "resources": {"limits": {"cpu": "1", "memory": "256Mi"}},
            },
            {
                "name": "worker",
                "image": "example/shop:1",
                "env": [{"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so.2"}],
                "resources": LIMITS,
            },
            {"name": "exporter", "image": "example/exporter:1", "resources": LIMITS},
        ],
        "initContainers": [
            {
                "name": "migrate",
                "image": "example/shop:1",
                "env": [{"name": "X", "value": "1"}],
                "resources": LIMITS,
            }
        ],
        **extra,
    }
    if restart:
        spec["restartPolicy"] = restart
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def manifest(kind: str, name: str, namespace: str) -> JSON:
    selector = {"matchLabels": {"app": name}}
    if kind == "CronJob":
        spec: JSON = {
            "schedule": "0 0 * * *",
            "jobTemplate": {"spec": {"template": template(name, "Never")}},
        }
    elif kind == "Job":
        spec = {"template": template(name, "Never")}
    elif kind == "StatefulSet":
        spec = {"selector": selector, "serviceName": name, "template": template(name)}
    else:
        spec = {"selector": selector, "template": template(name)}
    api_version = pod_injection.SUPPORTED_KINDS[kind]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": spec,
    }


def pod_spec_of(obj: JSON) -> JSON:
    node = obj
    for key in (*pod_injection.pod_template_path(obj["kind"]), "spec"):
        node = node[key]
    return node


@pytest.fixture
def active_lumigo(cluster: LocalCluster, crd: Path, namespace: str) -> JSON:
    """A Lumigo resource in `namespace`, marked Active as the controller would."""
    cr = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "lumigo", "namespace": namespace},
        "spec": {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(cr))
    now = "2026-01-01T00:00:00Z"
    status = {
        "status": {
            "conditions": [
                {"type": "Active", "status": "True", "lastUpdateTime": now,
                 "lastTransitionTime": now, "message": "Lumigo is ready"},
            ],
            "instrumentedResources": [],
        }
    }  # fmt: skip
    cluster.kubectl(
        "patch", "lumigo", "lumigo", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip
    return kubectl_json(cluster, "get", "lumigo", "lumigo", "-n", namespace)


@pytest.mark.parametrize(
    "kind", ["DaemonSet", "Deployment", "ReplicaSet", "StatefulSet", "CronJob", "Job"]
)
def test_the_injected_object_is_accepted_stored_and_stable(
    cluster: LocalCluster, namespace: str, active_lumigo: JSON, kind: str
) -> None:
    events = Events()
    handler = InjectHandler(ApiLister(cluster), events, SETTINGS)
    name = f"{kind.lower()}-app"
    # What the webhook sees on CREATE: the object with the API server's defaults applied.
    seen = kubectl_json(
        cluster, "create", "--dry-run=server", "-f", "-", obj=manifest(kind, name, namespace)
    )
    response = handler.handle(parse_review(admission_body(seen), "application/json"))
    ops = patch_of(response)
    assert ops, response.message
    assert events.recorded == [("Normal", constants.REASON_ADDED)]

    created = kubectl_json(cluster, "create", "-f", "-", obj=creatable(apply(seen, ops)))
    stored = kubectl_json(cluster, "get", kind.lower(), name, "-n", namespace)
    assert stored["metadata"]["uid"] == created["metadata"]["uid"]
    assert stored["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == SETTINGS.label_value
    spec = pod_spec_of(stored)
    assert [c["name"] for c in spec["initContainers"]] == ["migrate", "lumigo-injector"]
    assert spec["initContainers"][0]["env"] == [{"name": "X", "value": "1"}]
    web, worker = spec["containers"][0]["env"], spec["containers"][1]["env"]
    assert web[0]["name"] == "LUMIGO_ORIGINAL_LD_PRELOAD"
    assert web[0]["valueFrom"]["configMapKeyRef"]["name"] == "preload"
    assert worker[0] == {"name": "LUMIGO_ORIGINAL_LD_PRELOAD", "value": "/usr/lib/libjemalloc.so.2"}
    assert worker[1] == {"name": "LD_PRELOAD", "value": pod_injection.CHAINED_LD_PRELOAD}
    # Every container is Guaranteed, so ours is too (requests == limits).
    init_resources = spec["initContainers"][1]["resources"]
    assert init_resources["requests"] == init_resources["limits"]

    # Re-injecting what the server stored is a no-op: no patch, no event on the next update.
    assert pod_injection.inject(stored, SETTINGS) == stored
    update = handler.handle(parse_review(admission_body(stored, "UPDATE"), "application/json"))
    assert patch_of(update) == []
    assert events.recorded == [("Normal", constants.REASON_ADDED)]

    # Removal gives back an object the server accepts, without anything of ours.
    cleaned = pod_injection.remove(stored)
    assert not pod_injection.is_instrumented(cleaned)
    if kind == "Job":  # why the webhook never patches a Job on UPDATE
        for _ in range(10):  # the Job controller may write the status meanwhile: re-read
            refused = cluster.kubectl("replace", "-f", "-", input=json.dumps(cleaned), check=False)
            if "Conflict" not in refused:
                break
            cleaned = pod_injection.remove(
                kubectl_json(cluster, "get", "job", name, "-n", namespace)
            )
        assert "field is immutable" in refused
        return
    # kube-controller-manager may write the status meanwhile: re-read and retry on a conflict.
    for _ in range(10):
        try:
            replaced = kubectl_json(cluster, "replace", "-f", "-", obj=cleaned)
            break
        except KubectlError as err:
            if "Conflict" not in err.output:
                raise
            cleaned = pod_injection.remove(kubectl_json(cluster, "get", kind.lower(), name, "-n",
                                                   namespace))  # fmt: skip
    else:
        raise AssertionError("kept conflicting with kube-controller-manager")
    assert constants.LABEL_AUTO_TRACE not in replaced["metadata"]["labels"]
    assert [c["name"] for c in pod_spec_of(replaced)["initContainers"]] == ["migrate"]
    assert pod_spec_of(replaced)["containers"] == pod_spec_of(seen)["containers"]


def test_unusual_pods_are_still_accepted(
    cluster: LocalCluster, namespace: str, active_lumigo: JSON
) -> None:
    """fsGroup 0 with runAsNonRoot, no securityContext at all, and pod-level resources."""
    handler = InjectHandler(ApiLister(cluster), Events(), SETTINGS)
    variants: list[tuple[str, dict[str, Any]]] = [
        ("fsgroup-zero", {"securityContext": {"fsGroup": 0, "runAsNonRoot": True}}),
        ("no-context", {"securityContext": None}),
        ("pod-resources", {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}),
    ]
    for name, extra in variants:
        obj = manifest("Deployment", name, namespace)
        obj["spec"]["template"]["spec"].update(extra)
        obj["spec"]["template"]["spec"] = {
            k: v for k, v in obj["spec"]["template"]["spec"].items() if v is not None
        }
        seen = kubectl_json(cluster, "create", "--dry-run=server", "-f", "-", obj=obj)
        ops = patch_of(handler.handle(parse_review(admission_body(seen), "application/json")))
        stored = kubectl_json(cluster, "create", "-f", "-", obj=creatable(apply(seen, ops)))
        init = pod_spec_of(stored)["initContainers"][-1]
        assert init["name"] == "lumigo-injector", name
        assert init["securityContext"]["runAsUser"] != 0, name
        assert pod_injection.inject(stored, SETTINGS) == stored, name


def test_pods_are_created_from_an_injected_template(
    full_cluster: LocalCluster, namespace: str, active_lumigo: JSON
) -> None:
    """The ReplicaSet controller's pods pass pod validation with our init container."""
    handler = InjectHandler(ApiLister(full_cluster), Events(), SETTINGS)
    obj = manifest("Deployment", "shop", namespace)
    seen = kubectl_json(full_cluster, "create", "--dry-run=server", "-f", "-", obj=obj)
    ops = patch_of(handler.handle(parse_review(admission_body(seen), "application/json")))
    full_cluster.kubectl("create", "-f", "-", input=json.dumps(creatable(apply(seen, ops))))

    def pods() -> list[JSON]:
        items: list[JSON] = kubectl_json(full_cluster, "get", "pods", "-n", namespace)["items"]
        return items

    wait_until(lambda: len(pods()) == 1, 60, "the Deployment's pod")
    (pod,) = pods()
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["migrate", "lumigo-injector"]
    assert pod["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == SETTINGS.label_value
    assert pod["status"].get("qosClass") == "Guaranteed"  # set by the API server on create


def test_the_defaulter_patch_is_accepted(cluster: LocalCluster, crd: Path, namespace: str) -> None:
    cr = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "lumigo", "namespace": namespace},
        "spec": {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}},
    }
    handler = MutateHandler(ApiLister(cluster))
    seen = kubectl_json(cluster, "create", "--dry-run=server", "-f", "-", obj=cr)
    response = handler.handle(parse_review(admission_body(seen), "application/json"))
    assert response.allowed
    stored = kubectl_json(
        cluster, "create", "-f", "-", obj=creatable(apply(seen, patch_of(response)))
    )
    assert stored["spec"]["tracing"]["injection"]["removeLumigoFromResourcesOnDeletion"] is True
    second = dict(cr, metadata={"name": "second", "namespace": namespace})
    response = handler.handle(parse_review(admission_body(second), "application/json"))
    assert not response.allowed
    assert response.message == (
        "There is already an instance of operator.lumigo.io/v1alpha1.Lumigo "
        f"in the '{namespace}' namespace"
    )
