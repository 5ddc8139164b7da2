"""Typed views of Kubernetes objects, and the one accessor for each metadata field.

Objects travel as the JSON the API server sends (plain dicts). The TypedDicts below name the
fields the operator reads or writes, so that `mypy --strict` checks the shapes where code builds
or takes them apart; `total=False` because the API server omits empty fields. The accessors read
defensively: an admission request carries what a user wrote, and a cached object may be a
metadata projection, so a field of the wrong type reads as absent instead of raising.

Every module reads metadata through these functions (no `obj.get("metadata") or {}` elsewhere).
The `Lumigo` resource's shape is `api.lumigo.Lumigo`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypedDict, cast

# --- shapes -------------------------------------------------------------------------------------

# A JSON object as the API server sends it: for what no shape below describes (yet). Defined here
# once for every package.
JSON = dict[str, Any]


class OwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]
    ownerReferences: list[OwnerReference]
    managedFields: list[dict[str, Any]]


class EnvVar(TypedDict, total=False):
    name: str
    value: str
    valueFrom: dict[str, object]


class VolumeMount(TypedDict, total=False):
    name: str
    mountPath: str
    readOnly: bool
    subPath: str


class Volume(TypedDict, total=False):
    name: str
    emptyDir: dict[str, str]
    image: dict[str, str]


class Container(TypedDict, total=False):
    name: str
    image: str
    imagePullPolicy: str
    env: list[EnvVar]
    volumeMounts: list[VolumeMount]
    resources: dict[str, dict[str, str]]
    securityContext: dict[str, object]
    terminationMessagePath: str
    terminationMessagePolicy: str


class PodSpec(TypedDict, total=False):
    containers: list[Container]
    initContainers: list[Container]
    volumes: list[Volume]
    os: dict[str, str]
    securityContext: dict[str, object]
    resources: dict[str, dict[str, str]]


class PodTemplate(TypedDict, total=False):
    metadata: ObjectMeta
    spec: PodSpec


# --- accessors ----------------------------------------------------------------------------------


def metadata(obj: Mapping[str, Any]) -> ObjectMeta:
    """The object's metadata (read only: empty when missing or not an object)."""
    meta = obj.get("metadata")
    return cast(ObjectMeta, meta) if isinstance(meta, Mapping) else ObjectMeta()


def _text_map(meta: ObjectMeta, key: str) -> Mapping[str, str]:
    found = cast(Mapping[str, Any], meta).get(key)
    return found if isinstance(found, Mapping) else {}


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """`metadata.labels` (read only; empty when missing or not an object)."""
    return _text_map(metadata(obj), "labels")


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """`metadata.annotations` (read only; empty when missing or not an object)."""
    return _text_map(metadata(obj), "annotations")


def name(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("name") or "")


def namespace(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("namespace") or "")


def generation(obj: Mapping[str, Any]) -> int:
    """`metadata.generation`, 0 when absent or not a number."""
    try:
        return int(metadata(obj).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


def created(obj: Mapping[str, Any]) -> str:
    """`metadata.creationTimestamp` as written (RFC 3339 sorts as text), "" when absent."""
    return str(metadata(obj).get("creationTimestamp") or "")


def is_being_deleted(obj: Mapping[str, Any]) -> bool:
    return bool(metadata(obj).get("deletionTimestamp"))


def finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list(metadata(obj).get("finalizers") or [])


def is_deployment_owned(obj: Mapping[str, Any], kind: str | None = None) -> bool:
    """A ReplicaSet (`kind`, or the object's own) owned by an apps/v1 Deployment: its Deployment
    is instrumented instead."""
    if (kind or obj.get("kind")) != "ReplicaSet":
        return False
    refs: Any = metadata(obj).get("ownerReferences")
    return any(
        isinstance(ref, Mapping)
        and ref.get("apiVersion") == "apps/v1"
        and ref.get("kind") == "Deployment"
        for ref in refs or []
    )


def mutable_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The object's metadata for writing in place (created when missing)."""
    meta: dict[str, Any] = obj.setdefault("metadata", {})
    return meta


def json_list(text: str, what: str, items: str = "") -> list[Any]:
    """A setting written as a JSON list ('' or blanks = empty); ValueError naming `what` (and
    what its `items` should be) when the text is not JSON or not a list."""
    if not text.strip():
        return []
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ValueError(f"invalid {what} {text!r}: not JSON ({err})") from None
    if not isinstance(value, list):
        of = f" of {items}" if items else ""
        raise ValueError(f"invalid {what} {text!r}: expected a JSON list{of}")
    return value
