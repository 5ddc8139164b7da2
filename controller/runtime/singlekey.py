"""A controller with a single key, for a loop over a whole state rather than one object.

Some reconcilers converge one thing built from many objects (a rendered configuration, the
webhook certificate): every event means "look again at everything". They are ordinary
controllers all the same, with the work queue's de-duplication, the rate limiter's backoff on
error and the reconcile metrics; their reconcile function just takes no key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.runtime.manager import Controller, Result
from controller.runtime.ratelimit import RateLimiter
from controller.runtime.store import ObjectKey
from controller.runtime.workqueue import RateLimitingQueue

KEY = ObjectKey("", "singleton")


def single_key_controller(
    name: str, reconcile: Callable[[], Result | None], *, rate_limiter: RateLimiter
) -> Controller:
    """A one-worker controller whose queue already holds the key: it runs a first pass as soon
    as it starts, then whenever `trigger` is called, and as its results ask."""
    queue = RateLimitingQueue[ObjectKey](name=name, rate_limiter=rate_limiter)
    queue.add(KEY)
    return Controller(name, lambda _key: reconcile(), queue=queue)


def trigger(controller: Controller) -> None:
    """Ask for a pass (a no-op if one is already waiting)."""
    controller.queue.add(KEY)


def to_key(_obj: dict[str, Any]) -> list[ObjectKey]:
    """A watch mapper: any event on the watched kind means a pass."""
    return [KEY]
