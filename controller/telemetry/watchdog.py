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
- every `top_interval`, each container's CPU and memory usage from metrics.k8s.io, when
  metrics-server serves it: the reference's two gauges, as OTLP metrics to the metrics endpoint
  (controller.telemetry.top); a failure there never stops the other reports.

It sends them as OTLP/HTTP log records (JSON encoding) to the logs endpoint, directly (not
through the proxy it watches), with the cluster-collection token, read from its Secret at each
export (so creating the Secret later turns reporting on). A failed export, or no token yet, keeps
the records (bounded) for the next pass.

On the wire it is the reference's watchdog: the resource names the service
`lumigo-kubernetes-operator-watchdog` with the operator's version, the cluster's version, name
and UID (the kube-system namespace's) and the namespace's name and UID; each Event is a record of
the scope `lumigo-operator.k8s-events` whose body is the Event as the reference shapes it
(metadata, timestamps, involvedObject, rootOwnerReference, reason, message, source), with the
Event's time, its name as the record's event name, and Warning as ERROR, Normal as INFO. The root
owner is walked through the API in this namespace (Pod -> ReplicaSet -> Deployment, Pod -> Job ->
CronJob); an owner that cannot be read (deleted, no permission) ends the walk at what is known.
The pod reports (and their metrics) have no equivalent in the reference: they keep a scope of
their own, `lumigo-operator.watchdog`.
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.runtime.kube import KubeClient
from controller.runtime.trust import upstream_context
from controller.telemetry.config import TOP_LEVEL_KINDS
from controller.telemetry.proxy_reconciler import namespace_uid
from controller.telemetry.top import TopReader, otlp_metrics
from kube import objects
from kube.kinds import EVENTS, JOBS, PODS, REPLICASETS, SECRETS
from kube.objects import JSON
from kube.rest import ApiError, Resource

log = logging.getLogger("lumigo.watchdog")

SCOPE = "lumigo-operator.watchdog"  # the pod reports (ours alone)
EVENTS_SCOPE = "lumigo-operator.k8s-events"  # the Events, as the reference's watchdog sends them
SERVICE_NAME = "lumigo-kubernetes-operator-watchdog"
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
RETRIED_CLIENT_ERRORS = frozenset({HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.TOO_MANY_REQUESTS})
# OTLP severity numbers; an Event's type maps as in the reference (Warning is ERROR).
SEVERITY = {"INFO": 9, "WARN": 13, "ERROR": 17}
EVENT_SEVERITY = {"normal": "INFO", "warning": "ERROR"}
# The owners read to find an Event's root owner (their own owners named in them); the kinds of
# TOP_LEVEL_KINDS are a root themselves (as the telemetry proxy's root owners).
OWNER_RESOURCES: dict[str, Resource] = {"Pod": PODS, "ReplicaSet": REPLICASETS, "Job": JOBS}
MAX_OWNER_DEPTH = 5
MAX_OWNER_CACHE = 512
IDENTITY_RETRY = 300.0  # seconds between reads of a resource identity not fully known
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
GO_ZERO_TIME = "0001-01-01T00:00:00Z"  # what the reference sends for a time the Event lacks


@dataclass(frozen=True)
class WatchdogSettings:
    namespace: str
    logs_endpoint: str  # full URL, …/v1/logs
    token_secret: str  # in `namespace`; read at each export, so a Secret created later counts
    token_key: str = "token"
    interval: float = 15.0
    metrics_interval: float = 15.0
    resource: dict[str, str] = field(default_factory=dict)  # cluster name, version…
    cluster_name: str = ""
    own_pod: str = ""  # the watchdog's own pod, left out
    # Full URL (…/v1/metrics) of the resource-usage gauges (controller.telemetry.top); "" = off.
    metrics_endpoint: str = ""
    top_interval: float = 15.0


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
    meta, status = objects.metadata(pod), pod.get("status") or {}
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


def _parse_time(value: Any) -> datetime | None:
    """An API time (`2024-05-01T10:00:00Z`, or a MicroTime with fractions) or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def _format_time(when: datetime | None, micro: bool = False) -> str:
    if when is None:
        return GO_ZERO_TIME.replace("Z", ".000000Z") if micro else GO_ZERO_TIME
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def event_times(event: JSON) -> dict[str, datetime | None]:
    meta = objects.metadata(event)
    series = event.get("series") or {}
    return {
        key: _parse_time(value)
        for key, value in (
            ("eventTime", event.get("eventTime")),
            ("lastTimestamp", event.get("lastTimestamp")),
            ("firstTimestamp", event.get("firstTimestamp")),
            ("creationTimestamp", meta.get("creationTimestamp")),
            ("lastObservedTime", series.get("lastObservedTime")),
        )
    }


def event_time(event: JSON) -> datetime | None:
    """When the Event happened, as the reference dates its record: eventTime, else
    lastTimestamp, else firstTimestamp, else its creation."""
    t = event_times(event)
    return t["eventTime"] or t["lastTimestamp"] or t["firstTimestamp"] or t["creationTimestamp"]


def reference(obj: Mapping[str, Any]) -> JSON:
    """`{apiVersion, kind, name, uid}` of an owner reference or an involvedObject."""
    return {key: str(obj.get(key) or "") for key in ("apiVersion", "kind", "name", "uid")}


def event_body(event: JSON, root_owner: JSON) -> JSON:
    """The record body of an Event, in the reference watchdog's shape and formats (times to the
    second, `eventTime` to the microsecond). Where the reference sends Go's zero time for a time
    the Event lacks (Events written through events.k8s.io have no first/last timestamp), the
    nearest known time is sent; `source` falls back to the reporting component likewise. Added:
    the Event's name and namespace in `metadata`, and `count`."""
    meta = objects.metadata(event)
    involved = event.get("involvedObject") or {}
    source = event.get("source") or {}
    t = event_times(event)
    first = t["firstTimestamp"] or t["eventTime"] or t["creationTimestamp"]
    last = t["lastTimestamp"] or t["lastObservedTime"] or t["eventTime"] or first
    involved_keys = (
        "kind",
        "namespace",
        "name",
        "uid",
        "apiVersion",
        "resourceVersion",
        "fieldPath",
    )
    return {
        "metadata": {key: str(meta.get(key) or "") for key in ("uid", "name", "namespace")},
        "lastTimestamp": _format_time(last),
        "eventTime": _format_time(first, micro=True),
        "creationTimestamp": _format_time(t["creationTimestamp"]),
        "type": str(event.get("type") or ""),
        "involvedObject": {key: str(involved.get(key) or "") for key in involved_keys},
        "rootOwnerReference": root_owner,
        "reason": str(event.get("reason") or ""),
        "message": str(event.get("message") or ""),
        "source": {
            "component": str(source.get("component") or event.get("reportingComponent") or ""),
            "host": str(source.get("host") or ""),
        },
        "count": event_count(event),
    }


