"""What a forged admission review can put into an Event, and how much the recorder keeps waiting
(issue 28 item 2): user-controlled text is sanitized and bounded, messages fit the API's 1024
bytes, and the events waiting for their object are a bounded set, the oldest dropped first."""

from __future__ import annotations

import unicodedata

import pykube
from prometheus_client import REGISTRY

from controller.lumigo.resources import WORKLOADS_BY_KIND
from controller.runtime import events as recorder_events
from controller.runtime.events import EventRecorder, PendingEvent
from controller.runtime.kube import KubeClient
from webhook import injection_events
from webhook.admission_review import parse_review
from webhook.inject_handler import InjectHandler
from webhook.pod_injection import InjectionSettings

from .webhook_samples import RecordingRecorder, StaticLister, review_body, simple_template, workload

DEAD = "https://127.0.0.1:1"  # nothing listens: any API call would fail the test


def dead_client() -> KubeClient:
    return KubeClient(pykube.KubeConfig.from_url(DEAD), timeout=2.0, retry_attempts=1)


def has_controls(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text)


def dropped(why: str) -> float:
    return REGISTRY.get_sample_value("lumigo_events_dropped_total", {"why": why}) or 0.0


def test_a_quoted_value_loses_its_control_characters_and_is_capped() -> None:
    assert injection_events.bounded("web\n\x1b[31mapp\u202e\u2028x\x00") == "web  [31mapp  x "
    assert injection_events.bounded("short") == "short"
    long = injection_events.bounded("é" * 10_000)
    assert len(long) == injection_events.MAX_QUOTED
    assert long.endswith("…")
    assert (
        injection_events.bounded("a" * injection_events.MAX_QUOTED)
        == "a" * injection_events.MAX_QUOTED
    )


def test_messages_bound_every_value_a_user_controls() -> None:
    name = "x" * 100_000 + "\nLumigoRemovedInstrumentation"
    trigger = injection_events.webhook_trigger("ns\r\n", name, cannot_add=True)
    text = injection_events.message(
        "add", trigger, "bad label " + "y" * 100_000 + "\x1b]0;owned\x07"
    )
    assert not has_controls(text)
    assert len(text.encode()) <= recorder_events.MAX_MESSAGE
    assert "LumigoRemovedInstrumentation" not in text


def test_a_forged_review_cannot_write_long_or_multiline_text_into_an_event() -> None:
    recorder = RecordingRecorder()
    handler = InjectHandler(StaticLister({}), recorder, InjectionSettings(operator_version="1"))
    name = "a" * 50_000 + "\nWarning  Forged  a message of the attacker's choice"
    obj = workload("Deployment", simple_template(), name=name)
    # Opted in by label with an invalid token Secret name: a Warning that quotes the label.
    obj["metadata"]["labels"].update(
        {"lumigo.auto-trace": "true", "lumigo.token-secret": "\x1b[2J" + "B" * 50_000}
    )
    handler.handle(parse_review(review_body(obj), "application/json"))
    ((_, type_, _, message, _),) = recorder.events
    assert type_ == "Warning"
    assert not has_controls(message)
    assert len(message.encode()) <= recorder_events.MAX_MESSAGE
    assert "Forged" not in message


def test_the_recorder_keeps_messages_within_the_apis_1024_bytes() -> None:
    rec = EventRecorder(
        dead_client(), resources=WORKLOADS_BY_KIND
    )  # not started: what is recorded stays queued
    obj = {"kind": "Deployment", "metadata": {"name": "web", "namespace": "ns", "uid": "u"}}
    rec.event(obj, "Normal", "R", "é" * 1000, "c")  # 1,000 characters, 2,000 bytes
    queued = rec._queue.get_nowait()
    assert queued is not None
    assert len(queued.message.encode()) <= recorder_events.MAX_MESSAGE
    assert queued.message.endswith("…")


def test_the_events_waiting_for_their_object_are_bounded_the_oldest_dropped() -> None:
    # The cache never has the objects and the wait is long: every event is set aside, and the
    # dead client proves that setting aside makes no API call.
    rec = EventRecorder(
        dead_client(),
        resources=WORKLOADS_BY_KIND,
        resolve_uid_timeout=600.0,
        lookup=lambda k, ns, n: None,
    )
    rec.max_pending = 10
    before = dropped("pending-full")
    for i in range(25):
        ref = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "ns", "name": f"d{i}"}
        rec._post(PendingEvent(ref, "Normal", "R", "m", "c", verify=True))
    waiting = [w.pending.involved["name"] for w in rec._unresolved.values()]
    assert waiting == [f"d{i}" for i in range(15, 25)]
    assert rec.dropped == 15
    assert dropped("pending-full") == before + 15
    # Nothing is due yet: looking again touches nothing (no API call, nothing dropped).
    rec._retry_unresolved()
    assert len(rec._unresolved) == 10
    assert rec.dropped == 15


def test_an_admission_event_with_an_invalid_name_is_never_looked_up() -> None:
    rec = EventRecorder(
        dead_client(), resources=WORKLOADS_BY_KIND, lookup=lambda kind, ns, name: None
    )
    before = dropped("invalid-object")
    for name, namespace in (("../../kube-system/secrets/x", "ns"), ("web", "a/b"), ("", "ns")):
        ref = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": namespace, "name": name}
        rec._post(PendingEvent(ref, "Normal", "R", "m", "c", verify=True))
    assert not rec._unresolved
    assert dropped("invalid-object") == before + 3
