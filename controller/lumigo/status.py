"""Pure status logic of a Lumigo resource: token-secret validation and conditions.

Messages are the reference operator's, word for word (users grep for them). Conditions follow the
reference's bookkeeping — updated in place by type, appended only when first True, so "no Active
condition at all" means "never activated yet" — plus metav1.Condition's `reason` and
`observedGeneration`. Unlike the reference, `lastUpdateTime` moves only when the condition's
content changes, so an unchanged resource never gets a status write.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from api import constants
from api.lumigo import Condition, Lumigo, LumigoStatus, SecretRef
from kube import objects
from kube.objects import JSON

SECRET_ERROR_PREFIX = "invalid Lumigo token secret reference: "
ACTIVE_MESSAGE = "Lumigo is ready"
ERROR_SEE_CONDITION = "This Lumigo has an error, see the 'Error' condition"
BEING_DELETED = "This Lumigo instance is being deleted"
OTHER_INSTANCES = "other Lumigo instances in this namespace"
EMPTY_SPEC = "the Lumigo spec is empty"

REASON_READY = "LumigoIsReady"
REASON_HAS_ERROR = "LumigoHasError"
REASON_DELETING = "LumigoIsBeingDeleted"
REASON_NO_ERROR = "NoError"
REASON_INVALID_SECRET = "InvalidTokenSecret"
REASON_DUPLICATE = "DuplicateLumigo"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_EXCLUDED_NAMESPACE = "ExcludedNamespace"

# Never instrumented, whatever a Lumigo there says: the injector webhook's namespaceSelector
# leaves out the same namespaces (charts/lumigo-operator/templates/webhooks.yaml, config/webhook).
KUBE_SYSTEM = "kube-system"

_TOKEN = re.compile(constants.TOKEN_PATTERN)


def token_secret_problem(namespace: str, ref: SecretRef, secret: JSON | None) -> str | None:
    """Why the referenced token is unusable (the full reference message), or None if fine.

    `secret` is the Secret as read from the API server (None when it could not be read). The
    token itself never appears in a message.
    """
    if not ref.name and not ref.key:
        return SECRET_ERROR_PREFIX + "no Kubernetes secret reference provided"
    if not ref.name:
        return SECRET_ERROR_PREFIX + "cannot the secret name is not specified"
    where = f"'{namespace}/{ref.name}'"
    if not ref.key:
        return SECRET_ERROR_PREFIX + f"no key is specified for the secret {where}"
    if secret is None:
        return SECRET_ERROR_PREFIX + f"cannot retrieve secret {where}"
    value = secret_value(secret, ref.key)
    if value is None:
        return SECRET_ERROR_PREFIX + f"the secret {where} does not have the key '{ref.key}'"
    if valid_token(value) is None:
        return SECRET_ERROR_PREFIX + (
            f"the value of the field '{ref.key}' of the secret {where} does not match the "
            "expected structure of Lumigo tokens: it should be `t_` followed by 21 alphanumeric "
            "characters; see https://docs.lumigo.io/docs/lumigo-tokens for instructions on how "
            "to retrieve your Lumigo token"
        )
    return None


def valid_token(value: str) -> str | None:
    """The token without surrounding whitespace if all of it is a Lumigo token, else None.

    A full match, not the reference's search: the token is written into the telemetry proxy's
    configuration, so nothing but `t_` and 21 hex digits may ever pass.
    """
    token = value.strip()
    return token if _TOKEN.fullmatch(token) else None


def secret_token(secret: JSON, key: str) -> str | None:
    """The valid token held in `key` of a Secret, or None (see `token_secret_problem` for why)."""
    value = secret_value(secret, key)
    return None if value is None else valid_token(value)


def secret_value(secret: JSON, key: str) -> str | None:
    """The decoded value of `key` in a Secret (data is base64; stringData is write-only)."""
    data = secret.get("data") or {}
    if key in data:
        try:
            return base64.b64decode(data[key] or "", validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return ""
    string_data = secret.get("stringData") or {}
    if key in string_data:
        return str(string_data[key])
    return None


def excluded_namespace_problem(namespace: str, operator_namespace: str) -> str | None:
    """Why a Lumigo in `namespace` never takes effect, or None when it may.

    `kube-system` and the operator's own namespace are never instrumented: the webhook is not
    called there (its namespaceSelector), so the controller must not instrument them either.
    """
    if namespace == KUBE_SYSTEM:
        what = "Kubernetes' own namespace"
    elif operator_namespace and namespace == operator_namespace:
        what = "the Lumigo operator's own namespace"
    else:
        return None
    return (
        f"the '{namespace}' namespace is {what}, which Lumigo never traces: no workload is "
        "instrumented here; create the Lumigo resource in the namespace of the applications "
        "to trace"
    )


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: bool
    message: str
    reason: str


def apply_conditions(
    existing: list[Condition], updates: list[ConditionUpdate], generation: int, now: str
) -> list[Condition]:
    """The new condition list (a copy); `existing` is not modified."""
    out = [c.copy() for c in existing]
    for update in updates:
        status = "True" if update.status else "False"
        current = next((c for c in out if c.get("type") == update.type), None)
        if current is None:
            if not update.status:
                continue  # the reference appends a condition only when it first becomes True
            out.append(
                Condition(
                    type=update.type,
                    status=status,
                    lastTransitionTime=now,
                    lastUpdateTime=now,
                    message=update.message,
                    reason=update.reason,
                    observedGeneration=generation,
                )
            )
            continue
        changed = (
            current.get("status") != status
            or current.get("message", "") != update.message
            or current.get("reason", "") != update.reason
            or current.get("observedGeneration") != generation
        )
        if current.get("status") != status:
            current["lastTransitionTime"] = now
        if changed:
            current.update(
                Condition(
                    status=status,
                    message=update.message,
                    reason=update.reason,
                    observedGeneration=generation,
                    lastUpdateTime=now,
                )
            )
    return out


def condition(status: LumigoStatus | None, type_: str) -> Condition | None:
    """A copy of the status's condition of type `type_`, or None."""
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c.copy()
    return None


