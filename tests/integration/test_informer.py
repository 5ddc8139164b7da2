"""Informers on a real API server: no lost events, survival of restarts and of 410 Gone."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pykube
import pytest

from controller.runtime.informer import FuncHandler, Informer, Selection, metadata_projection
from controller.runtime.kube import KubeClient
from controller.runtime.store import Store
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import CONFIGMAPS
from tests.support.tcpproxy import TCPProxy

JSON = dict[str, Any]


class Recorder:
    """Collects what handlers saw, per object name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: dict[str, list[str]] = defaultdict(list)
        self.last: dict[str, JSON] = {}

    def handler(self) -> FuncHandler:
        return FuncHandler(
            add=lambda o: self._record("add", o),
            update=lambda old, new: self._record("update", new),
            delete=lambda o: self._record("delete", o),
        )

    def _record(self, what: str, obj: JSON) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            self.events[name].append(what)
            self.last[name] = obj

    def saw(self, name: str, what: str) -> bool:
        with self.lock:
            return what in self.events.get(name, [])


@pytest.fixture
def informers() -> Iterator[list[Informer]]:
    started: list[Informer] = []
    yield started
    for informer in started:
        informer.stop()


def start(informers: list[Informer], informer: Informer) -> Informer:
    informers.append(informer)
    informer.start()
    assert informer.wait_for_sync(30), informer.last_error
    return informer


def cm(name: str, **labels: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"v": "0"},
    }


def test_sees_every_create_update_delete(
    kube: KubeClient, namespace: str, informers: list[Informer]
) -> None:
    kube.create(CONFIGMAPS, cm("before"), namespace)
    recorder = Recorder()
    informer = Informer(kube, Selection(CONFIGMAPS, namespace=namespace), indexed_labels=("tier",))
    informer.add_handler(recorder.handler())
    start(informers, informer)
    assert recorder.saw("before", "add")

    names = [f"cm-{i:03d}" for i in range(150)]
    for i, name in enumerate(names):
        kube.create(CONFIGMAPS, cm(name, tier="odd" if i % 2 else "even"), namespace)
    for name in names[:50]:
        kube.merge_patch(CONFIGMAPS, name, {"data": {"v": "1"}}, namespace)
    for name in names[100:]:
        kube.delete(CONFIGMAPS, name, namespace)

    def ours(obj: JSON) -> bool:  # kube-controller-manager adds kube-root-ca.crt in full mode
        return obj["metadata"]["name"] != "kube-root-ca.crt"

    def converged() -> bool:
        return len(informer.store.list(namespace, ours)) == 101  # 100 left + "before"

    wait_until(converged, 30, "the store to hold exactly the live objects")
    wait_until(lambda: all(recorder.saw(n, "delete") for n in names[100:]), 30, "deletes")
    for name in names:
        assert recorder.saw(name, "add"), name
    for name in names[:50]:
        assert recorder.saw(name, "update"), name
        assert informer.get(namespace, name)["data"] == {"v": "1"}  # type: ignore[index]
    assert {o["metadata"]["name"] for o in informer.store.by_label("tier", "even")} == {
        n for i, n in enumerate(names[:100]) if i % 2 == 0
    }
    unlabelled = [o["metadata"]["name"] for o in informer.store.by_label("tier", None) if ours(o)]
    assert unlabelled == ["before"]
    assert informer.healthy()


def test_projection_keeps_only_metadata(
    kube: KubeClient, namespace: str, informers: list[Informer]
) -> None:
    kube.create(CONFIGMAPS, cm("big", app="x"), namespace)
    informer = start(
        informers,
        Informer(kube, Selection(CONFIGMAPS, namespace=namespace), transform=metadata_projection()),
    )
    cached = informer.get(namespace, "big")
    assert cached is not None
    assert "data" not in cached
    assert cached["metadata"]["labels"] == {"app": "x"}
    assert cached["kind"] == "ConfigMap"
    assert "managedFields" not in cached["metadata"]


