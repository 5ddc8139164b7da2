"""How many admission processes and maximum-size bodies fit the container's memory limit.

A JSON body expands ~24x into Python objects: handling one maximum-size (7 MiB) review peaks at
~235 MiB in a process that idles at ~60 MiB. Each admission worker process can hold large
bodies, so without a plan the pod's peak grows with the worker count (two workers each handling
one already pass a 512 Mi limit). The plan, from the container's limit L (cgroup v2 or v1):

    supervisor + workers x (worker at rest + its body budget + one body being joined)
        + slots x (handling one maximum-size body)  <=  90% of L

- the bytes of large bodies held at once are a pod-wide 32 MiB shared out over the workers (at
  least one maximum-size body and a quantum each);
- `slots` (at least one) is how many maximum-size bodies all workers together handle at once:
  a worker takes one of the slot files with `flock` before it handles a large body, so the
  kernel gives it back even when the worker is killed;
- no more workers start than fit with one slot: `auto` (the CPU limit) and an explicit count
  alike are lowered to what fits, with a warning that says what limit all would need (an
  OOM-killed pod serves no admission at all; the Lumigo defaulter fails closed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MiB = 1024 * 1024
SUPERVISOR_BYTES = 100 * MiB  # the process that starts the workers, at rest (measured ~65 MiB)
WORKER_BYTES = 64 * MiB  # an admission worker at rest (measured ~56-60 MiB)
LARGE_BODY_BYTES = 240 * MiB  # handling one maximum-size review (measured ~233 MiB)
POD_BODY_BUDGET = 32 * MiB  # bytes of large bodies held at once by all workers together
HEADROOM = 0.9  # of the limit: the rest for the kernel's view of fragmentation and buffers
QUANTUM = 256 * 1024  # room a large body takes ahead of its bytes (kube.http.asgi)

_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
LIMIT_ENV = "LUMIGO_MEMORY_LIMIT"  # bytes, e.g. from the downward API's limits.memory


def container_memory_limit() -> int | None:
    """The container's memory limit in bytes: $LUMIGO_MEMORY_LIMIT when set (where the cgroup
    files do not show the container's own), else cgroup v2, else v1; None when unlimited."""
    if text := os.environ.get(LIMIT_ENV, "").strip():
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{LIMIT_ENV} must be a number of bytes, not {text!r}") from None
    for name in _LIMIT_FILES:
        with contextlib.suppress(OSError, ValueError):
            text = Path(name).read_text().strip()
            if text == "max":
                return None
            value = int(text)
            return value if value < 1 << 60 else None  # cgroup v1 says "unlimited" this way
    return None


@dataclass(frozen=True)
class MemoryPlan:
    workers: int
    body_budget_bytes: int  # per worker
    large_slots: int  # maximum-size bodies handled at once by all workers together
    needed_bytes: int  # the pod's peak under the plan
    limit_bytes: int | None

    @property
    def fits(self) -> bool:
        return self.limit_bytes is None or self.needed_bytes <= self.limit_bytes * HEADROOM

    def describe(self) -> str:
        limit = "no limit" if self.limit_bytes is None else f"{self.limit_bytes // MiB} MiB"
        return (
            f"{self.workers} admission worker(s), {self.large_slots} maximum-size request(s) "
            f"handled at once, {self.body_budget_bytes // MiB} MiB of bodies per worker: peak "
            f"~{self.needed_bytes // MiB} MiB (memory limit: {limit})"
        )


def _needed(workers: int, budget: int, slots: int, max_body_bytes: int) -> int:
    return (
        SUPERVISOR_BYTES
        + workers * (WORKER_BYTES + budget + max_body_bytes)
        + slots * LARGE_BODY_BYTES
    )


def plan(workers: int, limit: int | None, max_body_bytes: int) -> MemoryPlan:
    """The body budget per worker and the pod-wide slots for `workers` under `limit`."""
    budget = max(max_body_bytes + QUANTUM, POD_BODY_BUDGET // max(workers, 1))
    slots = workers or 1
    if limit is not None:
        room = int(limit * HEADROOM) - _needed(workers, budget, 0, max_body_bytes)
        slots = max(1, min(slots, room // LARGE_BODY_BYTES))
    return MemoryPlan(
        workers, budget, slots, _needed(workers, budget, slots, max_body_bytes), limit
    )


def workers_that_fit(wanted: int, limit: int | None, max_body_bytes: int) -> int:
    """At most `wanted` workers, as many as fit `limit` with one slot (at least one)."""
    count = max(1, wanted)
    while count > 1 and not plan(count, limit, max_body_bytes).fits:
        count -= 1
    return count


class LargeBodySlots:
    """`count` slot files in `directory`, shared by processes: whoever holds the `flock` of one
    may handle a large body. A process that dies releases its slot with its file descriptor."""

    _POLL = 0.02  # seconds between tries while every slot is taken

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.paths = sorted(directory.glob("slot-*"))
        if not self.paths:
            raise ValueError(f"no slot files in {directory}")

    @classmethod
    def create(cls, directory: Path, count: int) -> LargeBodySlots:
        for index in range(count):
            (directory / f"slot-{index}").touch()
        return cls(directory)

    @contextlib.contextmanager
    def hold(self, timeout: float, stop: threading.Event | None = None) -> Iterator[bool]:
        """Yields True while holding a slot, False if none came free within `timeout`."""
        deadline = time.monotonic() + timeout
        fd = None
        while fd is None:
            fd = self._try()
            if fd is None:
                if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                    yield False
                    return
                time.sleep(self._POLL)  # a lock poll; large bodies take seconds to handle
        try:
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _try(self) -> int | None:
        start = os.getpid() % len(self.paths)  # processes try the slots in different orders
        for path in self.paths[start:] + self.paths[:start]:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None
