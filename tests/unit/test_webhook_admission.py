"""AdmissionReview v1 parsing (strict, clear messages) and response building (uid echoed)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube.http.routing import BadRequest
from webhook import admission_review as admission
from webhook.admission_review import (
    AdmissionRequest,
    AdmissionResponse,
    GroupVersionKind,
    parse_review,
)
from webhook.inject_handler import InjectHandler
from webhook.lumigo_defaulter import MutateHandler
from webhook.pod_injection import InjectionSettings

from .webhook_samples import (
    RecordingRecorder,
    StaticLister,
    lumigo,
    review_body,
    simple_template,
    workload,
)

JSON_TYPE = "application/json"


def good_review() -> dict[str, Any]:
    return json.loads(review_body(workload("Deployment", simple_template())))  # type: ignore[no-any-return]


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_a_well_formed_review_is_parsed() -> None:
    request = parse_review(
        review_body(workload("CronJob", simple_template()), dry_run=True),
        "application/json; charset=utf-8",
    )
    assert request.uid == "3b4d2f0e-uid"
    assert request.kind == GroupVersionKind("batch", "v1", "CronJob")
    assert str(request.kind) == "batch/v1, Kind=CronJob"
    assert request.kind.api_version == "batch/v1"
    assert (request.operation, request.namespace, request.name) == ("CREATE", "ns", "app")
    assert request.dry_run is True
    assert request.username == "kubernetes-admin"
    assert request.object is not None
    assert request.object["kind"] == "CronJob"
    assert str(GroupVersionKind("", "v1", "Pod")) == "/v1, Kind=Pod"
    assert GroupVersionKind("", "v1", "Pod").api_version == "v1"


def _mangled(change: Any) -> bytes:
    review = good_review()
    change(review)
    return body(review)


def _request_change(key: str, value: Any) -> Any:
    return lambda r: r["request"].update({key: value})


REQUEST_PROBLEMS = [
    (lambda r: r.update(apiVersion="admission.k8s.io/v1beta1"),
     "unsupported AdmissionReview version 'admission.k8s.io/v1beta1': "
     "only admission.k8s.io/v1 is served"),
    (lambda r: r.pop("request"), "the AdmissionReview has no 'request' object"),
    (lambda r: r["request"].pop("uid"), "request.uid is missing"),
    (_request_change("uid", ""), "request.uid is missing"),
    (_request_change("uid", 7), "request.uid is missing"),
    (_request_change("operation", "PATCH"),
     "request.operation must be one of CREATE, UPDATE, DELETE, CONNECT, got 'PATCH'"),
    (lambda r: r["request"].pop("kind"), "request.kind is missing"),
    (lambda r: r["request"]["kind"].pop("kind"), "request.kind.kind is missing"),
    (lambda r: r["request"]["kind"].update(version=1), "non-empty 'version'"),
    (_request_change("object", "x"), "request.object must be a JSON object for CREATE"),
    (_request_change("object", None), "request.object must be a JSON object for CREATE"),
    (_request_change("oldObject", [1]), "request.oldObject must be a JSON object or null"),
    (_request_change("namespace", 3), "request.namespace must be a string"),
    (_request_change("dryRun", "yes"), "request.dryRun must be a boolean"),
]  # fmt: skip
BODY_PROBLEMS = [
    (b"{}", "text/plain", "unsupported Content-Type 'text/plain': expected application/json"),
    (b"{}", None, "unsupported Content-Type '(none)'"),
    (b"", JSON_TYPE, "the request body is empty"),
    (b"{not json", JSON_TYPE, "the request body is not valid JSON"),
    (b"\xff\xfe\xfa", JSON_TYPE, "not"),
    (b'{"a": NaN}', JSON_TYPE, "NaN is not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, JSON_TYPE, "the JSON body is nested too deeply"),
    (b"[]", JSON_TYPE, "must be a JSON object (an AdmissionReview)"),
    (body({"apiVersion": "v1", "kind": "Pod"}), JSON_TYPE,
     "expected kind 'AdmissionReview', got 'Pod'"),
    (b" " * (admission.MAX_BODY_BYTES + 1), JSON_TYPE, "larger than"),
    *((_mangled(change), JSON_TYPE, message) for change, message in REQUEST_PROBLEMS),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "content_type", "message"), BODY_PROBLEMS)
def test_malformed_reviews_are_bad_requests_with_a_clear_message(
    raw: bytes, content_type: str | None, message: str
) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as caught:
        parse_review(raw, content_type)
    assert caught.value.message == str(caught.value)


def test_a_delete_may_have_no_object() -> None:
    review = good_review()
    review["request"].update(operation="DELETE", object=None, oldObject={"kind": "Deployment"})
    request = parse_review(body(review), JSON_TYPE)
    assert request.object is None
    assert request.old_object == {"kind": "Deployment"}


def test_responses_echo_the_uid_and_carry_the_status() -> None:
    request = parse_review(body(good_review()), JSON_TYPE)
    allowed = admission.allow(request, "fine").review()
    assert allowed == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": request.uid,
            "allowed": True,
            "status": {"code": 200, "message": "fine"},
        },
    }
    denied = admission.deny(request, "no").review()["response"]
    assert denied == {
        "uid": request.uid,
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": "no"},
    }
    errored = admission.errored(request, 500, "boom").review()["response"]
    assert errored["status"] == {"code": 500, "message": "boom"}
    assert errored["allowed"] is False


def test_a_patch_response_is_base64_json_patch() -> None:
    request = parse_review(body(good_review()), JSON_TYPE)
    ops = [{"op": "add", "path": "/metadata/labels/a~1b", "value": "c"}]
    response = json.loads(admission.patched(request, ops).to_json())["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == ops
    assert "status" not in response
    empty = admission.patched(request, []).review()["response"]
    assert empty == {"uid": request.uid, "allowed": True}
    warned = AdmissionResponse("u", True, warnings=("careful",)).review()["response"]
    assert warned["warnings"] == ["careful"]


def test_review_runs_parse_handle_and_serialise() -> None:
    handler = MutateHandler(StaticLister())
    raw = review_body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    out = json.loads(admission.review(handler, raw, JSON_TYPE))
    assert out["response"]["uid"] == "3b4d2f0e-uid"
    assert out["response"]["allowed"] is True


# --- robustness: whatever arrives, a review or a BadRequest, nothing else -------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    ["spec", "template", "metadata", "labels", "containers", "initContainers", "env", "name",
     "volumes", "volumeMounts", "securityContext", "fsGroup", "lumigo.auto-trace", "jobTemplate",
     "ownerReferences", "status", "conditions", "lumigoToken", "secretRef", "key", "tracing"]
)  # fmt: skip
object_like = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["", "x", "true", "false"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(field_names, inner, max_size=4),
    max_leaves=25,
)
kinds = st.sampled_from(
    [("apps", "v1", k) for k in ("Deployment", "DaemonSet", "ReplicaSet", "StatefulSet")]
    + [("batch", "v1", "Job"), ("batch", "v1", "CronJob"), ("", "v1", "Pod")]
    + [("operator.lumigo.io", "v1alpha1", "Lumigo")]
)


@st.composite
def reviews(draw: st.DrawFn) -> bytes:
    """Mostly plausible reviews with random objects, sometimes random JSON or bytes."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.binary(max_size=64))
    if choice == 1:
        return json.dumps(draw(json_values)).encode()
    group, version, kind = draw(kinds)
    request: dict[str, Any] = {
        "uid": draw(st.sampled_from(["u-1", "", None, 5]))
        if draw(st.integers(0, 9)) == 0
        else "u-1",
        "kind": {"group": group, "version": version, "kind": kind},
        "namespace": "ns",
        "operation": draw(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])),
        "object": draw(object_like),
        "dryRun": draw(st.booleans()),
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


