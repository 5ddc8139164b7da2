"""Whether a workload may be instrumented (`api.eligibility`): the one rule the webhook and the
controller share, and the typed accessors it reads through (`kube.objects`)."""

from __future__ import annotations

from typing import Any

import pytest

from api import constants, eligibility
from api.marks import STATE, is_reverted
from kube import objects

JSON = dict[str, Any]
DEPLOYMENT_OWNER = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u"}


def workload(kind: str = "Deployment", **meta: Any) -> JSON:
    return {"kind": kind, "metadata": {"name": "w", "namespace": "ns", **meta}}


REVERTED = {"annotations": {constants.ANNOTATION_REVERTED: "pods failed"}}
DELETING = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
OWNED = {"ownerReferences": [DEPLOYMENT_OWNER]}


@pytest.mark.parametrize(
    ("kind", "meta", "exists", "expected"),
    [
        ("Deployment", {}, False, None),
        ("Deployment", {}, True, None),
        ("StatefulSet", {}, True, None),
        ("CronJob", {}, True, None),
        ("Job", {}, False, None),  # created: its pod template is still ours to set
        ("Job", {}, True, "job-immutable"),
        ("ReplicaSet", {}, True, None),  # standalone
        ("ReplicaSet", OWNED, True, "deployment-owned"),
        ("ReplicaSet", OWNED, False, "deployment-owned"),
        ("ReplicaSet", {"ownerReferences": [{**DEPLOYMENT_OWNER, "apiVersion": "v1"}]}, True, None),
        ("ReplicaSet", {"ownerReferences": "not a list of objects"}, True, None),
        ("Deployment", OWNED, True, None),  # only ReplicaSets follow a Deployment
        ("Deployment", REVERTED, True, "reverted"),
        ("Job", REVERTED, True, "reverted"),
        ("ReplicaSet", {**OWNED, **REVERTED}, True, "reverted"),
        ("Deployment", DELETING, False, "being-deleted"),
        ("Job", {**DELETING, **REVERTED}, True, "being-deleted"),
        ("ReplicaSet", {**OWNED, **DELETING}, True, "being-deleted"),
        ("Deployment", {"deletionTimestamp": None}, True, None),
    ],
)
def test_refusal(kind: str, meta: JSON, exists: bool, expected: str | None) -> None:
    assert eligibility.refusal(workload(kind, **meta), kind, exists=exists) == expected


def test_the_kind_given_wins_over_the_objects_own() -> None:
    """The webhook decodes the kind from the request, not from the (user-written) object."""
    obj = {"metadata": {"name": "rs", **OWNED}}
    assert eligibility.refusal(obj, "ReplicaSet", exists=True) == "deployment-owned"
    assert eligibility.refusal(obj, "Job", exists=True) == "job-immutable"


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (workload(**REVERTED), True),
        (workload(), False),
        (workload(annotations={"other": "x"}), False),
        # A cached metadata projection carries our annotations under the rollout state.
        ({**workload(), STATE: {"annotations": {constants.ANNOTATION_REVERTED: ""}}}, True),
        ({**workload(), STATE: {"annotations": {}}}, False),
        ({**workload(), STATE: "garbage"}, False),
        ({"metadata": "garbage"}, False),
    ],
)
def test_one_is_reverted_for_full_objects_and_projections(obj: JSON, expected: bool) -> None:
    assert is_reverted(obj) is expected


@pytest.mark.parametrize(
    ("obj", "name", "namespace", "generation", "labels"),
    [
        ({}, "", "", 0, {}),
        ({"metadata": None}, "", "", 0, {}),
        ({"metadata": "x"}, "", "", 0, {}),
        ({"metadata": {"labels": "x", "generation": "x"}}, "", "", 0, {}),
        (
            {"metadata": {"name": "a", "namespace": "b", "generation": 3, "labels": {"k": "v"}}},
            "a", "b", 3, {"k": "v"},
        ),
    ],
)  # fmt: skip
def test_accessors_read_what_is_there_and_nothing_else(
    obj: JSON, name: str, namespace: str, generation: int, labels: JSON
) -> None:
    assert objects.name(obj) == name
    assert objects.namespace(obj) == namespace
    assert objects.generation(obj) == generation
    assert dict(objects.labels_of(obj)) == labels
    assert dict(objects.annotations_of(obj)) == {}


def test_the_job_message_is_the_references() -> None:
    assert eligibility.JOB_IMMUTABLE_MESSAGE.endswith("immutable once the job has been created")
