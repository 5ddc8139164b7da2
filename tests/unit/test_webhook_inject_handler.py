"""/v1alpha1/inject: every gating branch, its reason text, its event (or none), its metric."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from api import constants
from api.effective import governing
from kube.http.routing import BadRequest
from kube.jsonpatch import apply
from webhook.admission_review import AdmissionResponse, parse_review
from webhook.inject_handler import InjectHandler, settings_from_labels
from webhook.pod_injection import InjectionSettings

from .webhook_samples import (
    RecordingRecorder,
    StaticLister,
    lumigo,
    review_body,
    simple_template,
    template_of,
    workload,
)

JSON = dict[str, Any]
SETTINGS = InjectionSettings(operator_version="1.2.3")
COMPONENT = "lumigo-operator.v1.2.3/injector-webhook"
LABEL = "lumigo-operator.v1.2.3"
TRIGGER = "injector webhook, acting on behalf of the 'ns/lumigo' Lumigo resource"


class World:
    """A handler with its collaborators, and what it answered."""

    def __init__(self, lumigoes: list[JSON] | None = None) -> None:
        self.lister = StaticLister({"ns": lumigoes if lumigoes is not None else [lumigo()]})
        self.recorder = RecordingRecorder()
        self.handler = InjectHandler(self.lister, self.recorder, SETTINGS)

    def admit(self, obj: JSON | None, **kwargs: Any) -> AdmissionResponse:
        request = parse_review(review_body(obj, **kwargs), "application/json")
        response = self.handler.handle(request)
        assert response.uid == request.uid
        assert response.allowed  # the injector never refuses a workload
        return response

    @property
    def reasons(self) -> list[tuple[str, str]]:
        return [(type_, reason) for _, type_, reason, _, _ in self.recorder.events]


def patched_object(obj: JSON, response: AdmissionResponse) -> JSON:
    ops = json.loads(base64.b64decode(response.review()["response"]["patch"]))
    result: JSON = apply(obj, ops)
    return result


def count(kind: str, result: str, reason: str, namespace: str = "ns") -> float:
    labels = {"namespace": namespace, "kind": kind, "result": result, "reason": reason}
    return REGISTRY.get_sample_value("lumigo_injections_total", labels) or 0.0


def deployment(**labels: str) -> JSON:
    obj = workload("Deployment", simple_template())
    obj["metadata"]["labels"].update(labels)
    return obj


# --- step 8: injection ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["DaemonSet", "Deployment", "ReplicaSet", "StatefulSet", "CronJob", "Job"]
)
def test_each_kind_is_injected_with_an_added_event(kind: str) -> None:
    world = World()
    obj = workload(kind, simple_template())
    before = count(kind, "injected", "lumigo")
    response = world.admit(obj)
    out = patched_object(obj, response)
    assert template_of(out)["spec"]["initContainers"][0]["name"] == "lumigo-injector"
    assert out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == LABEL
    (event,) = world.recorder.events
    involved, type_, reason, message, component = event
    assert involved == {
        "apiVersion": obj["apiVersion"],
        "kind": kind,
        "metadata": {"name": "app", "namespace": "ns"},
    }
    assert (type_, reason) == ("Normal", "LumigoAddedInstrumentation")
    assert message == f"Adding Lumigo instrumentation (trigger: {TRIGGER})"
    assert component == COMPONENT
    assert response.review()["response"]["patchType"] == "JSONPatch"
    assert count(kind, "injected", "lumigo") == before + 1


def test_fix_daemonsets_are_injected_by_the_webhook() -> None:
    """The reference matched the kind "Daemonset" and so never injected real DaemonSets."""
    obj = workload("DaemonSet", simple_template())
    out = patched_object(obj, World().admit(obj))
    assert template_of(out)["spec"]["volumes"][0]["name"] == "lumigo-injector"


def test_the_settings_come_from_the_lumigo_spec() -> None:
    spec = {
        "lumigoToken": {"secretRef": {"name": "tok", "key": "k"}},
        "tracing": {"enabled": False},
        "logging": {"enabled": True},
    }
    world = World([lumigo(spec=spec)])
    obj = deployment(**{"lumigo.token-secret": "ignored", "lumigo.enable-logs": "false"})
    out = patched_object(obj, world.admit(obj))
    env = {e["name"]: e for e in template_of(out)["spec"]["containers"][0]["env"]}
    assert env["LUMIGO_TRACER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "tok"
    assert env["LUMIGO_TRACER_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "k"
    assert env["LUMIGO_ENABLE_TRACES"]["value"] == "false"
    assert env["LUMIGO_ENABLE_LOGS"]["value"] == "true"  # labels are ignored when a CR exists


def test_an_already_instrumented_update_changes_nothing_and_says_nothing() -> None:
    world = World()
    obj = deployment()
    injected = patched_object(obj, world.admit(obj))
    world.recorder.events.clear()
    before = count("Deployment", "unchanged", "already-instrumented")
    response = world.admit(injected, operation="UPDATE", old=injected)
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []  # fix: no event unless something changed
    assert count("Deployment", "unchanged", "already-instrumented") == before + 1


def test_re_injecting_an_instrumented_workload_is_an_update() -> None:
    world = World()
    obj = deployment()
    injected = patched_object(obj, world.admit(obj))
    world.recorder.events.clear()
    stale = json.loads(json.dumps(injected))
    template_of(stale)["spec"]["initContainers"][0]["image"] = "old-injector:0.1"
    out = patched_object(stale, world.admit(stale, operation="UPDATE"))
    assert template_of(out)["spec"]["initContainers"][0]["image"] == SETTINGS.injector_image
    assert world.reasons == [("Normal", "LumigoUpdatedInstrumentation")]
    assert world.recorder.events[0][3] == f"Updating Lumigo instrumentation (trigger: {TRIGGER})"


def test_the_oldest_lumigo_resource_counts() -> None:
    newer = lumigo(name="b-newer", created="2026-02-01T00:00:00Z", active=False)
    older = lumigo(name="z-older", created="2026-01-01T00:00:00Z")
    same_time = lumigo(name="a-same", created="2026-01-01T00:00:00Z", active=False)
    assert (governing([newer, older]) or {})["metadata"]["name"] == "z-older"
    assert (governing([older, same_time]) or {})["metadata"]["name"] == "a-same"
    world = World([newer, older])
    obj = deployment()
    world.admit(obj)
    assert "'ns/z-older' Lumigo resource" in world.recorder.events[0][3]


def test_dry_run_records_no_event() -> None:
    world = World()
    obj = deployment()
    response = world.admit(obj, dry_run=True)
    assert "patch" in response.review()["response"]
    assert world.recorder.events == []


# --- steps 1-2: operations and kinds -------------------------------------------------------


def test_deletions_have_nothing_to_do() -> None:
    world = World()
    response = world.admit(None, operation="DELETE", kind=("apps", "v1", "Deployment"))
    assert response.message == "Mutating webhooks have nothing to do on deletions"
    assert world.recorder.events == []


def test_other_kinds_are_not_mutated() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    response = World().admit(pod)
    assert response.message == (
        "The Lumigo Injector webhook does not mutate resources of type /v1, Kind=Pod"
    )
    wrong_version = workload("Deployment", simple_template())
    wrong_version["apiVersion"] = "apps/v1beta2"
    response = World().admit(wrong_version)
    assert response.message.endswith("resources of type apps/v1beta2, Kind=Deployment")


def test_an_object_that_does_not_decode_is_a_bad_request() -> None:
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"] = "not a list"
    request = parse_review(review_body(obj), "application/json")
    with pytest.raises(BadRequest) as caught:
        World().handler.handle(request)
    assert caught.value.message == (
        "cannot decode the apps/v1 Deployment: spec.template.spec.containers must be an array"
    )


# --- steps 3-5: which Lumigo applies -------------------------------------------------------


def test_no_lumigo_and_no_opt_in_label_means_no_change() -> None:
    world = World([])
    before = count("Deployment", "skipped", "no-lumigo")
    response = world.admit(deployment())
    assert response.message == (
        "No Lumigo configuration for the 'ns' namespace; resource will not be mutated"
    )
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []
    assert count("Deployment", "skipped", "no-lumigo") == before + 1


def test_no_lumigo_but_opted_in_by_label() -> None:
    world = World([])
    labels = {
        "lumigo.auto-trace": "TRUE",
        "lumigo.token-secret": "my-secret",
        "lumigo.token-key": "my-key",
        "lumigo.enable-traces": "False",
        "lumigo.enable-logs": "true",
    }
    obj = deployment(**labels)
    out = patched_object(obj, world.admit(obj))
    env = {e["name"]: e for e in template_of(out)["spec"]["containers"][0]["env"]}
    assert env["LUMIGO_TRACER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "my-secret",
        "key": "my-key",
        "optional": True,
    }
    assert env["LUMIGO_ENABLE_TRACES"]["value"] == "false"
    assert env["LUMIGO_ENABLE_LOGS"]["value"] == "true"
    assert out["metadata"]["labels"]["lumigo.auto-trace"] == LABEL
    (event,) = world.recorder.events
    assert event[3] == (
        "Adding Lumigo instrumentation (trigger: injector webhook, acting on behalf of the "
        "'ns/app' Lumigo resource)"
    )


def test_label_opt_in_defaults() -> None:
    settings = settings_from_labels(SETTINGS, {"lumigo.auto-trace": "true"})
    assert (settings.token_secret_name, settings.token_secret_key) == (
        "lumigo-credentials",
        "token",
    )
    assert (settings.enable_traces, settings.enable_logs) == (True, False)
    # Fix: an empty label value means the default, not a reference the API server rejects.
    settings = settings_from_labels(SETTINGS, {"lumigo.token-secret": "", "lumigo.token-key": ""})
    assert (settings.token_secret_name, settings.token_secret_key) == (
        "lumigo-credentials",
        "token",
    )


def test_an_invalid_opt_in_label_is_a_warning_not_a_broken_workload() -> None:
    world = World([])
    obj = deployment(**{"lumigo.auto-trace": "true", "lumigo.token-secret": "Not_A_Secret_Name"})
    before = count("Deployment", "failed", "invalid-settings")
    response = world.admit(obj)
    assert "patch" not in response.review()["response"]
    assert response.message.startswith(
        "cannot inject Lumigo tracing in the pod spec invalid token secret name 'Not_A_Secret_Name'"
    )
    ((_, type_, reason, message, _),) = world.recorder.events
    assert (type_, reason) == ("Warning", "LumigoCannotAddInstrumentation")
    assert message.startswith(
        "Cannot add Lumigo instrumentation (trigger: injector webhook, acting on behalf of the "
        "'ns/app'): invalid token secret name"
    )
    assert count("Deployment", "failed", "invalid-settings") == before + 1


def test_injection_disabled_in_the_spec() -> None:
    spec = {
        "lumigoToken": {"secretRef": {"name": "s", "key": "k"}},
        "tracing": {"injection": {"enabled": False}},
    }
    world = World([lumigo(spec=spec)])
    response = world.admit(deployment(**{"lumigo.auto-trace": "true"}))
    assert response.message == (
        "Tracing injection is disabled in the 'ns' namespace; resource will not be mutated"
    )
    assert world.recorder.events == []


def test_an_inactive_lumigo_means_no_change_even_with_the_opt_in_label() -> None:
    world = World([lumigo(active=False)])
    response = world.admit(deployment(**{"lumigo.auto-trace": "true"}))
    assert response.message == (
        "The Lumigo object in the 'ns' namespace is not active; resource will not be mutated"
    )
    assert "patch" not in response.review()["response"]
    no_status = lumigo()
    del no_status["status"]
    response = World([no_status]).admit(deployment())
    assert response.message.startswith("The Lumigo object in the 'ns' namespace is not active")


def test_an_invalid_lumigo_spec_is_a_warning() -> None:
    world = World(
        [lumigo(spec={"lumigoToken": {"secretRef": {"name": "s", "key": "k"}}, "logging": 3})]
    )
    response = world.admit(deployment())
    assert response.message == (
        "cannot inject Lumigo tracing in the pod spec "
        "invalid Lumigo spec: spec.logging: must be an object"
    )
    assert world.reasons == [("Warning", "LumigoCannotAddInstrumentation")]


# --- steps 6-7: handshake and opt-out ------------------------------------------------------


def test_skip_next_injector_strips_the_label_and_injects_nothing() -> None:
    world = World()
    obj = deployment(**{"lumigo.auto-trace": "skip-next-injector"})
    response = world.admit(obj, operation="UPDATE")
    ops = json.loads(base64.b64decode(response.review()["response"]["patch"]))
    assert ops == [{"op": "remove", "path": "/metadata/labels/lumigo.auto-trace"}]
    out = apply(obj, ops)
    assert out["metadata"]["labels"] == {"app": "app"}
    assert out["spec"] == obj["spec"]
    assert world.recorder.events == []


def test_fix_opting_out_is_not_a_warning() -> None:
    """The reference sent a LumigoCannotAddInstrumentation Warning on every such admission."""
    world = World()
    before = count("Deployment", "skipped", "opted-out")
    response = world.admit(deployment(**{"lumigo.auto-trace": "false"}))
    assert response.message == (
        "cannot inject Lumigo tracing in the pod spec the resource has the 'lumigo.auto-trace' "
        "label set to 'false'"
    )
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []
    assert count("Deployment", "skipped", "opted-out") == before + 1


# --- opting out of an instrumented workload ------------------------------------------------


def opted_out(obj: JSON) -> JSON:
    """`obj` as `kubectl label ... lumigo.auto-trace=false --overwrite` sends it."""
    out: JSON = json.loads(json.dumps(obj))
    out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = "false"
    return out


def test_labelling_an_instrumented_workload_false_removes_the_instrumentation() -> None:
    world = World()
    obj = workload("Deployment", simple_template())
    env = [{"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so"}, {"name": "A", "value": "1"}]
    template_of(obj)["spec"]["containers"][0]["env"] = env
    injected = patched_object(obj, world.admit(obj))
    world.recorder.events.clear()
    before = count("Deployment", "removed", "opted-out")
    update = opted_out(injected)
    out = patched_object(update, world.admit(update, operation="UPDATE", old=injected))
    assert out == opted_out(obj)  # everything of ours gone, the user's LD_PRELOAD restored
    assert out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == "false"
    assert constants.LABEL_AUTO_TRACE not in (template_of(out).get("metadata") or {}).get(
        "labels", {}
    )
    assert world.reasons == [("Normal", "LumigoRemovedInstrumentation")]
    involved, _, _, message, component = world.recorder.events[0]
    assert involved["metadata"] == {"name": "app", "namespace": "ns"}
    assert message == f"Removing Lumigo instrumentation (trigger: {TRIGGER})"
    assert component == COMPONENT
    assert count("Deployment", "removed", "opted-out") == before + 1
    # Opted out and clean: further updates change nothing and say nothing.
    world.recorder.events.clear()
    response = world.admit(out, operation="UPDATE", old=out)
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []


def test_the_opt_out_removal_does_not_depend_on_the_lumigo() -> None:
    """`false` is the user's word: our instrumentation goes even where we would not inject."""
    obj = deployment(**{"lumigo.auto-trace": "true"})
    injected = patched_object(obj, World([]).admit(obj))  # opted in by label, no Lumigo
    for lumigoes in ([], [lumigo(spec={"tracing": {"injection": {"enabled": False}}})]):
        world = World(lumigoes)
        update = opted_out(injected)
        out = patched_object(update, world.admit(update, operation="UPDATE"))
        assert "initContainers" not in template_of(out)["spec"]
        assert world.reasons == [("Normal", "LumigoRemovedInstrumentation")]


