"""Is a workload healthy, judging by its pods? Pure functions over pod objects.

Used twice: just before the controller instruments a workload (only a workload that was healthy
then is ever reverted), and while watching the pods of the revision it produced (do they
crash-loop, fail their `lumigo-injector` init container, or never become ready?), and while
watching the workload itself: its pods may never exist, because the API server refuses them
(a ResourceQuota, a LimitRange, Pod Security, an OpenShift SCC) and only the ReplicaSet's, the
StatefulSet's or the DaemonSet's controller hears why (`FailedCreate`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from api import constants
from api.marks import parse_time
from kube import objects

FAILED_CREATE: Final = "FailedCreate"
REPLICA_FAILURE: Final = "ReplicaFailure"
MESSAGE_LIMIT: Final = 400  # characters of a refusal kept (annotation, event, status)


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


def _refusal(kind: str, name: str, message: str) -> str:
    text = " ".join(message.split())
    if len(text) > MESSAGE_LIMIT:
        text = text[: MESSAGE_LIMIT - 1] + "…"
    return f"the API server refused the new pods of {kind} {name}: {text}"


def replica_failure(deployment: Mapping[str, Any]) -> str | None:
    """A Deployment's `ReplicaFailure` condition, which its controller copies from the ReplicaSet
    that could not create a pod: the refusal in the API server's words."""
    meta = objects.metadata(deployment)
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == REPLICA_FAILURE and condition.get("status") == "True":
            message = condition.get("message") or condition.get("reason") or FAILED_CREATE
            return _refusal("Deployment", meta.get("name", "?"), str(message))
    return None


def _event_time(event: Mapping[str, Any]) -> dt.datetime | None:
    """When an event last happened: core/v1 `lastTimestamp`, or the events.k8s.io fields a
    newer recorder fills instead."""
    series = event.get("series") or {}
    for value in (
        event.get("lastTimestamp"),
        series.get("lastObservedTime"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
    ):
        when = parse_time(value)
        if when is not None:
            return when
    return None


def failed_create(
    kind: str, name: str, events: Iterable[Mapping[str, Any]], since: dt.datetime
) -> str | None:
    """The newest `FailedCreate` event of a StatefulSet or DaemonSet since we instrumented it
    (older refusals are not ours)."""
    newest: tuple[dt.datetime, str] | None = None
    for event in events:
        when = _event_time(event)
        if event.get("reason") != FAILED_CREATE or when is None or when < since:
            continue
        if newest is None or when > newest[0]:
            newest = (when, str(event.get("message") or FAILED_CREATE))
    return None if newest is None else _refusal(kind, name, newest[1])
