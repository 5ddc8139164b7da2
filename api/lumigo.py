"""The `Lumigo` v1alpha1 resource: typed model plus the marshmallow schemas that load it.

The schemas are the single source of truth for fields and defaults: the CRD's OpenAPI schema
is generated from them (`api.crd`), and the defaulting webhook fills defaults by loading then
dumping a spec.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

import marshmallow
from marshmallow import EXCLUDE, Schema, fields, post_load

from api import constants
from kube.objects import ObjectMeta

# --- the resource as the API server returns it (the spec is `load_spec`'s) -------------------


class Condition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    lastUpdateTime: str
    observedGeneration: int


class LumigoStatus(TypedDict, total=False):
    conditions: list[Condition]
    instrumentedResources: list[dict[str, str]]
    revertedResources: list[dict[str, str]]
    skippedResources: list[dict[str, str]]
    rollouts: dict[str, int]


class Lumigo(TypedDict, total=False):
    """A `Lumigo` resource as the API server returns it (the spec is `api.lumigo.load_spec`'s)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]
    status: LumigoStatus


class InvalidSpecError(ValueError):
    """A Lumigo spec that cannot be loaded; the message names every bad field and why."""

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = problems
        super().__init__(
            "invalid Lumigo spec: " + "; ".join(f"{p}: {m}" for p, m in sorted(problems.items()))
        )


# A wrong value is quoted in the error (a CR's status, a denial) only this long: a tenant's spec
# must not turn into a megabyte of status.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 64
_SHORT.maxlist = _SHORT.maxdict = 4
_SHORT.maxlevel = 2


class _Strict(fields.Field[Any]):
    """Only JSON values of `kind`, never coerced: marshmallow's Boolean would silently accept
    "yes", 1 or "off", and its String a number."""

    kind: ClassVar[type]

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, self.kind):
            return value
        raise self.make_error("invalid", input=_SHORT.repr(value))


class StrictBoolean(_Strict, fields.Boolean):
    kind = bool
    default_error_messages = {"invalid": "must be a boolean (true or false), got {input}"}


class StrictString(_Strict, fields.String):
    kind = str
    default_error_messages = {"invalid": "must be a string, got {input}"}


class StrictInteger(_Strict, fields.Integer):
    kind = int
    default_error_messages = {"invalid": "must be an integer, got {input}"}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, bool):  # a bool is an int to Python, never to the API
            raise self.make_error("invalid", input=value)
        return super()._deserialize(value, attr, data, **kwargs)


class _Base(Schema):
    class Meta:
        unknown = EXCLUDE  # the API server prunes unknown fields; be lenient when reading

    error_messages = {"type": "must be an object"}


class _ModelSchema(_Base):
    """A schema that loads into its `model` (a frozen dataclass of the same fields)."""

    model: ClassVar[Callable[..., Any]]

    def on_bind_field(self, field_name: str, field_obj: fields.Field[Any]) -> None:
        """The model's attribute is the field's name in snake_case (secretRef: secret_ref)."""
        field_obj.attribute = re.sub(r"(?<!^)(?=[A-Z])", "_", field_name).lower()

    @post_load
    def make(self, data: dict[str, Any], **_: Any) -> Any:
        return self.model(**data)


def _flag(default: bool, description: str) -> StrictBoolean:
    """A boolean of the spec (the `enabled` switch of a section, or an option of it)."""
    return StrictBoolean(load_default=default, metadata={"description": description})


def _nested(schema: type[_ModelSchema], description: str) -> fields.Nested:
    """A sub-section; absent, it loads as its model's defaults."""
    return fields.Nested(schema, load_default=schema.model, metadata={"description": description})


# --- spec ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretRef:
    name: str = ""
    key: str = ""


@dataclass(frozen=True)
class LumigoToken:
    secret_ref: SecretRef = field(default_factory=SecretRef)


@dataclass(frozen=True)
class Switchable:
    """A section of the spec that can be turned off (most are on unless told otherwise)."""

    enabled: bool = True


@dataclass(frozen=True)
class Injection(Switchable):
    inject_lumigo_into_existing_resources_on_creation: bool = True
    remove_lumigo_from_resources_on_deletion: bool = True
    max_concurrent_rollouts: int = constants.DEFAULT_MAX_CONCURRENT_ROLLOUTS


@dataclass(frozen=True)
class Tracing(Switchable):
    injection: Injection = field(default_factory=Injection)


@dataclass(frozen=True)
class Logging(Switchable):
    enabled: bool = False


@dataclass(frozen=True)
class KubeEvents(Switchable):
    """Kubernetes events and object versions: only the switch."""


@dataclass(frozen=True)
class Infrastructure(Switchable):
    kube_events: KubeEvents = field(default_factory=KubeEvents)


@dataclass(frozen=True)
class LumigoSpec:
    lumigo_token: LumigoToken = field(default_factory=LumigoToken)
    tracing: Tracing = field(default_factory=Tracing)
    logging: Logging = field(default_factory=Logging)
    infrastructure: Infrastructure = field(default_factory=Infrastructure)


