"""What a reconcile does to the workloads of an active namespace, as pure functions of what the
cache shows (the reconciler, `lumigo_reconciler`, does the reading and the writing):

- selection: which unlabelled workloads the controller instruments (`select`): those created
  after the Lumigo became active (repair: the webhook should have done it, but it was down, its
  failurePolicy is Ignore), or every one when `injectLumigoIntoExistingResourcesOnCreation` is
  set; never one `api.eligibility` refuses; Jobs only get an event, once, on first activation;
- budget: which of them start now (`schedule`): the kinds that restart no pod all, the rolling
  kinds as many as `maxConcurrentRollouts` leaves free;
- repair of opt-outs: which workloads labelled `false` still carry our instrumentation and are
  cleaned (`opted_out_to_clean`);
- the status lists (instrumented, reverted): never a Deployment's ReplicaSet (`listed`), which
  carries its Deployment's labels and annotations.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from api import constants, eligibility
from api.lumigo import LumigoStatus
from api.marks import ROLLING_KINDS
from controller.lumigo import status as st
from controller.lumigo.instrumentation import Target, is_opted_out_but_instrumented, target_order
from controller.lumigo.rollouts import Budget
from kube import objects

W = TypeVar("W", bound=Mapping[str, Any])


@dataclass(frozen=True)
class Selection:
    targets: list[Target]  # to instrument, now or when the budget allows
    jobs: list[Target]  # Jobs the controller cannot change: an event each


def activation_time(status: LumigoStatus | None, now: str) -> str:
    """When the Lumigo became active: its Active condition's lastTransitionTime while True,
    else `now` (becoming active in this reconcile)."""
    active = st.condition(status, constants.CONDITION_ACTIVE)
    if active is not None and active.get("status") == "True":
        return str(active.get("lastTransitionTime", ""))
    return now


def select(
    workloads: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    activated: str,
    inject_existing: bool,
    first_activation: bool,
    left_out: Container[Target] = (),
) -> Selection:
    """The unlabelled `workloads` (kind, cached object) the controller instruments. Created
    strictly after `activated`: creation timestamps have a one-second resolution, and a workload
    from the same second may well predate the activation. `left_out`: those instrumenting would
    harm (`skipped`), warned about instead."""
    targets: list[Target] = []
    jobs: list[Target] = []
    for kind, obj in workloads:
        why = eligibility.refusal(obj, kind, exists=True)
        if why is not None and why != eligibility.JOB_IMMUTABLE:
            continue
        if not (inject_existing or objects.created(obj) > activated):
            continue
        target = Target.of(obj)
        if target in left_out:
            continue
        if why == eligibility.JOB_IMMUTABLE:
            if first_activation and inject_existing:
                jobs.append(target)
            continue
        targets.append(target)
    return Selection(targets, jobs)


def schedule(targets: Iterable[Target], limit: int, rolling: int) -> tuple[list[Target], int]:
    """The targets to instrument now, in `target_order`, and how many rolling ones wait for the
    budget (`limit` rollouts at once, 0: no limit, `rolling` under way)."""
    ordered = sorted(targets, key=target_order)
    rollable = [t for t in ordered if t.resource.kind in ROLLING_KINDS]
    free = Budget(limit, rolling).free
    now = [t for t in ordered if t.resource.kind not in ROLLING_KINDS] + rollable[:free]
    return sorted(now, key=target_order), len(rollable) - len(rollable[:free])


def opted_out_to_clean(workloads: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Target]:
    """Cached workloads labelled `false` whose pod template is still ours, in `target_order`;
    not Jobs (immutable pod template) nor those being deleted."""
    return sorted(
        (
            Target.of(obj)
            for kind, obj in workloads
            if not eligibility.template_is_immutable(kind, exists=True)
            and is_opted_out_but_instrumented(dict(obj))
            and not objects.is_being_deleted(obj)
        ),
        key=target_order,
    )


def listed(workloads: Iterable[W]) -> list[W]:
    """The workloads a status list shows: never a Deployment's ReplicaSet, which inherits its
    Deployment's labels and annotations (old revisions would pile up in the list)."""
    return [o for o in workloads if not objects.is_deployment_owned(o)]
