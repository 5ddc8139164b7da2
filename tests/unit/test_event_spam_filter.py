"""client-go's spam filter for events: a burst of 25 per object and message, then one per 5 min."""

from __future__ import annotations

import pytest

from controller.runtime import events
from controller.runtime.events import PendingEvent, SpamFilter


def pending(name: str = "shop", message: str = "added") -> PendingEvent:
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "ns", "name": name}
    return PendingEvent(ref, "Normal", "LumigoAddedInstrumentation", message, "lumigo-operator")


def test_a_burst_of_25_then_one_per_five_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(events.time, "monotonic", lambda: now[0])
    spam = SpamFilter()
    assert [spam.allow(pending()) for _ in range(26)] == [True] * 25 + [False]
    # Another object, or another message about the same one, has a bucket of its own.
    assert spam.allow(pending(name="cart"))
    assert spam.allow(pending(message="updated"))
    now[0] += 299.0
    assert not spam.allow(pending())
    now[0] += 2.0  # a token every 300 s
    assert spam.allow(pending())
    assert not spam.allow(pending())


def test_the_number_of_buckets_is_bounded() -> None:
    spam = SpamFilter(size=10)
    for i in range(100):
        spam.allow(pending(name=f"d{i}"))
    assert len(spam._buckets) == 10
