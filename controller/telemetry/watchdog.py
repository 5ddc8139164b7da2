"""The watchdog: the installation's own health, sent upstream so it is visible without cluster
access (`lumigo-operator watchdog`, a Deployment of its own next to the manager).

A process of its own, not a thread of the manager: a manager that crash-loops, or a telemetry
proxy that cannot export, must still be reported. Every `interval` it reads, in its namespace
only (the operator's):

- each pod (the manager, the telemetry proxy, the cluster agent): phase, readiness, each
  container's restarts, current waiting reason (CrashLoopBackOff, ImagePullBackOff…) and last
  termination (reason, exit code) — a pod not ready or restarted since the last pass is a WARN;
- every `metrics_interval`, each pod's Prometheus endpoint (its container port named `metrics`):
  a selection of the operator's and the collectors' own series (work-queue depth, reconcile and
  webhook errors, certificate expiry, export successes/failures and queue size, memory);
- the namespace's Kubernetes Events not reported before (a BackOff, a FailedScheduling…).

It sends them as OTLP/HTTP log records (JSON encoding, scope `lumigo-operator.watchdog`) to the
logs endpoint, directly (not through the proxy it watches), with the cluster-collection token,
read from its Secret at each export (so creating the Secret later turns reporting on). A failed
export, or no token yet, keeps the records (bounded) for the next pass.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.runtime.kube import KubeClient
from controller.runtime.resources import EVENTS, PODS, SECRETS, ApiError

log = logging.getLogger("lumigo.watchdog")

JSON = dict[str, Any]

SCOPE = "lumigo-operator.watchdog"
# Series of the operator and of the collectors worth reporting (counters and gauges only).
METRIC_PREFIXES = (
    "lumigo_",
    "workqueue_depth",
    "controller_runtime_reconcile_errors_total",
    "controller_runtime_webhook_requests_total",
    "leader_election_master_status",
    "process_resident_memory_bytes",
    "otelcol_exporter_",
    "otelcol_receiver_accepted",
    "otelcol_receiver_refused",
    "otelcol_process_memory_rss",
    "otelcol_process_uptime",
)
MAX_SERIES_PER_POD = 300
MAX_PENDING = 2000  # records kept while the upstream is unreachable
SEVERITY = {"INFO": 9, "WARN": 13}


@dataclass(frozen=True)
class WatchdogSettings:
    namespace: str
    logs_endpoint: str  # full URL, …/v1/logs
    token_secret: str  # in `namespace`; read at each export, so a Secret created later counts
    token_key: str = "token"
    interval: float = 15.0
    metrics_interval: float = 15.0
    resource: dict[str, str] = field(default_factory=dict)  # cluster name, version…
    own_pod: str = ""  # the watchdog's own pod, left out


def container_reports(pod: JSON) -> list[JSON]:
    """Each container's readiness, restarts, waiting reason and last termination."""
    out: list[JSON] = []
    status = pod.get("status") or {}
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = c.get("state") or {}
        last = (c.get("lastState") or {}).get("terminated") or {}
        report: JSON = {
            "name": c.get("name", ""),
            "ready": bool(c.get("ready")),
            "restartCount": int(c.get("restartCount") or 0),
            "state": next(iter(state), "unknown"),
        }
        if reason := (state.get("waiting") or {}).get("reason"):
            report["waitingReason"] = reason
        if last:
            report["lastTerminationReason"] = last.get("reason", "")
            report["lastExitCode"] = int(last.get("exitCode") or 0)
        out.append(report)
    return out


def pod_report(pod: JSON) -> JSON:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return {
        "kind": "pod",
        "component": labels.get("app.kubernetes.io/component") or labels.get("control-plane", ""),
        "pod": meta.get("name", ""),
        "node": (pod.get("spec") or {}).get("nodeName", ""),
        "phase": status.get("phase", ""),
        "ready": conditions.get("Ready") == "True",
        "restarts": sum(c["restartCount"] for c in container_reports(pod)),
        "containers": container_reports(pod),
    }


