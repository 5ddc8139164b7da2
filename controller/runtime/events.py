"""Kubernetes Events, posted in the background so that nobody ever waits for them.

The webhook records events on the admission path, where every millisecond counts: recording
only enqueues, and one background thread posts. Like client-go's correlator, an event repeated
within ten minutes patches the existing Event's count instead of creating a new one, so a busy
namespace produces a bounded number of Event objects.

An admission request for a CREATE has no UID yet; `kubectl describe` matches events by UID, so
such an event is set aside until the object exists, and then gets its UID and resourceVersion
(the reference re-binds such events later; doing it at posting time is simpler). While it waits,
the poster goes on with other events: it looks again, with backoff, in the operator's informer
caches (`lookup`: no API call, which matters on the admission path's busiest moments) and falls
back to a GET. If the object never appears (a later admission plugin rejected it) the event is
dropped: it was about nothing.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.runtime.kube import KubeClient
from controller.runtime.resources import EVENTS, WORKLOADS_BY_KIND, ApiError, Resource

log = logging.getLogger("lumigo.events")

JSON = dict[str, Any]
Lookup = Callable[[str, str, str], JSON | None]  # (kind, namespace, name) -> cached object
MAX_MESSAGE = 1024
AGGREGATION_WINDOW = 600.0


@dataclass(frozen=True)
class PendingEvent:
    involved: JSON
    type: str
    reason: str
    message: str
    component: str


@dataclass
class _Unresolved:
    """An event about an object that did not exist yet: looked for again at `next_try`."""

    pending: PendingEvent
    give_up_at: float
    next_try: float
    delay: float


class SpamFilter:
    """client-go's EventSourceObjectSpamFilter: per source, object, type, reason and message, a
    burst of 25 events, then one per 5 minutes; the rest are dropped. The same admission
    repeated thousands of times a second (a controller in a hot loop, a benchmark) costs the API
    server 25 writes, not thousands."""

    def __init__(self, burst: float = 25.0, per_second: float = 1 / 300, size: int = 4096) -> None:
        self.burst = burst
        self.per_second = per_second
        self.size = size
        self._buckets: collections.OrderedDict[tuple[str, ...], tuple[float, float]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def allow(self, pending: PendingEvent) -> bool:
        ref = pending.involved
        key = (
            pending.component, str(ref.get("kind", "")), str(ref.get("namespace", "")),
            str(ref.get("name", "")), str(ref.get("uid", "")), str(ref.get("apiVersion", "")),
            pending.type, pending.reason, pending.message,
        )  # fmt: skip
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.per_second)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            while len(self._buckets) > self.size:
                self._buckets.popitem(last=False)
        return allowed


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_reference(obj: JSON) -> JSON:
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion", ""),
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "uid": meta.get("uid", ""),
        "resourceVersion": meta.get("resourceVersion", ""),
    }
    return {k: v for k, v in ref.items() if v}


class EventRecorder:
    """`event(obj, type, reason, message, component)` never blocks and never raises."""

    def __init__(
        self,
        client: KubeClient,
        *,
        max_queue: int = 2000,
        resolve_uid_timeout: float = 5.0,
        resources: dict[str, Resource] | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        self.client = client
        self.lookup = lookup
        self.resolve_uid_timeout = resolve_uid_timeout
        self._resources = resources or dict(WORKLOADS_BY_KIND)
        self._queue: queue.Queue[PendingEvent | None] = queue.Queue(max_queue)
        self._seen: collections.OrderedDict[tuple[str, ...], tuple[str, str, int, float]] = (
            collections.OrderedDict()
        )
        self._unresolved: list[_Unresolved] = []  # changed by the poster thread only
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._instance = socket.gethostname()
        self._spam = SpamFilter()
        self._drop_lock = threading.Lock()
        self._drop_logged_at = -60.0
        self._drops_logged = 0
        self.dropped = 0

    # -- recording (any thread) ----------------------------------------------------------------
    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        self.record(
            PendingEvent(object_reference(obj), type, reason, message[:MAX_MESSAGE], component)
        )

    def record(self, pending: PendingEvent) -> None:
        """Queue an event built elsewhere (an admission worker process forwards its own)."""
        if self._stopping.is_set():
            return
        if not self._spam.allow(pending):
            self._dropping("repeated too often (client-go's spam filter)", pending.reason)
            return
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            self._dropping("the event queue is full", pending.reason)

    def _dropping(self, why: str, reason: str) -> None:
        """Count a dropped event; say so at most once a minute (a storm must not flood logs)."""
        with self._drop_lock:
            self.dropped += 1
            now = time.monotonic()
            if now - self._drop_logged_at < 60.0:
                return
            self._drop_logged_at = now
            count, self._drops_logged = self.dropped - self._drops_logged, self.dropped
        log.warning("dropping events", extra={"why": why, "reason": reason, "dropped": count})

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Post what is queued, then stop; returns within `timeout` whatever the API does."""
        if self._thread is None:
            return
        self._stopping.set()
        # A full queue has no room for the marker: the poster then ends once it is empty.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout)
        self._thread = None

    def healthy(self) -> None:
        """A check for /healthz: the poster thread of a started recorder is alive."""
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError("the event poster thread died")

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything recorded so far was posted or dropped (tests, uninstall)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0 and not self._unresolved:
                return True
            time.sleep(0.02)
        return False

    def _run(self) -> None:
        try:
            while True:
                self._retry_unresolved()
                try:
                    pending = self._queue.get(timeout=self._until_next_retry())
                except queue.Empty:
                    continue
                try:
                    if pending is None:
                        return
                    self._post(pending)
                except Exception:
                    log.exception("posting an event failed")
                finally:
                    self._queue.task_done()
                if self._stopping.is_set() and self._queue.empty():
                    return
        finally:
            self.dropped += len(self._unresolved)
            self._unresolved.clear()

    def _until_next_retry(self) -> float | None:
        if not self._unresolved:
            return None
        return max(0.0, min(u.next_try for u in self._unresolved) - time.monotonic())

    def _retry_unresolved(self) -> None:
        now = time.monotonic()
        for waiting in [u for u in self._unresolved if u.next_try <= now]:
            try:
                self._post(waiting.pending, waiting)
            except Exception:
                log.exception("posting an event failed")
            finally:  # kept in the list meanwhile, so that `flush` never sees a gap
                if waiting.next_try <= now:  # posted or dropped, not set aside again
                    self._unresolved.remove(waiting)

    # -- posting -------------------------------------------------------------------------------
    def _post(self, pending: PendingEvent, waiting: _Unresolved | None = None) -> None:
        involved = dict(pending.involved)
        if not involved.get("uid") and not self._resolve(pending, involved, waiting):
            return
        namespace = involved.get("namespace") or "default"
        key = (
            involved.get("uid", ""), pending.type, pending.reason, pending.message,
            pending.component,
        )  # fmt: skip
        now, now_mono = _now(), time.monotonic()
        previous = self._seen.get(key)
        if previous is not None and now_mono - previous[3] < AGGREGATION_WINDOW:
            name, first, count, _ = previous
            try:
                self.client.merge_patch(
                    EVENTS, name, {"count": count + 1, "lastTimestamp": now}, namespace
                )
                self._remember(key, (name, first, count + 1, now_mono))
                return
            except ApiError as err:
                if not err.not_found:
                    log.warning("cannot update event", extra={"error": str(err)})
                    return
        name = f"{involved.get('name', 'object')}.{uuid.uuid4().hex[:16]}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": pending.reason,
            "message": pending.message,
            "type": pending.type,
            "source": {"component": pending.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingInstance": self._instance,
        }
        try:
            self.client.create(EVENTS, body, namespace)
        except ApiError as err:
            log.warning("cannot post event", extra={"error": str(err), "reason": pending.reason})
            return
        self._remember(key, (name, now, 1, now_mono))

    def _remember(self, key: tuple[str, ...], value: tuple[str, str, int, float]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > 4096:
            self._seen.popitem(last=False)

    def _resolve(self, pending: PendingEvent, involved: JSON, waiting: _Unresolved | None) -> bool:
        """Fill in uid/resourceVersion of an object that was being created when recorded.

        False when the event cannot be posted now: set aside to look again later (the poster
        goes on meanwhile), or dropped once the object did not appear in time.
        """
        kind, name = str(involved.get("kind", "")), str(involved.get("name", ""))
        namespace = str(involved.get("namespace", ""))
        resource = self._resources.get(kind)
        if resource is None or not name:
            return False
        now = time.monotonic()
        first_try = waiting is None
        if waiting is None:
            waiting = _Unresolved(pending, now + self.resolve_uid_timeout, now, 0.01)
        last_chance = now + waiting.delay > waiting.give_up_at
        obj = self.lookup(kind, namespace, name) if self.lookup is not None else None
        if obj is None and (self.lookup is None or last_chance):
            try:
                obj = self.client.get_or_none(resource, name, namespace or None)
            except ApiError as err:
                log.warning("cannot resolve event object", extra={"error": str(err)})
                return False
        if obj is not None:
            meta = obj.get("metadata") or {}
            involved["uid"] = meta.get("uid", "")
            involved["resourceVersion"] = meta.get("resourceVersion", "")
            return True
        if not last_chance:
            waiting.next_try = now + waiting.delay
            waiting.delay = min(waiting.delay * 2, 0.5)
            if first_try:
                self._unresolved.append(waiting)
        return False
