"""The instrumentation events: reasons, message formats, triggers and source components.

They are part of the compatibility contract (users grep and alert on them), so they are defined
once, here, for the webhook and the controller alike.

Collaborator (implemented by `controller.runtime.events.EventRecorder`, passed in by the manager):

    class EventRecorder(Protocol):
        def event(self, obj, type, reason, message, component) -> None

`obj` is the involved object as a dict (apiVersion, kind and metadata are read); recording must
neither block nor raise (the webhook calls it on the admission path).

Messages (reference `api/v1alpha1/lumigo_events.go`):
    Normal   LumigoAddedInstrumentation      "Adding Lumigo instrumentation (trigger: <t>)"
    Warning  LumigoCannotAddInstrumentation  "Cannot add Lumigo instrumentation (trigger: <t>): <e>"
and the same for Updated/Updating and Removed/Removing.

Every value quoted into a message that a user controls (names, labels, error texts: an admission
review can be forged by anyone who reaches the webhook port) goes through `bounded`: control and
format characters become spaces, and at most MAX_QUOTED characters are kept. A message of three
quoted values then fits the API's 1,024 bytes with room for its fixed text.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Final, Literal, Protocol

from api import constants

NORMAL: Final = "Normal"
WARNING: Final = "Warning"

Action = Literal["add", "update", "remove"]

_REASONS: Final[dict[Action, tuple[str, str]]] = {
    "add": (constants.REASON_ADDED, constants.REASON_CANNOT_ADD),
    "update": (constants.REASON_UPDATED, constants.REASON_CANNOT_UPDATE),
    "remove": (constants.REASON_REMOVED, constants.REASON_CANNOT_REMOVE),
}
_VERBS: Final[dict[Action, str]] = {"add": "Adding", "update": "Updating", "remove": "Removing"}

MAX_QUOTED: Final = 256
ELLIPSIS: Final = "\u2026"
# Control (newlines, terminal escapes, NUL), format (bidirectional overrides, zero-width),
# line and paragraph separators, lone surrogates: nothing a reader should get from a user.
_HIDDEN: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

UNINSTALL_TRIGGER: Final = "controller, uninstall hook for standalone resources"
UNINSTALL_COMPONENT: Final = "Lumigo Operator uninstall hook"


class EventRecorder(Protocol):
    """Posts a Kubernetes Event about `obj`; never blocks, never raises."""

    def event(
        self, obj: dict[str, Any], type: str, reason: str, message: str, component: str
    ) -> None: ...


def bounded(value: str, limit: int = MAX_QUOTED) -> str:
    """`value` as a message may quote it: control and format characters replaced by spaces, at
    most `limit` characters (the last one an ellipsis when cut)."""
    head = value[: limit + 1]
    if head.isprintable():  # the usual case: nothing to replace
        clean = head
    else:
        category = unicodedata.category
        clean = "".join(" " if category(c) in _HIDDEN else c for c in head)
    return clean if len(clean) <= limit else clean[: limit - 1] + ELLIPSIS


def reason(action: Action, failed: bool = False) -> str:
    return _REASONS[action][1 if failed else 0]


def message(action: Action, trigger: str, error: str | None = None) -> str:
    """The reference's message: "Adding Lumigo instrumentation (trigger: <t>)" or the
    "Cannot add ...: <error>" variant when `error` is given."""
    if error is None:
        return f"{_VERBS[action]} Lumigo instrumentation (trigger: {trigger})"
    return f"Cannot {action} Lumigo instrumentation (trigger: {trigger}): {bounded(error)}"


def webhook_trigger(namespace: str, name: str, *, cannot_add: bool = False) -> str:
    """The injector webhook's trigger. The reference drops " Lumigo resource" from the
    CannotAdd variant only; kept for compatibility with anything matching on it."""
    trigger = f"injector webhook, acting on behalf of the '{bounded(namespace)}/{bounded(name)}'"
    return trigger if cannot_add else f"{trigger} Lumigo resource"


def controller_trigger(namespace: str, name: str) -> str:
    where = f"{bounded(namespace)}/{bounded(name)}"
    return f"controller, acting on behalf of the '{where}' Lumigo resource"


def webhook_component(operator_version: str) -> str:
    return f"{constants.AUTO_TRACE_VERSION_PREFIX}{operator_version}/injector-webhook"


def controller_component(operator_version: str) -> str:
    return f"{constants.AUTO_TRACE_VERSION_PREFIX}{operator_version}/controller"
