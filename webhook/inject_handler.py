"""/v1alpha1/inject: instrument workloads as they are created or updated.

Wiring (the manager does this; the handler never imports controller/):

    handler = InjectHandler(
        lumigoes=lumigo_informer.store,    # LumigoLister: .list(namespace) -> raw Lumigo dicts
        recorder=event_recorder,           # injection_events.EventRecorder: .event(obj, type, ...)
        settings=InjectionSettings(operator_version=..., injector_image=..., ...),
    )
    response = handler.handle(request)    # admission.AdmissionRequest -> AdmissionResponse

The lister should raise (not return []) while its cache is not synced: a failed lookup allows the
workload unchanged and is counted, whereas [] would be read as "no Lumigo in this namespace".

Gating, in the reference injector's order and with its texts (steps 1-8):
 1. DELETE (or CONNECT): allowed, nothing to do.
 2. Not one of the six workload kinds: allowed, "does not mutate resources of type ...".
    An object that does not decode as its kind: BadRequest (HTTP 400).
 3. The Lumigo resources of the namespace; if there are several, the one that governs it counts
    (`api.effective`: the same rule as the controller and the telemetry proxy).
 4. None: inject only if the workload is labelled `lumigo.auto-trace=true`, with the token and
    flags from its `lumigo.token-secret`/`lumigo.token-key`/`lumigo.enable-*` labels.
 5. Injection disabled in the spec, or the resource not Active (or being deleted): allowed
    unchanged.
 6. `lumigo.auto-trace=skip-next-injector`: the label is removed, nothing injected.
 7. Opted out (`lumigo.auto-trace=false`): allowed unchanged, no event (the reference sent a
    Warning on every update). Other errors: Warning event LumigoCannotAdd/UpdateInstrumentation.
    Beyond the reference: an UPDATE that labels an instrumented workload `false` gets a patch that
    removes our instrumentation (the label stays) and a LumigoRemovedInstrumentation event,
    whatever the namespace's Lumigo says (checked right after step 3: the user asked us to keep
    away). Jobs aside (immutable pod template); a CREATE labelled `false` is left alone.
 7b. Beyond the reference: a workload marked `operator.lumigo.io/instrumentation-reverted` (the
    controller reverted it: its instrumented pods failed) is allowed unchanged. The UPDATE that
    removes the mark is injected and annotated like a controller rollout, so that the controller
    watches the new pods again (a retry).
 8. Injected: the JSON patch, and a LumigoAdded/UpdatedInstrumentation event only if it changed.

Never blocks a workload: any failure allows it unchanged (the reference answered some errors with
`allowed: false`, which refuses the workload even under failurePolicy Ignore). Also fixed: Jobs are
not patched on UPDATE (their pod template is immutable, so the patch would make the update fail),
objects being deleted are left alone, and dry-run requests record no events.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, cast

from prometheus_client import Counter

from api import constants, eligibility, marks
from api.effective import governing, in_effect
from api.lumigo import Lumigo, load_spec
from kube import objects
from kube.http.routing import BadRequest
from kube.jsonpatch import diff
from kube.objects import JSON
from webhook import injection_events, pod_injection
from webhook.admission_review import AdmissionRequest, AdmissionResponse, allow, patched
from webhook.pod_injection import InjectionSettings, InvalidObjectError, OptedOutError

log = logging.getLogger("lumigo.webhook.inject")

# The handler's decisions (the other webhook series are the server's: kube.http.server_metrics).
#   result   injected | updated | removed | unchanged | skipped | failed
#   reason   short machine-readable token, e.g. lumigo, label-opt-in, no-lumigo, not-active,
#            injection-disabled, opted-out, skip-next-injector, deployment-owned, windows-pod,
#            job-immutable, being-deleted, reverted, already-instrumented, list-error,
#            invalid-settings, internal-error, ephemeral-storage
INJECTIONS_TOTAL = Counter(
    "lumigo_injections_total",
    "Workload admissions seen by the injector webhook, by outcome and reason.",
    ["namespace", "kind", "result", "reason"],
)

NOTHING_ON_DELETE: Final = "Mutating webhooks have nothing to do on deletions"
NOT_A_WORKLOAD: Final = "The Lumigo Injector webhook does not mutate resources of type {kind}"
NOT_A_SUBRESOURCE: Final = (
    "The Lumigo Injector webhook does not mutate the {sub_resource} subresource"
)
NO_LUMIGO: Final = (
    "No Lumigo configuration for the '{namespace}' namespace; resource will not be mutated"
)
INJECTION_DISABLED: Final = (
    "Tracing injection is disabled in the '{namespace}' namespace; resource will not be mutated"
)
NOT_ACTIVE: Final = (
    "The Lumigo object in the '{namespace}' namespace is not active; resource will not be mutated"
)
CANNOT_INJECT: Final = "cannot inject Lumigo tracing in the pod spec {error}"
LIST_FAILED: Final = "cannot retrieve Lumigo instances in namespace {namespace}: {error}"
BEING_DELETED: Final = "The resource is being deleted; resource will not be mutated"
REVERTED: Final = (
    "Lumigo reverted the instrumentation of this workload because its pods failed; remove the"
    f" annotation {constants.ANNOTATION_REVERTED} to try again"
)
INTERNAL_ERROR: Final = "internal error in the Lumigo injector webhook ({error}); see its logs"

# Metric series per namespace are capped: a client posting random namespaces must not be able to
# grow the operator's memory without bound.
MAX_NAMESPACE_SERIES: Final = 1000
MAX_CACHED_SPECS: Final = 1024


class LumigoLister(Protocol):
    """The Lumigo resources of a namespace, as raw dicts (read only; may be cache entries)."""

    def list(self, namespace: str) -> Sequence[Mapping[str, Any]]: ...


@dataclasses.dataclass(frozen=True)
class _Decision:
    response: AdmissionResponse
    result: str  # injected | updated | removed | unchanged | skipped | failed
    reason: str


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where the settings come from: a Lumigo resource, or the workload's own labels."""

    reason: str  # "lumigo" or "label-opt-in"
    trigger_namespace: str
    trigger_name: str
    lumigo_spec: Any = None