def event_count(event: JSON) -> int:
    """How often it happened (core/v1 `count`, events.k8s.io `series.count`)."""
    return int(event.get("count") or (event.get("series") or {}).get("count") or 1)


def event_record(event: JSON, root_owner: JSON) -> JSON:
    """An Event as a log record: dated by the Event, its name as the record's event name, its
    type as the severity text and Warning as ERROR (Normal as INFO), as the reference does."""
    kind = str(event.get("type") or "")
    when = event_time(event)
    return {
        "scope": EVENTS_SCOPE,
        "time_ns": (when - EPOCH) // timedelta(microseconds=1) * 1000 if when else 0,
        "severity_text": kind,
        "severity_number": SEVERITY.get(EVENT_SEVERITY.get(kind.lower(), ""), 0),
        "event_name": str(objects.metadata(event).get("name") or ""),
        "body": event_body(event, root_owner),
        "attributes": {},
    }


@dataclass(eq=False)
class OwnerResolver:
    """An Event's root owner (apiVersion, kind, name, namespace, uid: the reference watchdog's
    name, kind and uid, plus the two the telemetry proxy's root owners carry), walked through the
    API in one namespace: each owner's controller reference (else its first), up to a kind of
    TOP_LEVEL_KINDS or an object without owners. A read that fails (deleted, no permission, a
    different object under the same name) ends the walk: the root is the farthest reference
    known."""

    client: KubeClient
    namespace: str
    _owners: dict[str, JSON | None] = field(default_factory=dict, init=False)

    def root(self, involved: JSON) -> JSON:
        ref = reference(involved)
        namespace = str(involved.get("namespace") or self.namespace)
        for _ in range(MAX_OWNER_DEPTH):
            if ref["kind"] in TOP_LEVEL_KINDS or namespace != self.namespace:
                break
            known, owner = self._owner(ref)
            ref = known
            if owner is None:
                break
            ref = owner
        # An ObjectReference, as the telemetry proxy's root owners (owners share the namespace).
        return {**ref, "namespace": namespace}

    def _owner(self, ref: JSON) -> tuple[JSON, JSON | None]:
        """(`ref` with its uid filled in when it was read, its owner or None)."""
        resource = OWNER_RESOURCES.get(ref["kind"])
        if (
            not ref["name"]
            or resource is None
            or ref["apiVersion"]
            not in (
                "",
                resource.api_version,
            )
        ):
            return ref, None
        if ref["uid"] and ref["uid"] in self._owners:
            return ref, self._owners[ref["uid"]]
        try:
            obj = self.client.get(resource, ref["name"], self.namespace)
        except ApiError as err:
            log.debug(
                "owner not readable",
                extra={"object": f"{ref['kind']}/{ref['name']}", "error": str(err)},
            )
            return ref, None
        meta = objects.metadata(obj)
        uid = str(meta.get("uid") or "")
        if ref["uid"] and uid != ref["uid"]:
            return ref, None  # deleted and made again under the same name: not its owner
        refs = meta.get("ownerReferences") or []
        chosen = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
        owner = reference(chosen) if chosen else None
        if len(self._owners) >= MAX_OWNER_CACHE:
            self._owners.clear()
        if uid:
            self._owners[uid] = owner
        return {**ref, "apiVersion": ref["apiVersion"] or resource.api_version, "uid": uid}, owner


