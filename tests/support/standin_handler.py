"""A stand-in admission handler doing the work a real injection does, for server tests/bench.

It parses and validates the AdmissionReview like the real handlers (400 on anything unusable)
and builds a comparable JSON patch (volume, init container, env and mount per container), so
the server's fuzz test and the direct benchmark exercise realistic request handling until the
real handlers (webhook-core) are wired in.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from kube.http.routing import BadRequest

INJECTED_ENV = (
    ("LD_PRELOAD", "/opt/lumigo/injector/lumigo_injector.so"),
    ("LUMIGO_ENDPOINT", "http://lumigo-telemetry-proxy.lumigo-system.svc.cluster.local/v1/traces"),
    (
        "LUMIGO_LOGS_ENDPOINT",
        "http://lumigo-telemetry-proxy.lumigo-system.svc.cluster.local/v1/logs",
    ),
    ("LUMIGO_ENABLE_TRACES", "true"),
    ("LUMIGO_ENABLE_LOGS", "false"),
)


def _review(uid: str, patch: list[dict[str, Any]] | None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def handle(body: bytes, content_type: str) -> Mapping[str, Any]:
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise BadRequest(f"Content-Type must be application/json, not {content_type[:60]!r}")
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadRequest("the body is not an AdmissionReview")
    if review.get("apiVersion") != "admission.k8s.io/v1":
        raise BadRequest("only admission.k8s.io/v1 AdmissionReviews are supported")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadRequest("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest("request.uid is missing")
    if request.get("operation") == "DELETE":
        return _review(uid, None)
    try:
        patch = _patch(request.get("object"))
    except (KeyError, TypeError, IndexError, AttributeError, ValueError):
        raise BadRequest(
            "request.object does not decode as a workload with a pod template"
        ) from None
    return _review(uid, patch)


def _patch(obj: Any) -> list[dict[str, Any]]:
    if obj.get("kind") == "CronJob":
        spec, base = (
            obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            "/spec/jobTemplate/spec",
        )
    else:
        spec, base = obj["spec"]["template"]["spec"], "/spec"
    base += "/template/spec"
    containers = spec["containers"]
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        raise TypeError("containers")

    def append(field: str, value: dict[str, Any]) -> dict[str, Any]:
        if isinstance(spec.get(field), list):
            return {"op": "add", "path": f"{base}/{field}/-", "value": value}
        return {"op": "add", "path": f"{base}/{field}", "value": [value]}

    patch = [
        append("volumes", {"name": "lumigo-injector", "emptyDir": {"sizeLimit": "200M"}}),
        append(
            "initContainers",
            {
                "name": "lumigo-injector",
                "image": "public.ecr.aws/lumigo/lumigo-autotrace:latest",
                "env": [{"name": "TARGET_DIRECTORY", "value": "/target"}],
                "volumeMounts": [{"name": "lumigo-injector", "mountPath": "/target"}],
            },
        ),
    ]
    for i, container in enumerate(containers):
        env = list(container.get("env") or [])
        env += [{"name": k, "value": v} for k, v in INJECTED_ENV]
        env.append({"name": "LUMIGO_CONTAINER_NAME", "value": str(container.get("name", ""))})
        patch.append({"op": "add", "path": f"{base}/containers/{i}/env", "value": env})
        mounts = list(container.get("volumeMounts") or [])
        mounts.append({"name": "lumigo-injector", "mountPath": "/opt/lumigo", "readOnly": True})
        patch.append({"op": "add", "path": f"{base}/containers/{i}/volumeMounts", "value": mounts})
    return patch
