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

Admission events are not trusted: anyone who reaches the webhook port can post an AdmissionReview
naming any object, uid and text. They are recorded with `verify` (`AdmissionEvents`, and every
event an admission worker forwards) and posted only for an object the API has: with the uid the
request names, or, for a CREATE (no uid yet), one created no earlier than the request. Anything
else waits like an object being created and is dropped when the wait ends; nothing is posted
about it. The events waiting are a bounded set (MAX_PENDING, the oldest dropped first), retried
in the order they are due (a heap), and every dropped event is counted in
`lumigo_events_dropped_total{why}` and logged at most once a minute.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import heapq
import itertools
import logging
import queue
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from controller.runtime.kube import KubeClient
from kube import objects
from kube.kinds import EVENTS
from kube.objects import JSON
from kube.rest import ApiError, Resource

log = logging.getLogger("lumigo.events")

Lookup = Callable[[str, str, str], JSON | None]  # (kind, namespace, name) -> cached object
MAX_MESSAGE = 1024  # bytes: the API server refuses a longer message
AGGREGATION_WINDOW = 600.0
MAX_PENDING = 1000  # events waiting for their object
MAX_REMEMBERED = 4096  # (object, reason, message) keys the spam filter remembers
DROP_LOG_INTERVAL = 60.0  # seconds between two log lines about dropped events
MAX_LABEL_LENGTH = 63  # DNS-1123 label: a namespace
MAX_SUBDOMAIN_LENGTH = 253  # DNS-1123 subdomain: an object name
# How much older than the request a CREATE's object may look: creationTimestamp has whole
# seconds, and the API server's clock is not ours.
CREATED_SLACK = 5.0
ELLIPSIS = "\u2026"
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # an object's name
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a namespace's

EVENTS_DROPPED = Counter(
    "lumigo_events_dropped_total",
    "Events not posted, by why: spam, queue-full, pending-full (too many waiting for their"
    " object), not-found (no such object, or not with the request's uid), invalid-object,"
    " stopped.",
    ["why"],
)
_WHY = {
    "spam": "repeated too often (client-go's spam filter)",
    "queue-full": "the event queue is full",
    "pending-full": "too many events wait for their object; the oldest are dropped",
    "not-found": "their object is not in the API (or not with the uid they name)",
    "invalid-object": "they name no valid object",
}


@dataclass(frozen=True)
class PendingEvent:
    involved: JSON
    type: str
    reason: str
    message: str
    component: str
    # An admission event (untrusted): posted only about an object found with the uid it names
    # or, without a uid (a CREATE), created no earlier than `recorded_at` (wall clock).
    verify: bool = False
    recorded_at: float = 0.0


def pending_event(
    obj: JSON, type: str, reason: str, message: str, component: str, *, verify: bool = False
) -> PendingEvent:
    return PendingEvent(
        object_reference(obj), type, reason, fit_message(message), component, verify, time.time()
    )


def fit_message(message: str) -> str:
    """`message` within the API's MAX_MESSAGE bytes (cut on a character, with an ellipsis)."""
    if len(message) <= MAX_MESSAGE // 4:  # at most 4 bytes a character: fits
        return message
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_MESSAGE:
        return message
    cut = MAX_MESSAGE - len(ELLIPSIS.encode())
    return data[:cut].decode("utf-8", "ignore") + ELLIPSIS


