"""Plain-HTTP probe and metrics endpoints: /healthz, /readyz, /metrics.

Checks are named callables returning None when fine or raising (any exception = failing, its
message is shown). `/healthz?verbose` and `/readyz?verbose` list every check like the API server.

Served by the webhook's HTTP server (`webhook.admission.server.HTTPServer`: uvicorn, without
TLS): idle connections are closed after a while, a request must arrive within a deadline, and the
number of open connections is capped (the longest idle closed first), so idle or slow clients can
neither pile up threads nor keep the kubelet's probes from being answered.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from webhook.admission.server import HTTPServer, Request, Response, ServerOptions

log = logging.getLogger("lumigo.health")

Check = Callable[[], None]

# Probes and scrapes are small GETs from a few clients (kubelet, Prometheus).
PROBE_OPTIONS = ServerOptions(
    max_connections=256,
    workers=2,
    max_body_bytes=64 * 1024,
    body_budget_bytes=1024 * 1024,
    handler_budget_bytes=1024 * 1024,
    shutdown_timeout=5.0,
)


class CheckFailed(Exception):
    pass


def parse_bind_address(address: str) -> tuple[str, int]:
    """':8080' -> ('0.0.0.0', 8080); '127.0.0.1:0' -> ('127.0.0.1', 0)."""
    host, _, port = address.rpartition(":")
    return (host or "0.0.0.0", int(port))  # noqa: S104 - probes must be reachable by kubelet


class ProbeServer:
    """One HTTP server; serves probes, metrics, or both depending on flags."""

    def __init__(
        self,
        address: str,
        *,
        probes: bool = True,
        metrics: bool = True,
        options: ServerOptions = PROBE_OPTIONS,
    ) -> None:
        self.healthz: dict[str, Check] = {}
        self.readyz: dict[str, Check] = {}
        self._serve_probes = probes
        self._serve_metrics = metrics
        host, port = parse_bind_address(address)
        self._server = HTTPServer(
            self._handle,
            dataclasses.replace(options, host=host, port=port),
            name=f"probe-server-{port}",
        )

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def _handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", "text/plain", {"Allow": "GET, HEAD"})
        path, _, query = request.target.partition("?")
        if path == "/metrics" and self._serve_metrics:
            return Response(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        if path in ("/healthz", "/livez") and self._serve_probes:
            return self._checks(self.healthz, "verbose" in query)
        if path == "/readyz" and self._serve_probes:
            return self._checks(self.readyz, "verbose" in query)
        return Response(404, b"not found\n", "text/plain")

    @staticmethod
    def _checks(checks: dict[str, Check], verbose: bool) -> Response:
        lines, ok = [], True
        for name, check in sorted(checks.items()):
            try:
                check()
                lines.append(f"[+]{name} ok")
            except Exception as err:
                ok = False
                lines.append(f"[-]{name} failed: {err}")
        if ok and not verbose:
            return Response(200, b"ok", "text/plain")
        text = "\n".join(lines) + ("\nok\n" if ok else "\nfailed\n")
        return Response(200 if ok else 500, text.encode(), "text/plain")
