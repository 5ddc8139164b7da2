"""The watchdog against a real API server and an OTLP sink: what it reports of the operator's
namespace (pods, restarts, waiting reasons, Events, the pods' own metrics), once per change, and
nothing lost while the upstream is down."""

from __future__ import annotations

import uuid
from typing import Any

from controller.runtime.kube import KubeClient
from controller.runtime.resources import EVENTS, PODS, SECRETS
from controller.telemetry.watchdog import SCOPE, Watchdog, WatchdogSettings
from tests.support.otel import LogSeen, running_sink

JSON = dict[str, Any]
TOKEN = "t_0123456789abcdef01234"
METRICS = """# TYPE otelcol_exporter_send_failed_log_records counter
otelcol_exporter_send_failed_log_records_total{exporter="otlp_http/lumigo"} 7
# TYPE otelcol_exporter_queue_size gauge
otelcol_exporter_queue_size{exporter="otlp_http/lumigo"} 3
# TYPE go_goroutines gauge
go_goroutines 40
# TYPE lumigo_webhook_certificate_expiry_timestamp_seconds gauge
lumigo_webhook_certificate_expiry_timestamp_seconds 1.8e9
"""


def pod(kube: KubeClient, namespace: str, name: str, component: str) -> JSON:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}},
        "spec": {"containers": [{"name": "otelcol", "image": "otelcol:test",
                                 "ports": [{"name": "metrics", "containerPort": 8888}]}]},
    }  # fmt: skip
    return kube.create(PODS, body, namespace)


def set_status(kube: KubeClient, namespace: str, name: str, *, ready: bool, restarts: int,
               waiting: str = "") -> None:  # fmt: skip
    state: JSON = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    container = {
        "name": "otelcol", "ready": ready, "restartCount": restarts, "image": "otelcol:test",
        "imageID": "", "state": state,
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1}} if restarts else {},
    }  # fmt: skip
    status = {
        "phase": "Running",
        "podIP": "10.9.9.9",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [container],
    }
    kube.merge_patch(PODS, name, {"status": status}, namespace, "status")


def watchdog(kube: KubeClient, namespace: str, url: str, scraped: list[str]) -> Watchdog:
    """A watchdog whose token Secret exists."""
    if kube.get_or_none(SECRETS, "cluster-token", namespace) is None:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cluster-token"},
                  "stringData": {"token": f" {TOKEN}\n"}}  # fmt: skip
        kube.create(SECRETS, secret, namespace)
    settings = WatchdogSettings(
        namespace,
        f"{url}/v1/logs",
        "cluster-token",
        interval=1,
        metrics_interval=0,
        resource={"k8s.cluster.name": "it"},
        own_pod="watchdog-self",
    )

    def fetch(target: str) -> str:
        scraped.append(target)
        return METRICS

    return Watchdog(kube, settings, "9.9.9", fetch=fetch)


def pod_records(logs: list[LogSeen], name: str) -> list[LogSeen]:
    return [r for r in logs if r.body.get("kind") == "pod" and r.body.get("pod") == name]


def test_a_crash_looping_pod_and_its_events_are_reported_once(
    kube: KubeClient, namespace: str
) -> None:
    pod(kube, namespace, "proxy", "telemetry-proxy")
    pod(kube, namespace, "watchdog-self", "watchdog")
    set_status(kube, namespace, "proxy", ready=False, restarts=4, waiting="CrashLoopBackOff")
    event = {
        "apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "BackOff",
        "message": "Back-off restarting failed container otelcol", "count": 4,
        "metadata": {"name": f"proxy.{uuid.uuid4().hex[:8]}"},
        "involvedObject": {"kind": "Pod", "name": "proxy", "namespace": namespace},
    }  # fmt: skip
    kube.create(EVENTS, event, namespace)
    scraped: list[str] = []
    with running_sink() as sink:
        dog = watchdog(kube, namespace, sink.url, scraped)
        dog.check()
        assert dog.flush()
        logs = sink.logs()
        (proxy,) = pod_records(logs, "proxy")
        assert not pod_records(logs, "watchdog-self"), "the watchdog leaves itself out"
        assert (proxy.scope, proxy.authorization) == (SCOPE, f"LumigoToken {TOKEN}")
        assert proxy.resource == {"k8s.cluster.name": "it"}
        body = proxy.body
        assert (body["component"], body["ready"], body["restarts"]) == ("telemetry-proxy", False, 4)
        (container,) = body["containers"]
        assert container["waitingReason"] == "CrashLoopBackOff"
        assert (container["lastTerminationReason"], container["lastExitCode"]) == ("Error", 1)
        assert scraped == ["http://10.9.9.9:8888/metrics"]
        assert body["metrics"] == {
            'otelcol_exporter_send_failed_log_records_total{exporter="otlp_http/lumigo"}': 7.0,
            'otelcol_exporter_queue_size{exporter="otlp_http/lumigo"}': 3.0,
            "lumigo_webhook_certificate_expiry_timestamp_seconds": 1.8e9,
        }
        # (In a cluster with a scheduler, the pods' own Events come too.)
        (backoff,) = [r for r in logs if r.body.get("kind") == "event"
                      and r.body["reason"] == "BackOff"]  # fmt: skip
        assert (backoff.body["object"], backoff.severity) == ("Pod/proxy", "WARN")

        # Next pass: the same Event is not sent again; a recovered pod is INFO, with its restarts.
        set_status(kube, namespace, "proxy", ready=True, restarts=4)
        before = len(sink.logs())
        dog.check()
        assert dog.flush()
        new = sink.logs()[before:]
        assert not [
            r for r in new if r.body.get("kind") == "event" and r.body["reason"] == "BackOff"
        ]
        (recovered,) = pod_records(new, "proxy")
        assert recovered.body["ready"] is True


def test_records_wait_for_an_upstream_outage_to_end(kube: KubeClient, namespace: str) -> None:
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    with running_sink() as sink:
        dog = watchdog(kube, namespace, sink.url, [])
        with sink.outage():
            dog.check()
            assert not dog.flush()
            dog.check()
            assert not dog.flush()
        assert dog.flush()
        assert len(pod_records(sink.logs(), "manager")) == 2, "both passes, in order, after it"
        assert dog.flush(), "nothing left pending"
        assert len(pod_records(sink.logs(), "manager")) == 2


def test_without_the_token_secret_records_wait_for_it(kube: KubeClient, namespace: str) -> None:
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    with running_sink() as sink:
        settings = WatchdogSettings(namespace, f"{sink.url}/v1/logs", "created-later")
        dog = Watchdog(kube, settings, fetch=lambda _url: "")
        dog.check()
        assert not dog.flush()
        assert not sink.logs()
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "created-later"},
                  "stringData": {"token": TOKEN}}  # fmt: skip
        kube.create(SECRETS, secret, namespace)
        assert dog.flush()
        (record,) = pod_records(sink.logs(), "manager")
        assert record.authorization == f"LumigoToken {TOKEN}"


def test_records_the_upstream_refuses_for_good_are_dropped_not_resent(
    kube: KubeClient, namespace: str
) -> None:
    pod(kube, namespace, "manager", "controller-manager")
    set_status(kube, namespace, "manager", ready=True, restarts=0)
    with running_sink() as sink:
        sink.refused_tokens.add(TOKEN)  # 401, as for a wrong token
        dog = watchdog(kube, namespace, sink.url, [])
        dog.check()
        assert not dog.flush()
        assert sink.refused == 1
        assert dog.flush(), "nothing pending: the refused records were dropped"
        assert sink.refused == 1
