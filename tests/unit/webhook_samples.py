"""Workload builders and hypothesis strategies for the webhook tests.

Generated objects are in the form the API server serialises (no empty lists or maps where Go
omits them) and never use the names the mutation reserves for itself.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from api import constants
from webhook.pod_injection import CHAINED_LD_PRELOAD

JSON = dict[str, Any]

RESERVED_ENV = {*constants.INJECTED_ENV_NAMES, constants.ENV_ORIGINAL_LD_PRELOAD}


def template_of(obj: JSON) -> JSON:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]  # type: ignore[no-any-return]
    return obj["spec"]["template"]  # type: ignore[no-any-return]


def workload(kind: str, template: JSON, name: str = "app", namespace: str = "ns") -> JSON:
    """A workload of `kind` around a pod template (copied)."""
    template = copy.deepcopy(template)
    api_version = "batch/v1" if kind in ("CronJob", "Job") else "apps/v1"
    obj: JSON = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
    }
    if kind == "CronJob":
        obj["spec"] = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}
    elif kind == "Job":
        obj["spec"] = {"template": template}
    else:
        obj["spec"] = {"selector": {"matchLabels": {"app": name}}, "template": template}
    return obj


def simple_template(**spec: Any) -> JSON:
    """One Python container; keyword arguments are added to the pod spec."""
    return {"spec": {"containers": [{"name": "app", "image": "python:3.12"}], **spec}}


def realistic_template() -> JSON:
    """Three containers (app, sidecar, metrics), an init container, volumes, probes, env."""
    return {
        "metadata": {"labels": {"app": "shop", "app.kubernetes.io/part-of": "shop"}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "fsGroup": 2000},
            "initContainers": [
                {
                    "name": "migrate",
                    "image": "registry.example.com/shop:1.2.3",
                    "command": ["python", "manage.py", "migrate"],
                    "env": [{"name": "DB_URL", "value": "postgres://db/shop"}],
                }
            ],
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example.com/shop:1.2.3",
                    "ports": [{"containerPort": 8000, "protocol": "TCP"}],
                    "env": [
                        {"name": "DB_URL", "value": "postgres://db/shop"},
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        },
                    ],
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "256Mi"},
                        "limits": {"cpu": "1", "memory": "512Mi"},
                    },
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/shop"}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8000}},
                },
                {
                    "name": "worker",
                    "image": "registry.example.com/shop:1.2.3",
                    "command": ["node", "worker.js"],
                    "env": [{"name": "QUEUE", "value": "orders"}],
                },
                {"name": "metrics", "image": "registry.example.com/exporter:0.9"},
            ],
            "volumes": [{"name": "config", "configMap": {"name": "shop-config"}}],
        },
    }


# --- hypothesis strategies -----------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True).filter(
    lambda n: n != constants.INJECTOR_VOLUME
)
env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in RESERVED_ENV
)
texts = st.text(max_size=12)
user_ld_preload_values = texts.filter(
    lambda v: v not in (constants.LD_PRELOAD_VALUE, CHAINED_LD_PRELOAD)
)
value_from = st.sampled_from(
    [
        {"configMapKeyRef": {"name": "cm", "key": "k"}},
        {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
        {"fieldRef": {"fieldPath": "metadata.name"}},
    ]
)


def _env_entry(name: st.SearchStrategy[str]) -> st.SearchStrategy[JSON]:
    return st.one_of(
        st.builds(lambda n, v: {"name": n, "value": v}, name, texts.filter(bool)),
        st.builds(lambda n: {"name": n}, name),
        st.builds(lambda n, v: {"name": n, "valueFrom": v}, name, value_from),
    )


user_ld_preload = st.one_of(
    st.builds(lambda v: {"name": "LD_PRELOAD", "value": v}, user_ld_preload_values.filter(bool)),
    st.just({"name": "LD_PRELOAD"}),  # LD_PRELOAD="" (Go omits the empty value)
    st.builds(lambda v: {"name": "LD_PRELOAD", "valueFrom": v}, value_from),
)


@st.composite
def env_lists(draw: st.DrawFn, allow_ld_preload: bool = True) -> list[JSON]:
    entries = draw(st.lists(_env_entry(env_names), max_size=4, unique_by=lambda e: e["name"]))
    if allow_ld_preload and draw(st.booleans()):
        entries.insert(draw(st.integers(0, len(entries))), draw(user_ld_preload))
    return entries


quantities = st.sampled_from(["100m", "0.5", "1", "2", "64Mi", "128Mi", "1Gi", "500M"])
resources = st.one_of(
    st.builds(lambda c, m: {"limits": {"cpu": c, "memory": m}}, quantities, quantities),
    st.builds(
        lambda c, m: {"requests": {"cpu": c, "memory": m}, "limits": {"cpu": c, "memory": m}},
        quantities,
        quantities,
    ),
    st.builds(lambda c: {"requests": {"cpu": c}}, quantities),
)
container_security = st.fixed_dictionaries(
    {},
    optional={
        "runAsUser": st.integers(0, 5000),
        "readOnlyRootFilesystem": st.booleans(),
        "capabilities": st.just({"add": ["NET_ADMIN"]}),
    },
).filter(bool)
mounts = st.lists(
    st.builds(
        lambda n, p, ro: {"name": n, "mountPath": p, **({"readOnly": True} if ro else {})},
        names,
        st.from_regex(r"/[a-z]{1,6}(/[a-z]{1,4})?", fullmatch=True).filter(
            lambda p: p != constants.LUMIGO_MOUNT_PATH
        ),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda m: m["mountPath"],
)


@st.composite
def containers(draw: st.DrawFn, name: str, init: bool = False) -> JSON:
    container: JSON = {"name": name, "image": draw(st.sampled_from(["python:3.12", "node:22"]))}
    env = draw(env_lists())
    if env:
        container["env"] = env
    if draw(st.booleans()):
        container["volumeMounts"] = draw(mounts)
    if draw(st.booleans()):
        container["resources"] = draw(resources)
    if draw(st.booleans()):
        container["securityContext"] = draw(container_security)
    if init and draw(st.booleans()):
        container["restartPolicy"] = "Always"  # a native sidecar
    return container


label_maps = st.dictionaries(
    st.sampled_from(["app", "tier", "app.kubernetes.io/name", "x~y/z", "team"]),
    st.from_regex(r"[a-z0-9]{0,5}", fullmatch=True),
    min_size=1,
    max_size=3,
)
pod_security = st.fixed_dictionaries(
    {},
    optional={
        "fsGroup": st.integers(0, 5000),
        "runAsNonRoot": st.booleans(),
        "runAsUser": st.integers(1, 5000),
        "seccompProfile": st.just({"type": "RuntimeDefault"}),
    },
)


@st.composite
def pod_templates(draw: st.DrawFn) -> JSON:
    all_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    split = draw(st.integers(1, len(all_names)))
    regular, init = all_names[:split], all_names[split:]
    spec: JSON = {"containers": [draw(containers(n)) for n in regular]}
    if init:
        spec["initContainers"] = [draw(containers(n, init=True)) for n in init]
    if draw(st.integers(0, 4)) == 0:
        spec["ephemeralContainers"] = [
            {"name": "debugger", "image": "busybox", "env": [{"name": "X", "value": "1"}]}
        ]
    volumes = draw(st.lists(names, max_size=3, unique=True))
    if volumes:
        spec["volumes"] = [
            {"name": v, "emptyDir": {}} if i % 2 else {"name": v, "configMap": {"name": v}}
            for i, v in enumerate(volumes)
        ]
    choice = draw(st.integers(0, 2))
    if choice == 1:
        spec["securityContext"] = {}
    elif choice == 2:
        spec["securityContext"] = draw(pod_security)
    if draw(st.integers(0, 9)) == 0:
        spec["os"] = {"name": draw(st.sampled_from(["linux", "windows"]))}
    if draw(st.integers(0, 9)) == 0:
        spec["resources"] = {"limits": {"cpu": "2", "memory": "1Gi"}}
    template: JSON = {"spec": spec}
    metadata_choice = draw(st.integers(0, 2))
    if metadata_choice == 1:
        template["metadata"] = {"labels": draw(label_maps)}
    elif metadata_choice == 2:
        template["metadata"] = {"annotations": {"note": "x"}}
    return template


kinds = st.sampled_from([r.kind for r in constants.WORKLOAD_KINDS])


@st.composite
def workloads(draw: st.DrawFn) -> JSON:
    kind = draw(kinds)
    obj = workload(kind, draw(pod_templates()), name=draw(names))
    if draw(st.booleans()):
        del obj["metadata"]["labels"]
    if kind == "ReplicaSet" and draw(st.integers(0, 3)) == 0:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u"}
        ]
    return obj


# --- admission requests and collaborators --------------------------------------------------


def review_body(
    obj: JSON | None,
    *,
    operation: str = "CREATE",
    kind: tuple[str, str, str] | None = None,
    namespace: str = "ns",
    uid: str = "3b4d2f0e-uid",
    dry_run: bool = False,
    old: JSON | None = None,
) -> bytes:
    """An AdmissionReview v1 body as the API server sends it."""
    if kind is None:
        assert obj is not None
        group, _, version = obj["apiVersion"].rpartition("/")
        kind = (group, version, obj["kind"])
    request: JSON = {
        "uid": uid,
        "kind": {"group": kind[0], "version": kind[1], "kind": kind[2]},
        "resource": {"group": kind[0], "version": kind[1], "resource": kind[2].lower() + "s"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    if obj is not None and obj.get("metadata", {}).get("name"):
        request["name"] = obj["metadata"]["name"]
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(review).encode()


def lumigo(
    name: str = "lumigo",
    namespace: str = "ns",
    active: bool = True,
    spec: JSON | None = None,
    created: str = "2026-01-01T00:00:00Z",
) -> JSON:
    """A Lumigo resource as the informer cache holds it."""
    return {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": spec
        if spec is not None
        else {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}},
        "status": {
            "conditions": [
                {"type": "Active", "status": "True" if active else "False", "message": ""}
            ],
            "instrumentedResources": [],
        },
    }


class StaticLister:
    """The Lumigo lister collaborator over a fixed dict (the controller backs it with a cache)."""

    def __init__(self, by_namespace: dict[str, list[JSON]] | None = None) -> None:
        self.by_namespace = by_namespace or {}
        self.error: Exception | None = None

    def list(self, namespace: str) -> list[JSON]:
        if self.error is not None:
            raise self.error
        return self.by_namespace.get(namespace, [])


class RecordingRecorder:
    """The event recorder collaborator, keeping what it was given."""

    def __init__(self) -> None:
        self.events: list[tuple[JSON, str, str, str, str]] = []

    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        self.events.append((obj, type, reason, message, component))
