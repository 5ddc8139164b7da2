"""The reconciler's rules as pure functions (`controller.lumigo.plan`): which workloads it
instruments (selection and repair), how many start now (budget), which opted-out ones it cleans,
and what the status lists."""

from __future__ import annotations

from typing import Any

import pytest

from api import constants
from api.marks import STATE
from controller.lumigo import plan
from controller.lumigo.instrumentation import OPTED_OUT_INSTRUMENTED, Target

JSON = dict[str, Any]
ACTIVATED = "2026-03-01T12:00:00Z"
BEFORE = "2026-03-01T11:00:00Z"
AFTER = "2026-03-01T13:00:00Z"
OWNED = {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"}]}


def workload(kind: str, name: str = "w", created: str = BEFORE, **meta: Any) -> JSON:
    return {
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created, **meta},
    }


def names(targets: list[Target]) -> list[str]:
    return [f"{t.resource.kind}/{t.name}" for t in targets]


# --- activation time ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, "now"),
        ({}, "now"),
        ({"conditions": [{"type": "Active", "status": "False", "lastTransitionTime": "t"}]}, "now"),
        ({"conditions": [{"type": "Active", "status": "True", "lastTransitionTime": "t"}]}, "t"),
        ({"conditions": [{"type": "Error", "status": "True", "lastTransitionTime": "t"}]}, "now"),
    ],
)
def test_activation_time(status: JSON | None, expected: str) -> None:
    assert plan.activation_time(status, "now") == expected


# --- selection and repair -----------------------------------------------------------------------

REVERTED = {"annotations": {constants.ANNOTATION_REVERTED: "pods failed"}}
DELETING = {"deletionTimestamp": AFTER}


@pytest.mark.parametrize(
    ("obj", "inject_existing", "first_activation", "targets", "jobs"),
    [
        # Repair: created after the activation, the webhook should have done it.
        (workload("Deployment", created=AFTER), False, False, ["Deployment/w"], []),
        (workload("Deployment", created=BEFORE), False, False, [], []),
        # Same second as the activation: may predate it.
        (workload("Deployment", created=ACTIVATED), False, False, [], []),
        (workload("Deployment", created=BEFORE), True, False, ["Deployment/w"], []),
        (workload("CronJob", created=BEFORE), True, True, ["CronJob/w"], []),
        (workload("ReplicaSet", created=AFTER), False, False, ["ReplicaSet/w"], []),
        # Never what `api.eligibility` refuses.
        (workload("ReplicaSet", created=AFTER, **OWNED), True, True, [], []),
        (workload("Deployment", created=AFTER, **REVERTED), True, True, [], []),
        (workload("Deployment", created=AFTER, **DELETING), True, True, [], []),
        # A reverted workload as the cache holds it: the mark in the rollout state.
        (
            {**workload("StatefulSet", created=AFTER),
             STATE: {"annotations": {constants.ANNOTATION_REVERTED: ""}}},
            True, True, [], [],
        ),
        # Jobs: an event, once, on first activation with inject-existing.
        (workload("Job", created=BEFORE), True, True, [], ["Job/w"]),
        (workload("Job", created=AFTER), True, False, [], []),
        (workload("Job", created=AFTER), False, True, [], []),
        (workload("Job", created=BEFORE), False, True, [], []),
        (workload("Job", created=AFTER, **REVERTED), True, True, [], []),
    ],
)  # fmt: skip
def test_select(
    obj: JSON, inject_existing: bool, first_activation: bool, targets: list[str], jobs: list[str]
) -> None:
    selection = plan.select(
        [(obj["kind"], obj)],
        activated=ACTIVATED,
        inject_existing=inject_existing,
        first_activation=first_activation,
    )
    assert (names(selection.targets), names(selection.jobs)) == (targets, jobs)


def test_select_leaves_out_what_was_warned_about() -> None:
    harmed, fine = workload("Deployment", "a"), workload("Deployment", "b")
    selection = plan.select(
        [("Deployment", harmed), ("Deployment", fine), ("Job", workload("Job", "j"))],
        activated=ACTIVATED,
        inject_existing=True,
        first_activation=True,
        left_out={Target.of(harmed), Target.of(workload("Job", "j"))},
    )
    assert (names(selection.targets), names(selection.jobs)) == (["Deployment/b"], [])


# --- budget -------------------------------------------------------------------------------------


def targets(*specs: str) -> list[Target]:
    return [Target.of(workload(*spec.split("/"))) for spec in specs]


MIXED = targets("Deployment/b", "CronJob/c", "StatefulSet/s", "Deployment/a", "ReplicaSet/r")


@pytest.mark.parametrize(
    ("limit", "rolling", "now", "pending"),
    [
        (0, 0, ["Deployment/a", "Deployment/b", "ReplicaSet/r", "StatefulSet/s", "CronJob/c"], 0),
        (0, 9, ["Deployment/a", "Deployment/b", "ReplicaSet/r", "StatefulSet/s", "CronJob/c"], 0),
        (1, 0, ["Deployment/a", "ReplicaSet/r", "CronJob/c"], 2),
        (2, 0, ["Deployment/a", "Deployment/b", "ReplicaSet/r", "CronJob/c"], 1),
        (2, 1, ["Deployment/a", "ReplicaSet/r", "CronJob/c"], 2),
        (2, 2, ["ReplicaSet/r", "CronJob/c"], 3),
        (2, 5, ["ReplicaSet/r", "CronJob/c"], 3),
        (3, 0, ["Deployment/a", "Deployment/b", "ReplicaSet/r", "StatefulSet/s", "CronJob/c"], 0),
    ],
)
def test_schedule_starts_what_restarts_no_pod_and_rolls_within_the_budget(
    limit: int, rolling: int, now: list[str], pending: int
) -> None:
    started, waiting = plan.schedule(MIXED, limit, rolling)
    assert (names(started), waiting) == (now, pending)


# --- opted-out repair and status lists ----------------------------------------------------------


def opted_out(kind: str, name: str, instrumented: bool = True, **meta: Any) -> JSON:
    obj = workload(kind, name, labels={constants.LABEL_AUTO_TRACE: "false"}, **meta)
    return {**obj, OPTED_OUT_INSTRUMENTED: instrumented}


def test_opted_out_to_clean() -> None:
    cached = [
        opted_out("StatefulSet", "s"),
        opted_out("Deployment", "b"),
        opted_out("Deployment", "a"),
        opted_out("Deployment", "clean", instrumented=False),
        opted_out("Deployment", "going", **DELETING),
        opted_out("Job", "j"),  # immutable: stays listed instead
        {**workload("Deployment", "unlabelled"), OPTED_OUT_INSTRUMENTED: True},
    ]
    assert names(plan.opted_out_to_clean((o["kind"], o) for o in cached)) == [
        "Deployment/a",
        "Deployment/b",
        "StatefulSet/s",
    ]


def test_the_status_lists_never_show_a_deployments_replicaset() -> None:
    cached = [workload("ReplicaSet", "owned", **OWNED), workload("ReplicaSet", "standalone")]
    assert [o["metadata"]["name"] for o in plan.listed(cached)] == ["standalone"]
