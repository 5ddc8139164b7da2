"""Test helpers for the telemetry proxy: a real OTLP/HTTP sink and a collector process.

The sink is what the proxy exports to: it decodes every OTLP/HTTP protobuf request with the
official opentelemetry-proto messages and keeps the request headers next to the payload, so a
test can check both what arrived and with which `Authorization`. The collector is the binary
`hack/install-tools otelcol` builds, run as a process with a rendered configuration.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import http.server
import os
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from controller.telemetry.config import Origin, ProxySettings
from envtest.process import Process, free_port

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = Path(os.environ.get("LUMIGO_BIN_DIR", ROOT / "bin")) / "otelcol-lumigo"


def attrs(kvs: Any) -> dict[str, Any]:
    """OTLP KeyValue list -> plain dict (strings, ints, bools; others as their text form)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        out[kv.key] = any_value(kv.value)
    return out


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "kvlist_value":
        return attrs(value.kvlist_value.values)
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def local_settings(upstream: str, lease_namespace: str, **overrides: Any) -> ProxySettings:
    """Settings for a collector run as a local process: loopback ports, kubeconfig auth."""
    values: dict[str, Any] = {
        "upstream_endpoint": upstream,
        "kube_auth": "kubeConfig",
        "listen_host": "127.0.0.1",
        "otlp_port": free_port(),
        "health_port": free_port(),
        "metrics_port": free_port(),
        "lease_namespace": lease_namespace,
        "lease_name": "telemetry-proxy-k8s-objects",
        "origin": Origin(cluster_name="local-test"),
        # COLLECTOR is built from hack/tools/otelcol, which has the lumigo_k8s_enricher processor.
        "k8s_enricher": True,
    }
    values.update(overrides)
    return ProxySettings(**values)


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    message: Any
    at: float = 0.0  # time.time() when it arrived


@dataclass
class SpanSeen:
    resource: dict[str, Any]
    name: str
    authorization: str
    attributes: dict[str, Any] = field(default_factory=dict)
    start: float = 0.0  # the span's start time, s since the epoch
    arrived: float = 0.0  # when its request reached the sink, s since the epoch


@dataclass
class LogSeen:
    resource: dict[str, Any]
    body: Any
    attributes: dict[str, Any]
    scope: str
    authorization: str
    severity: str = ""


@dataclass
class MetricSeen:
    resource: dict[str, Any]
    name: str
    authorization: str
    points: list[dict[str, Any]] = field(default_factory=list)  # each data point's attributes


