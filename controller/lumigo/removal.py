"""What deleting a Lumigo does to its namespace: one definition for the reconciler's finalizer and
for `lumigo-operator uninstall`, which finalizes the Lumigoes no running operator took care of.

If the Lumigo was Active and its spec asks for it (`removeLumigoFromResourcesOnDeletion`, with
injection enabled), instrumentation is removed from every workload labelled as instrumented;
then the finalizer is dropped, with a resourceVersion precondition. Workloads are found with live
LISTs, not a cache: one created a moment ago may not be cached yet, and once the finalizer is
gone nobody would clean it up. If some workload cannot be changed, the finalizer stays: the
Lumigo remains as a visible sign of what is left, and the caller retries or reports.
"""

from __future__ import annotations

from typing import NamedTuple

from api import constants
from api.effective import is_active
from api.lumigo import InvalidSpecError, Lumigo, load_spec
from controller.lumigo import monitored
from controller.lumigo.instrumentation import (
    InstrumentationIncomplete,
    Instrumenter,
    Target,
    is_labelled_instrumented,
    is_opted_out_and_instrumented,
    target_order,
)
from controller.lumigo.resources import LUMIGOES, WORKLOADS
from controller.runtime.kube import KubeClient
from kube import objects
from kube.kinds import JOBS
from kube.rest import ApiError
from webhook import injection_events

PASSES = 3  # the webhook may inject a new workload while we remove: look again, bounded


class Finalized(NamedTuple):
    uninstrumented: int  # workloads changed
    finalizer_removed: bool  # False: the Lumigo was already gone


def finalize(client: KubeClient, instrumenter: Instrumenter, lumigo: Lumigo) -> Finalized:
    """Remove the namespace's instrumentation if wanted, then our finalizer. Raises
    InstrumentationIncomplete (the finalizer kept) if some workload could not be changed."""
    changed = remove_instrumentation(client, instrumenter, lumigo) if removal_wanted(lumigo) else 0
    if not others_remain(client, lumigo):
        monitored.unmark(client, lumigo["metadata"]["namespace"])
    return Finalized(changed, remove_finalizer(client, lumigo))


def others_remain(client: KubeClient, lumigo: Lumigo) -> bool:
    """Another Lumigo of the namespace that is not being deleted (it keeps the label)."""
    meta = lumigo["metadata"]
    items, _ = client.list(LUMIGOES, meta["namespace"])
    return any(
        o["metadata"]["name"] != meta["name"] and not o["metadata"].get("deletionTimestamp")
        for o in items
    )


def removal_wanted(lumigo: Lumigo) -> bool:
    """Active, injecting, and `removeLumigoFromResourcesOnDeletion` set."""
    if not is_active(lumigo):
        return False
    try:
        spec = load_spec(lumigo.get("spec"))
    except InvalidSpecError:
        return False
    injection = spec.tracing.injection
    return injection.enabled and injection.remove_lumigo_from_resources_on_deletion


def remove_instrumentation(client: KubeClient, instrumenter: Instrumenter, lumigo: Lumigo) -> int:
    """Un-instrument the Lumigo's namespace; how many workloads changed."""
    meta = lumigo["metadata"]
    namespace = meta["namespace"]
    trigger = injection_events.controller_trigger(namespace, meta["name"])
    changed = 0
    immutable: set[Target] = set()  # Jobs: one CannotRemove event each is enough
    for _ in range(PASSES):
        targets = [t for t in instrumented_targets(client, namespace) if t not in immutable]
        if not targets:
            break
        immutable |= {t for t in targets if t.resource.kind == "Job"}
        outcomes = instrumenter.uninstrument_all(targets, trigger)
        changed += sum(1 for o in outcomes if o.changed)
        failed = [o for o in outcomes if o.error]
        if failed:
            raise InstrumentationIncomplete("remove instrumentation from", failed, len(outcomes))
    return changed


class Labelled(NamedTuple):
    """Live workloads carrying the auto-trace label that still have something of ours;
    Deployment-owned ReplicaSets aside (their Deployment is the one to change)."""

    instrumented: list[Target]  # labelled as instrumented (any value but `false`)
    opted_out: list[Target]  # labelled `false`, pod template still ours (Jobs aside: immutable)


def labelled_targets(client: KubeClient, namespace: str | None = None) -> Labelled:
    instrumented, opted_out = [], []
    for resource in WORKLOADS:
        items, _ = client.list(resource, namespace, label_selector=constants.LABEL_AUTO_TRACE)
        for obj in items:
            if objects.is_deployment_owned(obj):
                continue
            if is_labelled_instrumented(obj):
                instrumented.append(Target.of(obj))
            elif resource is not JOBS and is_opted_out_and_instrumented(obj):
                opted_out.append(Target.of(obj))
    return Labelled(sorted(instrumented, key=target_order), sorted(opted_out, key=target_order))


def instrumented_targets(client: KubeClient, namespace: str | None = None) -> list[Target]:
    """Workloads labelled as instrumented (any value but `false`), live."""
    return labelled_targets(client, namespace).instrumented


def remove_finalizer(client: KubeClient, lumigo: Lumigo) -> bool:
    """Drop our finalizer (409 if the object changed meanwhile); False if it was gone."""
    meta = lumigo["metadata"]
    finalizers = [f for f in meta.get("finalizers") or [] if f != constants.FINALIZER]
    patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
    try:
        client.merge_patch(LUMIGOES, meta["name"], patch, meta["namespace"])
    except ApiError as err:
        if not err.not_found:
            raise
        return False
    return True
