"""Container selection is linear in the number of names and containers (issue 28, item 9): a
workload annotated with 40,000 names and 3,000 containers took a second of an admission worker's
time when every name was looked up in a list. Counted, not timed: every string comparison the
selection makes is counted through a `str` subclass (`bench/container_selection.py` prints the
time)."""

from __future__ import annotations

from typing import Any, SupportsIndex

import pytest

from api import constants
from webhook.containers import select

EXCLUDE = constants.ANNOTATION_EXCLUDE_CONTAINERS
INCLUDE = constants.ANNOTATION_INCLUDE_CONTAINERS


class Counted(str):
    """A str whose equality tests are counted; what it splits into and strips to is Counted too,
    so the names parsed from an annotation are counted as well as the containers' names."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        Counted.comparisons += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        Counted.comparisons += 1
        return str.__ne__(self, other)

    __hash__ = str.__hash__

    def split(  # type: ignore[override]
        self, sep: str | None = None, maxsplit: SupportsIndex = -1
    ) -> list[Counted]:
        return [Counted(part) for part in str.split(self, sep, maxsplit)]

    def strip(self, chars: str | None = None) -> Counted:
        return Counted(str.strip(self, chars))


def containers(count: int) -> list[Counted]:
    return [Counted(f"c{i}") for i in range(count)]


def annotation(names: list[str]) -> Counted:
    return Counted(", ".join(names))


def comparisons(annotations: dict[str, Any], present: list[Counted]) -> int:
    Counted.comparisons = 0
    select(annotations, present)
    return Counted.comparisons


N, M = 2_000, 1_500  # names in the annotation, containers in the pod


@pytest.mark.parametrize(
    ("case", "annotations", "present"),
    [
        # No name is a container: each one used to be compared with every container.
        ("exclude-unknown", {EXCLUDE: annotation([f"x{i}" for i in range(N)])}, containers(M)),
        # Every name is a container (found late in a list on average).
        ("include-all", {INCLUDE: annotation([f"c{i}" for i in range(N)])}, containers(N)),
        ("exclude-all", {EXCLUDE: annotation([f"c{i}" for i in reversed(range(N))])},
         containers(N)),
        # Names that are not container names were also looked up in the list of invalid names.
        ("invalid", {EXCLUDE: annotation([f"X{i}" for i in range(N)])}, containers(M)),
        ("both", {INCLUDE: annotation([f"c{i}" for i in range(N)]),
                  EXCLUDE: annotation([f"c{i}" for i in range(N)])}, containers(M)),
    ],
)  # fmt: skip
def test_selection_compares_each_name_a_bounded_number_of_times(
    case: str, annotations: dict[str, Any], present: list[Counted]
) -> None:
    names = str(next(iter(annotations.values()))).count(",") + 1
    count = comparisons(annotations, present)
    # Linear: a few comparisons per name and per container (a quadratic selection makes
    # names x containers / 2 of them, here about a million).
    assert count <= 3 * (names + len(present)), (case, count)


def test_the_result_is_unchanged_by_the_sets() -> None:
    present = ["app", "istio-proxy", "fluent-bit"]
    chosen = select({INCLUDE: "app, nope, Bad_Name"}, present)
    assert chosen.traced == frozenset({"app"})
    assert chosen.problem == (
        f"{INCLUDE}: not container names, ignored: 'Bad_Name'; "
        f"{INCLUDE}: no such container, ignored: 'nope' "
        "(containers: 'app', 'istio-proxy', 'fluent-bit')"
    )
    chosen = select({EXCLUDE: "app, app, nope"}, present)
    assert chosen.traced == frozenset({"istio-proxy", "fluent-bit"})
    assert chosen.problem is not None
    assert "'nope'" in chosen.problem