@dataclass
class _Unresolved:
    """An event about an object not found yet: looked for again at `next_try`."""

    key: int
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
            pending.component,
            str(ref.get("kind", "")),
            str(ref.get("namespace", "")),
            str(ref.get("name", "")),
            str(ref.get("uid", "")),
            str(ref.get("apiVersion", "")),
            pending.type,
            pending.reason,
            pending.message,
        )
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
    meta = objects.metadata(obj)
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

    # How many events may wait for their object; how much older than an admission its CREATE's
    # object may look (set on an instance to change them).
    max_pending: int = MAX_PENDING
    created_slack: float = CREATED_SLACK

    def __init__(
        self,
        client: KubeClient,
        *,
        max_queue: int = 2000,
        resolve_uid_timeout: float = 5.0,
        resources: Mapping[str, Resource],
        lookup: Lookup | None = None,
    ) -> None:
        self.client = client
        self.lookup = lookup
        self.resolve_uid_timeout = resolve_uid_timeout
        self._resources = dict(resources)  # kind -> where objects of that kind live
        self._queue: queue.Queue[PendingEvent | None] = queue.Queue(max_queue)
        self._seen: collections.OrderedDict[tuple[str, ...], tuple[str, str, int, float]] = (
            collections.OrderedDict()
        )
        # Changed by the poster thread only: the events waiting for their object, oldest first,
        # and when each is due again (a heap of (next_try, key); entries of events dropped or
        # rescheduled meanwhile are skipped when they come up).
        self._unresolved: dict[int, _Unresolved] = {}
        self._retries: list[tuple[float, int]] = []
        self._keys = itertools.count()
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
        """An event about an object read from the API (trusted: its uid is the object's)."""
        self.record(pending_event(obj, type, reason, message, component))

    def record(self, pending: PendingEvent, *, verify: bool = False) -> None:
        """Queue an event built elsewhere. An admission worker's are recorded with `verify`:
        they name objects from requests that anyone reaching the webhook port can forge."""
        if self._stopping.is_set():
            return
        now = time.time()
        pending = dataclasses.replace(
            pending,
            message=fit_message(pending.message),
            verify=pending.verify or verify,
            recorded_at=min(pending.recorded_at or now, now),
        )
        if not self._spam.allow(pending):
            self._dropping("spam", pending.reason)
            return
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            self._dropping("queue-full", pending.reason)

    def _dropping(self, why: str, reason: str) -> None:
        """Count a dropped event; say so at most once a minute (a storm must not flood logs)."""
        EVENTS_DROPPED.labels(why).inc()
        with self._drop_lock:
            self.dropped += 1
            now = time.monotonic()
            if now - self._drop_logged_at < DROP_LOG_INTERVAL:
                return
            self._drop_logged_at = now
            count, self._drops_logged = self.dropped - self._drops_logged, self.dropped
        log.warning("dropping events", extra={"why": _WHY[why], "reason": reason, "dropped": count})

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
            with self._drop_lock:
                self.dropped += len(self._unresolved)
            EVENTS_DROPPED.labels("stopped").inc(len(self._unresolved))
            self._unresolved.clear()
            self._retries.clear()

    def _until_next_retry(self) -> float | None:
        while self._retries:
            due, key = self._retries[0]
            waiting = self._unresolved.get(key)
            if waiting is not None and waiting.next_try == due:
                return max(0.0, due - time.monotonic())
            heapq.heappop(self._retries)  # dropped, or due at another time
        return None

    def _retry_unresolved(self) -> None:
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            due, key = heapq.heappop(self._retries)
            waiting = self._unresolved.get(key)
            if waiting is None or waiting.next_try != due:
                continue  # dropped, or due at another time
            try:
                self._post(waiting.pending, waiting)
            except Exception:
                log.exception("posting an event failed")
            finally:  # kept in the set meanwhile, so that `flush` never sees a gap
                if waiting.next_try <= now:  # posted or dropped, not set aside again
                    del self._unresolved[key]

    def _set_aside(self, waiting: _Unresolved) -> None:
        """Look for `waiting`'s object again at its `next_try`; a new one may push the oldest
        out (a flood of admissions about objects that never appear must not grow memory)."""
        if waiting.key not in self._unresolved:
            while self._unresolved and len(self._unresolved) >= self.max_pending:
                oldest = self._unresolved.pop(next(iter(self._unresolved)))
                self._dropping("pending-full", oldest.pending.reason)
            self._unresolved[waiting.key] = waiting
        heapq.heappush(self._retries, (waiting.next_try, waiting.key))

    # -- posting -------------------------------------------------------------------------------
    def _post(self, pending: PendingEvent, waiting: _Unresolved | None = None) -> None:
        involved = dict(pending.involved)
        resolve = pending.verify or not involved.get("uid")
        if resolve and not self._resolve(pending, involved, waiting):
            return
        namespace = involved.get("namespace") or "default"
        key = (
            involved.get("uid", ""),
            pending.type,
            pending.reason,
            pending.message,
            pending.component,
        )
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
        while len(self._seen) > MAX_REMEMBERED:
            self._seen.popitem(last=False)

    def _resolve(self, pending: PendingEvent, involved: JSON, waiting: _Unresolved | None) -> bool:
        """Fill in uid/resourceVersion of an object that was being created when recorded, or
        (`verify`) of the object the event names, once found as it names it (`_is_named`).

        False when the event cannot be posted now: set aside to look again later (the poster
        goes on meanwhile), or dropped once the object did not appear in time.
        """
        kind, name = str(involved.get("kind", "")), str(involved.get("name", ""))
        namespace = str(involved.get("namespace", ""))
        resource = self._resource_of(pending, kind, namespace, name)
        if resource is None:
            return False
        now = time.monotonic()
        if waiting is None:
            waiting = _Unresolved(
                next(self._keys), pending, now + self.resolve_uid_timeout, now, 0.01
            )
        last_chance = now + waiting.delay > waiting.give_up_at
        obj = self.lookup(kind, namespace, name) if self.lookup is not None else None
        if obj is not None and not self._is_named(pending, obj):
            obj = None  # the cache may lag behind the API: look again
        if obj is None and (self.lookup is None or last_chance):
            try:
                obj = self.client.get_or_none(resource, name, namespace or None)
            except ApiError as err:
                log.warning("cannot resolve event object", extra={"error": str(err)})
                return False
            if obj is not None and not self._is_named(pending, obj):
                obj = None
        if obj is not None:
            meta = objects.metadata(obj)
            involved["uid"] = meta.get("uid", "")
            involved["resourceVersion"] = meta.get("resourceVersion", "")
            return True
        if not last_chance:
            waiting.next_try = now + waiting.delay
            waiting.delay = min(waiting.delay * 2, 0.5)
            self._set_aside(waiting)
        elif pending.verify:
            self._dropping("not-found", pending.reason)
        return False

    def _resource_of(
        self, pending: PendingEvent, kind: str, namespace: str, name: str
    ) -> Resource | None:
        """The API resource to look the involved object up in; None when it cannot be: an
        unknown kind or no name, or (`verify`) a name the API would not accept. An admission
        event (`verify`) is then dropped."""
        resource = self._resources.get(kind)
        if resource is None or not name:
            if pending.verify:
                self._dropping("invalid-object", pending.reason)
            return None
        if pending.verify and not _valid_name(namespace, name):
            self._dropping("invalid-object", pending.reason)  # no API call for what cannot be
            return None
        return resource

    def _is_named(self, pending: PendingEvent, obj: JSON) -> bool:
        """Whether `obj` (found by kind, namespace and name) is the object an event names: any
        for a trusted event; for an admission event, the one with the uid it names, or without
        a uid (a CREATE's object has none yet), one created no earlier than the request."""
        if not pending.verify:
            return True
        meta = objects.metadata(obj)
        uid = pending.involved.get("uid")
        if uid:
            return bool(meta.get("uid") == uid)
        created = _timestamp(meta.get("creationTimestamp"))
        return created is not None and created >= pending.recorded_at - self.created_slack


class AdmissionEvents:
    """The recorder as the admission path gets it (the webhook's `EventRecorder` protocol):
    every event is verified (`PendingEvent.verify`) before it is posted."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder

    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        self.recorder.record(pending_event(obj, type, reason, message, component, verify=True))


def _valid_name(namespace: str, name: str) -> bool:
    """A namespace (DNS-1123 label) and an object name (DNS-1123 subdomain) the API accepts."""
    return (
        len(namespace) <= MAX_LABEL_LENGTH
        and len(name) <= MAX_SUBDOMAIN_LENGTH
        and _LABEL.fullmatch(namespace) is not None
        and _SUBDOMAIN.fullmatch(name) is not None
    )


def _timestamp(value: Any) -> float | None:
    """An RFC 3339 time of the API (`creationTimestamp`) in seconds since the epoch."""
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