@dataclasses.dataclass(frozen=True)
class _Subject:
    """The workload being admitted."""

    request: AdmissionRequest
    obj: JSON
    namespace: str
    name: str
    label: str | None  # its lumigo.auto-trace label
    refusal: eligibility.Refusal | None  # why it is not to be instrumented (`api.eligibility`)

    @property
    def had_instrumentation(self) -> bool:
        return (self.label or "").startswith(constants.AUTO_TRACE_VERSION_PREFIX)


class InjectHandler:
    def __init__(
        self,
        lumigoes: LumigoLister,
        recorder: injection_events.EventRecorder,
        settings: InjectionSettings,
        *,
        max_namespace_series: int = MAX_NAMESPACE_SERIES,
        injection_mode: Callable[[], str] | None = None,
    ) -> None:
        self.lumigoes = lumigoes
        self.recorder = recorder
        self.settings = settings
        # Asked on every admission when the mode follows the cluster (--injection-mode=auto).
        self.injection_mode = injection_mode
        self.component = injection_events.webhook_component(settings.operator_version)
        self._max_namespaces = max_namespace_series
        self._namespaces: set[str] = set()
        self._spec_settings: dict[str, InjectionSettings] = {}
        self._lock = threading.Lock()
        self.clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    def handle(self, request: AdmissionRequest) -> AdmissionResponse:
        if request.operation not in {"CREATE", "UPDATE"}:
            if request.operation == "DELETE":
                return allow(request, NOTHING_ON_DELETE)
            return allow(request, f"Nothing to do on {request.operation}")
        kind = request.kind
        if pod_injection.SUPPORTED_KINDS.get(kind.kind) != kind.api_version:
            return allow(request, NOT_A_WORKLOAD.format(kind=kind))
        if request.sub_resource:  # e.g. deployments/status: the API server ignores spec changes
            return allow(request, NOT_A_SUBRESOURCE.format(sub_resource=request.sub_resource))
        obj = request.object or {}
        try:
            pod_injection.validate(obj, kind.kind)
        except InvalidObjectError as err:
            # kind and apiVersion are a supported pair here (checked above), not free text.
            raise BadRequest(f"cannot decode the {kind.api_version} {kind.kind}: {err}") from None
        subject = _Subject(
            request,
            obj,
            namespace=request.namespace or objects.namespace(obj),
            name=objects.name(obj) or request.name,
            label=pod_injection.auto_trace_label(obj),
            refusal=eligibility.refusal(obj, kind.kind, exists=request.operation == "UPDATE"),
        )
        try:
            decision = self._decide(subject)
        except Exception as err:  # never block a workload, whatever went wrong
            log.exception("injector webhook failed", extra=_log_fields(subject))
            decision = _Decision(
                allow(request, INTERNAL_ERROR.format(error=type(err).__name__)),
                "failed",
                "internal-error",
            )
        self._count(subject.namespace, kind.kind, decision.result, decision.reason)
        if log.isEnabledFor(logging.DEBUG):
            fields = {**_log_fields(subject), "result": decision.result, "reason": decision.reason}
            log.debug("admission decision", extra=fields)
        return decision.response

    # -- gating ----------------------------------------------------------------------------------
    def _decide(self, subject: _Subject) -> _Decision:
        request, namespace = subject.request, subject.namespace
        if subject.refusal == eligibility.BEING_DELETED:
            return _Decision(allow(request, BEING_DELETED), "skipped", subject.refusal)
        try:
            # The cache holds what the API server returned: Lumigo resources.
            lumigoes = cast(list[Lumigo], list(self.lumigoes.list(namespace)))
        except Exception as err:
            log.warning(
                "cannot list Lumigo resources", extra={**_log_fields(subject), "error": str(err)}
            )
            message = LIST_FAILED.format(namespace=namespace, error=err)
            return _Decision(allow(request, message), "failed", "list-error")
        if request.operation == "UPDATE" and pod_injection.is_opted_out(subject.obj):
            removed = self._remove_opted_out(subject, lumigoes)
            if removed is not None:
                return removed
        source = _source(subject, lumigoes)
        if isinstance(source, _Decision):
            return source
        if subject.label == constants.AUTO_TRACE_SKIP_NEXT_INJECTOR:
            return _Decision(
                patched(request, diff(subject.obj, _without_label(subject.obj))),
                "skipped",
                "skip-next-injector",
            )
        if subject.refusal == eligibility.REVERTED:
            return _Decision(allow(request, REVERTED), "skipped", subject.refusal)
        return self._inject(subject, source)

    # -- removal on opt-out ----------------------------------------------------------------------
    def _remove_opted_out(self, subject: _Subject, lumigoes: Sequence[Lumigo]) -> _Decision | None:
        """The patch that removes our instrumentation from a workload just labelled `false`, or
        None when there is nothing to remove (or it cannot be: a Job's template is immutable)."""
        request, kind = subject.request, subject.request.kind.kind
        if eligibility.template_is_immutable(kind, exists=True):
            return None
        ops = diff(subject.obj, pod_injection.remove(subject.obj, kind))
        if not ops:
            return None
        lumigo = governing(lumigoes)
        meta = objects.metadata(lumigo or {})
        trigger = injection_events.webhook_trigger(
            str(meta.get("namespace", subject.namespace)), str(meta.get("name", subject.name))
        )
        self._record(subject, injection_events.NORMAL, "remove", trigger, None)
        return _Decision(patched(request, ops), "removed", "opted-out")

    # -- injection -------------------------------------------------------------------------------
    def _inject(self, subject: _Subject, source: _Source) -> _Decision:
        request, kind = subject.request, subject.request.kind.kind
        try:
            settings = self._settings_for(source, subject.obj)
            mutated = pod_injection.inject(subject.obj, settings, kind)
        except OptedOutError as err:
            # The user's explicit choice: answer why, but no Warning event (the reference's spam).
            message = CANNOT_INJECT.format(error=err)
            return _Decision(allow(request, message), "skipped", "opted-out")
        except Exception as err:
            expected = isinstance(err, ValueError)  # bad spec or labels, invalid settings
            error = str(err) if expected else INTERNAL_ERROR.format(error=type(err).__name__)
            if not expected:
                log.exception("injection failed", extra=_log_fields(subject))
            action: injection_events.Action = "update" if subject.had_instrumentation else "add"
            trigger = injection_events.webhook_trigger(
                source.trigger_namespace, source.trigger_name, cannot_add=action == "add"
            )
            self._record(subject, injection_events.WARNING, action, trigger, error)
            reason = "invalid-settings" if expected else "internal-error"
            return _Decision(allow(request, CANNOT_INJECT.format(error=error)), "failed", reason)
        self._warn_about_containers(subject, kind)
        ops = diff(subject.obj, mutated)
        evicted_by_copy = pod_injection.storage_problem(subject.obj, settings, kind)
        if evicted_by_copy is not None:
            # Never get a user's pod evicted: not instrumented (what was there is removed), and
            # a Warning says why; the controller lists it in the Lumigo's status.
            trigger = injection_events.webhook_trigger(
                source.trigger_namespace, source.trigger_name, cannot_add=True
            )
            self._record(subject, injection_events.WARNING, "add", trigger, evicted_by_copy)
            if subject.refusal == eligibility.JOB_IMMUTABLE:
                ops = []  # immutable pod template: left as it is
            return _Decision(patched(request, ops), "skipped", "ephemeral-storage")
        if not ops:
            reason = pod_injection.skip_reason(subject.obj, kind) or "already-instrumented"
            return _Decision(patched(request, []), "unchanged", reason)
        if subject.refusal == eligibility.JOB_IMMUTABLE:
            message = CANNOT_INJECT.format(error=eligibility.JOB_IMMUTABLE_MESSAGE)
            return _Decision(allow(request, message), "skipped", eligibility.JOB_IMMUTABLE)
        if _is_retry_after_revert(request, kind):
            # The user removed the revert mark: watch this new revision like the first time.
            old = request.old_object or {}
            healthy = marks.rollout_complete({**old, "kind": kind})
            retry = {**mutated, "metadata": dict(objects.metadata(mutated))}
            marks.set_annotations(retry, marks.marks(subject.obj, self.clock(), healthy))
            ops = diff(subject.obj, retry)
        action = "update" if subject.had_instrumentation else "add"
        trigger = injection_events.webhook_trigger(source.trigger_namespace, source.trigger_name)
        self._record(subject, injection_events.NORMAL, action, trigger, None)
        result = "updated" if subject.had_instrumentation else "injected"
        return _Decision(patched(request, ops), result, source.reason)

    def _warn_about_containers(self, subject: _Subject, kind: str) -> None:
        """A per-container annotation that could not be honoured as written: a Warning event
        (the workload is admitted all the same, with what could be understood)."""
        problem = pod_injection.container_selection(subject.obj, kind).problem
        if problem is None or subject.request.dry_run:
            return
        # Quotes the annotations' names: user text, bounded like every other quoted value.
        message = injection_events.bounded(problem, 2 * injection_events.MAX_QUOTED)
        self._event(subject, injection_events.WARNING, constants.REASON_INVALID_CONTAINERS, message)

    def _settings_for(self, source: _Source, obj: JSON) -> InjectionSettings:
        if source.reason == "lumigo":
            settings = self._settings_for_spec(source.lumigo_spec)
        else:
            settings = settings_from_labels(self.settings, objects.labels_of(obj))
        if self.injection_mode is not None:
            mode = self.injection_mode()
            if mode != settings.injection_mode:
                settings = dataclasses.replace(settings, injection_mode=mode)
        return settings

    def _settings_for_spec(self, spec: Any) -> InjectionSettings:
        """Loading a spec costs more than the rest of an admission: cache by content (a spec
        that fails to load is not cached, and raises every time)."""
        key = json.dumps(spec, sort_keys=True)
        with self._lock:
            cached = self._spec_settings.get(key)
        if cached is not None:
            return cached
        settings = self.settings.for_spec(load_spec(spec))
        with self._lock:
            if len(self._spec_settings) >= MAX_CACHED_SPECS:
                self._spec_settings.clear()
            self._spec_settings[key] = settings
        return settings

    # -- events and metrics ----------------------------------------------------------------------
    def _record(
        self,
        subject: _Subject,
        type_: str,
        action: injection_events.Action,
        trigger: str,
        error: str | None,
    ) -> None:
        if subject.request.dry_run:
            return  # a dry run must have no side effects (sideEffects: None)
        self._event(
            subject,
            type_,
            injection_events.reason(action, failed=error is not None),
            injection_events.message(action, trigger, error),
        )

    def _event(self, subject: _Subject, type_: str, reason: str, message: str) -> None:
        metadata: JSON = {"name": subject.name, "namespace": subject.namespace}
        uid = objects.metadata(subject.obj).get("uid")
        if isinstance(uid, str) and uid:
            metadata["uid"] = uid
        involved = {
            "apiVersion": subject.request.kind.api_version,
            "kind": subject.request.kind.kind,
            "metadata": metadata,
        }
        try:
            self.recorder.event(involved, type_, reason, message, self.component)
        except Exception:
            log.exception("recording an event failed", extra=_log_fields(subject))

    def _count(self, namespace: str, kind: str, result: str, reason: str) -> None:
        with self._lock:
            if namespace not in self._namespaces:
                if len(self._namespaces) >= self._max_namespaces:
                    namespace = "other"
                else:
                    self._namespaces.add(namespace)
        INJECTIONS_TOTAL.labels(namespace, kind, result, reason).inc()


