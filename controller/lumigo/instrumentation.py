"""Instrument and un-instrument existing workloads: conflict-safe writes, events, concurrency.

The pod-template change itself is the webhook's pure mutation (one definition of "injected");
this module only applies it to stored objects: GET the latest version, mutate, PUT with its
resourceVersion, and on a 409 start again from a fresh GET, so a change a user makes at the same
moment is never overwritten. A bounded thread pool keeps a namespace with hundreds of workloads
from either taking forever or flooding the API server.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final, Protocol

from api import constants
from api.eligibility import JOB_IMMUTABLE_MESSAGE, template_is_immutable
from api.marks import ROLLING_KINDS, is_reverted, marks, rollout_complete, set_annotations
from controller.lumigo.resources import WORKLOADS_BY_KIND
from controller.runtime.kube import KubeClient
from controller.runtime.logs import in_log_context
from controller.runtime.manager import ReconcileError
from kube import jsonpatch, objects
from kube.objects import JSON
from kube.rest import ApiError, Resource
from webhook import injection_events, pod_injection

log = logging.getLogger("lumigo.instrumentation")


# Removing our instrumentation also drops the rollout annotations of the change that added it.
ROLLOUT_MARKS_CLEARED: Final[dict[str, str | None]] = {
    constants.ANNOTATION_INSTRUMENTED_GENERATION: None,
    constants.ANNOTATION_INSTRUMENTED_AT: None,
    constants.ANNOTATION_HEALTHY_BEFORE: None,
}


class Recorder(Protocol):
    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None: ...


@dataclass(frozen=True)
class Target:
    """One workload to act on (a cached projection is enough: we GET before writing)."""

    resource: Resource
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Target:
        meta = objects.metadata(obj)
        return cls(WORKLOADS_BY_KIND[obj["kind"]], meta.get("namespace", ""), meta["name"])


@dataclass(frozen=True)
class Outcome:
    target: Target
    changed: bool
    error: str | None = None


class InstrumentationIncomplete(ReconcileError):
    """Some workloads could not be (un)instrumented: retry with backoff."""

    def __init__(self, action: str, failed: list[Outcome], total: int) -> None:
        self.failed = failed
        first = failed[0]
        super().__init__(
            f"could not {action} {len(failed)} of {total} workloads; first: "
            f"{first.target.resource.kind} {first.target.name}: {first.error}"
        )


def target_order(target: Target) -> tuple[int, str]:
    """Kind order DaemonSet, Deployment, ReplicaSet, StatefulSet, CronJob, Job; then by name."""
    return (constants.KIND_ORDER.get(target.resource.kind, 99), target.name)


def is_labelled_instrumented(obj: JSON) -> bool:
    """Carries the auto-trace label with any value but `false` (the reference's selector)."""
    return pod_injection.auto_trace_label(obj) is not None and not pod_injection.is_opted_out(obj)


# Key the workload caches add to the metadata projection of a workload labelled `false`: whether
# its pod template still carries our instrumentation (the one case the label does not tell).
OPTED_OUT_INSTRUMENTED: Final = "lumigoOptedOutInstrumented"


def opted_out_state(obj: JSON) -> JSON:
    """The projection extra (`metadata_projection(opted_out_state)`); computed for workloads
    labelled `false` only, so the cost stays off every other workload event."""
    if not pod_injection.is_opted_out(obj) or objects.is_deployment_owned(obj):
        return {}
    try:
        return {OPTED_OUT_INSTRUMENTED: pod_injection.is_instrumented(obj)}
    except pod_injection.MutationError:
        return {}


def is_opted_out_and_instrumented(obj: JSON) -> bool:
    """A full workload object (not a projection) labelled `false` whose pod template still
    carries our instrumentation; never a Deployment's ReplicaSet."""
    return opted_out_state(obj).get(OPTED_OUT_INSTRUMENTED) is True


def is_opted_out_but_instrumented(obj: JSON) -> bool:
    """A cached workload labelled `false` whose pod template still has our instrumentation."""
    return pod_injection.is_opted_out(obj) and obj.get(OPTED_OUT_INSTRUMENTED) is True


def is_instrumented_now(obj: JSON) -> bool:
    """What `status.instrumentedResources` lists: labelled as instrumented, or opted out while
    the pod template still carries our instrumentation (e.g. a Job, or a removal that failed)."""
    return is_labelled_instrumented(obj) or is_opted_out_but_instrumented(obj)


@dataclass(eq=False)
class Instrumenter:
    """Adds or removes the injection on workloads, `concurrency` at a time."""

    client: KubeClient
    recorder: injection_events.EventRecorder
    _: KW_ONLY
    component: str
    concurrency: int = 8
    # Whether a workload's pods are healthy right now (recorded on the workloads we roll, so
    # that only those healthy before are ever reverted); None: not recorded.
    pods_healthy: Callable[[JSON], bool] | None = None
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    # -- one object ----------------------------------------------------------------------------
    def instrument(
        self,
        target: Target,
        settings: pod_injection.InjectionSettings,
        trigger: str,
        current: JSON | None = None,
    ) -> Outcome:
        if template_is_immutable(target.resource.kind, exists=True):
            return self._job_is_immutable(target, "add", trigger)

        def change(obj: JSON) -> JSON | None:
            if pod_injection.auto_trace_label(obj) is not None or is_reverted(obj):
                return None  # labelled meanwhile (webhook, user opt-out), or reverted
            mutated = pod_injection.inject(obj, settings)
            if jsonpatch.same(mutated, obj):
                return None
            if target.resource.kind in ROLLING_KINDS and self.pods_healthy is not None:
                healthy = rollout_complete(obj) and self.pods_healthy(obj)
                set_annotations(mutated, marks(obj, self.clock(), healthy))
            return mutated

        written: list[tuple[JSON, str | None]] = []  # the last attempt's object and problem

        def checked(obj: JSON) -> JSON | None:
            result = change(obj)
            if result is not None:
                written.append((result, pod_injection.container_selection(result).problem))
            return result

        outcome = self._write(target, checked, "add", trigger, current=current)
        if outcome.changed and written:
            # The per-container annotations could not be honoured as written: say so.
            obj, problem = written[-1]
            if problem is not None:
                self.recorder.event(
                    obj,
                    injection_events.WARNING,
                    constants.REASON_INVALID_CONTAINERS,
                    problem,
                    self.component,
                )
        return outcome

    def uninstrument(self, target: Target, trigger: str, component: str | None = None) -> Outcome:
        if template_is_immutable(target.resource.kind, exists=True):
            return self._job_is_immutable(target, "remove", trigger, component)

        def change(obj: JSON) -> JSON | None:
            if not is_labelled_instrumented(obj):
                return None
            cleaned = pod_injection.remove(obj)
            if jsonpatch.same(cleaned, obj):
                return None
            set_annotations(cleaned, ROLLOUT_MARKS_CLEARED)
            # Tell the webhook not to inject again on this very update (the reference handshake).
            labels = objects.mutable_metadata(cleaned).setdefault("labels", {})
            labels[constants.LABEL_AUTO_TRACE] = constants.AUTO_TRACE_SKIP_NEXT_INJECTOR
            return cleaned

        outcome = self._write(target, change, "remove", trigger, component)
        if outcome.changed and outcome.error is None:
            self._drop_leftover_skip_label(target)
        return outcome

    def remove_opted_out(
        self, target: Target, trigger: str, component: str | None = None
    ) -> Outcome:
        """Clean a workload the user labelled `false` (the label stays: they opted out)."""

        def change(obj: JSON) -> JSON | None:
            if not pod_injection.is_opted_out(obj):
                return None  # the user changed their mind meanwhile
            cleaned = pod_injection.remove(obj)
            if jsonpatch.same(cleaned, obj):
                return None
            set_annotations(cleaned, ROLLOUT_MARKS_CLEARED)
            return cleaned

        return self._write(target, change, "remove", trigger, component)

    def _drop_leftover_skip_label(self, target: Target) -> None:
        """Without a running webhook (failurePolicy Ignore) the handshake label stays: drop it,
        or later "inject existing" passes (which select unlabelled objects) would skip it.
        Conflict-safe: controllers (e.g. the Deployment controller's status writes) race us."""

        def drop(obj: JSON) -> JSON | None:
            labels = objects.mutable_metadata(obj).get("labels") or {}
            if labels.get(constants.LABEL_AUTO_TRACE) != constants.AUTO_TRACE_SKIP_NEXT_INJECTOR:
                return None
            del labels[constants.LABEL_AUTO_TRACE]
            return obj

        try:
            self.client.update_with_retry(target.resource, target.name, target.namespace, drop)
        except ApiError as err:
            log.info("could not drop the handshake label", extra={"error": str(err)})

    # -- many objects --------------------------------------------------------------------------
    def instrument_all(
        self,
        targets: Iterable[Target],
        settings: pod_injection.InjectionSettings,
        trigger: str,
        current: dict[Target, JSON] | None = None,
    ) -> list[Outcome]:
        """`current`: copies of the targets just listed, saving a GET each."""
        known = current or {}
        return self._map(lambda t: self.instrument(t, settings, trigger, known.get(t)), targets)

    def uninstrument_all(
        self, targets: Iterable[Target], trigger: str, component: str | None = None
    ) -> list[Outcome]:
        return self._map(lambda t: self.uninstrument(t, trigger, component), targets)

    def remove_opted_out_all(
        self, targets: Iterable[Target], trigger: str, component: str | None = None
    ) -> list[Outcome]:
        return self._map(lambda t: self.remove_opted_out(t, trigger, component), targets)

    def _map(self, fn: Callable[[Target], Outcome], targets: Iterable[Target]) -> list[Outcome]:
        items = list(targets)
        if len(items) <= 1:
            return [fn(t) for t in items]
        with ThreadPoolExecutor(min(self.concurrency, len(items)), "instrument") as pool:
            return list(pool.map(in_log_context(fn), items))  # keeps the reconcile ID

    # -- internals -----------------------------------------------------------------------------
    def _write(
        self,
        target: Target,
        change: Callable[[JSON], JSON | None],
        action: injection_events.Action,
        trigger: str,
        component: str | None = None,
        *,
        current: JSON | None = None,
    ) -> Outcome:
        component = component or self.component
        try:
            result = self.client.update_with_retry(
                target.resource, target.name, target.namespace, change, current=current
            )
        except ApiError as err:
            if err.not_found:
                return Outcome(target, False)  # deleted meanwhile: nothing to do
            return self._failed(target, action, trigger, component, err.message)
        except pod_injection.MutationError as err:
            return self._failed(target, action, trigger, component, str(err))
        if result is None:
            return Outcome(target, False)
        self.recorder.event(
            result,
            injection_events.NORMAL,
            injection_events.reason(action),
            injection_events.message(action, trigger),
            component,
        )
        return Outcome(target, True)

    def _failed(
        self,
        target: Target,
        action: injection_events.Action,
        trigger: str,
        component: str,
        error: str,
    ) -> Outcome:
        self._event_on(
            target,
            injection_events.reason(action, failed=True),
            injection_events.message(action, trigger, error),
            component,
        )
        return Outcome(target, False, error)

    def _job_is_immutable(
        self,
        target: Target,
        action: injection_events.Action,
        trigger: str,
        component: str | None = None,
    ) -> Outcome:
        message = injection_events.message(action, trigger, JOB_IMMUTABLE_MESSAGE)
        failed = injection_events.reason(action, failed=True)
        self._event_on(target, failed, message, component or self.component)
        return Outcome(target, False)

    def _event_on(self, target: Target, reason: str, message: str, component: str) -> None:
        try:
            obj = self.client.get(target.resource, target.name, target.namespace)
        except ApiError:
            return
        self.recorder.event(obj, injection_events.WARNING, reason, message, component)
