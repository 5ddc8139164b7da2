"""The annotations the operator puts on the workloads it instruments and reverts, and what a
workload's status says about its rollout: shared by the webhook and the controller.

- `instrumented-generation`, `instrumented-at`, `healthy-before-instrumentation`: written with the
  change that instruments an existing Deployment, StatefulSet or DaemonSet (the rollout budget
  counts it while that generation rolls; the revert watch looks at its new pods).
- `instrumentation-reverted`: the mark of a reverted workload, with what was observed. Neither
  the webhook nor the controller instruments a workload that carries it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final

from api import constants
from kube import objects
from kube.objects import JSON

ROLLING_KINDS: Final = frozenset({"Deployment", "StatefulSet", "DaemonSet"})

# Key the controller's workload caches add to a workload's metadata projection: our annotations
# (and, for rolling kinds, the rollout's generation and completeness): `controller.lumigo.rollouts`.
STATE: Final = "lumigoRollout"


def is_reverted(obj: Mapping[str, Any]) -> bool:
    """Carries the revert mark: a full object's annotation, or a cached projection's copy of it."""
    state = obj.get(STATE)
    projected = state.get("annotations") if isinstance(state, Mapping) else None
    in_projection = isinstance(projected, Mapping) and constants.ANNOTATION_REVERTED in projected
    return in_projection or constants.ANNOTATION_REVERTED in objects.annotations_of(obj)


def timestamp(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 time as the API writes it; None for anything else (annotations are user
    input: a bad value must not raise)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def rollout_complete(obj: Mapping[str, Any]) -> bool:
    """Whether the workload's controller reports the current generation fully rolled out and
    available (what `kubectl rollout status` waits for)."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    generation = objects.generation(obj)
    if as_int(status.get("observedGeneration")) < generation:
        return False
    if kind == "Deployment":
        wanted = as_int(spec.get("replicas", 1))
        updated = as_int(status.get("updatedReplicas"))
        return (
            updated >= wanted
            and as_int(status.get("replicas")) <= updated
            and as_int(status.get("availableReplicas")) >= updated
        )
    if kind == "StatefulSet":
        if (spec.get("updateStrategy") or {}).get("type") == "OnDelete":
            return True  # pods change only when someone deletes them: nothing rolls
        wanted = as_int(spec.get("replicas", 1))
        return (
            as_int(status.get("updatedReplicas")) >= wanted
            and as_int(status.get("readyReplicas")) >= wanted
            and status.get("currentRevision") == status.get("updateRevision")
        )
    if kind == "DaemonSet":
        if (spec.get("updateStrategy") or {}).get("type") == "OnDelete":
            return True
        wanted = as_int(status.get("desiredNumberScheduled"))
        return (
            as_int(status.get("updatedNumberScheduled")) >= wanted
            and as_int(status.get("numberAvailable")) >= wanted
        )
    return True


def marks(obj: Mapping[str, Any], now: dt.datetime, healthy_before: bool) -> dict[str, str]:
    """The annotations our instrumenting write adds. A change of the pod template bumps the
    generation by exactly one, so the write's own generation is known before it is made."""
    generation = objects.generation(obj) + 1
    return {
        constants.ANNOTATION_INSTRUMENTED_GENERATION: str(generation),
        constants.ANNOTATION_INSTRUMENTED_AT: timestamp(now),
        constants.ANNOTATION_HEALTHY_BEFORE: "true" if healthy_before else "false",
    }


def set_annotations(obj: JSON, values: Mapping[str, str | None]) -> None:
    """Set (or, for None, delete) annotations on a full object in place."""
    meta = objects.mutable_metadata(obj)
    current = dict(meta.get("annotations") or {})
    for key, value in values.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    if current:
        meta["annotations"] = current
    else:
        meta.pop("annotations", None)
