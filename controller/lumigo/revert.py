"""Automatic revert of instrumentation that broke a workload.

After the controller instruments an existing Deployment, StatefulSet or DaemonSet that was healthy,
it watches the pods of the revision its change produced for `window` seconds, whenever the
workload is not fully available. If they crash-loop, fail their `lumigo-injector` init container
or never become ready (`workload_health.Thresholds`), or the API server refuses to create them
(`FailedCreate`: a quota, a LimitRange, Pod Security), the workload goes back to its
un-instrumented pod template in one conflict-safe write that also marks it
(`operator.lumigo.io/instrumentation-reverted`, saying what was observed): neither the webhook
nor the controller instruments it again until a user removes the mark. A Warning event, the
Lumigo's `status.revertedResources` and `lumigo_instrumentation_reverts_total` tell about it.

Never reverted: a workload that was not healthy before (`healthy-before-instrumentation: false`),
and a workload changed by someone else since (its generation is no longer the one our change
produced: the new pods are theirs). Pods are listed by the workload's selector, and a StatefulSet's
or DaemonSet's `FailedCreate` events by its UID, only while it is watched: the operator never
caches the cluster's pods or events. A Deployment says it in its `ReplicaFailure` condition.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from api import constants
from api.marks import ROLLING_KINDS, is_reverted, set_annotations
from controller.lumigo import workload_health
from controller.lumigo.instrumentation import (
    ROLLOUT_MARKS_CLEARED,
    Target,
    is_labelled_instrumented,
)
from controller.lumigo.rollouts import (
    instrumented_at,
    is_complete,
    is_our_revision,
    our_annotation,
)
from controller.runtime.kube import KubeClient
from controller.runtime.selectors import selector_string
from kube import objects
from kube.kinds import EVENTS, PODS
from kube.objects import JSON
from kube.rest import ApiError
from webhook import injection_events, pod_injection

log = logging.getLogger("lumigo.revert")

REVERTS_TOTAL = Counter(
    "lumigo_instrumentation_reverts_total",
    "Workloads whose instrumentation was reverted because their new pods failed.",
    ["namespace", "kind"],
)


def revert_message(kind: str, name: str, problem: str) -> str:
    return (
        f"Lumigo reverted the instrumentation of {kind} {name}: {problem}, while the pods before"
        f" instrumentation were healthy. Remove the annotation {constants.ANNOTATION_REVERTED}"
        " to try again."
    )


@dataclass
class PodReader:
    """The pods of one workload, by its selector (a LIST, never a cache)."""

    client: KubeClient

    def pods_of(self, obj: Mapping[str, Any]) -> list[JSON]:
        selector = selector_string((obj.get("spec") or {}).get("selector"))
        if selector is None:
            return []
        namespace = objects.metadata(obj).get("namespace", "")
        pods, _ = self.client.list(PODS, namespace, label_selector=selector)
        return pods

    def healthy(self, obj: Mapping[str, Any], thresholds: workload_health.Thresholds) -> bool:
        return workload_health.is_healthy(self.pods_of(obj), thresholds)

    def refusal(self, obj: Mapping[str, Any]) -> str | None:
        """Why the API server would not create the workload's new pods, if it would not."""
        if obj.get("kind") == "Deployment":
            return workload_health.replica_failure(obj)
        meta = objects.metadata(obj)
        since = instrumented_at(obj)
        if since is None or not meta.get("uid"):
            return None
        events, _ = self.client.list(
            EVENTS,
            meta.get("namespace", ""),
            field_selector=f"involvedObject.uid={meta['uid']},reason={workload_health.FAILED_CREATE}",
        )
        return workload_health.failed_create(
            str(obj.get("kind")), meta.get("name", "?"), events, since
        )


@dataclass
class Reverter:
    client: KubeClient
    recorder: Any  # injection_events.EventRecorder
    component: str
    thresholds: workload_health.Thresholds = field(default_factory=workload_health.Thresholds)
    window: float = 600.0  # seconds after instrumenting during which new pods are watched
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    def watched(self, cached: Mapping[str, Any], now: dt.datetime) -> bool:
        """A cached workload whose new pods are under watch and may be in trouble. A workload
        whose rollout is complete with every replica available has no failing pod (a crash or a
        failed readiness probe makes one unavailable, which changes the cached state and wakes
        the controller): only the others cost a pod LIST."""
        started = instrumented_at(cached)
        return (
            cached.get("kind") in ROLLING_KINDS
            and not is_complete(cached)
            and is_labelled_instrumented(dict(cached))
            and not is_reverted(cached)
            and our_annotation(cached, constants.ANNOTATION_HEALTHY_BEFORE) == "true"
            and is_our_revision(cached)
            and started is not None
            and (now - started).total_seconds() < self.window
        )

    def check(self, target: Target) -> str | None:
        """Look at the workload's new pods; revert it if they fail. The problem, if reverted."""
        try:
            obj = self.client.get(target.resource, target.name, target.namespace)
            if not (is_our_revision(obj) and is_labelled_instrumented(obj)):
                return None
            reader = PodReader(self.client)
            problem = workload_health.new_pods_problem(
                reader.pods_of(obj), self.thresholds, self.clock()
            ) or reader.refusal(obj)
        except ApiError as err:
            if err.not_found:
                return None
            raise
        if problem is None:
            return None
        return problem if self._revert(target, problem) else None

    def _revert(self, target: Target, problem: str) -> bool:
        def change(obj: JSON) -> JSON | None:
            if is_reverted(obj) or not (is_our_revision(obj) and is_labelled_instrumented(obj)):
                return None  # changed meanwhile: not ours to revert any more
            cleaned = pod_injection.remove(obj)
            set_annotations(
                cleaned, {**ROLLOUT_MARKS_CLEARED, constants.ANNOTATION_REVERTED: problem}
            )
            return cleaned

        result = self.client.update_with_retry(
            target.resource, target.name, target.namespace, change
        )
        if result is None:
            return False
        kind = target.resource.kind
        log.warning(
            "reverted instrumentation",
            extra={
                "kind": kind,
                "namespace": target.namespace,
                "resource": target.name,
                "problem": problem,
            },
        )
        self.recorder.event(
            result,
            injection_events.WARNING,
            constants.REASON_REVERTED,
            revert_message(kind, target.name, problem),
            self.component,
        )
        REVERTS_TOTAL.labels(target.namespace, kind).inc()
        return True
