"""The Lumigo reconciler: finalizer, secret validation, instrumentation, status.

Level-triggered: every reconcile computes what should be true of the namespace from the cache and
the API server, and makes it so — so a crash at any point is repaired by the next reconcile.

- One Lumigo per namespace governs it (`api.effective`: the oldest, by creationTimestamp then
  name); the others get the reference's Error condition.
- `kube-system` and the operator's own namespace are never instrumented (the webhook's
  namespaceSelector leaves them out too): a Lumigo there gets an Error condition saying so
  (reason ExcludedNamespace), and nothing else happens.
- Opt-out: a workload labelled `lumigo.auto-trace=false` whose pod template still carries our
  instrumentation (labelled while the webhook was down, or before this operator version) is
  cleaned, label kept, with a LumigoRemovedInstrumentation event — whatever the spec says about
  injection. Jobs cannot be changed and stay listed in the status, which lists what the pod
  templates contain. Removing the label again makes the workload unlabelled, see below.
- Instrumentation: every workload without a `lumigo.auto-trace` label in an active namespace is
  instrumented by the controller if `injectLumigoIntoExistingResourcesOnCreation` is set, or if it
  was created after the Lumigo became active (the webhook should have done it, but it was down:
  its failurePolicy is Ignore). Deployment-owned ReplicaSets follow their Deployment; Jobs cannot be
  changed and get an event instead, once, on first activation.
- Deletion: with the finalizer in place, instrumentation is removed (if the spec says so) before
  the finalizer is dropped, with a resourceVersion precondition so that only ours goes
  (`controller.lumigo.removal`, shared with `lumigo-operator uninstall`).
- Token Secrets are read with a GET on every reconcile and re-checked every `resync_period`
  (every `error_requeue` while in error): no list/watch of Secrets cluster-wide is needed, so the
  operator's RBAC holds `get` on Secrets only. A read that fails (other than 404) says nothing
  about the Secret: the reconcile fails and is retried with backoff, changing nothing.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from api import constants
from api.effective import governing
from api.lumigo import InvalidSpecError, Lumigo, LumigoSpec, load_spec
from api.marks import ROLLING_KINDS, is_reverted
from controller.lumigo import monitored, plan, removal, skipped
from controller.lumigo import status as st
from controller.lumigo.instrumentation import (
    InstrumentationIncomplete,
    Instrumenter,
    Outcome,
    Target,
    is_instrumented_now,
    is_opted_out_but_instrumented,
    target_order,
)
from controller.lumigo.resources import LUMIGOES
from controller.lumigo.revert import Reverter
from controller.lumigo.rollouts import (
    is_rolling_because_of_us,
    our_annotation,
)
from controller.runtime.informer import Informer
from controller.runtime.kube import KubeClient
from controller.runtime.manager import ReconcileError, Result
from controller.runtime.store import ObjectKey
from kube import objects
from kube.kinds import SECRETS
from kube.objects import JSON
from kube.rest import ApiError
from webhook import injection_events, pod_injection

log = logging.getLogger("lumigo.controller")

BULK_LIST_THRESHOLD = 10
SettingsFactory = Callable[[LumigoSpec], pod_injection.InjectionSettings]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class LumigoReconciler:
    client: KubeClient
    lumigoes: Informer
    workloads: dict[str, Informer]  # by kind; caches keep metadata projections only
    instrumenter: Instrumenter
    settings_for: SettingsFactory
    resync_period: float = 30.0
    error_requeue: float = 5.0
    reverter: Reverter | None = None  # None: no automatic revert
    rollout_timeout: float = 600.0  # a rollout of ours holds a budget slot at most this long
    rollout_poll: float = 5.0  # requeue period while rollouts are under way or watched
    # Never instrumented, as the webhook's namespaceSelector says (with kube-system).
    operator_namespace: str = ""
    # Rollouts started by this process that the cache does not show yet (our write's watch
    # event may arrive after the next reconcile starts): they hold their slot meanwhile.
    _started: dict[Target, float] = field(default_factory=dict, init=False)
    _started_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # Workloads left uninstrumented (`skipped`) and the reason a Warning was recorded for: once
    # per workload and reason, not on every resync.
    _warned: dict[Target, str] = field(default_factory=dict, init=False)

    # -- entry point ---------------------------------------------------------------------------
    def reconcile(self, key: ObjectKey) -> Result:
        cached = self.lumigoes.get(key.namespace, key.name)
        if cached is None:
            return Result()  # gone: its finalizer already did the cleanup
        lumigo = cast(Lumigo, copy.deepcopy(cached))  # the cache holds what the API server sent
        if objects.is_being_deleted(lumigo):
            self._finalize(lumigo)
            return Result()
        lumigo = self._ensure_finalizer(lumigo)
        problem, reason, spec = self._problem(lumigo)
        if problem is not None:
            if reason != st.REASON_DUPLICATE:  # a duplicate leaves the effective one's label
                monitored.unmark(self.client, key.namespace)
            self._write_status(lumigo, st.active_updates(problem, reason), [])
            return Result(requeue_after=self.error_requeue)
        assert spec is not None
        # Before Active: from then on the API server sends the namespace's workloads to the
        # webhook.
        monitored.mark(self.client, key.namespace)
        first_activation = not st.was_ever_activated(lumigo)
        removals = self._remove_opted_out(lumigo)
        watching = self._revert_broken(key.namespace)
        mode = self.settings_for(spec).injection_mode
        left_out = self._skipped(key.namespace, mode)
        progress = self._instrument_namespace(lumigo, spec, first_activation, left_out)
        limit = spec.tracing.injection.max_concurrent_rollouts
        self._write_status(
            lumigo,
            [*st.active_updates(None, ""), st.progressing_update(*progress, limit)],
            self._instrumented(key.namespace),
            {
                "rollouts": {"rolling": progress[0], "pending": progress[1]},
                "revertedResources": self._reverted(key.namespace),
                "skippedResources": st.sort_instrumented(
                    [st.reverted_reference(obj, why) for obj, why in left_out.values()]
                ),
            },
        )
        failed = [o for o in removals if o.error]
        if failed:
            raise InstrumentationIncomplete("remove instrumentation from", failed, len(removals))
        busy = watching or any(progress)
        return Result(requeue_after=self.rollout_poll if busy else self.resync_period)

    # -- validation ----------------------------------------------------------------------------
    def _problem(self, lumigo: Lumigo) -> tuple[str | None, str, LumigoSpec | None]:
        namespace = objects.namespace(lumigo)
        excluded = st.excluded_namespace_problem(namespace, self.operator_namespace)
        if excluded is not None:
            return excluded, st.REASON_EXCLUDED_NAMESPACE, None
        oldest = self.effective_lumigo(namespace)
        if oldest is not None and objects.name(oldest) != objects.name(lumigo):
            return st.OTHER_INSTANCES, st.REASON_DUPLICATE, None
        raw_spec = lumigo.get("spec")
        if not raw_spec:
            return st.EMPTY_SPEC, st.REASON_INVALID_SPEC, None
        try:
            spec = load_spec(raw_spec)
        except InvalidSpecError as err:
            return str(err), st.REASON_INVALID_SPEC, None
        ref = spec.lumigo_token.secret_ref
        secret = None
        if ref.name and ref.key:
            try:
                secret = self.client.get_or_none(SECRETS, ref.name, namespace)
            except ApiError as err:
                # Not "missing": the Secret may be fine. Change nothing (the status, the
                # instrumented list, what the webhook and the proxy do) and retry with backoff.
                raise ReconcileError(
                    f"cannot read the token secret '{namespace}/{ref.name}': {err}"
                ) from err
        problem = st.token_secret_problem(namespace, ref, secret)
        if problem is not None:
            return problem, st.REASON_INVALID_SECRET, None
        return None, "", spec

    def effective_lumigo(self, namespace: str) -> Lumigo | None:
        """The namespace's governing Lumigo (`api.effective`); the others are duplicates."""
        return governing(cast(list[Lumigo], self.lumigoes.store.list(namespace)))

    # -- instrumentation -----------------------------------------------------------------------
    def _instrument_namespace(
        self,
        lumigo: Lumigo,
        spec: LumigoSpec,
        first_activation: bool,
        left_out: dict[Target, tuple[JSON, str]],
    ) -> tuple[int, int]:
        """Instrument what should be, within the rollout budget: (rolling, pending) after.
        `left_out`: the workloads instrumenting would harm (`_skipped`), warned about instead."""
        injection = spec.tracing.injection
        namespace, name = objects.namespace(lumigo), objects.name(lumigo)
        rolling = self._rolling(namespace)
        if not injection.enabled:
            return rolling, 0
        selection = plan.select(
            (
                (kind, obj)
                for kind, informer in self.workloads.items()
                for obj in informer.store.by_label(constants.LABEL_AUTO_TRACE, None, namespace)
            ),
            activated=plan.activation_time(lumigo.get("status"), _now()),
            inject_existing=injection.inject_lumigo_into_existing_resources_on_creation,
            first_activation=first_activation,
            left_out=left_out,
        )
        targets, jobs = selection.targets, selection.jobs
        if not targets and not jobs:
            return rolling, 0
        now, pending = plan.schedule(targets, injection.max_concurrent_rollouts, rolling)
        trigger = injection_events.controller_trigger(namespace, name)
        settings = self.settings_for(spec)
        outcomes = self.instrumenter.instrument_all(
            now, settings, trigger, self._listed(namespace, now)
        )
        for job in jobs:
            self.instrumenter.instrument(job, settings, trigger)  # records the immutability event
        started = [
            o.target for o in outcomes if o.changed and o.target.resource.kind in ROLLING_KINDS
        ]
        with self._started_lock:
            self._started.update((t, time.monotonic()) for t in started)
        failed = [o for o in outcomes if o.error]
        if failed:
            raise InstrumentationIncomplete("instrument", failed, len(outcomes))
        return rolling + len(started), pending

    def _skipped(self, namespace: str, mode: str) -> dict[Target, tuple[JSON, str]]:
        """Workloads of the namespace left uninstrumented (`skipped.skip_reason`), with why; a
        Warning event on each, once per workload and reason."""
        found = {
            Target.of(obj): (obj, why)
            for informer in self.workloads.values()
            for obj in informer.store.list(namespace)
            if (why := skipped.skip_reason(obj, mode)) is not None
        }
        lumigo = self.effective_lumigo(namespace)
        name = objects.name(lumigo or {})
        trigger = injection_events.controller_trigger(namespace, name)
        with self._started_lock:
            new = [(t, o, w) for t, (o, w) in found.items() if self._warned.get(t) != w]
            self._warned = {t: w for t, w in self._warned.items() if t.namespace != namespace} | {
                t: w for t, (_, w) in found.items()
            }
        for _, obj, why in sorted(new, key=lambda n: target_order(n[0])):
            self.instrumenter.recorder.event(
                obj,
                injection_events.WARNING,
                injection_events.reason("add", failed=True),
                injection_events.message("add", trigger, why),
                self.instrumenter.component,
            )
        return found

    def _rolling(self, namespace: str) -> int:
        """Workloads of the namespace rolling because we instrumented them: from the cache, plus
        those we started whose write the cache has not caught up with."""
        now = dt.datetime.now(dt.UTC)
        cached = sum(
            1
            for kind in ROLLING_KINDS
            if kind in self.workloads
            for _ in self.workloads[kind].store.list(
                namespace, lambda o: is_rolling_because_of_us(o, now, self.rollout_timeout)
            )
        )
        return cached + self._not_yet_cached(namespace)

    def _not_yet_cached(self, namespace: str) -> int:
        unseen = 0
        with self._started_lock:
            for target, since in list(self._started.items()):
                if target.namespace != namespace:
                    continue
                obj = self.workloads[target.resource.kind].get(target.namespace, target.name)
                seen = (
                    obj is None
                    or our_annotation(obj, constants.ANNOTATION_INSTRUMENTED_GENERATION) is not None
                )
                if seen or time.monotonic() - since > self.rollout_timeout:
                    del self._started[target]
                else:
                    unseen += 1
        return unseen

    def _revert_broken(self, namespace: str) -> bool:
        """Revert the watched workloads whose new pods fail; whether any is still watched."""
        if self.reverter is None:
            return False
        reverter = self.reverter
        now = dt.datetime.now(dt.UTC)
        watched = [
            Target.of(obj)
            for kind in ROLLING_KINDS
            if kind in self.workloads
            for obj in self.workloads[kind].store.list(
                namespace, lambda o: reverter.watched(o, now)
            )
        ]
        for target in sorted(watched, key=target_order):
            reverter.check(target)
        return bool(watched)

    def _reverted(self, namespace: str) -> list[JSON]:
        refs = [
            st.reverted_reference(obj, our_annotation(obj, constants.ANNOTATION_REVERTED) or "")
            for informer in self.workloads.values()
            for obj in plan.listed(informer.store.list(namespace, is_reverted))
        ]
        return st.sort_instrumented(refs)

    def _remove_opted_out(self, lumigo: Lumigo) -> list[Outcome]:
        """Clean the workloads labelled `false` that still carry our instrumentation."""
        namespace, name = objects.namespace(lumigo), objects.name(lumigo)
        targets = plan.opted_out_to_clean(
            (kind, obj)
            for kind, informer in self.workloads.items()
            for obj in informer.store.list(namespace, is_opted_out_but_instrumented)
        )
        if not targets:
            return []
        trigger = injection_events.controller_trigger(namespace, name)
        return self.instrumenter.remove_opted_out_all(targets, trigger)

    def _listed(self, namespace: str, targets: list[Target]) -> dict[Target, JSON]:
        """Full copies of many targets from one paginated LIST per kind instead of a GET each
        (the cache only keeps metadata). Not worth it for a few."""
        if len(targets) < BULK_LIST_THRESHOLD:
            return {}
        wanted = set(targets)
        found: dict[Target, JSON] = {}
        for resource in {t.resource for t in targets}:
            items, _ = self.client.list(
                resource, namespace, label_selector=f"!{constants.LABEL_AUTO_TRACE}"
            )
            found |= {t: o for o in items if (t := Target.of(o)) in wanted}
        return found

    def _instrumented(self, namespace: str) -> list[JSON]:
        """Labelled workloads, and opted-out ones still instrumented; Deployment-owned ReplicaSets
        inherit the label from the template but are their Deployment's business (old revisions
        would pile up in the list)."""
        refs = [
            st.instrumented_reference(obj)
            for informer in self.workloads.values()
            for obj in plan.listed(informer.store.list(namespace, is_instrumented_now))
        ]
        return st.sort_instrumented(refs)

    # -- deletion ------------------------------------------------------------------------------
    def _finalize(self, lumigo: Lumigo) -> None:
        """Ours to finalize: what deleting a Lumigo does (`removal`), shared with uninstall."""
        if constants.FINALIZER in objects.finalizers(lumigo):
            removal.finalize(self.client, self.instrumenter, lumigo)

    def _ensure_finalizer(self, lumigo: Lumigo) -> Lumigo:
        meta = lumigo["metadata"]
        finalizers = objects.finalizers(lumigo)
        if constants.FINALIZER in finalizers:
            return lumigo
        patch = {
            "metadata": {
                "finalizers": [*finalizers, constants.FINALIZER],
                "resourceVersion": meta["resourceVersion"],  # 409 if the cache was stale
            }
        }
        patched = self.client.merge_patch(LUMIGOES, meta["name"], patch, meta["namespace"])
        return cast(Lumigo, patched)

    # -- status --------------------------------------------------------------------------------
    def _write_status(
        self,
        lumigo: Lumigo,
        updates: list[st.ConditionUpdate],
        instrumented: list[JSON],
        extra: JSON | None = None,
    ) -> None:
        """`extra`: the rollout fields, written while Active (kept as they were otherwise)."""
        meta = lumigo["metadata"]
        generation = int(meta.get("generation") or 0)

        def desired(current: JSON) -> JSON | None:
            status = current.get("status") or {}
            conditions = st.apply_conditions(
                status.get("conditions") or [], updates, generation, _now()
            )
            new_status = {
                **status,
                "conditions": conditions,
                "instrumentedResources": instrumented,
                **(extra or {}),
            }
            if new_status == status:
                return None  # unchanged: no write
            current["status"] = new_status
            return current

        fresh = desired(copy.deepcopy(dict(lumigo)))
        if fresh is None:
            return
        try:
            self.client.replace(LUMIGOES, fresh, meta["namespace"], subresource="status")
        except ApiError as err:
            if not err.conflict:
                raise
            self.client.update_with_retry(
                LUMIGOES, meta["name"], meta["namespace"], desired, subresource="status"
            )