def test_an_opted_out_update_keeps_the_lumigo_env_of_a_workload_we_never_instrumented() -> None:
    """The operator's own Deployments are labelled `false` and configured through LUMIGO_ENDPOINT
    and LUMIGO_LOGS_ENDPOINT (OLM's Subscription env); so is an app traced by hand. Under OLM,
    which cannot scope the webhook to other namespaces, OLM's update adding that env passed
    through here and lost the two variables: the proxy then exported to Lumigo's default."""
    world = World()
    obj = deployment(**{"lumigo.auto-trace": "false"})
    own = [
        {"name": "LUMIGO_ENDPOINT", "value": "http://sink:4318"},
        {"name": "LUMIGO_LOGS_ENDPOINT", "value": "http://sink:4318/v1/logs"},
        {"name": "LUMIGO_TRACER_TOKEN", "value": "t_0123456789abcdef01234"},
        {"name": "KUBERNETES_CLUSTER_NAME", "value": "prod"},
    ]
    template_of(obj)["spec"]["containers"][0]["env"] = own
    before = count("Deployment", "removed", "opted-out")
    response = world.admit(
        obj, operation="UPDATE", old=deployment(**{"lumigo.auto-trace": "false"})
    )
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []
    assert count("Deployment", "removed", "opted-out") == before