def test_survives_an_api_server_restart(
    disposable_cluster: LocalCluster,
    disposable_kube: KubeClient,
    disposable_namespace: str,
    informers: list[Informer],
) -> None:
    cluster, kube, namespace = disposable_cluster, disposable_kube, disposable_namespace
    recorder = Recorder()
    informer = Informer(kube, Selection(CONFIGMAPS, namespace=namespace))
    informer.add_handler(recorder.handler())
    start(informers, informer)
    kube.create(CONFIGMAPS, cm("one"), namespace)
    wait_until(lambda: recorder.saw("one", "add"), 30, "the first add")

    cluster.restart_apiserver()
    kube.create(CONFIGMAPS, cm("two"), namespace)
    kube.delete(CONFIGMAPS, "one", namespace)
    wait_until(lambda: recorder.saw("two", "add"), 60, "an add after the restart")
    wait_until(lambda: recorder.saw("one", "delete"), 60, "a delete after the restart")
    assert informer.healthy()


def test_relists_after_410_and_emits_deletes_that_happened_while_away(
    disposable_cluster: LocalCluster,
    disposable_kube: KubeClient,
    disposable_namespace: str,
    informers: list[Informer],
) -> None:
    cluster, kube, namespace = disposable_cluster, disposable_kube, disposable_namespace
    proxy = TCPProxy("127.0.0.1", cluster.apiserver_port)
    try:
        config = pykube.KubeConfig.from_file(str(cluster.kubeconfig))
        config.cluster["server"] = proxy.url
        via_proxy = KubeClient(config, retry_attempts=1)
        for name in ("stays", "goes", "changes"):
            kube.create(CONFIGMAPS, cm(name), namespace)
        recorder = Recorder()
        informer = Informer(via_proxy, Selection(CONFIGMAPS, namespace=namespace))
        informer.add_handler(recorder.handler())
        start(informers, informer)
        relists = informer.relists
        stale_rv = informer.resource_version

        proxy.pause()  # the informer is cut off; the test keeps talking to the API server
        kube.delete(CONFIGMAPS, "goes", namespace)
        kube.merge_patch(CONFIGMAPS, "changes", {"data": {"v": "2"}}, namespace)
        kube.create(CONFIGMAPS, cm("new"), namespace)
        cluster.compact_etcd()  # history before now is gone: resuming from stale_rv gets 410
        cluster.restart_apiserver()  # and the watch cache no longer remembers it either
        proxy.resume()

        wait_until(lambda: informer.relists > relists, 90, "a relist after 410 Gone")
        wait_until(lambda: recorder.saw("goes", "delete"), 30, "the synthetic delete")
        assert recorder.saw("new", "add")
        assert recorder.saw("changes", "update")
        assert informer.get(namespace, "changes")["data"] == {"v": "2"}  # type: ignore[index]
        assert informer.get(namespace, "goes") is None
        assert informer.resource_version != stale_rv
        assert informer.healthy()
    finally:
        proxy.close()


def test_a_dead_informer_thread_is_reported_unhealthy(kube: KubeClient) -> None:
    class Broken(Informer):
        def _run(self) -> None:
            return  # the thread ends although nobody stopped it: a fatal bug

    broken = Broken(kube, Selection(CONFIGMAPS, namespace="default"))
    assert not broken.healthy()  # never started
    broken.start()
    wait_until(lambda: not broken.healthy(), 10, "the dead thread to be noticed")


class RacingStore(Store):
    """Lets another thread register a handler just before the watch event for `name` is stored.

    That is the window a handler added at run time can fall into; the thread is given a bounded
    wait (it blocks for as long as the informer keeps "store, then hand out" atomic).
    """

    def __init__(self, name: str, register: Callable[[], None]) -> None:
        super().__init__()
        self.name, self.register = name, register

    def upsert(self, obj: JSON) -> JSON | None:
        if obj["metadata"]["name"] == self.name and self.name:
            self.name = ""
            racer = threading.Thread(target=self.register)
            racer.start()
            racer.join(2)
        return super().upsert(obj)


def test_a_handler_added_while_an_event_is_applied_hears_about_that_object(
    kube: KubeClient, namespace: str, informers: list[Informer]
) -> None:
    late = Recorder()
    informer = Informer(kube, Selection(CONFIGMAPS, namespace=namespace))
    informer.store = RacingStore("late", lambda: informer.add_handler(late.handler()))
    start(informers, informer)
    kube.create(CONFIGMAPS, cm("late"), namespace)
    wait_until(lambda: informer.get(namespace, "late") is not None, 30, "the watch event")
    wait_until(lambda: late.saw("late", "add"), 10, "the late handler to hear about it")
