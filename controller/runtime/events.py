"""Kubernetes Events, posted in the background so that nobody ever waits for them.

The webhook records events on the admission path, where every millisecond counts: recording
only enqueues, and one background thread posts. Like client-go's correlator, an event repeated
within ten minutes patches the existing Event's count instead of creating a new one, so a busy
namespace produces a bounded number of Event objects.

An admission request for a CREATE has no UID yet; `kubectl describe` matches events by UID, so
the poster waits briefly for the object to exist and fills in its UID and resourceVersion (the
reference re-binds such events later; doing it at posting time is simpler). It looks in the
operator's informer caches first (`lookup`: no API call, which matters on the admission path's
busiest moments) and falls back to a GET. If the object never appears (a later admission plugin
rejected it) the event is dropped: it was about nothing.
"""

from __future__ import annotations

import collections
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
        self._thread: threading.Thread | None = None
        self._instance = socket.gethostname()
        self.dropped = 0
        self.posted = 0

    # -- recording (any thread) ----------------------------------------------------------------
    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        pending = PendingEvent(
            object_reference(obj), type, reason, message[:MAX_MESSAGE], component
        )
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            self.dropped += 1
            log.warning("event queue full, dropping event", extra={"reason": reason})

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Post what is queued (bounded by `timeout`), then stop."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything recorded so far was posted (tests, uninstall)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.02)
        return False

    def _run(self) -> None:
        while True:
            pending = self._queue.get()
            try:
                if pending is None:
                    return
                self._post(pending)
            except Exception:
                log.exception("posting an event failed")
            finally:
                self._queue.task_done()

    # -- posting -------------------------------------------------------------------------------
    def _post(self, pending: PendingEvent) -> None:
        involved = dict(pending.involved)
        if not involved.get("uid") and not self._resolve(involved):
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
                self.posted += 1
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
        self.posted += 1

    def _remember(self, key: tuple[str, ...], value: tuple[str, str, int, float]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > 4096:
            self._seen.popitem(last=False)

    def _resolve(self, involved: JSON) -> bool:
        """Fill in uid/resourceVersion of an object that was being created when recorded."""
        kind, name = str(involved.get("kind", "")), str(involved.get("name", ""))
        namespace = str(involved.get("namespace", ""))
        resource = self._resources.get(kind)
        if resource is None or not name:
            return False
        deadline = time.monotonic() + self.resolve_uid_timeout
        delay = 0.01
        while True:
            obj = self.lookup(kind, namespace, name) if self.lookup is not None else None
            if obj is None and (self.lookup is None or time.monotonic() + delay > deadline):
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
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