LISTER = StaticLister({"ns": [lumigo()]})
HANDLERS = [
    InjectHandler(LISTER, RecordingRecorder(), InjectionSettings()),
    InjectHandler(StaticLister(), RecordingRecorder(), InjectionSettings()),
    MutateHandler(StaticLister()),
    MutateHandler(LISTER),
]


@settings(max_examples=1000, deadline=None)
@given(reviews())
def test_any_input_yields_a_valid_review_or_a_bad_request(raw: bytes) -> None:
    messages: list[str] = []
    for handler in HANDLERS:
        try:
            out = json.loads(admission.review(handler, raw, JSON_TYPE))
        except BadRequest as err:
            messages.append(err.message)
            continue
        response = out["response"]
        assert out["apiVersion"] == "admission.k8s.io/v1"
        assert out["kind"] == "AdmissionReview"
        assert response["uid"] == json.loads(raw)["request"]["uid"]
        assert isinstance(response["allowed"], bool)
        if "patch" in response:
            assert isinstance(json.loads(base64.b64decode(response["patch"])), list)
    assert all(messages)  # every BadRequest says what is wrong


def test_request_is_a_frozen_value() -> None:
    request = parse_review(body(good_review()), JSON_TYPE)
    assert isinstance(request, AdmissionRequest)
    with pytest.raises(AttributeError):
        request.uid = "other"  # type: ignore[misc]


@pytest.mark.parametrize("depth", [50, 500, 900, 990, 5000])
def test_deeply_nested_objects_never_crash_a_handler(depth: int) -> None:
    """Deep garbage in a field nobody reads: answered (inject: allowed as is) or a BadRequest."""
    nested = "[" * depth + "]" * depth
    problems = "nested too deeply"
    obj = workload("Deployment", simple_template())
    text = (
        review_body(obj)
        .decode()
        .replace('"image": "python:3.12"', f'"image": "x", "junk": {nested}')
    )
    for handler in HANDLERS:
        try:
            out = json.loads(admission.review(handler, text.encode(), JSON_TYPE))
        except BadRequest as err:
            problems = err.message
            continue
        assert out["response"]["uid"] == "3b4d2f0e-uid"
        if isinstance(handler, InjectHandler):
            assert out["response"]["allowed"] is True
    assert "nested too deeply" in problems  # the only acceptable BadRequest here
