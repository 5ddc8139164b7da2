"""The Lumigo model: defaults, strict loading, and agreement with the generated CRD."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from api import constants
from api.crd import crd_manifest
from api.lumigo import InvalidSpecError, dump_spec, load_spec, validate_status
from kube.kinds import SECRETS

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "config" / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"

REFERENCE_DEFAULTS = {
    "tracing": {
        "enabled": True,
        "injection": {
            "enabled": True,
            "injectLumigoIntoExistingResourcesOnCreation": True,
            "removeLumigoFromResourcesOnDeletion": True,
            # Beyond the reference (safe rollouts): additive, defaulted.
            "maxConcurrentRollouts": 5,
        },
    },
    "logging": {"enabled": False},
    "infrastructure": {"enabled": True, "kubeEvents": {"enabled": True}},
}


def committed_crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return loaded


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    version = crd["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def apply_structural_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """The API server's defaulting algorithm, written independently of api.crd."""
    if schema.get("type") != "object" or not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for name, prop in schema.get("properties", {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if name in out:
            out[name] = apply_structural_defaults(prop, out[name])
    return out


def test_committed_crd_is_generated_from_the_schemas() -> None:
    assert committed_crd() == crd_manifest(), "run `make manifests` and commit the result"


def test_crd_identity_matches_the_reference() -> None:
    crd = committed_crd()
    assert crd["metadata"]["name"] == "lumigoes.operator.lumigo.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["singular"]) == ("Lumigo", "lumigoes", "lumigo")
    assert names["shortNames"]
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Active", "Error", "Rolling", "Pending", "Age"} <= columns


def test_defaults_match_the_reference_table() -> None:
    spec = dump_spec(load_spec({"lumigoToken": {"secretRef": {"name": "n", "key": "k"}}}))
    assert {k: v for k, v in spec.items() if k != "lumigoToken"} == REFERENCE_DEFAULTS
    crd_filled = apply_structural_defaults(spec_schema(committed_crd()), {})
    assert {k: v for k, v in crd_filled.items() if k != "lumigoToken"} == REFERENCE_DEFAULTS


def _field_paths(schema: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, prop in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out[path] = prop
        out.update(_field_paths(prop, path))
    return out


def test_every_crd_field_is_known_to_the_model_and_vice_versa() -> None:
    crd_fields = _field_paths(spec_schema(committed_crd()))
    model = dump_spec(load_spec({"lumigoToken": {"secretRef": {"name": "n", "key": "k"}}}))

    def model_paths(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else key
            out[path] = value
            if isinstance(value, dict):
                out.update(model_paths(value, path))
        return out

    paths = model_paths(model)
    assert set(crd_fields) == set(paths)
    for path, prop in crd_fields.items():
        value = paths[path]
        types = {bool: "boolean", int: "integer", str: "string", dict: "object"}
        expected_type = types[type(value)]
        assert prop["type"] == expected_type, path
        if isinstance(value, bool):
            assert prop["default"] == value, path


# Partial specs as a user might write them: any subset of the boolean leaves.
BOOL_LEAVES = [
    ("tracing", "enabled"),
    ("tracing", "injection", "enabled"),
    ("tracing", "injection", "injectLumigoIntoExistingResourcesOnCreation"),
    ("tracing", "injection", "removeLumigoFromResourcesOnDeletion"),
    ("logging", "enabled"),
    ("infrastructure", "enabled"),
    ("infrastructure", "kubeEvents", "enabled"),
]


@st.composite
def partial_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"lumigoToken": {"secretRef": {"name": "s", "key": "k"}}}
    for leaf in draw(st.lists(st.sampled_from(BOOL_LEAVES), unique=True)):
        node = spec
        for part in leaf[:-1]:
            node = node.setdefault(part, {})
        node[leaf[-1]] = draw(st.booleans())
    return spec


@given(partial_specs())
def test_model_defaults_equal_api_server_defaults(spec: dict[str, Any]) -> None:
    from_crd = apply_structural_defaults(spec_schema(committed_crd()), spec)
    assert dump_spec(load_spec(spec)) == from_crd


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (
            {"tracing": {"injection": {"enabled": "yes"}}},
            "spec.tracing.injection.enabled",
            "boolean",
        ),
        ({"logging": {"enabled": 1}}, "spec.logging.enabled", "boolean"),
        (
            {"lumigoToken": {"secretRef": {"key": "token"}}},
            "spec.lumigoToken.secretRef.name",
            "required",
        ),
        ({"lumigoToken": {"secretRef": {"name": 7}}}, "spec.lumigoToken.secretRef.name", "string"),
        ({"infrastructure": []}, "spec.infrastructure", "object"),
    ],
)
def test_invalid_spec_names_the_field(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidSpecError) as err:
        load_spec(spec)
    assert field in err.value.problems
    assert words in err.value.problems[field]
    assert field in str(err.value)


def test_non_object_spec_is_rejected() -> None:
    with pytest.raises(InvalidSpecError, match="spec: must be an object"):
        load_spec("nope")


def test_status_validation() -> None:
    good = {
        "conditions": [
            {
                "type": "Active",
                "status": "True",
                "lastUpdateTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "message": "Lumigo is ready",
                "reason": "Ready",
                "observedGeneration": 2,
            }
        ],
        "instrumentedResources": [],
    }
    assert validate_status(good) == []
    bad = {"conditions": [{"type": "Bogus", "status": "True"}]}
    problems = "\n".join(validate_status(bad))
    assert "status.instrumentedResources: is required" in problems
    assert "status.conditions.0.type" in problems


def test_constants_are_the_reference_names() -> None:
    assert constants.FINALIZER == "operator.lumigo.io/lumigo-finalizer"
    assert constants.LABEL_AUTO_TRACE == "lumigo.auto-trace"
    assert [r.kind for r in constants.WORKLOAD_KINDS] == [
        "DaemonSet",
        "Deployment",
        "ReplicaSet",
        "StatefulSet",
        "CronJob",
        "Job",
    ]
    assert len(constants.INJECTED_ENV_NAMES) == 7


@pytest.mark.parametrize(
    ("namespace", "name", "path"),
    [
        (
            "tenant",
            "../../kube-system/secrets/x",
            "/api/v1/namespaces/tenant/secrets/..%2F..%2Fkube-system%2Fsecrets%2Fx",
        ),
        ("tenant", "..", "/api/v1/namespaces/tenant/secrets/%2E%2E"),
        ("..", ".", "/api/v1/namespaces/%2E%2E/secrets/%2E"),
        ("tenant", "a?b#c%d e", "/api/v1/namespaces/tenant/secrets/a%3Fb%23c%25d%20e"),
        ("tenant", "lumigo-credentials", "/api/v1/namespaces/tenant/secrets/lumigo-credentials"),
    ],
)  # fmt: skip
def test_every_path_segment_the_client_builds_is_escaped(
    namespace: str, name: str, path: str
) -> None:
    """Issue 28 item 1: whatever a caller passes, the request stays in its namespace."""
    assert SECRETS.path(namespace, name) == path


def test_secret_name_and_key_patterns_are_re2_compatible_and_match_python() -> None:
    """The CRD carries the same patterns the schema applies (no look-arounds: RE2)."""
    for pattern in (constants.SECRET_NAME_PATTERN, constants.SECRET_KEY_PATTERN):
        assert "(?" not in pattern
    secret_ref = committed_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    secret_ref = secret_ref["properties"]["spec"]["properties"]["lumigoToken"]
    secret_ref = secret_ref["properties"]["secretRef"]["properties"]
    assert secret_ref["name"]["pattern"] == constants.SECRET_NAME_PATTERN
    assert secret_ref["key"]["pattern"] == constants.SECRET_KEY_PATTERN
    assert secret_ref["name"]["maxLength"] == secret_ref["key"]["maxLength"] == 253
