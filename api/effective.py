"""Which `Lumigo` takes effect in a namespace: one rule for the controller, the webhook and the
telemetry proxy, so that they never disagree about a namespace.

The oldest Lumigo governs the namespace (creationTimestamp, then name, so that two created in the
same second still have one answer); the others are duplicates, whatever their state. It takes
effect only while it is Active and not being deleted; a newer one never stands in for it. An
object without a creationTimestamp (never one the API server returns) is not known to be older
than any other, so it counts as the newest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from api import constants
from api.lumigo import Lumigo
from kube import objects


def governing(lumigoes: Iterable[Lumigo]) -> Lumigo | None:
    """The Lumigo that governs its namespace (all of `lumigoes` from one namespace), or None."""
    return min(lumigoes, key=_age, default=None)


def in_effect(lumigo: Lumigo) -> bool:
    """The governing Lumigo applies: it is Active and not being deleted."""
    return is_active(lumigo) and not objects.is_being_deleted(lumigo)


def effective(lumigoes: Iterable[Lumigo]) -> Lumigo | None:
    """The Lumigo that takes effect in a namespace, or None when the governing one does not."""
    lumigo = governing(lumigoes)
    return lumigo if lumigo is not None and in_effect(lumigo) else None


def is_active(lumigo: Lumigo) -> bool:
    """Its status has an `Active` condition with status "True"."""
    status = lumigo.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, Mapping)
        and c.get("type") == constants.CONDITION_ACTIVE
        and c.get("status") == "True"
        for c in conditions
    )


def _age(lumigo: Lumigo) -> tuple[bool, str, str]:
    created = objects.created(lumigo)
    return (created == "", created, objects.name(lumigo))