# A Secret's name and data key are checked as the API server checks them before they ever reach
# a request path: a name such as "../../kube-system/secrets/x" must be refused here, not resolved.
def _kubernetes_name(max_length: int, pattern: str, what: str) -> list[Any]:
    """The validators of a name the API server checks: its length, then its characters."""
    return [
        marshmallow.validate.Length(
            max=max_length, error=f"must be at most {max_length} characters"
        ),
        marshmallow.validate.Regexp(pattern, error=f"must be {what}"),
    ]


_SECRET_NAME = _kubernetes_name(
    constants.SECRET_NAME_MAX_LENGTH,
    constants.SECRET_NAME_PATTERN,
    "the name of a Secret in the same namespace: lowercase letters, digits, '-' and '.',"
    " starting and ending with a letter or digit (a DNS-1123 subdomain)",
)
_SECRET_KEY = _kubernetes_name(
    constants.SECRET_KEY_MAX_LENGTH,
    constants.SECRET_KEY_PATTERN,
    "a key of a Secret's data: letters, digits, '-', '_' and '.', not '.' and not starting"
    " with '..'",
)


class SecretRefSchema(_ModelSchema):
    model = SecretRef

    name = StrictString(
        required=True,
        validate=_SECRET_NAME,
        metadata={"description": "Name of the Secret, in the same namespace, holding the token."},
    )
    key = StrictString(
        load_default="",
        validate=_SECRET_KEY,
        # "" is Go's zero value (absent), not a schema default: the CRD declares no default.
        metadata={
            "description": "Key in the Secret whose value is the Lumigo token.",
            "zero": True,
        },
    )


class LumigoTokenSchema(_ModelSchema):
    model = LumigoToken

    secretRef = _nested(
        SecretRefSchema, "Reference to the Kubernetes Secret holding the Lumigo token."
    )


class InjectionSchema(_ModelSchema):
    model = Injection

    enabled = _flag(True, "Inject the Lumigo tracers into workloads of this namespace.")
    injectLumigoIntoExistingResourcesOnCreation = _flag(
        True, "Instrument the workloads that already exist on activation."
    )
    removeLumigoFromResourcesOnDeletion = _flag(
        True, "Remove instrumentation when this resource is deleted."
    )
    maxConcurrentRollouts = StrictInteger(
        load_default=constants.DEFAULT_MAX_CONCURRENT_ROLLOUTS,
        validate=marshmallow.validate.Range(min=0, error="must be 0 (no limit) or more"),
        metadata={
            "description": (
                "How many existing Deployments, StatefulSets and DaemonSets of the namespace may"
                " be rolling at once because the operator instrumented them; the next one starts"
                " when one is available again. 0: no limit."
            )
        },
    )


def _section(
    model: type, enabled: bool, description: str, **sections: fields.Nested
) -> type[_ModelSchema]:
    """The schema of a spec section: its `enabled` switch, then its nested sections."""
    attributes: dict[str, object] = {"model": model, "enabled": _flag(enabled, description)}
    return type(f"{model.__name__}Schema", (_ModelSchema,), {**attributes, **sections})


TracingSchema = _section(
    Tracing,
    True,
    "Sets LUMIGO_ENABLE_TRACES in instrumented containers.",
    injection=_nested(InjectionSchema, "How workloads are instrumented."),
)
LoggingSchema = _section(Logging, False, "Sets LUMIGO_ENABLE_LOGS in instrumented containers.")
KubeEventsSchema = _section(KubeEvents, True, "Collect Kubernetes events and object versions.")
InfrastructureSchema = _section(
    Infrastructure,
    True,
    "Collect infrastructure telemetry for this namespace.",
    kubeEvents=_nested(KubeEventsSchema, "Kubernetes events and object versions collection."),
)


class LumigoSpecSchema(_ModelSchema):
    model = LumigoSpec

    lumigoToken = _nested(LumigoTokenSchema, "Where to find the Lumigo token of this namespace.")
    tracing = _nested(TracingSchema, "Distributed tracing of the namespace's workloads.")
    logging = _nested(LoggingSchema, "Log collection from the namespace's workloads.")
    infrastructure = _nested(
        InfrastructureSchema, "Infrastructure telemetry (Kubernetes events and objects)."
    )


# --- status -------------------------------------------------------------------------------


class ConditionSchema(_Base):
    """metav1.Condition-shaped: the reference's fields plus `reason` and `observedGeneration`."""

    type = StrictString(
        required=True,
        validate=marshmallow.validate.OneOf(
            [
                constants.CONDITION_ACTIVE,
                constants.CONDITION_ERROR,
                constants.CONDITION_PROGRESSING,
                constants.CONDITION_TELEMETRY_LEFT_OUT,
            ]
        ),
        metadata={"description": "Active, Error, Progressing or TelemetryLeftOut."},
    )
    status = StrictString(
        required=True,
        validate=marshmallow.validate.OneOf(["True", "False", "Unknown"]),
        metadata={"description": "True, False or Unknown."},
    )
    lastUpdateTime = fields.DateTime(
        required=True, format="iso", metadata={"description": "Last time the condition was set."}
    )
    lastTransitionTime = fields.DateTime(
        required=True,
        format="iso",
        metadata={"description": "Last time the status flipped."},
    )
    message = StrictString(
        required=True, metadata={"description": "Human-readable details; empty when fine."}
    )
    reason = StrictString(
        load_default="", metadata={"description": "CamelCase reason for the last transition."}
    )
    observedGeneration = fields.Integer(
        load_default=0,
        strict=True,
        metadata={"description": "The .metadata.generation the condition was computed from."},
    )


