"""Plain-HTTP probe and metrics endpoints: /healthz, /readyz, /metrics.

Checks are named callables returning None when fine or raising (any exception = failing, its
message is shown). `/healthz?verbose` and `/readyz?verbose` list every check like the API server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger("lumigo.health")

Check = Callable[[], None]


class CheckFailed(Exception):
    pass


def parse_bind_address(address: str) -> tuple[str, int]:
    """':8080' -> ('0.0.0.0', 8080); '127.0.0.1:0' -> ('127.0.0.1', 0)."""
    host, _, port = address.rpartition(":")
    return (host or "0.0.0.0", int(port))  # noqa: S104 - probes must be reachable by kubelet


class ProbeServer:
    """One HTTP server; serves probes, metrics, or both depending on flags."""

    def __init__(self, address: str, *, probes: bool = True, metrics: bool = True) -> None:
        self.healthz: dict[str, Check] = {}
        self.readyz: dict[str, Check] = {}
        self._serve_probes = probes
        self._serve_metrics = metrics
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path == "/metrics" and server._serve_metrics:
                    body = generate_latest(REGISTRY)
                    self._reply(200, body, CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/livez") and server._serve_probes:
                    self._checks(server.healthz, "verbose" in query)
                elif path == "/readyz" and server._serve_probes:
                    self._checks(server.readyz, "verbose" in query)
                else:
                    self._reply(404, b"not found\n", "text/plain")

            def _checks(self, checks: dict[str, Check], verbose: bool) -> None:
                lines, ok = [], True
                for name, check in sorted(checks.items()):
                    try:
                        check()
                        lines.append(f"[+]{name} ok")
                    except Exception as err:
                        ok = False
                        lines.append(f"[-]{name} failed: {err}")
                if ok and not verbose:
                    self._reply(200, b"ok", "text/plain")
                    return
                text = "\n".join(lines) + ("\nok\n" if ok else "\nfailed\n")
                self._reply(200 if ok else 500, text.encode(), "text/plain")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds would drown the log

        host, port = parse_bind_address(address)
        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=f"probe-server-{self.port}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
