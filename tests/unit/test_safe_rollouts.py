"""Safe rollouts, the pure parts: when a rollout is complete, what counts as rolling because of us,
the budget, and what makes pods healthy or broken."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from api import constants
from api.marks import marks, rollout_complete
from controller.lumigo import workload_health
from controller.lumigo.revert import Reverter
from controller.lumigo.rollouts import Budget, is_rolling_because_of_us, state
from controller.runtime.selectors import selector_string

JSON = dict[str, Any]
NOW = dt.datetime(2026, 11, 25, 12, 0, 0, tzinfo=dt.UTC)
THRESHOLDS = workload_health.Thresholds(restarts=3, unready_after=300)


def deployment(generation: int = 2, **status: int) -> JSON:
    return {
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns", "generation": generation},
        "spec": {"replicas": 2},
        "status": status,
    }


def done(generation: int = 2) -> JSON:
    return deployment(generation, observedGeneration=generation, replicas=2, updatedReplicas=2,
                      availableReplicas=2)  # fmt: skip


# --- rollout_complete ---------------------------------------------------------------------------


def test_a_deployment_is_complete_when_every_replica_is_updated_and_available() -> None:
    assert rollout_complete(done())
    assert not rollout_complete({**done(), "status": {**done()["status"], "observedGeneration": 1}})
    assert not rollout_complete({**done(), "status": {**done()["status"], "updatedReplicas": 1}})
    assert not rollout_complete({**done(), "status": {**done()["status"], "availableReplicas": 1}})
    # An old pod still terminating: more replicas than updated ones.
    assert not rollout_complete({**done(), "status": {**done()["status"], "replicas": 3}})
    assert not rollout_complete(deployment())  # no controller has looked at it yet


def test_statefulsets_and_daemonsets_follow_their_own_status_fields() -> None:
    sts = {
        "kind": "StatefulSet",
        "metadata": {"generation": 3},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 3, "updatedReplicas": 2, "readyReplicas": 2,
                   "currentRevision": "a", "updateRevision": "a"},
    }  # fmt: skip
    assert rollout_complete(sts)
    assert not rollout_complete({**sts, "status": {**sts["status"], "updateRevision": "b"}})
    assert rollout_complete({**sts, "spec": {"updateStrategy": {"type": "OnDelete"}}})
    ds = {
        "kind": "DaemonSet",
        "metadata": {"generation": 1},
        "spec": {},
        "status": {"observedGeneration": 1, "desiredNumberScheduled": 3,
                   "updatedNumberScheduled": 3, "numberAvailable": 2},
    }  # fmt: skip
    assert not rollout_complete(ds)
    assert rollout_complete({**ds, "status": {**ds["status"], "numberAvailable": 3}})


# --- rolling because of us ---------------------------------------------------------------------


def ours(obj: JSON, generation: int, at: dt.datetime = NOW) -> JSON:
    obj["metadata"]["annotations"] = {
        constants.ANNOTATION_INSTRUMENTED_GENERATION: str(generation),
        constants.ANNOTATION_INSTRUMENTED_AT: at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return obj


def cached(obj: JSON) -> JSON:
    """What the workload cache keeps: metadata projection plus the rollout state."""
    return {"kind": obj["kind"], "metadata": {"name": "web"}, **state(obj)}


def test_a_rollout_we_started_counts_until_complete_or_timed_out() -> None:
    rolling = cached(ours(deployment(generation=2, observedGeneration=1), 2))
    assert is_rolling_because_of_us(rolling, NOW + dt.timedelta(seconds=30), timeout=600)
    assert not is_rolling_because_of_us(rolling, NOW + dt.timedelta(seconds=601), timeout=600)
    assert not is_rolling_because_of_us(cached(ours(done(), 2)), NOW, timeout=600)


def test_someone_elses_rollout_or_a_bad_annotation_does_not_count() -> None:
    theirs = cached(ours(deployment(generation=3, observedGeneration=2), 2))  # changed since
    assert not is_rolling_because_of_us(theirs, NOW, timeout=600)
    unmarked = cached(deployment(generation=2, observedGeneration=1))
    assert not is_rolling_because_of_us(unmarked, NOW, timeout=600)
    garbage = ours(deployment(generation=2, observedGeneration=1), 2)
    garbage["metadata"]["annotations"][constants.ANNOTATION_INSTRUMENTED_AT] = "yesterday"
    assert not is_rolling_because_of_us(cached(garbage), NOW, timeout=600)
    cron = {"kind": "CronJob", "metadata": {"name": "c", "generation": 2}}
    assert not is_rolling_because_of_us(cached(ours(cron, 2)), NOW, timeout=600)


def test_our_write_records_the_generation_it_makes_and_the_health_before() -> None:
    assert marks(done(generation=4), NOW, healthy_before=False) == {
        constants.ANNOTATION_INSTRUMENTED_GENERATION: "5",
        constants.ANNOTATION_INSTRUMENTED_AT: "2026-11-25T12:00:00Z",
        constants.ANNOTATION_HEALTHY_BEFORE: "false",
    }


@pytest.mark.parametrize(
    ("limit", "rolling", "free"), [(3, 0, 3), (3, 2, 1), (3, 5, 0), (0, 50, None)]
)
def test_the_budget(limit: int, rolling: int, free: int | None) -> None:
    assert Budget(limit, rolling).free == free


# --- pods -----------------------------------------------------------------------------------


def pod(
    *,
    ready: bool = True,
    restarts: int = 0,
    injected: bool = True,
    init_exit: int | None = None,
    since: dt.datetime = NOW,
    waiting: str | None = None,
) -> JSON:
    container: JSON = {"name": "app", "restartCount": restarts, "state": {"running": {}}}
    if restarts:
        container["lastState"] = {"terminated": {"exitCode": 3, "reason": "Error"}}
    if waiting:
        container["state"] = {"waiting": {"reason": waiting}}
    status: JSON = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                        "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ")}],
        "containerStatuses": [container],
    }  # fmt: skip
    if init_exit is not None:
        status["phase"] = "Pending"
        status["initContainerStatuses"] = [
            {"name": "lumigo-injector", "state": {"terminated": {"exitCode": init_exit}}}
        ]
    spec: JSON = {"containers": [{"name": "app"}]}
    if injected:
        spec["initContainers"] = [{"name": "lumigo-injector"}]
    return {"metadata": {"name": "web-1"}, "spec": spec, "status": status}


def test_new_pods_that_crash_loop_fail_the_init_container_or_stay_unready_are_broken() -> None:
    later = NOW + dt.timedelta(seconds=301)
    assert workload_health.new_pods_problem([pod(restarts=3)], THRESHOLDS, NOW) == (
        "container app of pod web-1 restarted 3 times, last exit code 3, Error"
    )
    assert workload_health.new_pods_problem([pod(init_exit=1)], THRESHOLDS, NOW) == (
        "the lumigo-injector init container of pod web-1 failed (exit code 1)"
    )
    assert workload_health.new_pods_problem([pod(ready=False)], THRESHOLDS, later) == (
        "pod web-1 has not been ready for 301 s"
    )


def test_new_pods_within_the_thresholds_or_old_pods_are_not_broken() -> None:
    assert workload_health.new_pods_problem([pod(restarts=2)], THRESHOLDS, NOW) is None
    assert workload_health.new_pods_problem([pod(ready=False)], THRESHOLDS, NOW) is None
    # The previous revision's pods (no lumigo-injector) are not ours to judge.
    assert (
        workload_health.new_pods_problem([pod(restarts=9, injected=False)], THRESHOLDS, NOW) is None
    )
    terminating = pod(restarts=9)
    terminating["metadata"]["deletionTimestamp"] = "2026-11-25T12:00:00Z"
    assert workload_health.new_pods_problem([terminating], THRESHOLDS, NOW) is None


def test_health_before_instrumentation() -> None:
    assert workload_health.is_healthy([pod(injected=False, restarts=7)], THRESHOLDS)  # old restarts
    assert workload_health.is_healthy([], THRESHOLDS)
    assert not workload_health.is_healthy([pod(injected=False, ready=False)], THRESHOLDS)
    assert not workload_health.is_healthy(
        [pod(injected=False, waiting="CrashLoopBackOff")], THRESHOLDS
    )


def test_selectors_become_list_queries() -> None:
    selector = {
        "matchLabels": {"app": "web", "tier": "front"},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
            {"key": "team", "operator": "Exists"},
        ],
    }
    assert selector_string(selector) == (
        "app=web,tier=front,env in (a,b),!canary,zone notin (x),team"
    )
    assert selector_string({}) is None
    assert selector_string(None) is None


def test_only_a_watched_workload_that_is_not_fully_available_costs_a_pod_list() -> None:
    reverter = Reverter(client=None, recorder=None, component="c", window=600)  # type: ignore[arg-type]
    labelled = {"lumigo.auto-trace": "lumigo-operator.v1"}

    def watched(obj: JSON, healthy_before: str = "true", at: dt.datetime = NOW) -> bool:
        obj = ours(obj, obj["metadata"]["generation"], at)
        obj["metadata"]["annotations"][constants.ANNOTATION_HEALTHY_BEFORE] = healthy_before
        obj["metadata"]["labels"] = labelled
        projected = {**cached(obj), "metadata": {"name": "web", "labels": labelled}}
        return reverter.watched(projected, NOW + dt.timedelta(seconds=60))

    assert watched(deployment(generation=2, observedGeneration=2, replicas=2, updatedReplicas=2))
    assert not watched(done())  # every replica available: nothing can be failing
    assert not watched(deployment(generation=2), healthy_before="false")
    assert not watched(deployment(generation=2), at=NOW - dt.timedelta(seconds=601))


def test_a_pod_with_the_autotrace_image_volume_counts_as_instrumented() -> None:
    """Image-volume mode: no init container, our volume is the image."""
    crashing = pod(restarts=3, injected=False)
    crashing["spec"]["volumes"] = [{"name": "lumigo-injector", "image": {"reference": "x:1"}}]
    assert workload_health.new_pods_problem([crashing], THRESHOLDS, NOW) is not None
    crashing["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    assert workload_health.new_pods_problem([crashing], THRESHOLDS, NOW) is None


# --- pods the API server refuses (FailedCreate) ---------------------------------------------------

QUOTA = (
    'pods "web-7c9-x2" is forbidden: exceeded quota: q, requested: limits.cpu=200m,'
    " used: limits.cpu=100m, limited: limits.cpu=250m"
)


def test_a_deployments_replica_failure_is_the_api_servers_refusal() -> None:
    failing = deployment(generation=2)
    failing["status"]["conditions"] = [
        {"type": "Available", "status": "True", "message": "fine"},
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA},
    ]
    assert workload_health.replica_failure(failing) == (
        f"the API server refused the new pods of Deployment web: {QUOTA}"
    )
    failing["status"]["conditions"][1]["status"] = "False"
    assert workload_health.replica_failure(failing) is None
    assert workload_health.replica_failure(deployment()) is None


def event(reason: str, at: dt.datetime, message: str = QUOTA, field: str = "lastTimestamp") -> JSON:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    if field == "series":
        return {"reason": reason, "message": message, "series": {"lastObservedTime": stamp}}
    return {"reason": reason, "message": message, field: stamp}


def test_only_failed_create_events_since_we_instrumented_count_and_the_newest_wins() -> None:
    before, after = NOW - dt.timedelta(seconds=5), NOW + dt.timedelta(seconds=5)
    newest = "create Pod web-0 in StatefulSet web failed error: LimitRange says no"

    def problem(*events: JSON) -> str | None:
        return workload_health.failed_create("StatefulSet", "web", events, NOW)

    assert problem(event("FailedCreate", before)) is None  # not ours: before our change
    assert problem(event("SuccessfulCreate", after)) is None
    assert problem(event("FailedCreate", after, field="nothing")) is None  # no time: not counted
    found = problem(
        event("FailedCreate", NOW),
        event("FailedCreate", after, newest, field="series"),
        event("FailedCreate", after - dt.timedelta(seconds=1), field="eventTime"),
    )
    assert found == f"the API server refused the new pods of StatefulSet web: {newest}"


def test_a_long_or_multi_line_refusal_is_bounded_to_one_line() -> None:
    long = "forbidden:\n" + "x" * 5000
    found = workload_health.failed_create(
        "DaemonSet", "agent", [event("FailedCreate", NOW, long)], NOW
    )
    assert found is not None
    assert "\n" not in found
    message = found.split(": ", 1)[1]
    assert len(message) == workload_health.MESSAGE_LIMIT
    assert message.startswith("forbidden: xxx")
    assert message.endswith("…")