def cluster_version(client: KubeClient) -> str:
    """The API server's gitVersion (as the reference: "unknown" when it cannot be read)."""
    try:
        info = client.request("GET", "/version", retry=False)
    except ApiError:
        return "unknown"
    version = info.get("gitVersion") if isinstance(info, dict) else None
    return str(version) if version else "unknown"


def readable_namespace_uid(client: KubeClient, name: str) -> str:
    """A namespace's UID ("" when it cannot be read)."""
    try:
        return namespace_uid(client, name)
    except ApiError:
        return ""


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
    """An OTLP/HTTP JSON ExportLogsServiceRequest of `records` (each: scope, time, severity,
    body, attributes, optionally an event name), one scope block per scope, in order."""
    scopes: dict[str, list[JSON]] = {}
    observed = str(time.time_ns())
    for r in records:
        record = {
            "timeUnixNano": str(r["time_ns"]),
            "observedTimeUnixNano": observed,
            "severityNumber": r["severity_number"],
            "severityText": r["severity_text"],
            "body": any_value(r["body"]),
            "attributes": key_values(r["attributes"]),
        }
        if r.get("event_name"):
            record["eventName"] = r["event_name"]
        scopes.setdefault(r["scope"], []).append(record)
    # The reference's Events scope has no version; ours names the operator's.
    return {
        "resourceLogs": [
            {
                "resource": {"attributes": key_values(resource)},
                "scopeLogs": [
                    {
                        "scope": {"name": name, "version": version}
                        if name == SCOPE
                        else {"name": name},
                        "logRecords": logs,
                    }
                    for name, logs in scopes.items()
                ],
            }
        ]
    }


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


