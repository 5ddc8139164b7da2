"""Rollouts the controller causes, and the budget that paces them.

Instrumenting an existing Deployment, StatefulSet or DaemonSet changes its pod template, so its
controller replaces every pod. Doing that to a whole namespace at once restarts everything at
once; the Lumigo's `tracing.injection.maxConcurrentRollouts` bounds how many may be rolling
because of us, and the next starts only when one is done.

"Because of us" is level-triggered, so it survives operator restarts: the write that instruments
a workload also annotates it with the generation that write produced and when. The workload is
ours to wait for while its generation is still that one (a later change by someone else makes
the rollout theirs) and its controller does not yet report the rollout complete, at most
`timeout` seconds (a rollout stuck for other reasons must not hold the budget forever).
Standalone ReplicaSets and CronJobs replace no running pod when their template changes: they
are never counted and never wait.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from api import constants
from api.marks import ROLLING_KINDS, STATE, as_int, parse_time, rollout_complete
from kube import objects
from kube.objects import JSON

_OUR_ANNOTATIONS: Final = (
    constants.ANNOTATION_INSTRUMENTED_GENERATION,
    constants.ANNOTATION_INSTRUMENTED_AT,
    constants.ANNOTATION_HEALTHY_BEFORE,
    constants.ANNOTATION_REVERTED,
)


def state(obj: JSON) -> JSON:
    """The projection extra: for a workload carrying our annotations, those and (rolling kinds)
    whether its rollout is complete, so the controller counts rollouts from its cache and wakes
    when one completes. Nothing for every other workload: the cache stays as small as before."""
    ours = {k: str(v) for k, v in objects.annotations_of(obj).items() if k in _OUR_ANNOTATIONS}
    if not ours:
        return {}
    if obj.get("kind") not in ROLLING_KINDS:
        return {STATE: {"annotations": ours}}
    generation = objects.generation(obj)
    return {
        STATE: {"annotations": ours, "generation": generation, "complete": rollout_complete(obj)}
    }


def _state(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get(STATE) or {}


def is_complete(obj: Mapping[str, Any]) -> bool:
    """A cached workload whose controller reports its rollout complete and every replica
    available (False when the cache has no rollout state for it)."""
    return bool(_state(obj).get("complete", False))


def our_annotation(obj: Mapping[str, Any], key: str) -> str | None:
    """One of our annotations, from a full object or a cached projection."""
    value = (_state(obj).get("annotations") or {}).get(key)
    if value is None:
        value = objects.annotations_of(obj).get(key)
    return None if value is None else str(value)


def instrumented_at(obj: Mapping[str, Any]) -> dt.datetime | None:
    return parse_time(our_annotation(obj, constants.ANNOTATION_INSTRUMENTED_AT))


def is_our_revision(obj: Mapping[str, Any]) -> bool:
    """The workload is still at the generation our instrumenting write produced."""
    ours = our_annotation(obj, constants.ANNOTATION_INSTRUMENTED_GENERATION)
    generation = _state(obj).get("generation")
    if generation is None:
        generation = objects.metadata(obj).get("generation")
    return ours is not None and ours == str(as_int(generation))


def is_rolling_because_of_us(obj: Mapping[str, Any], now: dt.datetime, timeout: float) -> bool:
    """A cached workload whose rollout we started and its controller has not completed."""
    if obj.get("kind") not in ROLLING_KINDS or _state(obj).get("complete", True):
        return False
    started = instrumented_at(obj)
    return (
        is_our_revision(obj) and started is not None and (now - started).total_seconds() < timeout
    )


@dataclass(frozen=True)
class Budget:
    """How many more rollouts may start now (None: no limit), and how many are under way."""

    limit: int  # 0: no limit
    rolling: int

    @property
    def free(self) -> int | None:
        return None if self.limit == 0 else max(0, self.limit - self.rolling)
