"""Thread-safe object cache with a namespace index and optional label indexes.

Informers write it from their own thread; reconcilers and the webhook read it from many threads.
Reads return the stored dicts themselves: callers must treat them as read-only (deep-copy before
mutating), exactly as with client-go's cache.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from kube import objects
from kube.objects import JSON

JSONList = list[JSON]  # an alias: `list` is shadowed by methods named list in classes
ABSENT = "\x00absent"  # index value for objects without the indexed label


class ObjectKey(NamedTuple):
    """namespace ("" for cluster-scoped objects) and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


KeyList = list[ObjectKey]
StrList = list[str]


def key_of(obj: Mapping[str, Any]) -> ObjectKey:
    meta = objects.metadata(obj)
    return ObjectKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class Store:
    """Objects by key, plus a namespace index and label-value indexes for chosen label keys."""

    def __init__(self, indexed_labels: Iterable[str] = ()) -> None:
        self._lock = threading.RLock()
        self._items: dict[ObjectKey, JSON] = {}
        self._by_namespace: dict[str, set[ObjectKey]] = defaultdict(set)
        self._labels = tuple(indexed_labels)
        self._by_label: dict[str, dict[str, set[ObjectKey]]] = {
            label: defaultdict(set) for label in self._labels
        }

    # -- writes (informer thread) ---------------------------------------------------------------
    def upsert(self, obj: JSON) -> JSON | None:
        """Insert or replace; returns the previous version (None if new)."""
        key = key_of(obj)
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._unindex(key, old)
            self._items[key] = obj
            self._index(key, obj)
            return old

    def delete(self, key: ObjectKey) -> JSON | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, old)
            return old

    def replace(self, objs: Iterable[JSON]) -> tuple[list[tuple[JSON | None, JSON]], JSONList]:
        """Swap in a fresh LIST; returns (upserts as (old, new), objects that vanished)."""
        with self._lock:
            fresh = {key_of(o): o for o in objs}
            vanished = [self._items[k] for k in self._items.keys() - fresh.keys()]
            for obj in vanished:
                self.delete(key_of(obj))
            upserts = [(self.upsert(obj), obj) for obj in fresh.values()]
            return upserts, vanished

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: ObjectKey) -> JSON | None:
        with self._lock:
            return self._items.get(key)

    def list(
        self,
        namespace: str | None = None,
        predicate: Callable[[JSON], bool] | None = None,
    ) -> JSONList:
        with self._lock:
            if namespace is None:
                objs = list(self._items.values())
            else:
                objs = [self._items[k] for k in self._by_namespace.get(namespace, ())]
        return [o for o in objs if predicate is None or predicate(o)]

    def by_label(self, label: str, value: str | None, namespace: str | None = None) -> JSONList:
        """Objects whose `label` equals `value` (None: objects without the label)."""
        wanted = ABSENT if value is None else value
        with self._lock:
            keys = self._by_label[label].get(wanted, set())
            objs = [self._items[k] for k in keys]
        return [o for o in objs if namespace is None or key_of(o).namespace == namespace]

    def keys(self) -> KeyList:
        with self._lock:
            return list(self._items)

    def namespaces(self) -> StrList:
        with self._lock:
            return [ns for ns, keys in self._by_namespace.items() if keys]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # -- indexes ----------------------------------------------------------------------------------
    def _index(self, key: ObjectKey, obj: JSON) -> None:
        self._by_namespace[key.namespace].add(key)
        labels = objects.labels_of(obj)
        for label in self._labels:
            self._by_label[label][labels.get(label, ABSENT)].add(key)

    def _unindex(self, key: ObjectKey, obj: JSON) -> None:
        self._by_namespace[key.namespace].discard(key)
        labels = objects.labels_of(obj)
        for label in self._labels:
            self._by_label[label][labels.get(label, ABSENT)].discard(key)