def post_otlp(url: str, payload: JSON, token: str) -> None:
    """POST an OTLP/HTTP JSON request with the Lumigo token (urllib's errors raised)."""
    request = urllib.request.Request(  # noqa: S310 - the configured upstream
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"LumigoToken {token}"},
    )
    # Through egress.httpsProxy (HTTPS_PROXY) when set, trusting egress.caBundle too.
    with urllib.request.urlopen(request, timeout=10, context=upstream_context()) as response:  # noqa: S310
        response.read()


def _read(request: urllib.request.Request, context: ssl.SSLContext | None) -> str:
    """An in-cluster read: never through the egress proxy (a pod IP is in no NO_PROXY)."""
    direct = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    with direct.open(request, timeout=3) as response:
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
    _identity: dict[str, str] = field(default_factory=dict, init=False)
    _identity_read: float = field(default=float("-inf"), init=False)
    _owners: OwnerResolver = field(init=False)
    _top: TopReader = field(init=False)
    _last_top: float = field(default=float("-inf"), init=False)

    def __post_init__(self) -> None:
        self._owners = OwnerResolver(self.client, self.settings.namespace)
        self._top = TopReader(self.client, self.settings.namespace)

    def resource(self) -> dict[str, str]:
        """The resource of every record, as the reference's watchdog names itself. The cluster's
        version and the UIDs are read until known, at most every IDENTITY_RETRY seconds (a UID
        not readable, e.g. without the permission, is left out)."""
        s = self.settings
        known = self._identity.get("k8s.cluster.uid") and self._identity.get("k8s.namespace.uid")
        if not known and time.monotonic() - self._identity_read >= IDENTITY_RETRY:
            self._identity_read = time.monotonic()
            self._identity = {
                "k8s.cluster.version": cluster_version(self.client),
                "k8s.cluster.uid": readable_namespace_uid(self.client, "kube-system"),
                "k8s.namespace.uid": readable_namespace_uid(self.client, s.namespace),
            }
        identity = {
            "service.name": SERVICE_NAME,
            "lumigo.k8s_operator.version": self.version,
            "k8s.namespace.name": s.namespace,
            "k8s.cluster.name": s.cluster_name,
            **{k: v for k, v in self._identity.items() if v},
        }
        return {**identity, **s.resource}

    def check(self, now: float | None = None) -> list[JSON]:
        """Read the namespace once; the records to send (also queued for `flush`)."""
        now = time.monotonic() if now is None else now
        scrape = now - self._last_metrics >= self.settings.metrics_interval
        if scrape:
            self._last_metrics = now
        pods, _ = self.client.list(PODS, self.settings.namespace)
        records = [
            self._pod_record(p, scrape)
            for p in pods
            if p["metadata"]["name"] != self.settings.own_pod
        ]
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
        payload = otlp_logs(records, self.resource(), self.version)
        try:
            post_otlp(self.settings.logs_endpoint, payload, token)
        except urllib.error.HTTPError as err:
            client_error = HTTPStatus.BAD_REQUEST <= err.code < HTTPStatus.INTERNAL_SERVER_ERROR
            if client_error and err.code not in RETRIED_CLIENT_ERRORS:
                # Refused for good (e.g. a wrong token): sending them again cannot succeed.
                log.warning(
                    "watchdog records refused by the upstream; dropped",
                    extra={"status": err.code, "dropped": len(records)},
                )
                self._drop(len(records))
            else:
                log.warning(
                    "watchdog export failed; records kept for the next pass",
                    extra={"status": err.code, "pending": len(records)},
                )
            return False
        except OSError as err:  # URLError too: unreachable, timed out
            log.warning(
                "watchdog export failed; records kept for the next pass",
                extra={"error": str(err), "pending": len(records)},
            )
            return False
        self._drop(len(records))
        return True

    def top(self, now: float | None = None) -> bool:
        """Every `top_interval`, send the containers' resource usage (controller.telemetry.top)
        to the metrics endpoint; False when nothing was sent. Not kept on failure: a gauge is
        read again next interval."""
        now = time.monotonic() if now is None else now
        s = self.settings
        if not s.metrics_endpoint or now - self._last_top < s.top_interval:
            return False
        self._last_top = now
        try:
            usages = self._top.read()
        except ApiError as err:
            log.warning(
                "could not read the pods' resource usage; tried again next interval",
                extra={"error": str(err)},
            )
            return False
        token = self._token() if usages else ""
        if not token:
            return False
        payload = otlp_metrics(
            usages or [], s.namespace, key_values(self.resource()), time.time_ns()
        )
        try:
            post_otlp(s.metrics_endpoint, payload, token)
        except OSError as err:  # HTTPError and URLError too
            log.warning("watchdog resource-usage export failed", extra={"error": str(err)})
            return False
        return True

    def _drop(self, count: int) -> None:
        for _ in range(count):
            self._pending.popleft()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            for step in (self._report, self.top):
                try:
                    step()
                except ApiError as err:
                    log.warning("watchdog could not read the namespace", extra={"error": str(err)})
                except Exception:  # a watchdog that crash-loops reports nothing: log, go on
                    log.exception("watchdog pass failed")
            stop.wait(self.settings.interval)

    # -- helpers -------------------------------------------------------------------------------
    def _report(self) -> None:
        self.check()
        self.flush()

    def _token(self) -> str:
        """The token of the Secret ("" while it is missing: records wait, bounded)."""
        s = self.settings
        secret = self.client.get_or_none(SECRETS, s.token_secret, s.namespace)
        value = ((secret or {}).get("data") or {}).get(s.token_key, "")
        token = base64.b64decode(value).decode("utf-8", "replace").strip() if value else ""
        if not token and not self._no_token_logged:
            where = {"secret": f"{s.namespace}/{s.token_secret}", "key": s.token_key}
            log.warning(
                "no cluster-collection token yet: the watchdog keeps its records", extra=where
            )
        self._no_token_logged = not token
        return token

    def _pod_record(self, pod: JSON, scrape: bool) -> JSON:
        report = pod_report(pod)
        uid = str(pod["metadata"].get("uid", ""))
        restarted = report["restarts"] > self._restarts.get(uid, 0)
        self._restarts[uid] = report["restarts"]
        if scrape:
            report["metrics"] = self._scrape(pod)
        severity = "WARN" if not report["ready"] or restarted else "INFO"
        return {
            "scope": SCOPE,
            "time_ns": time.time_ns(),
            "severity_text": severity,
            "severity_number": SEVERITY[severity],
            "body": report,
            "attributes": {"lumigo.watchdog.kind": "pod"},
        }

    def _scrape(self, pod: JSON) -> dict[str, float]:
        ip = (pod.get("status") or {}).get("podIP")
        ports = [
            p["containerPort"]
            for c in (pod.get("spec") or {}).get("containers") or []
            for p in c.get("ports") or []
            if p.get("name") == "metrics"
        ]
        out: dict[str, float] = {}
        for port in ports if ip else []:
            try:
                out.update(select_metrics(self.fetch(f"http://{ip}:{port}/metrics")))
            except (OSError, ValueError) as err:
                out["lumigo_watchdog_scrape_failed"] = 1.0
                log.debug(
                    "metrics scrape failed",
                    extra={"pod": pod["metadata"]["name"], "error": str(err)},
                )
        return out

    def _new_event(self, event: JSON) -> bool:
        uid = str(event["metadata"].get("uid", ""))
        count = event_count(event)
        if self._events_seen.get(uid, 0) >= count:
            return False
        self._events_seen[uid] = count
        return True

    def _event_record(self, event: JSON) -> JSON:
        return event_record(event, self._owners.root(event.get("involvedObject") or {}))
