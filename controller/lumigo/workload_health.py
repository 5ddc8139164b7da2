"""Is a workload healthy, judging by its pods? Pure functions over pod objects.

Used twice: just before the controller instruments a workload (only a workload that was healthy
then is ever reverted), and while watching the pods of the revision it produced (do they
crash-loop, fail their `lumigo-injector` init container, or never become ready?).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from api import constants
from api.marks import parse_time
from kube import objects


@dataclass(frozen=True)
class Thresholds:
    restarts: int = 3  # container restarts of one new pod
    unready_after: float = 300.0  # seconds a started pod may stay not Ready


def is_instrumented_pod(pod: Mapping[str, Any]) -> bool:
    """Our init container, or our payload volume (the autotrace image in image-volume mode)."""
    spec = pod.get("spec") or {}
    inits = spec.get("initContainers") or []
    volumes = spec.get("volumes") or []
    return any(c.get("name") == constants.INJECTOR_INIT_CONTAINER for c in inits) or any(
        v.get("name") == constants.INJECTOR_VOLUME for v in volumes
    )


def _live(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pods if not objects.metadata(p).get("deletionTimestamp")]


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for key in ("state", "lastState"):
        terminated = (status.get(key) or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return dict(terminated)
    return None


def _exit(terminated: Mapping[str, Any]) -> str:
    reason = terminated.get("reason")
    code = terminated.get("exitCode")
    return f"exit code {code}" + (f", {reason}" if reason else "")


def _ready_since(pod: Mapping[str, Any]) -> tuple[bool, dt.datetime | None]:
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True", parse_time(
                condition.get("lastTransitionTime")
            )
    return False, parse_time(status.get("startTime"))


def pod_problem(pod: Mapping[str, Any], thresholds: Thresholds, now: dt.datetime) -> str | None:
    """What is wrong with one pod, in words for an event; None if nothing (yet)."""
    name = objects.metadata(pod).get("name", "?")
    status = pod.get("status") or {}
    for init in status.get("initContainerStatuses") or []:
        if init.get("name") != constants.INJECTOR_INIT_CONTAINER:
            continue
        terminated = _terminated(init)
        if terminated is not None:
            return f"the {init['name']} init container of pod {name} failed ({_exit(terminated)})"
    for container in status.get("containerStatuses") or []:
        restarts = int(container.get("restartCount") or 0)
        if restarts >= thresholds.restarts:
            last = _terminated(container)
            detail = f", last {_exit(last)}" if last else ""
            return (
                f"container {container.get('name')} of pod {name} restarted {restarts} times"
                f"{detail}"
            )
    if status.get("phase") == "Running":
        ready, since = _ready_since(pod)
        if not ready and since is not None:
            waited = (now - since).total_seconds()
            if waited >= thresholds.unready_after:
                return f"pod {name} has not been ready for {int(waited)} s"
    return None


def new_pods_problem(
    pods: Iterable[Mapping[str, Any]], thresholds: Thresholds, now: dt.datetime
) -> str | None:
    """The first problem among the instrumented (new revision's) live pods."""
    for pod in _live(pods):
        if is_instrumented_pod(pod):
            problem = pod_problem(pod, thresholds, now)
            if problem is not None:
                return problem
    return None


def is_healthy(pods: Iterable[Mapping[str, Any]], thresholds: Thresholds) -> bool:
    """Before instrumenting: every live pod ready and no container waiting (CrashLoopBackOff,
    ImagePullBackOff, ...). Past restarts do not count: a pod that restarted three times last
    month is healthy today."""
    for pod in _live(pods):
        status = pod.get("status") or {}
        if status.get("phase") == "Succeeded":
            continue
        ready, _ = _ready_since(pod)
        if not ready:
            return False
        for container in status.get("containerStatuses") or []:
            if (container.get("state") or {}).get("waiting"):
                return False
    return True
