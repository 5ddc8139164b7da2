"""The rate limiters follow client-go's formulas exactly (fake clock, no sleeping)."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.runtime.ratelimit import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    default_controller_rate_limiter,
)


class FakeClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_exponential_doubles_from_5ms_and_caps_at_1000s() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    delays = [limiter.when("a") for _ in range(25)]
    # 5 ms * 2**n; 5 ms * 2**17 = 655.36 s, 2**18 would be 1310.72 s -> capped.
    assert delays[:18] == [0.005 * 2**n for n in range(18)]
    assert delays[0] == 0.005
    assert delays[17] == 655.36
    assert delays[18:] == [1000.0] * 7
    assert limiter.num_requeues("a") == 25


def test_exponential_is_per_key_and_forget_resets() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    for _ in range(3):
        limiter.when(("ns", "a"))
    assert limiter.when(("ns", "b")) == 0.005  # another key starts at the base
    assert limiter.num_requeues(("ns", "a")) == 3
    limiter.forget(("ns", "a"))
    assert limiter.num_requeues(("ns", "a")) == 0
    assert limiter.when(("ns", "a")) == 0.005
    limiter.forget("never-seen")  # harmless


def test_exponential_never_overflows() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 1e308)
    for _ in range(1100):  # 2.0**1024 raises OverflowError in Python
        delay = limiter.when("a")
    assert delay == 1e308


def test_bucket_starts_full_then_spreads_debt_at_qps() -> None:
    clock = FakeClock()
    bucket = BucketRateLimiter(qps=10.0, burst=100, clock=clock)
    assert [bucket.when("any") for _ in range(100)] == [0.0] * 100
    assert bucket.when("a") == 0.1  # tokens -1
    assert bucket.when("b") == 0.2  # tokens -2: the bucket is global, keys do not matter
    clock.advance(0.25)  # +2.5 tokens -> 0.5, minus 1 -> -0.5
    assert bucket.when("a") == 0.05
    clock.advance(3600.0)  # refills, but never above the burst
    assert [bucket.when("a") for _ in range(100)] == [0.0] * 100
    assert bucket.when("a") == 0.1
    assert bucket.num_requeues("a") == 0
    bucket.forget("a")  # nothing per key
    assert bucket.when("a") == 0.2


def test_bucket_ignores_a_clock_going_backwards() -> None:
    clock = FakeClock()
    bucket = BucketRateLimiter(qps=10.0, burst=1, clock=clock)
    assert bucket.when("a") == 0.0
    clock.advance(-5.0)
    assert bucket.when("a") == 0.1  # no refill from negative time, no crash


def test_max_of_asks_every_limiter_and_returns_the_longest() -> None:
    clock = FakeClock()
    exponential = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    bucket = BucketRateLimiter(qps=10.0, burst=1, clock=clock)
    limiter = MaxOfRateLimiter(exponential, bucket)
    assert limiter.when("a") == 0.005  # exponential wins; the bucket's token is still taken
    assert limiter.when("b") == 0.1  # so the bucket is now in debt and wins
    assert exponential.num_requeues("b") == 1  # both were asked
    assert limiter.num_requeues("a") == 1
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0


@pytest.mark.parametrize(
    ("factory", "kwargs"),
    [
        (ItemExponentialFailureRateLimiter, {"base_delay": -1.0}),
        (ItemExponentialFailureRateLimiter, {"base_delay": 2.0, "max_delay": 1.0}),
        (BucketRateLimiter, {"qps": 0.0}),
        (BucketRateLimiter, {"burst": 0}),
        (MaxOfRateLimiter, {}),
    ],
)
def test_invalid_parameters_are_rejected(factory: type, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        factory(**kwargs)


KEYS = st.sampled_from(["a", "b", ("ns", "c")])
# Dyadic steps (multiples of 1/64 s) keep the fake clock's sums exact in binary floating point.
STEPS = st.integers(min_value=0, max_value=640).map(lambda n: n / 64)
OPS = st.lists(
    st.tuples(st.sampled_from(["when", "when", "when", "forget"]), KEYS, STEPS),
    max_size=400,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_default_limiter_matches_client_go_formulas(
    ops: list[tuple[str, Hashable, float]],
) -> None:
    """max(5 ms * 2**failures capped at 1000 s, global bucket 10 qps / burst 100), for any
    sequence of failures, successes and elapsed time."""
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock=clock)
    failures: dict[Hashable, int] = {}
    tokens, last = 100.0, clock.now
    for op, key, step in ops:
        clock.advance(step)
        if op == "forget":
            limiter.forget(key)
            failures.pop(key, None)
            continue
        exp = failures.get(key, 0)
        failures[key] = exp + 1
        tokens = min(100.0, tokens + (clock.now - last) * 10.0) - 1.0
        last = clock.now
        exponential = min(0.005 * 2**exp, 1000.0)
        bucket = max(0.0, -tokens / 10.0)
        expected = max(exponential, bucket)
        assert limiter.when(key) == expected
        assert limiter.num_requeues(key) == failures[key]
