"""Informer: LIST + WATCH one resource into a Store and tell handlers what changed.

The loop follows client-go's reflector: paginated consistent LIST, WATCH with
bookmarks and a random 5-10 min server timeout, resourceVersion tracked from every event
(bookmarks included), relist on 410 Gone with synthetic deletes for objects that vanished while
we were away, backoff with jitter on errors (reset after two healthy minutes). The thread never
dies silently: an unexpected exception is logged, counted and retried; `healthy()` turns false if
the thread is gone, and the manager's /healthz reports it.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.runtime.kube import KubeClient, WatchStream
from controller.runtime.store import ObjectKey, Store, key_of
from kube import objects
from kube.objects import JSON
from kube.rest import (
    ApiError,
    EventHandler,  # one definition for watchers of both layers
    Resource,
)

log = logging.getLogger("lumigo.informer")

Transform = Callable[[JSON], JSON]


@dataclass
class FuncHandler:
    """An EventHandler made of plain callables (each optional)."""

    add: Callable[[JSON], None] | None = None
    update: Callable[[JSON, JSON], None] | None = None
    delete: Callable[[JSON], None] | None = None

    def on_add(self, obj: JSON) -> None:
        if self.add:
            self.add(obj)

    def on_update(self, old: JSON, new: JSON) -> None:
        if self.update:
            self.update(old, new)

    def on_delete(self, obj: JSON) -> None:
        if self.delete:
            self.delete(obj)


@dataclass
class Backoff:
    """client-go's reflector backoff: 800 ms doubling with full jitter, capped at 30 s."""

    initial: float = 0.8
    cap: float = 30.0
    reset_after: float = 120.0
    _current: float = 0.0
    _last_failure: float = field(default=0.0)

    def next(self) -> float:
        now = time.monotonic()
        if self._current and now - self._last_failure > self.reset_after:
            self._current = 0.0
        self._current = self.initial if not self._current else min(self._current * 2, self.cap)
        self._last_failure = now
        return self._current * (1 + random.random())  # jitter factor 1.0

    def reset(self) -> None:
        self._current = 0.0


_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
)


def metadata_projection(extra: Callable[[JSON], JSON] | None = None) -> Transform:
    """A Transform keeping apiVersion, kind and the metadata fields controllers read.

    Caching projections instead of whole objects bounds the operator's memory: a Deployment is
    tens of KB once parsed (managedFields, the pod template), its identity and labels a few
    hundred bytes. Repeated strings (kinds, namespaces, label keys and values) are interned so
    thousands of objects share one copy.
    """
    intern = sys.intern

    def project(obj: JSON) -> JSON:
        meta: Mapping[str, Any] = objects.metadata(obj)
        kept: JSON = {k: meta[k] for k in _KEPT_METADATA if k in meta}
        if "namespace" in kept:
            kept["namespace"] = intern(kept["namespace"])
        labels = meta.get("labels")
        if labels:
            kept["labels"] = {intern(k): intern(str(v)) for k, v in labels.items()}
        owners = meta.get("ownerReferences")
        if owners:
            kept["ownerReferences"] = [
                {
                    "apiVersion": intern(str(o.get("apiVersion", ""))),
                    "kind": intern(str(o.get("kind", ""))),
                    "name": o.get("name", ""),
                    "controller": bool(o.get("controller")),
                }
                for o in owners
            ]
        out: JSON = {
            "apiVersion": intern(str(obj.get("apiVersion", ""))),
            "kind": intern(str(obj.get("kind", ""))),
            "metadata": kept,
        }
        if extra is not None:
            out.update(extra(obj))
        return out

    return project


@dataclass(frozen=True)
class Selection:
    """What one informer lists and watches: a resource, optionally one namespace and selectors."""

    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None


