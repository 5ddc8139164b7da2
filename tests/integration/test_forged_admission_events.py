"""Forged admission reviews write no Events (issue 28 item 2), against a real API server.

Anyone who reaches the webhook port can post an AdmissionReview naming any namespace, object and
uid. The injector handler records its events through `AdmissionEvents`, as the operator wires it;
the recorder then posts only about an object the API has as the review names it: with that uid,
or, for a CREATE (no uid yet), created no earlier than the review.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from controller.lumigo.resources import WORKLOADS_BY_KIND
from controller.runtime.events import AdmissionEvents, EventRecorder
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, EVENTS
from tests.support import reviews
from webhook.admission_review import parse_review
from webhook.inject_handler import InjectHandler
from webhook.pod_injection import InjectionSettings

JSON = dict[str, Any]


class NoLumigo:
    """No namespace has a Lumigo: workloads are injected when labelled lumigo.auto-trace=true."""

    def list(self, namespace: str) -> list[JSON]:
        return []


def opted_in(name: str) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name, "lumigo.auto-trace": "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
            },
        },
    }


def as_reviewed(obj: JSON, namespace: str, **metadata: str) -> JSON:
    """`obj` as an AdmissionReview carries it (its namespace set; e.g. a uid)."""
    meta = {**obj["metadata"], "namespace": namespace, **metadata}
    return {**obj, "metadata": meta}


@pytest.fixture
def recorder(kube: KubeClient) -> Iterator[EventRecorder]:
    rec = EventRecorder(kube, resources=WORKLOADS_BY_KIND, resolve_uid_timeout=2.0)
    rec.start()
    yield rec
    rec.stop()


@pytest.fixture
def handler(recorder: EventRecorder) -> InjectHandler:
    settings = InjectionSettings(operator_version="9.9.9")
    return InjectHandler(NoLumigo(), AdmissionEvents(recorder), settings)


@pytest.fixture
def other_namespace(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    name = f"{namespace[:55]}-other"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def admit(handler: InjectHandler, obj: JSON, operation: str) -> None:
    review = reviews.review(obj, operation=operation)
    if operation == "UPDATE":
        review["request"]["oldObject"] = obj
    response = handler.handle(parse_review(reviews.body_of(review), "application/json"))
    assert response.allowed


def our_events(kube: KubeClient, namespace: str) -> list[JSON]:
    items, _ = kube.list(EVENTS, namespace)
    return [e for e in items if e.get("reason", "").startswith("Lumigo")]


def test_forged_reviews_naming_objects_that_are_not_as_named_post_no_event(
    kube: KubeClient,
    handler: InjectHandler,
    recorder: EventRecorder,
    namespace: str,
    other_namespace: str,
) -> None:
    real = kube.create(DEPLOYMENTS, opted_in("real"), namespace)
    elsewhere = kube.create(DEPLOYMENTS, opted_in("elsewhere"), other_namespace)
    forged = [
        # No such object, whatever the uid.
        as_reviewed(opted_in("ghost"), namespace, uid=str(uuid.uuid4())),
        # A real object, another uid (a deleted predecessor's, or made up).
        as_reviewed(opted_in("real"), namespace, uid=str(uuid.uuid4())),
        # The uid of an object of another namespace, moved into this one.
        as_reviewed(opted_in("elsewhere"), namespace, uid=elsewhere["metadata"]["uid"]),
    ]
    for obj in forged:
        admit(handler, obj, "UPDATE")
    admit(handler, as_reviewed(real, namespace), "UPDATE")  # the legitimate one
    assert recorder.flush(30)
    (event,) = our_events(kube, namespace)
    assert event["reason"] == "LumigoAddedInstrumentation"
    assert event["involvedObject"]["name"] == "real"
    assert event["involvedObject"]["uid"] == real["metadata"]["uid"]
    assert our_events(kube, other_namespace) == []


def test_a_forged_create_of_an_existing_object_posts_no_event(
    kube: KubeClient, handler: InjectHandler, recorder: EventRecorder, namespace: str
) -> None:
    recorder.created_slack = 1.0  # the API server runs on this machine: one clock
    existing = kube.create(DEPLOYMENTS, opted_in("existing"), namespace)
    created = dt.datetime.fromisoformat(existing["metadata"]["creationTimestamp"]).timestamp()
    # The review comes after the object was created (by more than creationTimestamp's second).
    wait_until(lambda: time.time() > created + 2.5, 10, "the object to be older than a second")
    admit(handler, as_reviewed(opted_in("existing"), namespace), "CREATE")  # forged: no uid
    admit(handler, as_reviewed(opted_in("new"), namespace), "CREATE")  # legitimate ...
    new = kube.create(DEPLOYMENTS, opted_in("new"), namespace)  # ... as the API server goes on
    assert recorder.flush(30)
    (event,) = our_events(kube, namespace)
    assert event["involvedObject"]["name"] == "new"
    assert event["involvedObject"]["uid"] == new["metadata"]["uid"]
