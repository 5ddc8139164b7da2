"""The background event recorder against a real API server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller.runtime.events import EventRecorder
from controller.runtime.kube import KubeClient
from controller.runtime.resources import DEPLOYMENTS, EVENTS
from localcluster import wait_until


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
    rec = EventRecorder(kube, resolve_uid_timeout=3.0)
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
    rec = EventRecorder(kube, max_queue=5)  # not started: nothing drains the queue
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
        kube, resolve_uid_timeout=3.0,
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
