"""The watchdog's records on the wire as the reference's watchdog sends them (issue 29 item 3):
an Event's body, time, event name, severity and scope; the pod reports keep a scope of their own.
Against a real API server (identity, root owners): tests/integration/test_watchdog.py."""

from __future__ import annotations

from typing import Any

from controller.telemetry import watchdog as wd

JSON = dict[str, Any]
ROOT = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "proxy", "uid": "d-1"}


def core_event(**extra: Any) -> JSON:
    """An Event as the kubelet writes it through core/v1."""
    event: JSON = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": "proxy-7c9.17a",
            "namespace": "lumigo-system",
            "uid": "e-1",
            "creationTimestamp": "2026-11-27T10:00:01Z",
        },
        "involvedObject": {
            "kind": "Pod",
            "namespace": "lumigo-system",
            "name": "proxy-7c9",
            "uid": "p-1",
            "apiVersion": "v1",
            "resourceVersion": "4711",
            "fieldPath": "spec.containers{otelcol}",
        },
        "reason": "BackOff",
        "message": "Back-off restarting failed container otelcol",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": "2026-11-27T10:00:01Z",
        "lastTimestamp": "2026-11-27T10:05:09Z",
        "count": 6,
        "type": "Warning",
        "eventTime": None,
    }
    event.update(extra)
    return event


def test_an_event_body_has_the_reference_shape_and_formats() -> None:
    body = wd.event_body(core_event(), ROOT)
    assert body == {
        "metadata": {"uid": "e-1", "name": "proxy-7c9.17a", "namespace": "lumigo-system"},
        "lastTimestamp": "2026-11-27T10:05:09Z",
        "eventTime": "2026-11-27T10:00:01.000000Z",  # the first time, to the microsecond
        "creationTimestamp": "2026-11-27T10:00:01Z",
        "type": "Warning",
        "involvedObject": {
            "kind": "Pod",
            "namespace": "lumigo-system",
            "name": "proxy-7c9",
            "uid": "p-1",
            "apiVersion": "v1",
            "resourceVersion": "4711",
            "fieldPath": "spec.containers{otelcol}",
        },
        "rootOwnerReference": ROOT,
        "reason": "BackOff",
        "message": "Back-off restarting failed container otelcol",
        "source": {"component": "kubelet", "host": "node-1"},
        "count": 6,
    }


def test_an_events_k8s_io_event_gets_its_own_times_not_the_zero_time() -> None:
    """Written through events.k8s.io (the scheduler's): no first/last timestamp, no source."""
    event = core_event(
        firstTimestamp=None,
        lastTimestamp=None,
        source={},
        count=None,
        eventTime="2026-11-27T10:00:00.123456Z",
        series={"count": 3, "lastObservedTime": "2026-11-27T10:02:00.000001Z"},
        reportingComponent="default-scheduler",
    )
    body = wd.event_body(event, ROOT)
    assert (body["eventTime"], body["lastTimestamp"]) == (
        "2026-11-27T10:00:00.123456Z",
        "2026-11-27T10:02:00Z",
    )
    assert body["source"] == {"component": "default-scheduler", "host": ""}
    assert body["count"] == 3
    bare = wd.event_body({"metadata": {}}, ROOT)
    assert (bare["lastTimestamp"], bare["eventTime"]) == (
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00.000000Z",
    )
    assert bare["involvedObject"]["uid"] == ""


def test_an_event_record_is_dated_named_and_graded_as_the_reference_does() -> None:
    warning = wd.event_record(core_event(), ROOT)
    assert warning["scope"] == wd.EVENTS_SCOPE == "lumigo-operator.k8s-events"
    assert (warning["severity_text"], warning["severity_number"]) == ("Warning", 17)  # ERROR
    assert warning["event_name"] == "proxy-7c9.17a"
    # eventTime, else lastTimestamp, else firstTimestamp, else the creation
    assert warning["time_ns"] == 1_795_773_909 * 10**9
    assert warning["attributes"] == {}
    normal = wd.event_record(core_event(type="Normal", eventTime="2026-11-27T10:00:00.5Z"), ROOT)
    assert (normal["severity_text"], normal["severity_number"]) == ("Normal", 9)  # INFO
    assert normal["time_ns"] == 1_795_773_600 * 10**9 + 500_000_000
    other = wd.event_record(core_event(type="Odd"), ROOT)
    assert (other["severity_text"], other["severity_number"]) == ("Odd", 0)


def test_events_and_pod_reports_go_in_one_request_under_their_own_scopes() -> None:
    event = wd.event_record(core_event(), ROOT)
    pod = {"scope": wd.SCOPE, "time_ns": 5, "severity_text": "INFO", "severity_number": 9,
           "body": {"kind": "pod"}, "attributes": {"lumigo.watchdog.kind": "pod"}}  # fmt: skip
    request = wd.otlp_logs([event, pod, event], {"service.name": wd.SERVICE_NAME}, "1.2.3")
    (resource_logs,) = request["resourceLogs"]
    assert resource_logs["resource"]["attributes"] == [
        {"key": "service.name", "value": {"stringValue": "lumigo-kubernetes-operator-watchdog"}}
    ]
    events, pods = resource_logs["scopeLogs"]
    assert events["scope"] == {"name": "lumigo-operator.k8s-events"}
    assert pods["scope"] == {"name": "lumigo-operator.watchdog", "version": "1.2.3"}
    assert [len(events["logRecords"]), len(pods["logRecords"])] == [2, 1]
    record = events["logRecords"][0]
    assert (record["eventName"], record["severityNumber"], record["severityText"]) == (
        "proxy-7c9.17a",
        17,
        "Warning",
    )
    assert record["timeUnixNano"] == str(1_795_773_909 * 10**9)
    assert int(record["observedTimeUnixNano"]) > 0
    assert "eventName" not in pods["logRecords"][0]