class Informer:
    """Keeps `store` in sync with one `Selection`."""

    # The server ends each WATCH after a random 5-10 min, so relists of many informers spread out.
    WATCH_TIMEOUTS = (300, 600)

    def __init__(
        self,
        client: KubeClient,
        selection: Selection,
        *,
        transform: Transform | None = None,
        indexed_labels: tuple[str, ...] = (),
    ) -> None:
        self.client = client
        self.selection = selection
        self.resource = selection.resource
        self.transform = transform
        self.indexed_labels = indexed_labels
        self.store = Store(indexed_labels)
        namespace = selection.namespace
        self.name = selection.resource.plural + (f"@{namespace}" if namespace else "")
        self._handlers: list[EventHandler] = []
        self._handlers_lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: WatchStream | None = None
        self._resource_version = ""
        self.last_error: str = ""
        self.relists = 0

    # -- lifecycle --------------------------------------------------------------------------------
    def add_handler(self, handler: EventHandler) -> None:
        """Register a handler; if the cache is already synced it first gets an add per object.

        The watch thread changes the store and copies the handler list in one step under the
        same lock, so a handler added meanwhile either is in that copy or finds the object in
        the store: it never misses one.
        """
        with self._handlers_lock:
            self._handlers.append(handler)
            if self._synced.is_set():
                for obj in self.store.list():
                    self._call(handler.on_add, obj)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def healthy(self) -> bool:
        """False when the informer thread has died (or was never started)."""
        return self._thread is not None and (self._thread.is_alive() or self._stop.is_set())

    @property
    def resource_version(self) -> str:
        return self._resource_version

    def get(self, namespace: str, name: str) -> JSON | None:
        return self.store.get(ObjectKey(namespace, name))

    # -- the loop ---------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = Backoff()
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                    backoff.reset()
                self._watch()
                backoff.reset()  # normal end of a watch: re-watch at once from the last RV
            except ApiError as err:
                self.last_error = str(err)
                if err.gone:
                    log.info("watch expired, relisting", extra={"informer": self.name})
                    need_list = True
                    continue
                if err.code in (401, 403, 404):
                    need_list = True  # RBAC or CRD changes: start from a fresh list
                self._sleep(backoff.next(), err)
            except Exception as err:  # never let the thread die on a bug or bad data
                self.last_error = repr(err)
                log.exception("informer loop failed", extra={"informer": self.name})
                need_list = True
                self._sleep(backoff.next(), err)

    def _sleep(self, delay: float, err: BaseException) -> None:
        log.warning(
            "informer error, backing off",
            extra={"informer": self.name, "error": str(err), "delay_s": round(delay, 2)},
        )
        self._stop.wait(delay)

    def _list(self) -> None:
        sel = self.selection
        objs, resource_version = self.client.list(
            sel.resource,
            sel.namespace,
            label_selector=sel.label_selector,
            field_selector=sel.field_selector,
            limit=100 if self.transform else 500,
            transform=self._prepare,
        )
        with self._handlers_lock:  # store, then hand out: see add_handler
            upserts, vanished = self.store.replace(objs)
            handlers = list(self._handlers)
        self._resource_version = resource_version
        self.relists += 1
        for obj in vanished:  # deleted while we were not watching (DeletedFinalStateUnknown)
            for h in handlers:
                self._call(h.on_delete, obj)
        for old, new in upserts:
            for h in handlers:
                if old is None:
                    self._call(h.on_add, new)
                elif _rv(old) != _rv(new):
                    self._call(h.on_update, old, new)
        self._synced.set()

    def _watch(self) -> None:
        sel = self.selection
        timeout = random.randint(*self.WATCH_TIMEOUTS)
        stream = self.client.watch(
            sel.resource,
            sel.namespace,
            resource_version=self._resource_version,
            label_selector=sel.label_selector,
            field_selector=sel.field_selector,
            timeout_seconds=timeout,
        )
        self._stream = stream
        if self._stop.is_set():
            return
        for kind, raw in stream:
            if self._stop.is_set():
                return
            rv = str(objects.metadata(raw).get("resourceVersion", ""))
            if kind == "BOOKMARK":
                self._resource_version = rv or self._resource_version
                continue
            self._apply(kind, self._prepare(raw))
            if rv:
                self._resource_version = rv

    def _apply(self, kind: str, obj: JSON) -> None:
        """Apply one ADDED, MODIFIED or DELETED watch event to the store, then hand it out."""
        if kind in ("ADDED", "MODIFIED"):
            with self._handlers_lock:  # store, then hand out: see add_handler
                old = self.store.upsert(obj)
                handlers = list(self._handlers)
            for h in handlers:
                if old is None:
                    self._call(h.on_add, obj)
                else:
                    self._call(h.on_update, old, obj)
        elif kind == "DELETED":
            with self._handlers_lock:
                old = self.store.delete(key_of(obj))
                handlers = list(self._handlers)
            for h in handlers:
                self._call(h.on_delete, old or obj)

    def _prepare(self, obj: JSON) -> JSON:
        obj.setdefault("apiVersion", self.resource.api_version)
        obj.setdefault("kind", self.resource.kind)
        return self.transform(obj) if self.transform else obj

    def _call(self, fn: Callable[..., None], *args: JSON) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("event handler failed", extra={"informer": self.name})


def _rv(obj: JSON) -> str:
    return str(objects.metadata(obj).get("resourceVersion", ""))
