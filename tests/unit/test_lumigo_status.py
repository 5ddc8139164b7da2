"""Secret validation messages and condition bookkeeping (reference behaviour + our fixes)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from api import constants
from api.effective import is_active
from api.lumigo import SecretRef
from controller.lumigo.instrumentation import is_instrumented_now, opted_out_state
from controller.lumigo.status import (
    ConditionUpdate,
    active_updates,
    apply_conditions,
    instrumented_reference,
    secret_token,
    sort_instrumented,
    token_secret_problem,
    was_ever_activated,
)
from controller.runtime.informer import metadata_projection
from webhook.pod_injection import InjectionSettings, inject, remove

from .webhook_samples import simple_template, workload

TOKEN = "t_123456789012345678901"
PREFIX = "invalid Lumigo token secret reference: "


def secret(**data: str) -> dict[str, Any]:
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


@pytest.mark.parametrize(
    ("ref", "sec", "message"),
    [
        (SecretRef("", ""), None, "no Kubernetes secret reference provided"),
        (SecretRef("", "token"), None, "cannot the secret name is not specified"),
        (SecretRef("creds", ""), None, "no key is specified for the secret 'ns/creds'"),
        (SecretRef("creds", "token"), None, "cannot retrieve secret 'ns/creds'"),
        (
            SecretRef("creds", "token"),
            secret(other=TOKEN),
            "the secret 'ns/creds' does not have the key 'token'",
        ),
        (
            SecretRef("creds", "token"),
            secret(token="t_123"),
            "the value of the field 'token' of the secret 'ns/creds' does not match the expected "
            "structure of Lumigo tokens: it should be `t_` followed by 21 alphanumeric characters;"
            " see https://docs.lumigo.io/docs/lumigo-tokens for instructions on how to retrieve "
            "your Lumigo token",
        ),
    ],
)
def test_secret_problems_use_the_reference_messages(
    ref: SecretRef, sec: dict[str, Any] | None, message: str
) -> None:
    assert token_secret_problem("ns", ref, sec) == PREFIX + message


def test_valid_tokens_pass_and_are_never_quoted() -> None:
    assert token_secret_problem("ns", SecretRef("c", "token"), secret(token=TOKEN)) is None
    # Surrounding whitespace (the newline of `echo t_... > file`) is not part of the token.
    assert token_secret_problem("ns", SecretRef("c", "token"), secret(token=TOKEN + "\n")) is None
    assert secret_token(secret(token=f" {TOKEN}\n"), "token") == TOKEN
    bad = "t_zzzzzzzzzzzzzzzzzzzzzsecret"
    problem = token_secret_problem("ns", SecretRef("c", "token"), secret(token=bad))
    assert problem is not None
    assert bad not in problem


def test_conditions_are_appended_only_when_first_true() -> None:
    now = "2026-01-01T00:00:00Z"
    errored = apply_conditions([], active_updates("boom", "InvalidTokenSecret"), 1, now)
    assert [c["type"] for c in errored] == ["Error"]  # Active=False is not appended
    assert errored[0]["status"] == "True"
    assert errored[0]["reason"] == "InvalidTokenSecret"
    assert not was_ever_activated({"status": {"conditions": errored}})

    later = "2026-01-01T00:01:00Z"
    fixed = apply_conditions(errored, active_updates(None, ""), 2, later)
    by_type = {c["type"]: c for c in fixed}
    assert by_type["Active"]["status"] == "True"
    assert by_type["Active"]["message"] == "Lumigo is ready"
    assert by_type["Error"] == {
        "type": "Error",
        "status": "False",
        "message": "",
        "reason": "NoError",
        "observedGeneration": 2,
        "lastTransitionTime": later,
        "lastUpdateTime": later,
    }
    assert is_active({"status": {"conditions": fixed}})


def test_unchanged_conditions_keep_their_timestamps() -> None:
    first = apply_conditions([], active_updates(None, ""), 3, "2026-01-01T00:00:00Z")
    again = apply_conditions(first, active_updates(None, ""), 3, "2026-01-02T00:00:00Z")
    assert again == first  # nothing changed, so no status write is needed
    bumped = apply_conditions(first, active_updates(None, ""), 4, "2026-01-03T00:00:00Z")
    active = next(c for c in bumped if c["type"] == "Active")
    assert active["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert active["lastUpdateTime"] == "2026-01-03T00:00:00Z"
    assert active["observedGeneration"] == 4


def test_transition_time_moves_only_on_flips() -> None:
    start = apply_conditions([], active_updates(None, ""), 1, "t1")
    broken = apply_conditions(start, active_updates("x", "R"), 1, "t2")
    broken_again = apply_conditions(broken, active_updates("y", "R"), 1, "t3")
    err = next(c for c in broken_again if c["type"] == "Error")
    assert err["lastTransitionTime"] == "t2"
    assert err["lastUpdateTime"] == "t3"
    assert err["message"] == "y"
    update = ConditionUpdate("Active", False, "deleting", "LumigoIsBeingDeleted")
    deleting = apply_conditions(start, [update], 1, "t4")
    assert next(c for c in deleting if c["type"] == "Active")["status"] == "False"


def test_instrumented_resources_are_sorted_like_the_reference() -> None:
    def obj(kind: str, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "batch/v1" if kind in ("Job", "CronJob") else "apps/v1",
            "kind": kind,
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                         "resourceVersion": "7"},
        }  # fmt: skip

    refs = [
        instrumented_reference(obj(k, n))
        for k, n in [
            ("Job", "a"), ("CronJob", "b"), ("Deployment", "z"), ("DaemonSet", "y"),
            ("Deployment", "a"), ("StatefulSet", "s"), ("ReplicaSet", "r"),
        ]
    ]  # fmt: skip
    ordered = [(r["kind"], r["name"]) for r in sort_instrumented(refs)]
    assert ordered == [
        ("DaemonSet", "y"), ("Deployment", "a"), ("Deployment", "z"), ("ReplicaSet", "r"),
        ("StatefulSet", "s"), ("CronJob", "b"), ("Job", "a"),
    ]  # fmt: skip
    assert set(refs[0]) == {"apiVersion", "kind", "name", "namespace", "resourceVersion", "uid"}


@pytest.mark.parametrize(
    "value",
    [
        TOKEN + "${env:AWS_SECRET}",  # collector env expansion
        TOKEN + "${file:/var/run/secrets/kubernetes.io/serviceaccount/token}",
        TOKEN + "${https://attacker.example/x}",
        "${env:X}" + TOKEN,
        TOKEN + "0",  # 22 hex digits
        TOKEN + "\nsecond: line",
        "Bearer " + TOKEN,
        TOKEN.replace("1", " ", 1),
    ],
)
def test_only_an_exact_token_is_valid(value: str) -> None:
    """The reference's unanchored search accepted all of these; the token goes into the proxy's
    configuration, so anything around `t_` + 21 hex digits is refused with the usual message."""
    problem = token_secret_problem("ns", SecretRef("c", "token"), secret(token=value))
    assert problem is not None
    assert "does not match the expected structure of Lumigo tokens" in problem
    assert secret_token(secret(token=value), "token") is None


def test_the_instrumented_list_follows_the_pod_templates_of_opted_out_workloads() -> None:
    """What the workload caches keep of a workload labelled `false`: whether its template still
    carries our instrumentation, so the status lists it until it is actually removed."""
    project = metadata_projection(opted_out_state)
    for kind in ("Deployment", "Job"):
        injected = inject(workload(kind, simple_template()), InjectionSettings())
        assert is_instrumented_now(project(injected))
        assert opted_out_state(injected) == {}  # the label tells: nothing computed
        injected["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = "false"
        assert is_instrumented_now(project(injected))
        assert not is_instrumented_now(project(remove(injected)))
