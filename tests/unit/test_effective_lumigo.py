"""Which Lumigo takes effect in a namespace: the one rule the controller, the webhook and the
telemetry proxy share (`api.effective`)."""

from __future__ import annotations

from typing import Any

from api.effective import effective, governing, in_effect

JSON = dict[str, Any]


def lumigo(name: str, created: str | None, *, active: bool = True, deleting: bool = False) -> JSON:
    meta: JSON = {"name": name, "namespace": "ns"}
    if created is not None:
        meta["creationTimestamp"] = created
    if deleting:
        meta["deletionTimestamp"] = "2026-03-01T00:00:00Z"
    condition = {"type": "Active", "status": "True" if active else "False"}
    return {"metadata": meta, "status": {"conditions": [condition]}}


def name(obj: JSON | None) -> str | None:
    return None if obj is None else str(obj["metadata"]["name"])


def test_the_oldest_governs_whatever_the_order() -> None:
    older = lumigo("z-older", "2026-01-01T00:00:00Z")
    newer = lumigo("a-newer", "2026-02-01T00:00:00Z")
    assert name(governing([older, newer])) == name(governing([newer, older])) == "z-older"


def test_a_tie_on_the_timestamp_goes_to_the_first_name() -> None:
    b = lumigo("b", "2026-01-01T00:00:00Z")
    a = lumigo("a", "2026-01-01T00:00:00Z")
    assert name(governing([b, a])) == name(governing([a, b])) == "a"


def test_without_a_timestamp_a_lumigo_counts_as_the_newest() -> None:
    dated = lumigo("z-dated", "2026-01-01T00:00:00Z")
    for undated in (lumigo("a-undated", None), lumigo("a-undated", "")):
        assert name(governing([undated, dated])) == "z-dated"
        assert name(governing([undated])) == "a-undated"
    assert name(governing([lumigo("b", None), lumigo("a", "")])) == "a"


def test_none_when_the_namespace_has_no_lumigo() -> None:
    assert governing([]) is None
    assert effective([]) is None


def test_an_inactive_oldest_still_governs_and_nothing_takes_effect() -> None:
    broken = lumigo("old-broken", "2026-01-01T00:00:00Z", active=False)
    duplicate = lumigo("new-active", "2026-02-01T00:00:00Z")
    assert name(governing([duplicate, broken])) == "old-broken"
    assert not in_effect(broken)
    assert effective([duplicate, broken]) is None  # a newer one never stands in


def test_a_deleting_oldest_still_governs_and_nothing_takes_effect() -> None:
    deleting = lumigo("old", "2026-01-01T00:00:00Z", deleting=True)
    duplicate = lumigo("new", "2026-02-01T00:00:00Z")
    assert name(governing([duplicate, deleting])) == "old"
    assert not in_effect(deleting)
    assert effective([deleting, duplicate]) is None


def test_an_active_oldest_takes_effect() -> None:
    older = lumigo("older", "2026-01-01T00:00:00Z")
    newer = lumigo("newer", "2026-02-01T00:00:00Z", active=False)
    assert in_effect(older)
    assert name(effective([newer, older])) == "older"


def test_a_status_of_the_wrong_shape_is_not_active() -> None:
    for status in (None, "x", {"conditions": None}, {"conditions": ["Active"]}):
        obj = {"metadata": {"name": "l", "creationTimestamp": "2026-01-01T00:00:00Z"}}
        assert not in_effect({**obj, "status": status})