# --- helpers (also used by tests) -------------------------------------------------------------


def settings_from_labels(base: InjectionSettings, labels: Mapping[str, Any]) -> InjectionSettings:
    """Settings for a workload opted in by label, with no Lumigo resource in its namespace.
    An empty token label means the default (the reference used "", which the API server rejects).
    """

    def text(key: str) -> str:
        value = labels.get(key)
        return value if isinstance(value, str) else ""

    return dataclasses.replace(
        base,
        token_secret_name=text(constants.LABEL_TOKEN_SECRET) or constants.DEFAULT_TOKEN_SECRET,
        token_secret_key=text(constants.LABEL_TOKEN_KEY) or constants.DEFAULT_TOKEN_KEY,
        enable_traces=text(constants.LABEL_ENABLE_TRACES).lower() != "false",
        enable_logs=text(constants.LABEL_ENABLE_LOGS).lower() == "true",
    )


def _is_retry_after_revert(request: AdmissionRequest, kind: str) -> bool:
    """An UPDATE that removes the revert mark from a workload we roll out."""
    return (
        request.operation == "UPDATE"
        and kind in marks.ROLLING_KINDS
        and request.old_object is not None
        and marks.is_reverted(request.old_object)
        and not marks.is_reverted(request.object or {})
    )


def _source(subject: _Subject, lumigoes: Sequence[Lumigo]) -> _Source | _Decision:
    """Where the settings come from: the namespace's governing Lumigo resource, or the
    workload's own opt-in label when there is none; or why nothing is injected."""
    request, namespace = subject.request, subject.namespace
    if not lumigoes:
        if (subject.label or "").lower() != constants.AUTO_TRACE_TRUE:
            message = NO_LUMIGO.format(namespace=namespace)
            return _Decision(allow(request, message), "skipped", "no-lumigo")
        return _Source("label-opt-in", namespace, subject.name)
    lumigo = governing(lumigoes)
    assert lumigo is not None
    spec = lumigo.get("spec")
    if _injection_disabled(spec):
        message = INJECTION_DISABLED.format(namespace=namespace)
        return _Decision(allow(request, message), "skipped", "injection-disabled")
    if not in_effect(lumigo):
        # Being deleted: the controller is removing instrumentation from the namespace,
        # so new workloads must not get it either.
        message = NOT_ACTIVE.format(namespace=namespace)
        return _Decision(allow(request, message), "skipped", "not-active")
    meta = objects.metadata(lumigo)
    return _Source("lumigo", str(meta.get("namespace", namespace)), str(meta.get("name", "")), spec)


def _injection_disabled(spec: Any) -> bool:
    """`tracing.injection.enabled` explicitly false (absent means enabled)."""
    node = spec
    for key in ("tracing", "injection"):
        node = node.get(key) if isinstance(node, Mapping) else None
    return isinstance(node, Mapping) and node.get("enabled") is False


def _without_label(obj: JSON) -> JSON:
    """`obj` without its top-level lumigo.auto-trace label (shallow copies along the path)."""
    meta = dict(obj["metadata"])
    meta["labels"] = {k: v for k, v in meta["labels"].items() if k != constants.LABEL_AUTO_TRACE}
    return {**obj, "metadata": meta}


def _log_fields(subject: _Subject) -> dict[str, Any]:
    return {
        "uid": subject.request.uid,
        "operation": subject.request.operation,
        "kind": subject.request.kind.kind,
        "namespace": subject.namespace,
        "resource": subject.name,  # not "name": that LogRecord attribute cannot be overridden
    }
