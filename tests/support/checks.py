"""Checks on Lumigo resources and workloads, shared by the operator's end-to-end tests."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from kube.kinds import EVENTS
from kube.rest import Resource
from tests.support.workloads import init_container_names, pod_spec, workload

TOKEN = "t_123456789012345678901"
LABEL = "lumigo-operator.v0.1.0-test"  # the version the test operator runs with
JSON = dict[str, Any]


def lumigo_yaml(**spec: Any) -> str:
    body = {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": "lumigo"},
        "spec": {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}},
                 **spec},
    }  # fmt: skip
    return json.dumps(body)


def status(kube: KubeClient, namespace: str, name: str = "lumigo") -> JSON:
    return kube.get(LUMIGOES, name, namespace).get("status") or {}


def condition(kube: KubeClient, namespace: str, type_: str, name: str = "lumigo") -> JSON | None:
    return next(
        (c for c in status(kube, namespace, name).get("conditions", []) if c["type"] == type_),
        None,
    )


def is_active(kube: KubeClient, namespace: str, name: str = "lumigo") -> bool:
    active = condition(kube, namespace, "Active", name)
    return active is not None and active["status"] == "True"


def instrumented(obj: JSON) -> bool:
    labels = obj["metadata"].get("labels") or {}
    template_labels = (
        obj["spec"]["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob"
        else obj["spec"]["template"]
    )["metadata"].get("labels") or {}  # fmt: skip
    return (
        labels.get(constants.LABEL_AUTO_TRACE) == LABEL
        and template_labels.get(constants.LABEL_AUTO_TRACE) == LABEL
        and init_container_names(obj).count("lumigo-injector") == 1
        and all(
            [e["name"] for e in c.get("env", [])].count("LD_PRELOAD") == 1
            for c in pod_spec(obj)["containers"]
        )
    )


def clean(obj: JSON) -> bool:
    """Nothing of ours: no instrumentation label value, init container, volume, mounts, env.
    (A user's own `lumigo.auto-trace: "false"` is theirs, not ours.)"""
    spec = pod_spec(obj)
    text = json.dumps(spec)
    label = (obj["metadata"].get("labels") or {}).get(constants.LABEL_AUTO_TRACE, "false")
    return (
        label.lower() == "false"
        and "lumigo-injector" not in text
        and "LUMIGO_" not in text
        and "/opt/lumigo" not in text
    )


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def events_of(kube: KubeClient, namespace: str, name: str) -> list[JSON]:
    """The operator's events about `name` (kube-controller-manager adds its own)."""
    items, _ = kube.list(EVENTS, namespace, field_selector=f"involvedObject.name={name}")
    return [e for e in items if e.get("reason", "").startswith("Lumigo")]


def has_event(kube: KubeClient, namespace: str, name: str, reason: str, text: str = "") -> bool:
    return any(
        e["reason"] == reason and text in e["message"] for e in events_of(kube, namespace, name)
    )


def create(kube: KubeClient, namespace: str, resource: Resource, name: str, **labels: str) -> JSON:
    return kube.create(resource, workload(resource, name, labels or None), namespace)
