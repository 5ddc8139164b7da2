"""The background event recorder against a real API server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pykube
import pytest

from controller.lumigo.resources import WORKLOADS_BY_KIND
from controller.runtime.events import EventRecorder
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, EVENTS


def deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
            },
        },
    }


@pytest.fixture
def recorder(kube: KubeClient) -> Iterator[EventRecorder]:
    rec = EventRecorder(kube, resources=WORKLOADS_BY_KIND, resolve_uid_timeout=3.0)
    rec.start()
    yield rec
    rec.stop()


def events_for(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """Events about `name` from our components (kube-controller-manager adds its own)."""
    items, _ = kube.list(EVENTS, namespace, field_selector=f"involvedObject.name={name}")
    return [e for e in items if e.get("reason", "").startswith("Lumigo")]


def test_events_are_posted_and_aggregated(
    kube: KubeClient, namespace: str, recorder: EventRecorder
) -> None:
    dep = kube.create(DEPLOYMENTS, deployment("web"), namespace)
    for _ in range(3):
        recorder.event(
            dep, "Normal", "LumigoAddedInstrumentation", "Adding Lumigo instrumentation (x)", "c/x"
        )
    assert recorder.flush(10)
    (event,) = events_for(kube, namespace, "web")
    assert event["count"] == 3
    assert event["reason"] == "LumigoAddedInstrumentation"
    assert event["type"] == "Normal"
    assert event["source"] == {"component": "c/x"}
    assert event["involvedObject"]["uid"] == dep["metadata"]["uid"]
    assert event["involvedObject"]["kind"] == "Deployment"


def test_an_object_being_created_gets_its_uid_filled_in(
    kube: KubeClient, namespace: str, recorder: EventRecorder
) -> None:
    pending = deployment("later")
    pending["metadata"]["namespace"] = namespace  # as in an AdmissionReview for a CREATE
    recorder.event(pending, "Normal", "LumigoAddedInstrumentation", "added", "c/webhook")
    created = kube.create(DEPLOYMENTS, deployment("later"), namespace)
    assert recorder.flush(10)
    (event,) = events_for(kube, namespace, "later")
    assert event["involvedObject"]["uid"] == created["metadata"]["uid"]


def test_events_about_objects_that_never_existed_are_dropped(
    kube: KubeClient, namespace: str, recorder: EventRecorder
) -> None:
    ghost = deployment("ghost")
    ghost["metadata"]["namespace"] = namespace
    recorder.event(ghost, "Warning", "LumigoCannotAddInstrumentation", "nope", "c/webhook")
    assert recorder.flush(10)
    assert events_for(kube, namespace, "ghost") == []


def test_recording_never_blocks_even_when_the_queue_is_full(kube: KubeClient) -> None:
    rec = EventRecorder(
        kube, resources=WORKLOADS_BY_KIND, max_queue=5
    )  # not started: nothing drains the queue
    done = threading.Event()

    def spam() -> None:
        for i in range(50):
            rec.event(deployment(f"d{i}"), "Normal", "R", "m", "c")
        done.set()

    threading.Thread(target=spam, daemon=True).start()
    wait_until(done.is_set, 5, "recording to return")
    assert rec.dropped == 45


def test_uids_come_from_the_cache_when_it_has_the_object(kube: KubeClient, namespace: str) -> None:
    cached = {"metadata": {"uid": "from-the-cache", "resourceVersion": "42"}}
    rec = EventRecorder(
        kube, resources=WORKLOADS_BY_KIND, resolve_uid_timeout=3.0,
        lookup=lambda kind, ns, name: cached if (kind, name) == ("Deployment", "cached") else None,
    )  # fmt: skip
    rec.start()
    try:
        pending = deployment("cached")
        pending["metadata"]["namespace"] = namespace
        rec.event(pending, "Normal", "LumigoAddedInstrumentation", "added", "c/webhook")
        assert rec.flush(10)
    finally:
        rec.stop()
    (event,) = events_for(kube, namespace, "cached")  # no such Deployment: no GET could find it
    assert event["involvedObject"]["uid"] == "from-the-cache"


def test_an_event_waiting_for_its_object_does_not_hold_up_the_others(
    kube: KubeClient, namespace: str
) -> None:
    rec = EventRecorder(
        kube, resources=WORKLOADS_BY_KIND, resolve_uid_timeout=120.0
    )  # far longer than the waits below
    rec.start()
    try:
        pending = deployment("being-created")
        pending["metadata"]["namespace"] = namespace  # an AdmissionReview for a CREATE
        rec.event(pending, "Normal", "LumigoAddedInstrumentation", "added", "c/webhook")
        existing = kube.create(DEPLOYMENTS, deployment("existing"), namespace)
        rec.event(existing, "Normal", "LumigoAddedInstrumentation", "added", "c/controller")
        # Without the fix the poster waits for "being-created" for the whole two minutes.
        wait_until(lambda: events_for(kube, namespace, "existing"), 30, "the other event")
        assert events_for(kube, namespace, "being-created") == []
        created = kube.create(DEPLOYMENTS, deployment("being-created"), namespace)
        wait_until(lambda: events_for(kube, namespace, "being-created"), 30, "the set-aside one")
        (event,) = events_for(kube, namespace, "being-created")
        assert event["involvedObject"]["uid"] == created["metadata"]["uid"]
    finally:
        rec.stop()


class UnansweringServer:
    """A real endpoint that accepts connections and never answers (a hung API server)."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.url = f"https://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.connections.append(self._listener.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self._listener.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def unanswering_server() -> Iterator[UnansweringServer]:
    server = UnansweringServer()
    yield server
    server.close()


def test_stop_returns_even_with_a_full_queue_and_a_hung_api_server(
    cluster: LocalCluster, unanswering_server: UnansweringServer
) -> None:
    config = pykube.KubeConfig.from_file(str(cluster.kubeconfig))
    config.cluster["server"] = unanswering_server.url
    rec = EventRecorder(
        KubeClient(config, timeout=60, retry_attempts=1), resources=WORKLOADS_BY_KIND, max_queue=2
    )
    rec.start()
    involved = {"kind": "Deployment", "name": "web", "namespace": "default", "uid": "u-1"}
    rec.event({"metadata": involved}, "Normal", "R", "first", "c")
    wait_until(lambda: unanswering_server.connections, 10, "the poster to hang in its POST")
    for i in range(10):  # until one is dropped: the queue is full
        rec.event({"metadata": involved}, "Normal", "R", f"m{i}", "c")
    assert rec.dropped > 0
    stopping = threading.Thread(target=rec.stop, kwargs={"timeout": 1.0}, daemon=True)
    stopping.start()
    stopping.join(30)  # without the fix: blocked forever putting the stop marker
    assert not stopping.is_alive()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_poster_thread_is_reported_unhealthy(kube: KubeClient, namespace: str) -> None:
    def fatal_lookup(kind: str, ns: str, name: str) -> None:
        raise SystemExit  # not an Exception: nothing inside the recorder catches it

    rec = EventRecorder(kube, resources=WORKLOADS_BY_KIND, lookup=fatal_lookup)
    rec.healthy()  # not started: nothing to report
    rec.start()
    rec.healthy()
    pending = deployment("being-created")
    pending["metadata"]["namespace"] = namespace
    rec.event(pending, "Normal", "LumigoAddedInstrumentation", "added", "c/webhook")

    def unhealthy() -> bool:
        try:
            rec.healthy()
        except RuntimeError:
            return True
        return False

    wait_until(unhealthy, 10, "the dead poster to be reported")
    rec.stop(timeout=1.0)
