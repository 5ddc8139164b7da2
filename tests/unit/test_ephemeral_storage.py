"""A pod whose ephemeral-storage limit cannot hold the tracer payload copy is never instrumented
in the init-container mode (issue 28, item 9): the kubelet would evict it. The decision, and
`inject` itself."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from api import constants
from controller.lumigo import skipped
from webhook import storage
from webhook.admission_review import AdmissionResponse
from webhook.pod_injection import InjectionSettings, inject, remove

from .test_webhook_inject_handler import World, count, patched_object
from .webhook_samples import simple_template, template_of, workload

JSON = dict[str, Any]
INIT = InjectionSettings(operator_version="1.2.3")
IMAGE = InjectionSettings(
    operator_version="1.2.3", injection_mode=constants.INJECTION_MODE_IMAGE_VOLUME
)
M = Decimal(10**6)
Mi = Decimal(2**20)


def c(name: str, limit: str | None = None, **extra: Any) -> JSON:
    container: JSON = {"name": name, "image": "app:1", **extra}
    if limit is not None:
        container["resources"] = {"limits": {"ephemeral-storage": limit}}
    return container


def spec(containers: list[JSON], init: list[JSON] | None = None) -> JSON:
    out: JSON = {"containers": containers}
    if init is not None:
        out["initContainers"] = init
    return out


@pytest.mark.parametrize(
    ("pod_spec", "limit"),
    [
        (spec([c("app")]), None),
        (spec([c("app", "100Mi")]), 100 * Mi),
        # Regular containers add up; one without a limit adds nothing.
        (spec([c("app", "100Mi"), c("side", "1Gi"), c("free")]), 1124 * Mi),
        # A regular init container counts when it is larger than the containers' sum.
        (spec([c("app", "100Mi")], [c("setup", "2G")]), 2000 * M),
        (spec([c("app", "3G")], [c("setup", "2G")]), 3000 * M),
        # A sidecar (restartable init container) runs beside the containers: it adds up, and
        # counts under the regular init containers that start after it.
        (spec([c("app", "100M")], [c("proxy", "50M", restartPolicy="Always")]), 150 * M),
        (
            spec(
                [c("app", "100M")], [c("proxy", "50M", restartPolicy="Always"), c("setup", "120M")]
            ),
            170 * M,
        ),
        # Our own init container is not the user's (it sets no ephemeral-storage limit).
        (spec([c("app")], [c(constants.INJECTOR_INIT_CONTAINER, "1Gi")]), None),
        # The API server stores quantities as strings; an unparsable one is not a limit.
        (spec([c("app", "lots")]), None),
    ],
)
def test_the_pod_limit_is_the_kubelets(pod_spec: JSON, limit: Decimal | None) -> None:
    assert storage.pod_limit(pod_spec) == limit


@pytest.mark.parametrize(
    ("pod_spec", "fits"),
    [
        (spec([c("app")]), True),
        (spec([c("app", "1Gi")]), True),
        (spec([c("app", "400M")]), True),  # the copy's bound (200M) and as much again
        (spec([c("app", "399M")]), False),
        (spec([c("app", "100Mi")]), False),
        (spec([c("app", "100Mi"), c("b", "100Mi"), c("d", "200Mi")]), True),
        (spec([c("app", "50Mi")], [c("setup", "1Gi")]), True),
    ],
)
def test_the_decision(pod_spec: JSON, fits: bool) -> None:
    problem = storage.problem(pod_spec)
    assert (problem is None) is fits
    if problem is not None:
        assert "ephemeral-storage limit" in problem
        assert "200M" in problem
        assert "evict" in problem
        assert len(problem) <= 256  # an Event quotes at most that much of it


def small_limit_workload(limit: str = "100Mi") -> JSON:
    template = simple_template()
    template["spec"]["containers"][0]["resources"] = {"limits": {"ephemeral-storage": limit}}
    return workload("Deployment", template)


def test_inject_leaves_a_pod_that_would_be_evicted_untouched() -> None:
    obj = small_limit_workload()
    assert inject(obj, INIT) == obj


def test_a_limit_lowered_after_injection_removes_the_instrumentation() -> None:
    obj = small_limit_workload("1Gi")
    injected = inject(obj, INIT)
    assert "initContainers" in template_of(injected)["spec"]
    lowered = inject(small_limit_workload("1Gi"), INIT)
    template_of(lowered)["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = (
        "100Mi"
    )
    out = inject(lowered, INIT)
    assert out == remove(lowered)
    assert "lumigo" not in str(template_of(out)["spec"]).lower()


def test_the_image_volume_mode_copies_nothing_and_instruments_it() -> None:
    out = inject(small_limit_workload(), IMAGE)
    pod_spec = template_of(out)["spec"]
    assert "initContainers" not in pod_spec
    assert pod_spec["volumes"][0]["image"]["reference"] == IMAGE.injector_image
    assert storage.problem(pod_spec) is not None  # the decision is the caller's, by mode


# --- the injector webhook ------------------------------------------------------------------

CANNOT_ADD_TRIGGER = "injector webhook, acting on behalf of the 'ns/lumigo'"


def admitted(obj: JSON, response: AdmissionResponse) -> JSON:
    """The object as the API server stores it after the response."""
    return patched_object(obj, response) if "patch" in response.review()["response"] else obj


def test_the_webhook_skips_it_with_a_warning_event() -> None:
    world = World()
    obj = small_limit_workload()
    before = count("Deployment", "skipped", "ephemeral-storage")
    response = world.admit(obj)
    assert admitted(obj, response) == obj
    ((_, type_, reason, message, _),) = world.recorder.events
    assert (type_, reason) == ("Warning", "LumigoCannotAddInstrumentation")
    assert message == (
        f"Cannot add Lumigo instrumentation (trigger: {CANNOT_ADD_TRIGGER}): "
        f"{storage.problem(template_of(obj)['spec'])}"
    )
    assert count("Deployment", "skipped", "ephemeral-storage") == before + 1


def test_the_webhook_removes_it_when_the_limit_is_lowered() -> None:
    world = World()
    instrumented = inject(small_limit_workload("1Gi"), INIT)
    lowered = inject(small_limit_workload("1Gi"), INIT)
    limits = template_of(lowered)["spec"]["containers"][0]["resources"]["limits"]
    limits["ephemeral-storage"] = "100Mi"
    response = world.admit(lowered, operation="UPDATE", old=instrumented)
    assert admitted(lowered, response) == remove(lowered)
    assert world.reasons == [("Warning", "LumigoCannotAddInstrumentation")]


def test_a_job_update_is_never_patched() -> None:
    world = World()
    template = simple_template()
    template["spec"]["containers"][0]["resources"] = {"limits": {"ephemeral-storage": "1Gi"}}
    job = inject(workload("Job", template), INIT)
    template_of(job)["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = "1Mi"
    response = world.admit(job, operation="UPDATE", old=job)
    assert admitted(job, response) == job


def test_a_dry_run_records_nothing() -> None:
    world = World()
    world.admit(small_limit_workload(), dry_run=True)
    assert world.recorder.events == []


# --- the controller's cache projection -----------------------------------------------------


def test_the_workload_cache_keeps_the_problem_for_the_controller() -> None:
    small = small_limit_workload()
    state = skipped.storage_state(small)
    assert state == {skipped.STORAGE_PROBLEM: storage.problem(template_of(small)["spec"])}
    assert skipped.storage_state(small_limit_workload("1Gi")) == {}
    cached = {**small, **state}
    assert (
        skipped.skip_reason(cached, constants.INJECTION_MODE_INIT_CONTAINER)
        == (state[skipped.STORAGE_PROBLEM])
    )
    assert skipped.skip_reason(cached, constants.INJECTION_MODE_IMAGE_VOLUME) is None
    opted_out = {**cached, "metadata": {**cached["metadata"], "labels": {
        constants.LABEL_AUTO_TRACE: "false"}}}  # fmt: skip
    assert skipped.skip_reason(opted_out, constants.INJECTION_MODE_INIT_CONTAINER) is None


def test_a_deployments_replicaset_is_its_deployments_business() -> None:
    template = simple_template()
    template["spec"]["containers"][0]["resources"] = {"limits": {"ephemeral-storage": "1Mi"}}
    replicaset = workload("ReplicaSet", template)
    replicaset["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u"}
    ]
    assert skipped.storage_state(replicaset) == {}