@dataclass
class OTLPSink:
    """An OTLP/HTTP receiver recording every request (start/stop it); on 127.0.0.1 unless told.

    `refused_tokens`: requests whose Authorization names one of them get 401 (a token that is
    wrong for the upstream) and are only counted, in `refused`. `outage()` takes it down."""

    requests: list[Received] = field(default_factory=list)
    count_only: bool = False  # benchmarks: count spans and log records, keep nothing
    spans_received: int = 0
    logs_received: int = 0
    host: str = "127.0.0.1"
    refused_tokens: set[str] = field(default_factory=set)
    refused: int = 0
    tls: ssl.SSLContext | None = None  # HTTPS with this server context (an upstream's CA)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if self.headers.get("Content-Encoding", "") == "gzip":
                    body = gzip.decompress(body)
                status = sink._record(self.path, dict(self.headers.items()), body)
                response = b""
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(response)))
                self.end_headers()
                self.wfile.write(response)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._handler = Handler
        self._bind(0)

    def _bind(self, port: int) -> None:
        tls = self.tls

        class Server(http.server.ThreadingHTTPServer):
            def get_request(self) -> tuple[Any, Any]:
                conn, address = super().get_request()
                if tls is not None:  # the handshake's failure is an OSError: that one is dropped
                    conn.settimeout(10)
                    conn = tls.wrap_socket(conn, server_side=True)
                return conn, address

        self._server = Server((self.host, port), self._handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def start(self) -> OTLPSink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Down inside the block (connections refused), back on the same port after it."""
        self.stop()
        try:
            yield
        finally:
            self._bind(self.port)
            self.start()

    def _record(self, path: str, headers: dict[str, str], body: bytes) -> int:
        message: Any
        authorization = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        if any(token and token in authorization for token in self.refused_tokens):
            with self._lock:
                self.refused += 1
            return 401
        if path == "/v1/traces":
            message = trace_service_pb2.ExportTraceServiceRequest()
        elif path == "/v1/logs":
            message = logs_service_pb2.ExportLogsServiceRequest()
        elif path == "/v1/metrics":
            message = metrics_service_pb2.ExportMetricsServiceRequest()
        else:
            return 404
        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        try:
            if content_type.startswith("application/json"):  # OTLP/HTTP's JSON encoding
                json_format.Parse(body, message)
            else:
                message.ParseFromString(body)
        except (DecodeError, json_format.ParseError):
            return 400
        with self._lock:
            if path == "/v1/traces":
                self.spans_received += sum(
                    len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans
                )
            elif path == "/v1/logs":
                self.logs_received += sum(
                    len(sl.log_records) for rl in message.resource_logs for sl in rl.scope_logs
                )
            if not self.count_only:
                lower = {k.lower(): v for k, v in headers.items()}
                self.requests.append(Received(path, lower, message, time.time()))
        return 200

    def spans(self) -> list[SpanSeen]:
        with self._lock:
            received = [r for r in self.requests if r.path == "/v1/traces"]
        return [
            SpanSeen(
                attrs(rs.resource.attributes),
                span.name,
                r.headers.get("authorization", ""),
                attrs(span.attributes),
                span.start_time_unix_nano / 1e9,
                r.at,
            )
            for r in received
            for rs in r.message.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def logs(self) -> list[LogSeen]:
        with self._lock:
            received = [r for r in self.requests if r.path == "/v1/logs"]
        return [
            LogSeen(
                attrs(rl.resource.attributes),
                any_value(rec.body),
                attrs(rec.attributes),
                sl.scope.name,
                r.headers.get("authorization", ""),
                rec.severity_text,
            )
            for r in received
            for rl in r.message.resource_logs
            for sl in rl.scope_logs
            for rec in sl.log_records
        ]

    def metrics(self, since: int = 0) -> list[MetricSeen]:
        """The metrics of the requests received after the first `since` ones."""
        with self._lock:
            received = [r for r in self.requests[since:] if r.path == "/v1/metrics"]
        return [
            MetricSeen(attrs(rm.resource.attributes), metric.name,
                       r.headers.get("authorization", ""), point_attributes(metric))
            for r in received
            for rm in r.message.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        ]  # fmt: skip


def point_attributes(metric: Any) -> list[dict[str, Any]]:
    """The attributes of each data point of an OTLP metric, whatever its kind."""
    kind = metric.WhichOneof("data")
    if kind is None:
        return []
    return [attrs(point.attributes) for point in getattr(metric, kind).data_points]


@contextlib.contextmanager
def running_sink(count_only: bool = False) -> Iterator[OTLPSink]:
    sink = OTLPSink(count_only=count_only).start()
    try:
        yield sink
    finally:
        sink.stop()


def export_request(
    name: str, resource: dict[str, str] | None = None, spans: int = 1
) -> trace_service_pb2.ExportTraceServiceRequest:
    """What an OTLP tracer sends: one resource, one scope, `spans` spans."""
    now = time.time_ns()
    resource_attrs = [
        KeyValue(key=k, value=AnyValue(string_value=v))
        for k, v in {"service.name": "checkout", **(resource or {})}.items()
    ]
    return trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource={"attributes": resource_attrs},
                scope_spans=[
                    trace_pb2.ScopeSpans(
                        scope={"name": "tests.support.otel"},
                        spans=[
                            trace_pb2.Span(
                                trace_id=os.urandom(16),
                                span_id=os.urandom(8),
                                name=name,
                                kind=trace_pb2.Span.SPAN_KIND_SERVER,
                                start_time_unix_nano=now,
                                end_time_unix_nano=now + 1_000_000,
                            )
                            for _ in range(spans)
                        ],
                    )
                ],
            )
        ]
    )


def send_traces(
    port: int,
    request: trace_service_pb2.ExportTraceServiceRequest,
    authorization: str | None,
    source: str | None = None,
) -> int:
    """POST one OTLP/HTTP protobuf request to 127.0.0.1:port, as the tracers do; from the
    loopback address `source` when given (the proxy finds pods by the connection's address)."""
    headers = {"Content-Type": "application/x-protobuf"}
    if authorization is not None:
        headers["Authorization"] = authorization
    conn = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=10, source_address=(source, 0) if source else None
    )
    try:
        conn.request("POST", "/v1/traces", body=request.SerializeToString(), headers=headers)
        response = conn.getresponse()
        response.read()
        return int(response.status)
    finally:
        conn.close()


def flood_with_forged_tokens(port: int, requests: int, threads: int = 4) -> Counter[int]:
    """`requests` OTLP/HTTP requests, each with a random token no Lumigo has, on keep-alive
    connections from `threads` clients; the statuses the proxy answered, counted."""
    body = export_request("forged").SerializeToString()
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def client(count: int) -> None:
        seen: Counter[int] = Counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for _ in range(count):
                headers = {
                    "Content-Type": "application/x-protobuf",
                    "Authorization": f"LumigoToken {forged_token()}",
                }
                try:
                    conn.request("POST", "/v1/traces", body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    seen[response.status] += 1
                    if response.will_close:
                        conn.close()
                except (OSError, http.client.HTTPException):
                    seen[0] += 1  # the connection went: a new one for the next request
                    conn.close()
        finally:
            conn.close()
            with lock:
                statuses.update(seen)

    share = [requests // threads + (i < requests % threads) for i in range(threads)]
    workers = [threading.Thread(target=client, args=(n,)) for n in share]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return statuses


def forged_token() -> str:
    """A token-shaped value no Lumigo has."""
    return f"t_{os.urandom(11).hex()[:21]}"


def wait_until_pod_known(
    port: int,
    sink: OTLPSink,
    pod_name: str,
    authorization: str,
    timeout: float = 60.0,
    source: str | None = None,
) -> None:
    """Send probe spans (with a token the proxy accepts) until one reaches the sink enriched
    with `pod_name`.

    `wait_for_metadata` makes the collector start only once its pod informer has synced, but the
    processor's own cache is filled by the informer's handler a moment later (a known upstream
    window, open-telemetry/opentelemetry-collector-contrib#32556); on a loaded machine a span sent
    in that moment leaves unenriched. Tests that check enrichment start after it.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        send_traces(port, export_request("probe"), authorization, source)
        time.sleep(0.5)
        if any(s.resource.get("k8s.pod.name") == pod_name for s in sink.spans()):
            return
    raise AssertionError(f"the proxy never enriched a span with pod {pod_name} in {timeout:.0f}s")


class Collector:
    """The project's collector binary running one configuration (always stop() it)."""

    def __init__(self, config: str, workdir: Path, health_port: int, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.config_path = workdir / "otelcol.yaml"
        self.config_path.write_text(config)
        self.config_path.chmod(0o600)
        self.log_path = workdir / "otelcol.log"
        self.health_port = health_port
        self.process = Process(
            "otelcol", [str(COLLECTOR), f"--config={self.config_path}"], self.log_path, env
        )

    @property
    def popen(self) -> subprocess.Popen[bytes] | None:
        return self.process.popen

    def start(self, timeout: float = 60.0) -> Collector:
        self.process.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"collector exited during start-up:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.1)
        raise TimeoutError(f"collector not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process.alive()

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def rss_kib(self) -> tuple[int, int]:
        """(current, peak) resident memory of the collector, in KiB."""
        assert self.popen is not None
        fields = {}
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)

    def stop(self, timeout: float = 20.0) -> None:
        self.process.stop(timeout)


@contextlib.contextmanager
def running_collector(
    config: str, workdir: Path, health_port: int, env: dict[str, str]
) -> Iterator[Collector]:
    collector = Collector(config, workdir, health_port, env)
    try:
        yield collector.start()
    finally:
        collector.stop()