def test_a_workload_created_opted_out_is_left_alone_even_if_instrumented() -> None:
    world = World()
    injected = patched_object(deployment(), world.admit(deployment()))
    world.recorder.events.clear()
    response = world.admit(opted_out(injected))  # CREATE
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []


def test_an_opted_out_job_is_not_patched_on_update() -> None:
    world = World()
    job = workload("Job", simple_template())
    injected = opted_out(patched_object(job, world.admit(job)))
    world.recorder.events.clear()
    response = world.admit(injected, operation="UPDATE", old=injected)
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []


def test_removing_the_false_label_instruments_again() -> None:
    world = World()
    obj = deployment(**{"lumigo.auto-trace": "false"})
    for label in (None, "true", "yes"):
        update = json.loads(json.dumps(obj))
        if label is None:
            del update["metadata"]["labels"][constants.LABEL_AUTO_TRACE]
        else:
            update["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = label
        out = patched_object(update, world.admit(update, operation="UPDATE", old=obj))
        assert template_of(out)["spec"]["initContainers"][0]["name"] == "lumigo-injector"
        assert out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == LABEL


# --- never block a workload ----------------------------------------------------------------


def test_a_lister_failure_allows_the_workload_unchanged() -> None:
    world = World()
    world.lister.error = RuntimeError("cache not synced")
    before = count("Deployment", "failed", "list-error")
    response = world.admit(deployment())
    assert response.allowed
    assert response.message == "cannot retrieve Lumigo instances in namespace ns: cache not synced"
    assert "patch" not in response.review()["response"]
    assert count("Deployment", "failed", "list-error") == before + 1


def test_an_internal_error_allows_the_workload_unchanged() -> None:
    class Broken:
        def list(self, namespace: str) -> list[JSON]:
            return [{"metadata": "garbage", "spec": 1}, "not even a dict"]  # type: ignore[list-item]

    handler = InjectHandler(Broken(), RecordingRecorder(), SETTINGS)
    response = handler.handle(parse_review(review_body(deployment()), "application/json"))
    assert response.allowed
    assert response.message.startswith("internal error in the Lumigo injector webhook")
    assert not response.patch


def test_a_failing_recorder_does_not_fail_the_admission() -> None:
    class Exploding:
        def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
            raise RuntimeError("queue full")

    handler = InjectHandler(StaticLister({"ns": [lumigo()]}), Exploding(), SETTINGS)
    response = handler.handle(parse_review(review_body(deployment()), "application/json"))
    assert response.allowed
    assert response.patch


def test_fix_jobs_are_not_patched_on_update() -> None:
    """A Job's pod template is immutable: patching it would make the user's update fail."""
    world = World()
    job = workload("Job", simple_template())
    response = world.admit(job, operation="UPDATE", old=job)
    assert "patch" not in response.review()["response"]
    assert response.message.endswith("immutable once the job has been created")
    assert world.recorder.events == []
    assert "patch" in World().admit(job).review()["response"]  # created: injected


def test_fix_objects_being_deleted_are_left_alone() -> None:
    obj = deployment()
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    response = World().admit(obj, operation="UPDATE")
    assert "patch" not in response.review()["response"]
    assert response.message == "The resource is being deleted; resource will not be mutated"


def test_deployment_owned_replicasets_are_unchanged() -> None:
    world = World()
    rs = workload("ReplicaSet", simple_template())
    rs["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u"}
    ]
    before = count("ReplicaSet", "unchanged", "deployment-owned")
    response = world.admit(rs)
    assert "patch" not in response.review()["response"]
    assert world.recorder.events == []
    assert count("ReplicaSet", "unchanged", "deployment-owned") == before + 1


