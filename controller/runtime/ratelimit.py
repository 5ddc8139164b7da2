"""Rate limiters for re-queueing failed keys, with client-go's formulas.

A failing reconcile must back off per object (so one broken object cannot hammer the API server)
and the controller as a whole must be throttled (so a thousand broken objects cannot either).
`default_controller_rate_limiter()` is client-go's DefaultControllerRateLimiter: the maximum of a
per-key exponential backoff (5 ms doubling up to 1000 s) and a global token bucket (10 qps,
burst 100). Every limiter is thread-safe; the clock is injectable so tests check the formulas
exactly without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

Clock = Callable[[], float]


class RateLimiter(Protocol):
    """What the work queue needs from a limiter (client-go's TypedRateLimiter)."""

    def when(self, key: Hashable) -> float:
        """Seconds to wait before `key` is re-added. Has side effects: counts a failure or
        consumes a token."""
        ...

    def forget(self, key: Hashable) -> None:
        """Stop tracking `key` (it succeeded); its next failure starts from the base delay."""
        ...

    def num_requeues(self, key: Hashable) -> int:
        """How many failures of `key` are being tracked."""
        ...


class ItemExponentialFailureRateLimiter:
    """Per-key backoff: `base * 2**failures`, capped at `max_delay`; `when` counts a failure."""

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        if base_delay < 0 or max_delay < base_delay:
            raise ValueError("need 0 <= base_delay <= max_delay")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def when(self, key: Hashable) -> float:
        with self._lock:
            exp = self._failures.get(key, 0)
            self._failures[key] = exp + 1
        try:
            backoff = self.base_delay * 2.0**exp
        except OverflowError:  # 2.0**exp past float range: far beyond any cap
            return self.max_delay
        return min(backoff, self.max_delay)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def num_requeues(self, key: Hashable) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class BucketRateLimiter:
    """Global token bucket (golang.org/x/time/rate `Reserve().Delay()`), shared by all keys.

    Starts full. Every `when` takes a token even when none is left: the balance goes negative
    and the delay is the time the bucket needs to pay that debt back, so a burst of failures is
    spread out at `qps` instead of being dropped.
    """

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("need qps > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def when(self, key: Hashable) -> float:
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._last)  # a clock going backwards refills nothing
            self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps)
            self._last = now
            self._tokens -= 1.0
            return max(0.0, -self._tokens / self.qps)

    def forget(self, key: Hashable) -> None:
        """The bucket is global: nothing per key to forget."""

    def num_requeues(self, key: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters. Every limiter is asked on every `when`, so the
    bucket is charged even when the exponential term wins (as in client-go)."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("need at least one limiter")
        self.limiters = limiters

    def when(self, key: Hashable) -> float:
        return max([limiter.when(key) for limiter in self.limiters])

    def forget(self, key: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(key)

    def num_requeues(self, key: Hashable) -> int:
        return max(limiter.num_requeues(key) for limiter in self.limiters)


def default_controller_rate_limiter(clock: Clock = time.monotonic) -> MaxOfRateLimiter:
    """client-go's DefaultControllerRateLimiter: max(5 ms * 2**failures up to 1000 s,
    global bucket of 10 qps with burst 100)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(qps=10.0, burst=100, clock=clock),
    )