def select_metrics(text: str) -> dict[str, float]:
    """`name{label="v",…}` -> value for the series worth reporting (at most MAX_SERIES_PER_POD)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(METRIC_PREFIXES) or sample.name.endswith(
                ("_bucket", "_created")
            ):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
            if len(out) >= MAX_SERIES_PER_POD:
                return out
    return out


def event_report(event: JSON) -> JSON:
    involved = event.get("involvedObject") or {}
    return {
        "kind": "event",
        "type": event.get("type", ""),
        "reason": event.get("reason", ""),
        "message": event.get("message", ""),
        "count": int(event.get("count") or 1),
        "object": f"{involved.get('kind', '')}/{involved.get('name', '')}",
        "lastTimestamp": event.get("lastTimestamp") or event.get("eventTime") or "",
    }


def any_value(value: Any) -> JSON:
    """A Python value as an OTLP JSON AnyValue."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": key_values(value)}}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def key_values(mapping: dict[str, Any]) -> list[JSON]:
    return [{"key": k, "value": any_value(v)} for k, v in mapping.items()]


def otlp_logs(records: Iterable[JSON], resource: dict[str, str], version: str) -> JSON:
    """An OTLP/HTTP JSON ExportLogsServiceRequest of `records` (each: body, severity, time)."""
    log_records = [
        {
            "timeUnixNano": str(r["time_ns"]),
            "severityNumber": SEVERITY[r["severity"]],
            "severityText": r["severity"],
            "body": any_value(r["body"]),
            "attributes": key_values({"lumigo.watchdog.kind": r["body"]["kind"]}),
        }
        for r in records
    ]
    return {
        "resourceLogs": [
            {
                "resource": {"attributes": key_values(resource)},
                "scopeLogs": [{"scope": {"name": SCOPE, "version": version},
                               "logRecords": log_records}],
            }
        ]
    }  # fmt: skip


SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def http_get(url: str) -> str:
    """A component's `/metrics` (`url` is its http:// address). The operator's processes serve
    it over HTTPS to tokens allowed to `get /metrics` (TokenReview + SubjectAccessReview), with a
    certificate made in memory, so it is tried first with this pod's ServiceAccount token and
    without verifying the certificate (the address is a pod IP from the API); the collectors
    serve plain HTTP, the fallback."""
    try:
        token = SERVICE_ACCOUNT_TOKEN.read_text().strip()
    except OSError:
        token = ""
    secure = urllib.request.Request(
        "https://" + url.removeprefix("http://"),
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    try:
        return _read(secure, unverified)
    except OSError as tls_error:
        try:
            return _read(urllib.request.Request(url), None)  # noqa: S310 - http:// pod IPs
        except OSError:
            raise tls_error from None


def _read(request: urllib.request.Request, context: ssl.SSLContext | None) -> str:
    with urllib.request.urlopen(request, timeout=3, context=context) as response:  # noqa: S310
        return str(response.read().decode("utf-8", "replace"))


@dataclass(eq=False)
class Watchdog:
    """One `check()` per interval; `run()` loops until `stop` is set."""

    client: KubeClient
    settings: WatchdogSettings
    version: str = "dev"
    fetch: Callable[[str], str] = http_get
    _restarts: dict[str, int] = field(default_factory=dict, init=False)
    _events_seen: dict[str, int] = field(default_factory=dict, init=False)
    _pending: deque[JSON] = field(default_factory=lambda: deque(maxlen=MAX_PENDING), init=False)
    _last_metrics: float = field(default=float("-inf"), init=False)
    _no_token_logged: bool = field(default=False, init=False)

    def check(self, now: float | None = None) -> list[JSON]:
        """Read the namespace once; the records to send (also queued for `flush`)."""
        now = time.monotonic() if now is None else now
        scrape = now - self._last_metrics >= self.settings.metrics_interval
        if scrape:
            self._last_metrics = now
        pods, _ = self.client.list(PODS, self.settings.namespace)
        records = [self._pod_record(p, scrape) for p in pods
                   if p["metadata"]["name"] != self.settings.own_pod]  # fmt: skip
        events, _ = self.client.list(EVENTS, self.settings.namespace)
        records += [self._event_record(e) for e in events if self._new_event(e)]
        # Forget what is gone (Events expire after an hour, pods are replaced).
        current = {str(e["metadata"].get("uid", "")) for e in events}
        self._events_seen = {u: n for u, n in self._events_seen.items() if u in current}
        alive = {str(p["metadata"].get("uid", "")) for p in pods}
        self._restarts = {u: n for u, n in self._restarts.items() if u in alive}
        self._pending.extend(records)
        return records

    def flush(self) -> bool:
        """Send what is pending; on failure keep it (bounded) for the next pass."""
        if not self._pending:
            return True
        token = self._token()
        if not token:
            return False
        records = list(self._pending)
        body = json.dumps(otlp_logs(records, self.settings.resource, self.version)).encode()
        request = urllib.request.Request(  # noqa: S310 - the configured upstream
            self.settings.logs_endpoint,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"LumigoToken {token}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                response.read()
        except urllib.error.HTTPError as err:
            if 400 <= err.code < 500 and err.code not in (408, 429):
                # Refused for good (e.g. a wrong token): sending them again cannot succeed.
                log.warning("watchdog records refused by the upstream; dropped",
                            extra={"status": err.code, "dropped": len(records)})  # fmt: skip
                self._drop(len(records))
            else:
                log.warning("watchdog export failed; records kept for the next pass",
                            extra={"status": err.code, "pending": len(records)})  # fmt: skip
            return False
        except OSError as err:  # URLError too: unreachable, timed out
            log.warning("watchdog export failed; records kept for the next pass",
                        extra={"error": str(err), "pending": len(records)})  # fmt: skip
            return False
        self._drop(len(records))
        return True

    def _drop(self, count: int) -> None:
        for _ in range(count):
            self._pending.popleft()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.check()
                self.flush()
            except ApiError as err:
                log.warning("watchdog could not read the namespace", extra={"error": str(err)})
            except Exception:  # a watchdog that crash-loops reports nothing: log, go on
                log.exception("watchdog pass failed")
            stop.wait(self.settings.interval)

    # -- helpers -------------------------------------------------------------------------------
    def _token(self) -> str:
        """The token of the Secret ("" while it is missing: records wait, bounded)."""
        s = self.settings
        secret = self.client.get_or_none(SECRETS, s.token_secret, s.namespace)
        value = ((secret or {}).get("data") or {}).get(s.token_key, "")
        token = base64.b64decode(value).decode("utf-8", "replace").strip() if value else ""
        if not token and not self._no_token_logged:
            where = {"secret": f"{s.namespace}/{s.token_secret}", "key": s.token_key}
            log.warning("no cluster-collection token yet: the watchdog keeps its records",
                        extra=where)  # fmt: skip
        self._no_token_logged = not token
        return token

    def _pod_record(self, pod: JSON, scrape: bool) -> JSON:
        report = pod_report(pod)
        uid = str(pod["metadata"].get("uid", ""))
        restarted = report["restarts"] > self._restarts.get(uid, 0)
        self._restarts[uid] = report["restarts"]
        if scrape:
            report["metrics"] = self._scrape(pod)
        unhealthy = not report["ready"] or restarted
        return {"time_ns": time.time_ns(), "severity": "WARN" if unhealthy else "INFO",
                "body": report}  # fmt: skip

    def _scrape(self, pod: JSON) -> dict[str, float]:
        ip = (pod.get("status") or {}).get("podIP")
        ports = [p["containerPort"] for c in (pod.get("spec") or {}).get("containers") or []
                 for p in c.get("ports") or [] if p.get("name") == "metrics"]  # fmt: skip
        out: dict[str, float] = {}
        for port in ports if ip else []:
            try:
                out.update(select_metrics(self.fetch(f"http://{ip}:{port}/metrics")))
            except (OSError, ValueError) as err:
                out["lumigo_watchdog_scrape_failed"] = 1.0
                log.debug("metrics scrape failed", extra={"pod": pod["metadata"]["name"],
                                                          "error": str(err)})  # fmt: skip
        return out

    def _new_event(self, event: JSON) -> bool:
        uid = str(event["metadata"].get("uid", ""))
        count = int(event.get("count") or 1)
        if self._events_seen.get(uid, 0) >= count:
            return False
        self._events_seen[uid] = count
        return True

    def _event_record(self, event: JSON) -> JSON:
        report = event_report(event)
        severity = "WARN" if report["type"] == "Warning" else "INFO"
        return {"time_ns": time.time_ns(), "severity": severity, "body": report}
