"""The controller's work queue, with client-go's semantics.

Informers add keys, workers `get` them, reconcile, then call `done`. The queue guarantees what
every Kubernetes engineer expects from client-go:

- de-duplication: adding a key that is already waiting is a no-op;
- a key is never handed to two workers at once: a key re-added while it is being processed is
  parked and handed out again once, after `done`, however many times it was re-added;
- no key added before shutdown is lost: queued keys are still handed out after `shut_down`
  until the queue is empty, then `get` returns `shutdown=True`;
- delayed adds (`add_after`): for a key waiting twice, the earliest time wins; waiting keys are
  dropped at shutdown;
- rate-limited adds (`add_rate_limited`) ask a `RateLimiter` for the delay; `forget` resets it.

Three layers as in client-go: `Queue` (FIFO + dirty set + processing set under one condition),
`DelayingQueue` (a heap served by one background thread) and `RateLimitingQueue`. A named queue
exports the client-go workqueue metrics and refreshes the in-flight gauges from its own thread
every 500 ms. Background threads are daemons and are joined by `shut_down`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar, cast

from controller.runtime import metrics
from controller.runtime.ratelimit import Clock, RateLimiter, default_controller_rate_limiter

K = TypeVar("K", bound=Hashable)

# client-go's defaultUnfinishedWorkUpdatePeriod.
UNFINISHED_WORK_UPDATE_PERIOD = 0.5


class _QueueMetrics(Generic[K]):
    """client-go's defaultQueueMetrics. Called with the queue's lock held, so it needs none."""

    def __init__(self, name: str, clock: Clock) -> None:
        labels = (name, name)
        self._clock = clock
        self.depth = metrics.WORKQUEUE_DEPTH.labels(*labels)
        self.adds = metrics.WORKQUEUE_ADDS.labels(*labels)
        self.queue_duration = metrics.WORKQUEUE_QUEUE_DURATION.labels(*labels)
        self.work_duration = metrics.WORKQUEUE_WORK_DURATION.labels(*labels)
        self.unfinished_work = metrics.WORKQUEUE_UNFINISHED_WORK.labels(*labels)
        self.longest_running = metrics.WORKQUEUE_LONGEST_RUNNING_PROCESSOR.labels(*labels)
        self.retries = metrics.WORKQUEUE_RETRIES.labels(*labels)
        self._added_at: dict[K, float] = {}
        self._started_at: dict[K, float] = {}

    def add(self, key: K) -> None:
        self.adds.inc()
        self.depth.inc()
        self._added_at.setdefault(key, self._clock())

    def get(self, key: K) -> None:
        now = self._clock()
        self.depth.dec()
        self._started_at[key] = now
        added_at = self._added_at.pop(key, None)
        if added_at is not None:
            self.queue_duration.observe(now - added_at)

    def done(self, key: K) -> None:
        started_at = self._started_at.pop(key, None)
        if started_at is not None:
            self.work_duration.observe(self._clock() - started_at)

    def update_unfinished_work(self) -> None:
        now = self._clock()
        ages = [now - started for started in self._started_at.values()]
        self.unfinished_work.set(sum(ages))
        self.longest_running.set(max(ages, default=0.0))


class Queue(Generic[K]):
    """client-go's workqueue.Type. An unnamed queue exports no metrics (and starts no thread)."""

    def __init__(self, name: str = "", *, clock: Clock = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()  # the order of work; every key here is dirty
        self._dirty: set[K] = set()  # keys that need processing
        self._processing: set[K] = set()  # keys a worker holds; may be dirty too
        self._shutting_down = False
        self._drain = False
        self._metrics: _QueueMetrics[K] | None = _QueueMetrics(name, clock) if name else None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        if self._metrics is not None:
            self._start_thread(self._unfinished_work_loop, "metrics")

    def _start_thread(self, target: Callable[[], None], role: str) -> None:
        thread = threading.Thread(target=target, name=f"workqueue-{self.name}-{role}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def add(self, key: K) -> None:
        """Mark `key` as needing processing. Ignored after shutdown; a no-op if already waiting."""
        with self._cond:
            if self._shutting_down or key in self._dirty:
                return
            if self._metrics is not None:
                self._metrics.add(key)
            self._dirty.add(key)
            if key in self._processing:
                return  # `done` queues it again
            self._queue.append(key)
            self._cond.notify()

    def len(self) -> int:
        """Keys waiting for a worker; informational only (it can change right after)."""
        with self._cond:
            return len(self._queue)

    def get(self) -> tuple[K, bool]:
        """Block until a key is available; the caller must call `done(key)` after processing.

        Returns `(key, False)`, or `(None, True)` once the queue is shut down and empty: the
        worker should then exit (the key is meaningless then, as in client-go).
        """
        with self._cond:
            while not self._queue and not self._shutting_down:
                self._cond.wait()
            if not self._queue:
                return cast(K, None), True
            key = self._queue.popleft()
            if self._metrics is not None:
                self._metrics.get(key)
            self._processing.add(key)
            self._dirty.discard(key)
            return key, False

    def done(self, key: K) -> None:
        """Finish processing `key`; hand it out again if it was re-added meanwhile.

        A `done` for a key no worker holds is ignored (client-go would queue a dirty key twice).
        """
        with self._cond:
            if key not in self._processing:
                return
            if self._metrics is not None:
                self._metrics.done(key)
            self._processing.remove(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()
            elif not self._processing and self._shutting_down:
                # Wake `shut_down_with_drain`. Only then: before shutdown the waiters are idle
                # workers in `get`, and waking them all for nothing costs throughput.
                self._cond.notify_all()

    def shut_down(self) -> None:
        """Ignore new adds, let workers take what is queued, then make `get` return shutdown."""
        with self._cond:
            self._drain = False
            self._shutting_down = True
            self._cond.notify_all()
        self._stop_threads()

    def shut_down_with_drain(self, timeout: float | None = None) -> bool:
        """`shut_down`, then wait until no key is being processed (at most `timeout` seconds).

        Returns whether the queue drained. A concurrent `shut_down` ends the wait early.
        Workers must keep calling `get`/`done` meanwhile, or this waits for the timeout.
        """
        with self._cond:
            self._drain = True
            self._shutting_down = True
            self._cond.notify_all()
        self._stop_threads()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._processing and self._drain:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
            return not self._processing

    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    def _stop_threads(self) -> None:
        """Stop and join this queue's background threads (idempotent)."""
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def _unfinished_work_loop(self) -> None:
        assert self._metrics is not None
        while not self._stop.wait(UNFINISHED_WORK_UPDATE_PERIOD):
            with self._cond:
                self._metrics.update_unfinished_work()


class DelayingQueue(Queue[K]):
    """client-go's DelayingQueue: `add_after` via a min-heap on ready time and one thread."""

    def __init__(self, name: str = "", *, clock: Clock = time.monotonic) -> None:
        super().__init__(name, clock=clock)
        self._waiting_cond = threading.Condition()
        # Heap of (ready_at, seq, key); `seq` breaks ties so keys are never compared. An entry
        # is live only while `_waiting[key]` still holds its (ready_at, seq): an earlier add
        # supersedes it and it is skipped when popped (heapq has no decrease-key).
        self._heap: list[tuple[float, int, K]] = []
        self._waiting: dict[K, tuple[float, int]] = {}
        self._seq = itertools.count()
        self._waiting_stopped = False
        self._start_thread(self._waiting_loop, "delay")

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` after `delay` seconds (at once if `delay <= 0`). Ignored after shutdown.

        If `key` is already waiting, the earlier of the two ready times wins.
        """
        if self.shutting_down():
            return
        if self._metrics is not None:
            self._metrics.retries.inc()
        if delay <= 0:
            self.add(key)
            return
        with self._waiting_cond:
            if self._waiting_stopped:
                return
            ready_at = self._clock() + delay
            current = self._waiting.get(key)
            if current is not None and current[0] <= ready_at:
                return
            seq = next(self._seq)
            self._waiting[key] = (ready_at, seq)
            heapq.heappush(self._heap, (ready_at, seq, key))
            if len(self._heap) > 2 * len(self._waiting) + 64:
                self._compact()
            if self._heap[0][1] == seq:  # new earliest: the loop must wake sooner
                self._waiting_cond.notify()

    def num_waiting(self) -> int:
        """Keys waiting for their delay to pass; informational only."""
        with self._waiting_cond:
            return len(self._waiting)

    def _compact(self) -> None:
        """Drop superseded heap entries, so repeated earlier re-adds cannot grow memory."""
        self._heap = [(at, seq, key) for key, (at, seq) in self._waiting.items()]
        heapq.heapify(self._heap)

    def _waiting_loop(self) -> None:
        # Keys are added to the queue with the waiting lock held (lock order: waiting, then
        # queue; the queue never takes the waiting lock), so a key is always either waiting
        # or queued, never in between.
        with self._waiting_cond:
            while not self._waiting_stopped:
                now = self._clock()
                while self._heap and self._heap[0][0] <= now:
                    ready_at, seq, key = heapq.heappop(self._heap)
                    if self._waiting.get(key) == (ready_at, seq):
                        del self._waiting[key]
                        self.add(key)
                timeout = self._heap[0][0] - now if self._heap else None
                self._waiting_cond.wait(timeout)

    def _stop_threads(self) -> None:
        with self._waiting_cond:
            self._waiting_stopped = True
            self._heap.clear()
            self._waiting.clear()
            self._waiting_cond.notify_all()
        super()._stop_threads()


class RateLimitingQueue(DelayingQueue[K]):
    """client-go's RateLimitingQueue: re-adds failed keys after the limiter's delay."""

    def __init__(
        self,
        name: str = "",
        rate_limiter: RateLimiter | None = None,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(name, clock=clock)
        self.rate_limiter = rate_limiter or default_controller_rate_limiter()

    def add_rate_limited(self, key: K) -> None:
        """Add `key` once the limiter allows it (counts a failure / takes a token)."""
        self.add_after(key, self.rate_limiter.when(key))

    def forget(self, key: K) -> None:
        """Reset the limiter for `key` (it succeeded). `done` must still be called."""
        self.rate_limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        """Failures of `key` the limiter tracks."""
        return self.rate_limiter.num_requeues(key)
