"""The HTTPS admission server: TLS >= 1.2, HTTP/1.1 keep-alive, bounded concurrency.

Design (machinery.md §5):
- One accept thread that only accepts. The TLS handshake happens in the connection's worker
  thread, under a handshake timeout, so a slow or silent client cannot stall `accept`.
- A fixed pool of `max_connections` workers, one per live connection (keep-alive connections
  are long-lived; the API server keeps a small idle pool per host). When every worker is busy
  the accept thread waits for a free one, and new connections wait in the kernel backlog:
  memory and threads stay bounded under any load.
- Idle keep-alive connections are closed after `idle_timeout` (120 s, above the API server's
  90 s idle timeout, so the client always closes first and no POST races a server close). Once a
  request has started, all of it must arrive within `request_timeout`, so a client trickling
  bytes cannot hold a worker forever.
- Responses are written in one buffered write and flushed, on a TCP_NODELAY socket: Nagle plus
  the client's delayed ACK would otherwise add ~40 ms to every keep-alive response.
- Every request is answered: 200 with the route's AdmissionReview, 400 with a clear message
  when the route raises BadRequest, 4xx for protocol mistakes (wrong method/path, missing or
  oversized Content-Length), 500 only for a bug in a route (logged with its stack, never with
  the body, which can hold secrets from the workload's spec).
- The certificate comes from a `ServingTLS` and can change at any time without a restart.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from webhook.metrics import LATENCY_SECONDS, REQUESTS_IN_FLIGHT, REQUESTS_TOTAL
from webhook.readiness import NotReady
from webhook.routing import BadRequest, Route
from webhook.tls import ServingTLS

log = logging.getLogger("lumigo.webhook.server")


@dataclass(frozen=True)
class ServerOptions:
    host: str = "0.0.0.0"  # noqa: S104 - the API server reaches us through the Service
    port: int = 9443
    max_connections: int = 128
    idle_timeout: float = 120.0
    request_timeout: float = 30.0
    handshake_timeout: float = 10.0
    max_body_bytes: int = (
        16 * 1024 * 1024
    )  # an AdmissionReview holds object + oldObject (<3 MiB each)
    shutdown_timeout: float = 10.0
    backlog: int = 1024


class AdmissionServer:
    """Serves `routes` (path -> Route) over HTTPS with the certificate held by `tls`."""

    def __init__(
        self, routes: Mapping[str, Route], tls: ServingTLS, options: ServerOptions | None = None
    ) -> None:
        self.routes = dict(routes)
        self.tls = tls
        self.options = options or ServerOptions()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(self.options.max_connections)
        self._stopping = threading.Event()
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._active = 0
        self.accepted = 0  # connections accepted so far (tells keep-alive reuse apart from churn)
        self.handshake_failures = 0
        self._handshake_failures_logged = 0
        self._handshake_logged_at = -60.0
        self.peak_connections = 0  # most connections served at once (never > max_connections)
        for path in self.routes:
            REQUESTS_IN_FLIGHT.labels(path)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the server is not started")
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        if self._listener is not None:
            return
        opts = self.options
        family = socket.AF_INET6 if ":" in opts.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((opts.host, opts.port))
        listener.listen(opts.backlog)
        listener.setblocking(False)
        self._listener = listener
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=opts.max_connections, thread_name_prefix="webhook-conn"
        )
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="webhook-accept", daemon=True
        )
        self._accept_thread.start()
        log.info("webhook server listening", extra={"address": f"{opts.host}:{self.port}"})

    def stop(self) -> None:
        """Stop accepting, close idle connections, let in-flight requests finish (bounded)."""
        if self._listener is None or self._stopping.is_set():
            return
        self._stopping.set()
        if self._accept_thread is not None:
            self._accept_thread.join()
        self._listener.close()
        deadline = time.monotonic() + self.options.shutdown_timeout
        while time.monotonic() < deadline:
            with self._lock:
                live = list(self._connections)
            if not live:
                break
            for conn in live:
                conn.close_if_idle()
            time.sleep(0.01)
        with self._lock:
            leftovers = list(self._connections)
        for conn in leftovers:  # past the deadline: cut them
            conn.abort()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        log.info("webhook server stopped")

    def ready(self) -> None:
        """For /readyz: raises NotReady until we listen and have a certificate to serve."""
        if self._listener is None or self._stopping.is_set():
            raise NotReady("the webhook server is not listening")
        if self.tls.loaded is None:
            raise NotReady("no serving certificate loaded yet")

    # -- accepting ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._listener is not None
        assert self._pool is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stopping.is_set():
                if not self._slots.acquire(timeout=0.2):
                    continue  # every worker is busy: leave new connections in the backlog
                try:
                    if not selector.select(timeout=0.2):
                        self._slots.release()
                        continue
                    sock, address = self._listener.accept()
                except OSError:
                    self._slots.release()
                    continue
                try:
                    self._pool.submit(self._serve, sock, address)
                except RuntimeError:  # the pool is shutting down
                    self._slots.release()
                    sock.close()

    def _serve(self, sock: socket.socket, address: Any) -> None:
        tls_sock: ssl.SSLSocket | None = None
        with self._lock:
            self.accepted += 1
            self._active += 1
            self.peak_connections = max(self.peak_connections, self._active)
        try:
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.options.handshake_timeout)
            tls_sock = self.tls.server_context().wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
            try:
                tls_sock.do_handshake()
            except OSError as err:  # ssl.SSLError included; scanners and bad bundles land here
                self._handshake_failed(address, err)
                return
            conn = _Connection(self, tls_sock, address)
            with self._lock:
                self._connections.add(conn)
            try:
                conn.run()
            finally:
                with self._lock:
                    self._connections.discard(conn)
        except Exception:
            log.exception("webhook connection failed")
        finally:
            with contextlib.suppress(OSError):
                (tls_sock or sock).close()
            with self._lock:
                self._active -= 1
            self._slots.release()

    def _handshake_failed(self, address: Any, err: OSError) -> None:
        """Log failed handshakes at most once a minute: a client that does not trust our
        certificate (a stale caBundle) shows up here, a port scanner must not flood the log."""
        now = time.monotonic()
        with self._lock:
            self.handshake_failures += 1
            if now - self._handshake_logged_at < 60.0:
                return
            self._handshake_logged_at = now
            count = self.handshake_failures - self._handshake_failures_logged
            self._handshake_failures_logged = self.handshake_failures
        log.warning(
            "TLS handshakes with the webhook failing",
            extra={"failures": count, "last_peer": str(address), "last_error": str(err)},
        )

    def is_stopping(self) -> bool:
        return self._stopping.is_set()


class _RequestTimeout(Exception):
    pass


class _Connection(BaseHTTPRequestHandler):
    """One keep-alive connection. BaseHTTPRequestHandler parses; this class decides."""

    protocol_version = "HTTP/1.1"
    server_version = "lumigo-webhook"
    sys_version = ""
    rbufsize = 64 * 1024
    wbufsize = -1  # buffered: status, headers and body leave in one TLS record

    def __init__(self, server: AdmissionServer, sock: ssl.SSLSocket, address: Any) -> None:
        # Deliberately not calling BaseRequestHandler.__init__ (it would handle() at once).
        self.admission = server
        self.request = sock
        self.client_address = address
        self._state_lock = threading.Lock()
        self._idle = False
        self._closed = False

    def run(self) -> None:
        self.setup()
        try:
            self.handle()
        finally:
            with contextlib.suppress(OSError):
                self.finish()
            self.abort()

    # -- shutdown support ---------------------------------------------------------------------
    def close_if_idle(self) -> None:
        with self._state_lock:
            if self._idle:
                self._shutdown_socket()

    def abort(self) -> None:
        with self._state_lock:
            self._shutdown_socket()

    def _is_closed(self) -> bool:
        return self._closed

    def _shutdown_socket(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                self.request.shutdown(socket.SHUT_RDWR)

    # -- the request loop ---------------------------------------------------------------------
    def handle_one_request(self) -> None:
        opts = self.admission.options
        with self._state_lock:
            if self.admission.is_stopping() or self._closed:
                self.close_connection = True
                return
            self._idle = True
        self.connection.settimeout(opts.idle_timeout)
        try:
            self.raw_requestline = self.rfile.readline(65537)
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        with self._state_lock:
            self._idle = False
            cut_while_idle = self._is_closed()
        if cut_while_idle:
            self.close_connection = True
            return
        if not self.raw_requestline:
            self.close_connection = True
            return
        deadline = time.monotonic() + opts.request_timeout
        try:
            self.connection.settimeout(opts.request_timeout)
            if len(self.raw_requestline) > 65536:
                self.requestline, self.request_version, self.command = "", "", ""
                self._reply_error(HTTPStatus.REQUEST_URI_TOO_LONG, "request line too long")
                return
            if not self.parse_request():
                self.wfile.flush()  # parse_request answered (400, 431, ...) and asked to close
                return
            if self.admission.is_stopping():
                self.close_connection = True
            self._dispatch(deadline)
            self.wfile.flush()
        except (TimeoutError, _RequestTimeout):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._reply_error(HTTPStatus.REQUEST_TIMEOUT, "the request did not arrive in time")
                self.wfile.flush()
        except (OSError, ValueError):  # peer went away mid-request, or a closed file
            self.close_connection = True

    def _dispatch(self, deadline: float) -> None:
        path = urlsplit(self.path).path
        if self.command != "POST":
            body = self._read_body(deadline, required=False)
            if body is None:
                return
            self._reply_error(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{self.command} is not supported: admission requests are POSTed",
                extra_headers={"Allow": "POST"},
            )
            return
        body = self._read_body(deadline, required=True)
        if body is None:
            return
        route = self.admission.routes.get(path)
        if route is None:
            self._reply_error(HTTPStatus.NOT_FOUND, f"no admission webhook is served at {path!r}")
            return
        content_type = self.headers.get("Content-Type", "")
        started = time.perf_counter()
        in_flight = REQUESTS_IN_FLIGHT.labels(path)
        in_flight.inc()
        code = HTTPStatus.OK
        try:
            try:
                review = route(body, content_type)
                payload = (
                    review
                    if isinstance(review, bytes)
                    else json.dumps(review, separators=(",", ":")).encode()
                )
            except BadRequest as err:
                code = HTTPStatus.BAD_REQUEST
                log.debug("bad admission request", extra={"path": path, "error": err.message})
                self._reply_error(code, err.message)
                return
            except Exception:
                code = HTTPStatus.INTERNAL_SERVER_ERROR
                log.exception("admission handler failed", extra={"path": path})
                self._reply_error(code, "internal error while handling the admission request")
                return
            self._reply(code, payload, "application/json")
        finally:
            in_flight.dec()
            REQUESTS_TOTAL.labels(path, str(int(code))).inc()
            LATENCY_SECONDS.labels(path).observe(time.perf_counter() - started)

    def _read_body(self, deadline: float, *, required: bool) -> bytes | None:
        """The body by Content-Length, or None after answering the error (and closing)."""
        if "Transfer-Encoding" in self.headers:
            self.close_connection = True
            self._reply_error(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length")
            return None
        raw = self.headers.get("Content-Length")
        if raw is None:
            if required:
                self.close_connection = True
                self._reply_error(HTTPStatus.LENGTH_REQUIRED, "a Content-Length is required")
                return None
            return b""
        try:
            length = int(raw.strip())
            if length < 0 or not raw.strip().isdigit():
                raise ValueError
        except ValueError:
            self.close_connection = True
            self._reply_error(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {raw[:40]!r}")
            return None
        limit = self.admission.options.max_body_bytes
        if length > limit:
            self.close_connection = True
            self._reply_error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the body ({length} bytes) is larger than the {limit} bytes accepted",
            )
            return None
        chunks: list[bytes] = []
        remaining = length
        while remaining > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _RequestTimeout
            self.connection.settimeout(left)
            chunk = self.rfile.read1(min(remaining, 256 * 1024))
            if not chunk:  # the peer closed before sending the whole body
                self.close_connection = True
                return None
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    # -- writing --------------------------------------------------------------------------------
    def _reply(
        self,
        code: int,
        body: bytes,
        content_type: str,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        if self.request_version == "HTTP/0.9":  # never answer in 0.9 (no status line at all)
            self.request_version = "HTTP/1.0"
        self.send_response_only(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra_headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reply_error(
        self, code: int, message: str, extra_headers: Mapping[str, str] | None = None
    ) -> None:
        """A metav1.Status body: readable with curl, and the API server shows its message."""
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": HTTPStatus(code).phrase.replace(" ", ""),
            "code": int(code),
        }
        self._reply(code, json.dumps(status).encode(), "application/json", extra_headers)

    def handle_expect_100(self) -> bool:
        """`Expect: 100-continue` (curl does it for big bodies): the interim answer must leave
        now, not sit in the write buffer while the client waits for it."""
        self.send_response_only(HTTPStatus.CONTINUE)
        self.end_headers()
        self.wfile.flush()
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """parse_request's errors (bad request line, too many headers...) in our format."""
        self.close_connection = True
        self._reply_error(code, message or HTTPStatus(code).phrase)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)
