"""Generate the `lumigoes.operator.lumigo.io` CRD from the marshmallow schemas.

Generating (rather than hand-writing) the OpenAPI schema keeps the API server's validation and
defaulting identical to what the operator loads; `make manifests` writes the YAML and a unit test
fails when the committed file drifts.
"""

from __future__ import annotations

from typing import Any

import marshmallow
from marshmallow import Schema, fields

from api import constants
from api.lumigo import LumigoSpecSchema, LumigoStatusSchema, StrictBoolean, StrictInteger

JSONSchema = dict[str, Any]


def field_schema(field: fields.Field[Any]) -> JSONSchema:
    """OpenAPI v3 (structural) schema for one marshmallow field."""
    out: JSONSchema
    if isinstance(field, fields.Nested):
        nested = field.nested
        schema = nested() if isinstance(nested, type) else nested
        assert isinstance(schema, Schema)
        out = object_schema(schema)
        if field.load_default is not marshmallow.missing and _has_defaults(schema):
            # An absent object is defaulted to {} so the API server fills the nested defaults.
            out["default"] = {}
    elif isinstance(field, fields.List):
        out = {"type": "array", "items": field_schema(field.inner)}
    elif isinstance(field, StrictBoolean):
        out = {"type": "boolean"}
        if field.load_default is not marshmallow.missing:
            out["default"] = field.load_default
    elif isinstance(field, fields.DateTime):
        out = {"type": "string", "format": "date-time"}
    elif isinstance(field, fields.Integer):
        out = _integer_schema(field)
    elif isinstance(field, fields.String):
        out = _string_schema(field)
    else:  # pragma: no cover - a new field type must be mapped explicitly
        raise TypeError(f"no OpenAPI mapping for {type(field).__name__}")
    description = field.metadata.get("description")
    if description:
        out = {"description": description, **out}
    return out


def _string_schema(field: fields.String) -> JSONSchema:
    """A string's enum, pattern and maximum length, so the API server refuses what we would."""
    out: JSONSchema = {"type": "string"}
    for validator in field.validators:
        if isinstance(validator, marshmallow.validate.OneOf):
            out["enum"] = list(validator.choices)
        elif isinstance(validator, marshmallow.validate.Regexp):
            out["pattern"] = validator.regex.pattern
        elif isinstance(validator, marshmallow.validate.Length) and validator.max is not None:
            out["maxLength"] = validator.max
    return out


def _integer_schema(field: fields.Integer) -> JSONSchema:
    """A spec integer has its default and minimum in the CRD; a status one has neither."""
    out: JSONSchema = {"type": "integer", "format": "int64"}
    if isinstance(field, StrictInteger) and field.load_default is not marshmallow.missing:
        out["default"] = field.load_default
    for validator in field.validators:
        if isinstance(validator, marshmallow.validate.Range) and validator.min is not None:
            out["minimum"] = validator.min
    return out


def _has_defaults(schema: Schema) -> bool:
    """Whether loading `{}` with this schema fills in any real (non-zero-value) default."""
    for f in schema.fields.values():
        if (
            isinstance(f, StrictBoolean | StrictInteger)
            and f.load_default is not marshmallow.missing
        ):
            return True
        if isinstance(f, fields.Nested):
            nested = f.nested() if isinstance(f.nested, type) else f.nested
            if isinstance(nested, Schema) and _has_defaults(nested):
                return True
    return False


def object_schema(schema: Schema) -> JSONSchema:
    properties = {
        (f.data_key or name): field_schema(f) for name, f in sorted(schema.fields.items())
    }
    properties = dict(sorted(properties.items()))
    out: JSONSchema = {"type": "object", "properties": properties}
    required = sorted((f.data_key or name) for name, f in schema.fields.items() if f.required)
    if required:
        out["required"] = required
    return out


def printer_columns() -> list[JSONSchema]:
    return [
        {
            "name": "Active",
            "type": "string",
            "description": "Whether tracing is active in this namespace",
            "jsonPath": '.status.conditions[?(@.type=="Active")].status',
        },
        {
            "name": "Error",
            "type": "string",
            "description": "What to fix, when the resource is in error",
            "jsonPath": '.status.conditions[?(@.type=="Error")].message',
        },
        {
            "name": "Rolling",
            "type": "integer",
            "description": "Workloads rolling because the operator instrumented them",
            "jsonPath": ".status.rollouts.rolling",
        },
        {
            "name": "Pending",
            "type": "integer",
            "description": "Workloads waiting for a rollout slot",
            "jsonPath": ".status.rollouts.pending",
        },
        {
            "name": "Age",
            "type": "date",
            "jsonPath": ".metadata.creationTimestamp",
        },
    ]


def crd_manifest() -> JSONSchema:
    spec = object_schema(LumigoSpecSchema())
    spec["description"] = "Desired tracing and telemetry settings for this namespace."
    status = object_schema(LumigoStatusSchema())
    status["description"] = "Observed state of the Lumigo resource."
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    status["properties"]["instrumentedResources"]["items"]["x-kubernetes-map-type"] = "atomic"
    status["properties"]["revertedResources"]["items"]["x-kubernetes-map-type"] = "atomic"
    status["properties"]["skippedResources"]["items"]["x-kubernetes-map-type"] = "atomic"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": constants.CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "lumigo-operator"},
        },
        "spec": {
            "group": constants.GROUP,
            "names": {
                "kind": constants.KIND,
                "listKind": constants.LIST_KIND,
                "plural": constants.PLURAL,
                "singular": constants.SINGULAR,
                "shortNames": list(constants.SHORT_NAMES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "description": (
                                "Lumigo turns on automatic distributed tracing for the Python and"
                                " Node.js workloads of its namespace."
                            ),
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }
