"""The work queue keeps client-go's promises, under any interleaving of several threads.

Waits poll with a deadline; no test asserts a duration. Every queue and thread a test starts is
shut down and joined by the fixtures, even when the test fails.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)
from prometheus_client import REGISTRY, generate_latest

from controller.runtime import metrics
from controller.runtime.ratelimit import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
)
from controller.runtime.workqueue import DelayingQueue, Queue, RateLimitingQueue
from envtest.process import wait_until

DEADLINE = 30.0  # generous: the machine is small and shared; a pass never takes this long


POLL = 0.001  # keys become ready within milliseconds


FAMILIES = {
    "workqueue_depth": metrics.WORKQUEUE_DEPTH,
    "workqueue_adds_total": metrics.WORKQUEUE_ADDS,
    "workqueue_queue_duration_seconds": metrics.WORKQUEUE_QUEUE_DURATION,
    "workqueue_work_duration_seconds": metrics.WORKQUEUE_WORK_DURATION,
    "workqueue_unfinished_work_seconds": metrics.WORKQUEUE_UNFINISHED_WORK,
    "workqueue_longest_running_processor_seconds": metrics.WORKQUEUE_LONGEST_RUNNING_PROCESSOR,
    "workqueue_retries_total": metrics.WORKQUEUE_RETRIES,
}


def metric(queue: Queue[Hashable], sample: str) -> float:
    """One sample of a queue's metric (read from its own series: the registry is big)."""
    family = next(f for prefix, f in FAMILIES.items() if sample.startswith(prefix))
    for collected in family.labels(queue.name, queue.name).collect():
        for s in collected.samples:
            if s.name == sample:
                return s.value
    raise AssertionError(f"no sample {sample} for queue {queue.name}")


def unique_name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def queue_threads(queue: Queue[Hashable]) -> list[threading.Thread]:
    prefix = f"workqueue-{queue.name}-"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


class FakeClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def stopper() -> Iterator[Callable[[Queue[Hashable]], Queue[Hashable]]]:
    """Registers queues to shut down after the test, and checks their threads are gone."""
    queues: list[Queue[Hashable]] = []

    def register(queue: Queue[Hashable]) -> Queue[Hashable]:
        queues.append(queue)
        return queue

    yield register
    for queue in queues:
        queue.shut_down()
    for queue in queues:
        assert not queue_threads(queue), "shut_down must join the queue's threads"


@pytest.fixture
def rlq(stopper: Callable[[Queue[Hashable]], Queue[Hashable]]) -> RateLimitingQueue[Hashable]:
    """A named rate-limiting queue whose limiter never delays (so nothing waits on time)."""
    queue = RateLimitingQueue[Hashable](unique_name(), ItemExponentialFailureRateLimiter(0, 0))
    stopper(queue)
    return queue


class Threads:
    """Starts daemon threads and joins them at teardown, failing if one is stuck."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self, target: Callable[[], object], name: str) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException as err:  # surfaced by the test, not lost in the thread
                self.errors.append(err)

        thread = threading.Thread(target=run, name=f"test-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def join(self, timeout: float = DEADLINE) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self.threads if t.is_alive()]
        assert not stuck, f"threads did not stop: {stuck}"
        if self.errors:
            raise self.errors[0]


@pytest.fixture
def threads() -> Iterator[Threads]:
    started = Threads()
    yield started
    started.join()


# -- the plain queue --------------------------------------------------------------------------


def test_add_deduplicates_waiting_keys_and_keeps_fifo_order(
    rlq: RateLimitingQueue[Hashable],
) -> None:
    for key in ["a", ("ns", "b"), "a", "c", ("ns", "b")]:
        rlq.add(key)
    assert rlq.len() == 3
    assert metric(rlq, "workqueue_adds_total") == 3
    assert metric(rlq, "workqueue_depth") == 3
    got = [rlq.get() for _ in range(3)]
    assert got == [("a", False), (("ns", "b"), False), ("c", False)]
    assert metric(rlq, "workqueue_depth") == 0


def test_readds_while_processing_run_exactly_once_afterwards(
    rlq: RateLimitingQueue[Hashable],
) -> None:
    rlq.add("a")
    assert rlq.get() == ("a", False)
    for _ in range(3):
        rlq.add("a")
    assert rlq.len() == 0, "a key being processed must not be handed to another worker"
    assert metric(rlq, "workqueue_depth") == 1  # client-go counts the parked re-add
    assert metric(rlq, "workqueue_adds_total") == 2
    rlq.done("a")
    assert rlq.len() == 1
    assert rlq.get() == ("a", False)
    rlq.done("a")
    assert rlq.len() == 0
    assert metric(rlq, "workqueue_depth") == 0
    assert metric(rlq, "workqueue_work_duration_seconds_count") == 2


def test_done_for_a_key_not_being_processed_is_ignored(rlq: RateLimitingQueue[Hashable]) -> None:
    rlq.add("a")
    rlq.done("a")  # never handed out: must not queue it a second time
    rlq.done("b")
    assert rlq.len() == 1
    assert rlq.get() == ("a", False)
    rlq.done("a")
    rlq.done("a")  # twice: still nothing queued
    assert rlq.len() == 0


def test_shut_down_hands_out_queued_keys_then_reports_shutdown(
    rlq: RateLimitingQueue[Hashable],
) -> None:
    rlq.add("a")
    rlq.add("b")
    assert rlq.get() == ("a", False)
    rlq.add("a")  # parked while processing
    rlq.shut_down()
    assert rlq.shutting_down()
    rlq.add("c")  # ignored
    rlq.add_after("d", 0)  # ignored, and not counted as a retry
    rlq.add_rate_limited("e")  # ignored
    assert metric(rlq, "workqueue_retries_total") == 0
    assert rlq.get() == ("b", False)
    rlq.done("a")  # the parked re-add of "a" is still handed out
    assert rlq.get() == ("a", False)
    assert rlq.get() == (None, True)
    assert rlq.get() == (None, True)


def test_shut_down_wakes_blocked_workers(
    rlq: RateLimitingQueue[Hashable], threads: Threads
) -> None:
    results: list[tuple[Hashable, bool]] = []
    for i in range(3):
        threads.start(lambda: results.append(rlq.get()), f"worker-{i}")
    rlq.shut_down()
    threads.join()
    assert results == [(None, True)] * 3


def test_shut_down_with_drain_waits_for_keys_in_flight(
    rlq: RateLimitingQueue[Hashable], threads: Threads
) -> None:
    rlq.add("a")
    assert rlq.get() == ("a", False)
    drained: list[bool] = []
    drainer = threads.start(lambda: drained.append(rlq.shut_down_with_drain()), "drainer")
    wait_until(rlq.shutting_down, DEADLINE, "shutdown to start", interval=POLL)
    assert drainer.is_alive(), "must not return while a key is being processed"
    assert drained == []
    rlq.done("a")
    threads.join()
    assert drained == [True]


def test_shut_down_with_drain_gives_up_at_its_timeout(rlq: RateLimitingQueue[Hashable]) -> None:
    rlq.add("a")
    rlq.get()
    assert rlq.shut_down_with_drain(timeout=0.01) is False


def test_shut_down_ends_a_drain_early(rlq: RateLimitingQueue[Hashable], threads: Threads) -> None:
    rlq.add("a")
    rlq.get()
    drained: list[bool] = []
    threads.start(lambda: drained.append(rlq.shut_down_with_drain()), "drainer")
    wait_until(rlq.shutting_down, DEADLINE, "shutdown to start", interval=POLL)
    rlq.shut_down()
    threads.join()
    assert drained == [False]


def test_unhashable_keys_fail_at_the_caller(rlq: RateLimitingQueue[Hashable]) -> None:
    with pytest.raises(TypeError):
        rlq.add(["not", "hashable"])
    with pytest.raises(TypeError):
        rlq.add_after({"not": "hashable"}, 10)


# -- delays ------------------------------------------------------------------------------------


def test_add_after_earliest_ready_time_wins(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    # A frozen fake clock: nothing becomes ready until the test moves it, whatever the load.
    # (The loop sleeps in real time until the earliest entry, so only short delays are moved
    # past; the far-future entries are checked through num_waiting.)
    clock = FakeClock()
    queue = DelayingQueue[Hashable](unique_name(), clock=clock)
    stopper(queue)
    queue.add_after("stays", 3600)
    queue.add_after("stays", 1800)  # earlier: replaces the entry
    queue.add_after("stays", 7200)  # later: ignored
    assert queue.num_waiting() == 1
    queue.add_after("late-then-early", 3600)
    queue.add_after("late-then-early", 0.01)
    queue.add_after("early-then-late", 0.01)
    queue.add_after("early-then-late", 3600)
    assert queue.num_waiting() == 3
    assert queue.len() == 0
    clock.advance(1.0)
    wait_until(lambda: queue.len() == 2, DEADLINE, "both early keys to become ready", interval=POLL)
    assert sorted(queue.get()[0] for _ in range(2)) == ["early-then-late", "late-then-early"]
    assert queue.num_waiting() == 1, "only 'stays' may still wait: no later duplicate is kept"
    assert metric(queue, "workqueue_retries_total") == 7


def test_add_after_hands_out_keys_in_ready_time_order(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    clock = FakeClock()
    queue = DelayingQueue[Hashable](unique_name(), clock=clock)
    stopper(queue)
    queue.add_after("third", 0.03)
    queue.add_after("first", 0.01)
    queue.add_after("second", 0.02)
    clock.advance(1.0)  # all three ready at once: the heap decides the order
    wait_until(lambda: queue.len() == 3, DEADLINE, "all keys to become ready", interval=POLL)
    assert [queue.get()[0] for _ in range(3)] == ["first", "second", "third"]


def test_a_superseded_delay_never_fires_later(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    clock = FakeClock(100.0)
    queue = DelayingQueue[Hashable](unique_name(), clock=clock)
    stopper(queue)
    queue.add_after("a", 0.05)  # ready at 100.05 ...
    queue.add_after("a", 0.01)  # ... superseded: ready at 100.01
    clock.now = 100.02
    wait_until(lambda: queue.len() == 1, DEADLINE, "the earlier entry to fire", interval=POLL)
    assert queue.get() == ("a", False)
    queue.done("a")
    queue.add_after("a", 0.2)  # a new wait, ready at 100.22
    queue.add_after("marker", 0.06)  # ready at 100.08: popped after the stale 100.05 entry
    clock.now = 100.1
    wait_until(lambda: queue.len() >= 1, DEADLINE, "the marker to fire", interval=POLL)
    assert queue.get() == ("marker", False), "the superseded 100.05 entry must not add 'a'"
    assert queue.num_waiting() == 1  # 'a' still waits for 100.22


def test_add_after_with_real_time_eventually_adds(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    queue = DelayingQueue[Hashable](unique_name())
    stopper(queue)
    queue.add_after(("ns", "a"), 0.005)
    wait_until(lambda: queue.len() == 1, DEADLINE, "the delayed key to be added", interval=POLL)
    assert queue.get() == (("ns", "a"), False)


def test_add_after_without_delay_adds_at_once(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    queue = DelayingQueue[Hashable](unique_name())
    stopper(queue)
    queue.add_after("a", 0)
    queue.add_after("b", -1)
    assert queue.len() == 2
    assert queue.num_waiting() == 0
    assert metric(queue, "workqueue_retries_total") == 2
    assert metric(queue, "workqueue_adds_total") == 2


def test_shut_down_drops_waiting_keys_and_joins_the_delay_thread(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    queue = DelayingQueue[Hashable](unique_name())
    stopper(queue)
    assert {t.name.rsplit("-", 1)[1] for t in queue_threads(queue)} == {"delay", "metrics"}
    queue.add_after("a", 3600)
    queue.shut_down()
    assert queue.num_waiting() == 0
    assert not queue_threads(queue)
    queue.add_after("b", 0.01)  # ignored after shutdown
    assert queue.num_waiting() == 0
    assert queue.get() == (None, True)


def test_superseded_delays_do_not_grow_memory(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    queue = DelayingQueue[Hashable](unique_name())
    stopper(queue)
    for i in range(1000):
        queue.add_after("a", 3600 - i)  # each one earlier than the last
    assert queue.num_waiting() == 1
    assert len(queue._heap) <= 2 * 1 + 64 + 1


# -- rate limiting -------------------------------------------------------------------------------


def test_add_rate_limited_waits_for_the_limiter_and_counts_requeues(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    limiter = ItemExponentialFailureRateLimiter(3600, 7200)
    queue = RateLimitingQueue[Hashable](unique_name(), limiter)
    stopper(queue)
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")
    assert queue.num_requeues("a") == 2
    assert queue.num_waiting() == 1
    assert queue.len() == 0
    assert metric(queue, "workqueue_retries_total") == 2
    queue.forget("a")
    assert queue.num_requeues("a") == 0
    assert queue.num_waiting() == 1, "forget resets the limiter only"


def test_default_limiter_requeues_after_its_short_first_delay(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    queue = RateLimitingQueue[Hashable](unique_name())  # default: 5 ms, 10 ms, ...
    stopper(queue)
    queue.add_rate_limited(("ns", "a"))
    wait_until(
        lambda: queue.len() == 1, DEADLINE, "the rate-limited key to come back", interval=POLL
    )
    assert queue.get() == (("ns", "a"), False)
    assert queue.num_requeues(("ns", "a")) == 1


# -- metrics -------------------------------------------------------------------------------------


def test_metrics_use_client_go_names_labels_and_buckets(rlq: RateLimitingQueue[Hashable]) -> None:
    rlq.add("a")
    rlq.get()
    rlq.done("a")
    text = generate_latest().decode()
    labels = f'{{controller="{rlq.name}",name="{rlq.name}"}}'
    for name in [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds_count",
        "workqueue_work_duration_seconds_count",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_retries_total",
    ]:
        assert f"{name}{labels}" in text
    assert "workqueue_adds_created" not in text
    assert tuple(10.0**e for e in range(-8, 4)) == metrics.WORKQUEUE_BUCKETS
    for bound in ["1e-08", "1.0", "1000.0", "+Inf"]:
        le = f'controller="{rlq.name}",le="{bound}",name="{rlq.name}"'
        assert f"workqueue_queue_duration_seconds_bucket{{{le}}}" in text


def test_unnamed_queue_exports_nothing_and_runs_only_the_delay_thread(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    before = {t.ident for t in threading.enumerate()}
    queue = RateLimitingQueue[Hashable]()
    stopper(queue)
    started = [t for t in threading.enumerate() if t.ident not in before]
    assert [t.name for t in started] == ["workqueue--delay"]
    queue.add("a")
    assert REGISTRY.get_sample_value("workqueue_adds_total", {"name": "", "controller": ""}) is None


def test_durations_and_in_flight_gauges_follow_the_clock(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]],
) -> None:
    clock = FakeClock(100.0)
    queue = Queue[Hashable](unique_name(), clock=clock)
    stopper(queue)
    queue.add("a")
    clock.now = 101.0
    queue.add("b")
    queue.add("a")  # duplicate: the first add time counts
    queue.get()  # a, waited 1 s
    clock.now = 103.0
    queue.get()  # b, waited 2 s
    assert metric(queue, "workqueue_queue_duration_seconds_sum") == 3.0
    clock.now = 104.0
    # a runs for 3 s and b for 1 s; the queue's own thread publishes this every 500 ms.
    wait_until(
        lambda: (
            metric(queue, "workqueue_unfinished_work_seconds") == 4.0
            and metric(queue, "workqueue_longest_running_processor_seconds") == 3.0
        ),
        DEADLINE,
        "the in-flight gauges to be refreshed",
        interval=POLL,
    )
    queue.done("a")
    queue.done("b")
    assert metric(queue, "workqueue_work_duration_seconds_sum") == 4.0
    assert metric(queue, "workqueue_work_duration_seconds_count") == 2
    wait_until(
        lambda: (
            metric(queue, "workqueue_unfinished_work_seconds") == 0.0
            and metric(queue, "workqueue_longest_running_processor_seconds") == 0.0
        ),
        DEADLINE,
        "the in-flight gauges to drop to zero",
        interval=POLL,
    )


# -- model-based: one thread, every step compared with a model of client-go ------------------------

MODEL_KEYS = st.sampled_from(["a", "b", "c", ("ns", "d")])


class QueueModel(RuleBasedStateMachine):
    """Random sequences of queue operations against a plain model of client-go's queue."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = RateLimitingQueue[Hashable](
            unique_name(), ItemExponentialFailureRateLimiter(0, 0)
        )
        self.fifo: list[Hashable] = []
        self.dirty: set[Hashable] = set()
        self.processing: set[Hashable] = set()
        self.failures: dict[Hashable, int] = {}
        self.shut = False
        self.adds = 0
        self.retries = 0
        self.dones = 0

    def _add(self, key: Hashable) -> None:
        if self.shut or key in self.dirty:
            return
        self.adds += 1
        self.dirty.add(key)
        if key not in self.processing:
            self.fifo.append(key)

    @rule(key=MODEL_KEYS)
    def add(self, key: Hashable) -> None:
        self.queue.add(key)
        self._add(key)

    @rule(key=MODEL_KEYS, delay=st.sampled_from([0, -1.0]))
    def add_after_now(self, key: Hashable, delay: float) -> None:
        self.queue.add_after(key, delay)
        if not self.shut:
            self.retries += 1
        self._add(key)

    @rule(key=MODEL_KEYS)
    def add_rate_limited(self, key: Hashable) -> None:
        self.queue.add_rate_limited(key)
        self.failures[key] = self.failures.get(key, 0) + 1  # the limiter is asked regardless
        if not self.shut:
            self.retries += 1
        self._add(key)

    @precondition(lambda self: self.fifo or self.shut)  # otherwise get() would block
    @rule()
    def get(self) -> None:
        if not self.fifo:
            assert self.queue.get() == (None, True)
            return
        key = self.fifo.pop(0)
        assert self.queue.get() == (key, False)
        self.processing.add(key)
        self.dirty.discard(key)

    @precondition(lambda self: self.processing)
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.processing, key=repr)))
        self.queue.done(key)
        self.dones += 1
        self.processing.remove(key)
        if key in self.dirty:
            self.fifo.append(key)

    @rule(key=MODEL_KEYS)
    def done_unheld(self, key: Hashable) -> None:
        if key not in self.processing:
            self.queue.done(key)  # ignored

    @rule(key=MODEL_KEYS)
    def forget(self, key: Hashable) -> None:
        self.queue.forget(key)
        self.failures.pop(key, None)

    @rule()
    def shut_down(self) -> None:
        self.queue.shut_down()
        self.shut = True

    @invariant()
    def matches_model(self) -> None:
        q = self.queue
        assert q.len() == len(self.fifo)
        assert q.shutting_down() == self.shut
        assert metric(q, "workqueue_depth") == len(self.dirty)
        assert metric(q, "workqueue_adds_total") == self.adds
        assert metric(q, "workqueue_retries_total") == self.retries
        assert metric(q, "workqueue_work_duration_seconds_count") == self.dones
        for key in ["a", "b", "c", ("ns", "d")]:
            assert q.num_requeues(key) == self.failures.get(key, 0)

    def teardown(self) -> None:
        self.queue.shut_down()
        assert not queue_threads(self.queue)


QueueModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_queue_matches_client_go_model = QueueModel.TestCase


# -- several threads: exclusivity and no lost keys under random interleavings -------------------

Op = tuple[Any, ...]
THREAD_KEYS = st.sampled_from(["a", "b", "c", ("ns", "d"), ("ns", "e")])
PRODUCER_OP = st.one_of(
    st.tuples(st.just("add"), THREAD_KEYS),
    st.tuples(st.just("add_after"), THREAD_KEYS, st.sampled_from([0.0, 0.001, 0.005, 0.02])),
    st.tuples(st.just("add_rate_limited"), THREAD_KEYS),
    st.tuples(st.just("forget"), THREAD_KEYS),
    st.tuples(st.just("yield")),
)
PRODUCERS = st.lists(st.lists(PRODUCER_OP, min_size=10, max_size=60), min_size=1, max_size=3)
# What a worker does with each key it gets, in turn: finish, or re-add it (or forget) first.
WORKER_OP = st.sampled_from(["done", "done", "add", "add_after", "add_rate_limited", "forget"])
WORKERS = st.lists(st.lists(WORKER_OP, max_size=20), min_size=2, max_size=4)


@dataclass
class Ledger:
    """What the threads did, under one lock: versions written by adds and seen by workers.

    A producer bumps a key's version, then adds the key; a worker reads the version right
    after `get`. If no add is lost, once everything settles every key's last version has been
    seen by a run that started after it: the level-triggered promise controllers rely on.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    version: dict[Hashable, int] = field(default_factory=dict)
    seen: dict[Hashable, int] = field(default_factory=dict)
    committed: dict[Hashable, int] = field(default_factory=dict)  # added before shutdown
    in_flight: set[Hashable] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    shutdown_started: bool = False
    runs: int = 0
    dones: int = 0
    retries: int = 0

    def add(self, queue: RateLimitingQueue[Hashable], op: str, key: Hashable, delay: float) -> None:
        """Bump the key's version, then add it the way `op` says."""
        with self.lock:
            version = self.version[key] = self.version.get(key, 0) + 1
            if op != "add":
                self.retries += 1  # every add_after / add_rate_limited counts in client-go
        if op == "add":
            queue.add(key)
        elif op == "add_after":
            queue.add_after(key, delay)
        else:
            queue.add_rate_limited(key)
        if op == "add" or (op == "add_after" and delay <= 0):
            with self.lock:  # an immediate add that returned before shutdown began
                if not self.shutdown_started:
                    self.committed[key] = max(self.committed.get(key, 0), version)

    def start(self, key: Hashable) -> None:
        with self.lock:
            self.runs += 1
            if key in self.in_flight:
                self.violations.append(f"{key!r} handed to two workers at once")
            if key not in self.version:
                self.violations.append(f"{key!r} handed out but never added")
            self.in_flight.add(key)
            self.seen[key] = max(self.seen.get(key, 0), self.version.get(key, 0))

    def finish(self, key: Hashable) -> None:
        with self.lock:
            self.in_flight.discard(key)

    def unseen(self, wanted: dict[Hashable, int]) -> dict[Hashable, tuple[int, int]]:
        """Keys whose wanted version no run has seen: (wanted, seen)."""
        with self.lock:
            return {
                k: (v, self.seen.get(k, 0)) for k, v in wanted.items() if self.seen.get(k, 0) < v
            }

    def settled(self) -> bool:
        with self.lock:
            return self.runs == self.dones and all(
                self.seen.get(k, 0) >= v for k, v in self.version.items()
            )


def produce(queue: RateLimitingQueue[Hashable], ledger: Ledger, ops: list[Op]) -> None:
    for op in ops:
        if op[0] == "yield":
            time.sleep(0)  # let another thread run; not a wait
        elif op[0] == "forget":
            queue.forget(op[1])
        else:
            ledger.add(queue, op[0], op[1], op[2] if op[0] == "add_after" else 0.0)


def work(queue: RateLimitingQueue[Hashable], ledger: Ledger, ops: list[str]) -> None:
    plan = iter(ops)  # a finite budget of re-adds, so the system settles
    while True:
        key, shutdown = queue.get()
        if shutdown:
            return
        ledger.start(key)
        op = next(plan, "done")
        if op == "forget":
            queue.forget(key)
        elif op != "done":
            ledger.add(queue, op, key, 0.001)  # a re-add while processing
        ledger.finish(key)  # before done: right after it, another worker may take the key
        queue.done(key)
        with ledger.lock:
            ledger.dones += 1


def make_threaded_queue() -> RateLimitingQueue[Hashable]:
    """Real limiters with small delays (milliseconds), so a run settles quickly."""
    limiter = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.001, 0.02), BucketRateLimiter(qps=1000, burst=20)
    )
    return RateLimitingQueue[Hashable](unique_name(), limiter)


THREADED = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@THREADED
@given(producers=PRODUCERS, workers=WORKERS)
def test_threads_never_share_a_key_and_never_lose_one(
    producers: list[list[Op]], workers: list[list[str]]
) -> None:
    queue = make_threaded_queue()
    ledger = Ledger()
    worker_threads, producer_threads = Threads(), Threads()
    try:
        for i, ops in enumerate(workers):
            worker_threads.start(partial(work, queue, ledger, ops), f"worker-{i}")
        for i, ops in enumerate(producers):
            producer_threads.start(partial(produce, queue, ledger, ops), f"producer-{i}")
        producer_threads.join()
        wait_until(
            lambda: ledger.settled() and queue.num_waiting() == 0 and queue.len() == 0,
            DEADLINE,
            "every added key to be processed after its last add",
            interval=POLL,
        )
        assert ledger.violations == []
        assert ledger.unseen(ledger.version) == {}
        # The metrics balance as client-go's do: every counted add was handed out and done.
        assert metric(queue, "workqueue_depth") == 0
        assert metric(queue, "workqueue_adds_total") == ledger.runs
        assert metric(queue, "workqueue_queue_duration_seconds_count") == ledger.runs
        assert metric(queue, "workqueue_work_duration_seconds_count") == ledger.runs
        assert metric(queue, "workqueue_retries_total") == ledger.retries
    finally:
        queue.shut_down()
        producer_threads.join()
        worker_threads.join()
    assert not queue_threads(queue)


@THREADED
@given(
    producers=PRODUCERS,
    workers=WORKERS,
    shutdown_after=st.integers(min_value=0, max_value=60),
    drain=st.booleans(),
)
def test_shutdown_mid_flight_loses_no_key_added_before_it(
    producers: list[list[Op]], workers: list[list[str]], shutdown_after: int, drain: bool
) -> None:
    """Shutdown (plain or draining) from its own thread, after producer 0's n-th operation."""
    queue = make_threaded_queue()
    ledger = Ledger()
    started = Threads()
    go = threading.Event()
    drained: list[bool] = []

    def shut() -> None:
        go.wait(DEADLINE)
        with ledger.lock:
            ledger.shutdown_started = True
        if drain:
            drained.append(queue.shut_down_with_drain(DEADLINE))
        else:
            queue.shut_down()

    def first_producer() -> None:
        produce(queue, ledger, producers[0][:shutdown_after])
        go.set()
        produce(queue, ledger, producers[0][shutdown_after:])

    try:
        for i, ops in enumerate(workers):
            started.start(partial(work, queue, ledger, ops), f"worker-{i}")
        started.start(shut, "shutdown")
        started.start(first_producer, "producer-0")
        for i, ops in enumerate(producers[1:], start=1):
            started.start(partial(produce, queue, ledger, ops), f"producer-{i}")
        started.join()  # workers return only once the queue is shut down and empty
        assert ledger.violations == []
        assert ledger.unseen(ledger.committed) == {}, "keys added before shutdown were lost"
        assert drained == ([True] if drain else [])
        assert queue.num_waiting() == 0
        assert queue.get() == (None, True)
    finally:
        go.set()
        queue.shut_down()
        started.join()
    assert not queue_threads(queue)


def test_many_keys_through_four_workers_each_run_once(
    stopper: Callable[[Queue[Hashable]], Queue[Hashable]], threads: Threads
) -> None:
    """A larger fixed load: 2,000 keys from 2 producers through 4 workers."""
    queue = RateLimitingQueue[Hashable](unique_name())
    stopper(queue)
    runs: dict[Hashable, int] = {}
    lock = threading.Lock()

    def run() -> None:
        while True:
            key, shutdown = queue.get()
            if shutdown:
                return
            with lock:
                runs[key] = runs.get(key, 0) + 1
            queue.done(key)

    def add_all(keys: list[Hashable]) -> None:
        for key in keys:
            queue.add(key)

    for i in range(4):
        threads.start(run, f"worker-{i}")
    keys: list[Hashable] = [("ns", f"obj-{i}") for i in range(2000)]
    for i in range(2):
        threads.start(partial(add_all, keys[i::2]), f"producer-{i}")
    wait_until(lambda: len(runs) == len(keys), DEADLINE, "every key to run", interval=POLL)
    assert queue.shut_down_with_drain(DEADLINE)
    threads.join()
    assert set(runs) == set(keys)
    assert set(runs.values()) == {1}  # each key was added once, so it runs once
