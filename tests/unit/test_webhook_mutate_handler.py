"""/v1alpha1/mutate: the Lumigo defaulter and its one-per-namespace and blank-reference rules."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from api.lumigo import dump_spec, load_spec
from kube.jsonpatch import apply
from webhook.admission_review import AdmissionResponse, parse_review
from webhook.lumigo_defaulter import MutateHandler

from .webhook_samples import StaticLister, lumigo, review_body

JSON = dict[str, Any]
LUMIGO_KIND = ("operator.lumigo.io", "v1alpha1", "Lumigo")


def new_lumigo(spec: Any) -> JSON:
    obj: JSON = {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": "lumigo", "namespace": "ns"},
    }
    if spec is not None:
        obj["spec"] = spec
    return obj


def admit(
    obj: JSON | None, existing: list[JSON] | None = None, operation: str = "CREATE"
) -> AdmissionResponse:
    handler = MutateHandler(StaticLister({"ns": existing or []}))
    raw = review_body(obj, operation=operation, kind=LUMIGO_KIND)
    request = parse_review(raw, "application/json")
    response = handler.handle(request)
    assert response.uid == request.uid
    return response


def defaulted(obj: JSON, response: AdmissionResponse) -> JSON:
    assert response.allowed
    payload = response.review()["response"]
    ops = json.loads(base64.b64decode(payload["patch"])) if "patch" in payload else []
    result: JSON = apply(obj, ops)
    return result


REF = {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}}


def test_defaults_are_filled_in() -> None:
    obj = new_lumigo(REF)
    out = defaulted(obj, admit(obj))
    assert out["spec"] == dump_spec(load_spec(REF))
    assert out["spec"]["tracing"]["injection"] == {
        "enabled": True,
        "injectLumigoIntoExistingResourcesOnCreation": True,
        "removeLumigoFromResourcesOnDeletion": True,
        "maxConcurrentRollouts": 5,
    }
    assert out["spec"]["logging"] == {"enabled": False}
    assert out["spec"]["infrastructure"] == {"enabled": True, "kubeEvents": {"enabled": True}}
    assert out["metadata"] == obj["metadata"]


def test_explicit_values_are_kept() -> None:
    spec = {**REF, "tracing": {"injection": {"enabled": False}}, "logging": {"enabled": True}}
    out = defaulted(new_lumigo(spec), admit(new_lumigo(spec)))
    assert out["spec"]["tracing"]["injection"]["enabled"] is False
    assert out["spec"]["tracing"]["injection"]["removeLumigoFromResourcesOnDeletion"] is True
    assert out["spec"]["logging"]["enabled"] is True


def test_a_complete_spec_needs_no_patch() -> None:
    full = dump_spec(load_spec(REF))
    response = admit(new_lumigo(full), operation="UPDATE")
    assert response.allowed
    assert "patch" not in response.review()["response"]


def test_a_second_lumigo_in_the_namespace_is_denied() -> None:
    response = admit(new_lumigo(REF), existing=[lumigo(name="first")])
    assert not response.allowed
    assert response.review()["response"]["status"] == {
        "code": 403,
        "reason": "Forbidden",
        "message": "There is already an instance of operator.lumigo.io/v1alpha1.Lumigo in the "
        "'ns' namespace",
    }


def test_updates_are_not_counted_as_a_second_instance() -> None:
    obj = new_lumigo(REF)
    assert admit(obj, existing=[lumigo()], operation="UPDATE").allowed


@pytest.mark.parametrize(
    "spec",
    [
        None,
        {},
        {"lumigoToken": {}},
        {"lumigoToken": {"secretRef": {"key": "token"}}},
        {"lumigoToken": {"secretRef": {"name": "", "key": "token"}}},
    ],
)
def test_a_blank_secret_name_is_denied(spec: Any) -> None:
    response = admit(new_lumigo(spec))
    assert not response.allowed
    assert response.message == (
        "no reference to a Lumigo token ('.Spec.LumigoToken.SecretRef.Name' is blank)"
    )


@pytest.mark.parametrize("ref", [{"name": "s"}, {"name": "s", "key": ""}])
def test_a_blank_secret_key_is_denied(ref: JSON) -> None:
    response = admit(new_lumigo({"lumigoToken": {"secretRef": ref}}))
    assert not response.allowed
    assert response.message == (
        "invalid reference to a Lumigo token ('.Spec.LumigoToken.SecretRef.Key' is blank)"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({**REF, "tracing": {"enabled": "yes"}}, "spec.tracing.enabled: must be a boolean"),
        ({**REF, "logging": []}, "spec.logging: must be an object"),
        (
            {"lumigoToken": {"secretRef": {"name": 5, "key": "k"}}},
            "spec.lumigoToken.secretRef.name",
        ),
        ("a string", "spec: must be an object"),
    ],
)
def test_a_spec_with_wrong_types_is_denied_naming_the_field(spec: Any, message: str) -> None:
    response = admit(new_lumigo(spec))
    assert not response.allowed
    assert response.code == 422
    assert response.reason == "Invalid"
    assert message in response.message
    assert response.message.startswith("invalid Lumigo spec: ")


@pytest.mark.parametrize(
    ("ref", "field", "what"),
    [
        ({"name": "../../kube-system/secrets/x", "key": "token"}, "name", "DNS-1123 subdomain"),
        ({"name": "Lumigo_Credentials", "key": "token"}, "name", "DNS-1123 subdomain"),
        ({"name": "a" * 254, "key": "token"}, "name", "at most 253 characters"),
        ({"name": "lumigo-credentials", "key": "../token"}, "key", "key of a Secret's data"),
        ({"name": "lumigo-credentials", "key": ".."}, "key", "key of a Secret's data"),
        ({"name": "lumigo-credentials", "key": "to/ken"}, "key", "key of a Secret's data"),
    ],
)
def test_a_secret_reference_kubernetes_would_refuse_is_denied_saying_what_to_fix(
    ref: JSON, field: str, what: str
) -> None:
    """Issue 28 item 1: a name such as ../../kube-system/secrets/x never reaches a request."""
    response = admit(new_lumigo({"lumigoToken": {"secretRef": ref}}))
    assert not response.allowed
    assert response.code == 422
    assert f"spec.lumigoToken.secretRef.{field}: must be" in response.message
    assert what in response.message
    assert len(response.message) < 400  # the hostile value is not quoted back


@pytest.mark.parametrize(
    "ref",
    [
        {"name": "lumigo-credentials", "key": "token"},
        {"name": "a.b-c1", "key": ".hidden_Key-1.x"},
        {"name": "a" * 253, "key": "k" * 253},
    ],
)
def test_every_secret_reference_kubernetes_accepts_is_allowed(ref: JSON) -> None:
    assert admit(new_lumigo({"lumigoToken": {"secretRef": ref}})).allowed


def test_deletions_and_other_kinds_are_allowed() -> None:
    handler = MutateHandler(StaticLister({"ns": [lumigo()]}))
    deletion = parse_review(
        review_body(None, operation="DELETE", kind=LUMIGO_KIND), "application/json"
    )
    assert handler.handle(deletion).allowed
    assert handler.handle(deletion).message == "Mutating webhooks have nothing to do on deletions"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    response = handler.handle(parse_review(review_body(pod), "application/json"))
    assert response.allowed
    assert response.message == (
        "Not a operator.lumigo.io/v1alpha1.Lumigo resource, nothing to validate"
    )


def test_a_lister_failure_refuses_with_500() -> None:
    lister = StaticLister()
    lister.error = RuntimeError("cache not synced")
    handler = MutateHandler(lister)
    raw = review_body(new_lumigo(REF), kind=LUMIGO_KIND)
    response = handler.handle(parse_review(raw, "application/json"))
    assert not response.allowed
    assert response.code == 500
    assert response.message == "cannot retrieve Lumigo instances in namespace ns: cache not synced"