class ObjectReferenceSchema(_Base):
    apiVersion = StrictString(load_default="")
    kind = StrictString(load_default="")
    namespace = StrictString(load_default="")
    name = StrictString(load_default="")
    uid = StrictString(load_default="")
    resourceVersion = StrictString(load_default="")
    fieldPath = StrictString(load_default="")


class RevertedResourceSchema(ObjectReferenceSchema):
    reason = StrictString(
        load_default="", metadata={"description": "What was observed when it was reverted."}
    )


class SkippedResourceSchema(ObjectReferenceSchema):
    reason = StrictString(load_default="", metadata={"description": "Why it is not instrumented."})


class RolloutsSchema(_Base):
    rolling = fields.Integer(
        load_default=0,
        strict=True,
        metadata={"description": "Workloads rolling because the operator changed them."},
    )
    pending = fields.Integer(
        load_default=0,
        strict=True,
        metadata={"description": "Workloads waiting for a rollout slot (maxConcurrentRollouts)."},
    )


class LumigoStatusSchema(_Base):
    conditions = fields.List(
        fields.Nested(ConditionSchema),
        required=True,
        metadata={"description": "Active and Error conditions of this Lumigo resource."},
    )
    instrumentedResources = fields.List(
        fields.Nested(ObjectReferenceSchema),
        required=True,
        metadata={"description": "Workloads of the namespace currently instrumented."},
    )
    rollouts = fields.Nested(
        RolloutsSchema,
        metadata={"description": "Instrumentation rollouts of existing workloads under way."},
    )
    revertedResources = fields.List(
        fields.Nested(RevertedResourceSchema),
        metadata={
            "description": (
                "Workloads whose instrumentation was reverted because their new pods failed;"
                " remove the operator.lumigo.io/instrumentation-reverted annotation to retry."
            )
        },
    )
    skippedResources = fields.List(
        fields.Nested(SkippedResourceSchema),
        metadata={
            "description": (
                "Workloads left uninstrumented because instrumenting them would harm them (e.g."
                " an ephemeral-storage limit that the payload copy would exceed), and why."
            )
        },
    )


# --- loading ------------------------------------------------------------------------------


def _flatten(messages: Any, prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(messages, Mapping):
        for key, value in messages.items():
            path = prefix if key == "_schema" else f"{prefix}.{key}"
            out.update(_flatten(value, path))
    elif isinstance(messages, list):
        texts = [m for m in messages if isinstance(m, str)]
        nested = [m for m in messages if not isinstance(m, str)]
        if texts:
            out[prefix] = _humanise("; ".join(texts))
        for m in nested:
            out.update(_flatten(m, prefix))
    else:
        out[prefix] = _humanise(str(messages))
    return out


def _humanise(message: str) -> str:
    replacements = {
        "Missing data for required field.": "is required",
        "Invalid input type.": "must be an object",
    }
    return replacements.get(message, message)


def load_spec(raw: Any) -> LumigoSpec:
    """Load a spec dict (missing parts defaulted); raises InvalidSpecError naming each field."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InvalidSpecError({"spec": "must be an object"})
    try:
        spec: LumigoSpec = LumigoSpecSchema().load(dict(raw))
    except marshmallow.ValidationError as err:
        raise InvalidSpecError(_flatten(err.messages, "spec")) from None
    return spec


def dump_spec(spec: LumigoSpec) -> dict[str, Any]:
    """The wire form of a spec, every default spelled out (what the defaulter writes back)."""
    ref = spec.lumigo_token.secret_ref
    inj = spec.tracing.injection
    return {
        "lumigoToken": {"secretRef": {"name": ref.name, "key": ref.key}},
        "tracing": {
            "enabled": spec.tracing.enabled,
            "injection": {
                "enabled": inj.enabled,
                "injectLumigoIntoExistingResourcesOnCreation": (
                    inj.inject_lumigo_into_existing_resources_on_creation
                ),
                "removeLumigoFromResourcesOnDeletion": inj.remove_lumigo_from_resources_on_deletion,
                "maxConcurrentRollouts": inj.max_concurrent_rollouts,
            },
        },
        "logging": {"enabled": spec.logging.enabled},
        "infrastructure": {
            "enabled": spec.infrastructure.enabled,
            "kubeEvents": {"enabled": spec.infrastructure.kube_events.enabled},
        },
    }


def validate_status(raw: Any) -> list[str]:
    """Problems with a status dict, as `status.<path>: <message>` lines (empty when valid)."""
    try:
        LumigoStatusSchema().load(raw if isinstance(raw, Mapping) else {})
    except marshmallow.ValidationError as err:
        return [f"{p}: {m}" for p, m in sorted(_flatten(err.messages, "status").items())]
    return []