def test_namespace_series_are_capped() -> None:
    handler = InjectHandler(StaticLister(), RecordingRecorder(), SETTINGS, max_namespace_series=2)
    for namespace in ("cap-a", "cap-b", "cap-c", "cap-d"):
        handler.handle(
            parse_review(review_body(deployment(), namespace=namespace), "application/json")
        )
    assert count("Deployment", "skipped", "no-lumigo", namespace="cap-b") == 1
    assert count("Deployment", "skipped", "no-lumigo", namespace="cap-c") == 0
    assert count("Deployment", "skipped", "no-lumigo", namespace="other") >= 2


def test_the_token_is_referenced_never_copied() -> None:
    """The webhook never reads the Secret: the pod gets a secretKeyRef, no value anywhere."""
    world = World()
    obj = deployment()
    out = patched_object(obj, world.admit(obj))
    for container in template_of(out)["spec"]["containers"]:
        (token_env,) = [e for e in container["env"] if e["name"] == "LUMIGO_TRACER_TOKEN"]
        assert set(token_env) == {"name", "valueFrom"}
        assert set(token_env["valueFrom"]) == {"secretKeyRef"}


def test_subresources_are_not_mutated() -> None:
    """deployments/status or /scale updates: the API server would drop a spec patch anyway, and
    an "Added" event would then be a lie."""
    world = World()
    review = json.loads(review_body(deployment(), operation="UPDATE"))
    review["request"]["subResource"] = "status"
    response = world.handler.handle(parse_review(json.dumps(review).encode(), "application/json"))
    assert response.allowed
    assert not response.patch
    assert response.message == (
        "The Lumigo Injector webhook does not mutate the status subresource"
    )
    assert world.recorder.events == []


def test_a_lumigo_being_deleted_counts_as_inactive() -> None:
    """Its finalizer is removing instrumentation from the namespace: new workloads must not get
    it meanwhile, or they would stay instrumented after the Lumigo resource is gone."""
    deleting = lumigo()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    response = World([deleting]).admit(deployment())
    assert not response.patch
    assert response.message == (
        "The Lumigo object in the 'ns' namespace is not active; resource will not be mutated"
    )


# --- safe rollouts: the revert mark -----------------------------------------------------------


def reverted(obj: JSON, why: str = "container app of pod p restarted 3 times") -> JSON:
    out: JSON = json.loads(json.dumps(obj))
    out["metadata"].setdefault("annotations", {})[constants.ANNOTATION_REVERTED] = why
    return out


def test_a_reverted_workload_is_not_instrumented_again_on_create_or_update() -> None:
    world = World()
    obj = reverted(deployment())
    for operation in ("CREATE", "UPDATE"):
        before = count("Deployment", "skipped", "reverted")
        response = world.admit(obj, operation=operation, old=obj if operation == "UPDATE" else None)
        payload = response.review()["response"]
        assert "patch" not in payload
        assert constants.ANNOTATION_REVERTED in payload["status"]["message"]
        assert count("Deployment", "skipped", "reverted") == before + 1
    assert world.recorder.events == []


