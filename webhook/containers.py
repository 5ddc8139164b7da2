"""Which containers of a workload to trace: the per-container annotations.

`operator.lumigo.io/exclude-containers: "istio-proxy, fluent-bit"` leaves those containers
untraced (service-mesh sidecars, log shippers); `operator.lumigo.io/include-containers: "app"`
traces only those. They are annotations of the workload (not of its pod template), read by the
webhook and the controller alike through `mutation.inject`.

A bad value never rejects or breaks a workload: names that are not container names, or that no
container has, are ignored; when both annotations are set, `include-containers` applies. Each
case is a `problem` the caller reports as a Warning event. An `include-containers` that names no
container of the workload traces none: the user asked to restrict, so nothing is traced rather
than everything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from api import constants

_CONTAINER_NAME: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_MAX_SHOWN: Final = 5


@dataclass(frozen=True)
class Selection:
    traced: frozenset[str]  # names of the containers to trace
    problem: str | None  # what was wrong with the annotations, for a Warning event


def _names(value: Any) -> list[str]:
    if not isinstance(value, str):
        return []
    return [n.strip() for n in value.split(",") if n.strip()]


def _shown(names: Sequence[str]) -> str:
    """Names for a message: quoted, at most a few (user input must not flood an event)."""
    items = [repr(n[:63]) for n in names[:_MAX_SHOWN]]
    more = f" and {len(names) - _MAX_SHOWN} more" if len(names) > _MAX_SHOWN else ""
    return ", ".join(items) + more


def select(annotations: Mapping[str, Any], containers: Iterable[str]) -> Selection:
    """The containers to trace among `containers`, by the workload's annotations.

    Linear in the number of names and containers (membership through sets): the annotation is
    user input and may name tens of thousands of containers.
    """
    present = list(containers)
    include_raw = annotations.get(constants.ANNOTATION_INCLUDE_CONTAINERS)
    exclude_raw = annotations.get(constants.ANNOTATION_EXCLUDE_CONTAINERS)
    if include_raw is None and exclude_raw is None:
        return Selection(frozenset(present), None)
    problems: list[str] = []
    if include_raw is not None and exclude_raw is not None:
        problems.append(
            f"both {constants.ANNOTATION_INCLUDE_CONTAINERS} and "
            f"{constants.ANNOTATION_EXCLUDE_CONTAINERS} are set: only the first applies"
        )
    key = (
        constants.ANNOTATION_INCLUDE_CONTAINERS
        if include_raw is not None
        else constants.ANNOTATION_EXCLUDE_CONTAINERS
    )
    names = _names(include_raw if include_raw is not None else exclude_raw)
    invalid = [
        n
        for n in names
        if len(n) > constants.CONTAINER_NAME_MAX_LENGTH or not _CONTAINER_NAME.fullmatch(n)
    ]
    present_set, invalid_set = set(present), set(invalid)
    unknown = [n for n in names if n not in present_set and n not in invalid_set]
    if invalid:
        problems.append(f"{key}: not container names, ignored: {_shown(invalid)}")
    if unknown:
        problems.append(
            f"{key}: no such container, ignored: {_shown(unknown)} (containers: {_shown(present)})"
        )
    wanted = set(names)
    if include_raw is not None:
        traced = frozenset(n for n in present if n in wanted)
        if not traced:
            problems.append(f"{key} names no container of this workload: none is traced")
    else:
        traced = frozenset(n for n in present if n not in wanted)
    return Selection(traced, "; ".join(problems) or None)