def was_ever_activated(obj: Lumigo) -> bool:
    """The reference's "just created" test, negated: an Active condition exists at all."""
    return condition(obj.get("status"), constants.CONDITION_ACTIVE) is not None


def active_updates(problem: str | None, reason: str) -> list[ConditionUpdate]:
    """Conditions for "fine" (problem None) or for an error with its message and reason."""
    if problem is None:
        return [
            ConditionUpdate(constants.CONDITION_ACTIVE, True, ACTIVE_MESSAGE, REASON_READY),
            ConditionUpdate(constants.CONDITION_ERROR, False, "", REASON_NO_ERROR),
        ]
    return [
        ConditionUpdate(constants.CONDITION_ERROR, True, problem, reason),
        ConditionUpdate(constants.CONDITION_ACTIVE, False, ERROR_SEE_CONDITION, REASON_HAS_ERROR),
    ]


def instrumented_reference(obj: JSON) -> JSON:
    """The status entry of one instrumented workload (a core ObjectReference)."""
    meta = objects.metadata(obj)
    return {
        "apiVersion": obj.get("apiVersion", ""),
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "resourceVersion": meta.get("resourceVersion", ""),
        "uid": meta.get("uid", ""),
    }


def sort_instrumented(refs: list[JSON]) -> list[JSON]:
    """Kind order DaemonSet, Deployment, ReplicaSet, StatefulSet, CronJob, Job; then by name."""
    order = constants.KIND_ORDER
    return sorted(refs, key=lambda r: (order.get(r.get("kind", ""), len(order)), r.get("name", "")))


REASON_ROLLING_OUT = "RollingOut"
REASON_ROLLOUTS_DONE = "RolloutsComplete"


def progressing_update(rolling: int, pending: int, limit: int) -> ConditionUpdate:
    """The Progressing condition: True while instrumentation rollouts are under way or waiting
    for a slot of the budget (`maxConcurrentRollouts`, 0 for no limit)."""
    if rolling == 0 and pending == 0:
        return ConditionUpdate(
            constants.CONDITION_PROGRESSING, False, "no rollout under way", REASON_ROLLOUTS_DONE
        )
    budget = f"maxConcurrentRollouts: {limit}" if limit else "no limit"
    return ConditionUpdate(
        constants.CONDITION_PROGRESSING,
        True,
        f"{rolling} workloads rolling out with the instrumentation, {pending} waiting ({budget})",
        REASON_ROLLING_OUT,
    )


def reverted_reference(obj: JSON, reason: str) -> JSON:
    """The status entry of a reverted workload: its reference and what was observed."""
    return {**instrumented_reference(obj), "reason": reason}