def test_removing_the_mark_retries_and_watches_the_new_revision() -> None:
    world = World()
    world.handler.clock = lambda: dt.datetime(2026, 11, 25, 10, 0, 0, tzinfo=dt.UTC)
    old = reverted(deployment())
    old["metadata"]["generation"] = 7
    old["spec"]["replicas"] = 2
    old["status"] = {"observedGeneration": 7, "replicas": 2, "updatedReplicas": 2,
                     "availableReplicas": 2}  # fmt: skip
    update = json.loads(json.dumps(old))
    del update["metadata"]["annotations"][constants.ANNOTATION_REVERTED]
    out = patched_object(update, world.admit(update, operation="UPDATE", old=old))
    assert template_of(out)["spec"]["initContainers"][0]["name"] == "lumigo-injector"
    assert out["metadata"]["annotations"] == {
        constants.ANNOTATION_INSTRUMENTED_GENERATION: "8",  # the generation this update makes
        constants.ANNOTATION_INSTRUMENTED_AT: "2026-11-25T10:00:00Z",
        constants.ANNOTATION_HEALTHY_BEFORE: "true",
    }
    # A previous revision that was not fully available is recorded as not healthy.
    old["status"]["availableReplicas"] = 1
    out = patched_object(update, World().admit(update, operation="UPDATE", old=old))
    assert out["metadata"]["annotations"][constants.ANNOTATION_HEALTHY_BEFORE] == "false"


def test_an_ordinary_update_or_a_kind_that_does_not_roll_gets_no_rollout_marks() -> None:
    obj = deployment()
    out = patched_object(obj, World().admit(obj, operation="UPDATE", old=obj))
    assert constants.ANNOTATION_INSTRUMENTED_AT not in out["metadata"].get("annotations", {})
    cron = reverted(workload("CronJob", simple_template()))
    update = json.loads(json.dumps(cron))
    del update["metadata"]["annotations"][constants.ANNOTATION_REVERTED]
    out = patched_object(update, World().admit(update, operation="UPDATE", old=cron))
    assert constants.ANNOTATION_INSTRUMENTED_AT not in out["metadata"].get("annotations", {})
