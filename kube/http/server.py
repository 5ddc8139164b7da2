"""HTTP/1.1 serving on uvicorn (TLS optional), and the HTTPS admission server built on it.

Why uvicorn: it is the most used, best kept asyncio HTTP server in Python (llhttp parsing
through httptools, uvloop), and of the servers measured for the admission routes (README,
"Choosing the webhook's HTTP server") it serves the most requests per core, with worker
processes sharing one port. What it leaves open for a server facing the network is closed in
`kube.http.protocol` (request, idle and handshake deadlines; head caps; a connection
cap that closes the longest-idle connection first) and `kube.http.asgi` (framing, body
limits and memory budgets). The defaults:
- TLS handshakes are non-blocking, each under `handshake_timeout` (3 s, below the 5 s
  `timeoutSeconds` of our webhooks); new connections use the current certificate of the
  `ServingTLS` (hot swap without restart, through the SNI callback).
- A request must arrive whole within `request_timeout` of its first byte (408). Idle keep-alive
  connections wait up to `idle_timeout` (120 s, above the API server's 90 s, so the client closes
  first and no POST races a close).
- At most `max_connections` connections are open; when full, the one idle the longest is closed.
- `stop()` stops accepting, closes idle connections and lets requests under way finish within
  `shutdown_timeout`.

Errors use the metav1.Status JSON body (readable with curl; the API server shows its message).
`AdmissionServer` adds: 200 with the route's AdmissionReview, 400 when the route raises
BadRequest, 404/405/411, and 500 only for a bug in a route (logged with its stack, never with the
body, which can hold secrets from the workload's spec).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import resource
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
import uvloop

from kube.http.asgi import BodyLimits, HandlerApp
from kube.http.memory import LargeBodySlots
from kube.http.messages import (
    MAX_BODY_BYTES,
    Request,
    RequestHandler,
    Response,
    quote,
    status_response,
)
from kube.http.protocol import BoundedProtocol, Connections
from kube.http.readiness import NotReady
from kube.http.routing import BadRequest, Route
from kube.http.server_metrics import LATENCY_SECONDS, REQUESTS_IN_FLIGHT, REQUESTS_TOTAL
from kube.http.tls import ServingTLS

__all__ = [
    "AdmissionServer",
    "HTTPServer",
    "Request",
    "Response",
    "ServerOptions",
    "bind",
    "status_response",
]

log = logging.getLogger("lumigo.webhook.server")

MiB = 1024 * 1024
FD_RESERVE = 256  # file descriptors kept for everything but served connections
_TLS_SHUTDOWN = 1.0  # seconds a closed TLS connection waits for the peer's close_notify


@dataclass(frozen=True)
class ServerOptions:
    host: str = "0.0.0.0"  # noqa: S104 - the API server reaches us through the Service
    port: int = 9443
    max_connections: int = 2048  # open at once; the longest idle closed first
    workers: int = 4  # threads handling large bodies (small ones run on the event loop)
    idle_timeout: float = 120.0
    request_timeout: float = 10.0  # first byte of a request -> its body complete
    handshake_timeout: float = 3.0
    max_body_bytes: int = MAX_BODY_BYTES
    body_budget_bytes: int = 32 * MiB  # large bodies held at once (counted as they arrive)
    handler_budget_bytes: int = MAX_BODY_BYTES + MiB  # bodies being handled at once
    min_body_rate: float = 128 * 1024  # bytes/s a body must arrive at, on average...
    body_grace: float = 2.0  # ...after this many seconds; nor may it pause longer (408)
    large_body_slots: str = ""  # directory of slot files shared by the pod's processes
    max_request_line: int = 8192
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    shutdown_timeout: float = 10.0
    backlog: int = 1024


def bind(host: str, port: int) -> socket.socket:
    """The listening socket: bound here, so worker processes can share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(ServerOptions.backlog)
    listener.setblocking(False)
    return listener


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, creating our protocol on our socket with a TLS handshake deadline."""

    def __init__(
        self, config: uvicorn.Config, limits: Connections, listener: socket.socket
    ) -> None:
        super().__init__(config)
        self.limits = limits
        self.listener = listener
        self.listening = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        config, loop = self.config, asyncio.get_running_loop()

        def create_protocol() -> asyncio.Protocol:
            return BoundedProtocol(
                config, self.server_state, self.lifespan.state, self.limits, _loop=loop
            )

        server = await loop.create_server(
            create_protocol,
            sock=self.listener,
            ssl=config.ssl,
            backlog=config.backlog,
            ssl_handshake_timeout=self.limits.handshake_timeout if config.ssl else None,
            # A client that never answers our close_notify must not hold a closed connection
            # (and a graceful stop) for asyncio's default 30 s; Go does not wait at all.
            ssl_shutdown_timeout=_TLS_SHUTDOWN if config.ssl else None,
        )
        self.servers = [server]
        self.started = True
        self.listening.set()

    async def on_tick(self, counter: int) -> bool:
        if counter % 10 == 0:
            self.limits.sweep_handshakes()
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        for connection in list(self.server_state.connections):  # past the deadline
            connection.transport.abort()


@dataclasses.dataclass(eq=False)
class HTTPServer:
    """Serves `handler` over HTTP/1.1 with keep-alive, over TLS when `tls` is given, on an event
    loop thread of its own. `listener` is a socket bound by `bind` (shared by worker
    processes); without one, the server binds `options.host:options.port`."""

    handler: RequestHandler
    options: ServerOptions
    _: dataclasses.KW_ONLY
    tls: ServingTLS | None = None
    name: str = "http-server"
    listener: socket.socket | None = None
    _limits: Connections = dataclasses.field(init=False)
    _server: _Uvicorn | None = dataclasses.field(default=None, init=False)
    _app: HandlerApp | None = dataclasses.field(default=None, init=False)
    _thread: threading.Thread | None = dataclasses.field(default=None, init=False)
    _pool: concurrent.futures.ThreadPoolExecutor | None = dataclasses.field(
        default=None, init=False
    )
    _stopping: threading.Event = dataclasses.field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        # The deadlines and caps the protocol enforces, by the same names as in `options`.
        shared = {
            f.name: getattr(self.options, f.name)
            for f in dataclasses.fields(Connections)
            if f.init and hasattr(self.options, f.name)
        }
        self._limits = Connections(cap=self.options.max_connections, name=self.name, **shared)

    # -- what tests and probes look at --------------------------------------------------------
    @property
    def port(self) -> int:
        if self.listener is None:
            raise RuntimeError("the server is not started")
        return int(self.listener.getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open right now (handshake done)."""
        return len(self._server.server_state.connections) if self._server is not None else 0

    @property
    def body_bytes_held(self) -> int:
        """Bytes of large request bodies held right now (counted against the body budget)."""
        return self._app.body_bytes_held if self._app is not None else 0

    @property
    def accepted(self) -> int:
        return self._limits.accepted

    @property
    def evicted(self) -> int:
        return self._limits.evicted

    @property
    def handshake_failures(self) -> int:
        return self._limits.handshake_failures

    def is_stopping(self) -> bool:
        return self._stopping.is_set()

    def listening(self) -> bool:
        return (
            self._server is not None
            and self._server.listening.is_set()
            and not self._stopping.is_set()
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        opts = self.options
        self._limits.cap = _connection_cap(opts.max_connections)
        if self.listener is None:
            self.listener = bind(opts.host, opts.port)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=opts.workers, thread_name_prefix=f"{self.name}-handler"
        )
        limits = BodyLimits(
            max_body_bytes=opts.max_body_bytes,
            body_budget_bytes=opts.body_budget_bytes,
            handler_budget_bytes=opts.handler_budget_bytes,
            wait_timeout=opts.request_timeout,
            min_body_rate=opts.min_body_rate,
            body_grace=opts.body_grace,
            large_slots=_slots(opts.large_body_slots),
        )
        self._app = HandlerApp(self.handler, limits, self._pool, self.name)
        tls = self.tls
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            ws="none",
            interface="asgi3",
            proxy_headers=False,
            server_header=False,
            date_header=False,
            access_log=False,
            log_config=None,
            timeout_keep_alive=int(opts.idle_timeout),
            timeout_graceful_shutdown=int(opts.shutdown_timeout),
            backlog=opts.backlog,
            ssl_context_factory=(lambda _cfg, _default: tls.server_context()) if tls else None,
        )
        self._server = _Uvicorn(config, self._limits, self.listener)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        while not self._server.listening.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError(f"the {self.name} server did not start")
        log.info(
            "server listening",
            extra={"server": self.name, "address": f"{opts.host}:{self.port}", "tls": bool(tls)},
        )

    def _run(self) -> None:
        assert self._server is not None
        loop = uvloop.new_event_loop()
        loop.set_exception_handler(_log_loop_error)
        try:
            loop.run_until_complete(self._server.serve())
        finally:
            loop.close()

    def drain(self) -> None:
        """Keep serving, but close each connection after its next response.

        Called when the pod starts terminating, while it still receives requests for a few
        seconds. A client that is told `Connection: close` dials again, and its new connection
        reaches a pod that stays. Closing an idle keep-alive connection instead (what `stop`
        must do) races a POST the client may be sending on it at that moment: the POST fails,
        and with `failurePolicy: Ignore` the workload is admitted uninstrumented. After a
        drain, `stop` finds few connections left that the client still uses.
        """
        if self._app is not None:
            self._app.closing = True
            log.info(
                "draining: connections close after their next response", extra={"server": self.name}
            )

    def stop(self) -> None:
        """Stop accepting, close idle connections, let requests under way finish (bounded)."""
        if self._server is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        log.info("server stopped", extra={"server": self.name})


class AdmissionServer(HTTPServer):
    """Serves `routes` (path -> Route) over HTTPS with the certificate held by `tls`."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        tls: ServingTLS,
        options: ServerOptions | None = None,
        *,
        listener: socket.socket | None = None,
    ) -> None:
        super().__init__(
            self._admit_request,
            options or ServerOptions(),
            tls=tls,
            name="webhook",
            listener=listener,
        )
        self.routes = dict(routes)
        for path in self.routes:
            REQUESTS_IN_FLIGHT.labels(path)

    def ready(self) -> None:
        """For /readyz: raises NotReady until we listen and have a certificate to serve."""
        if not self.listening():
            raise NotReady("the webhook server is not listening")
        if self.tls is None or self.tls.loaded is None:
            raise NotReady("no serving certificate loaded yet")

    def _admit_request(self, request: Request) -> Response:
        if request.method != "POST":
            return status_response(
                405,
                f"{request.method} is not supported: admission requests are POSTed",
                headers={"Allow": "POST"},
            )
        if request.content_length is None:
            return status_response(411, "a Content-Length is required", close=True)
        path = request.path
        route = self.routes.get(path)
        if route is None:
            return status_response(404, f"no admission webhook is served at {quote(path)}")
        started = time.perf_counter()
        in_flight = REQUESTS_IN_FLIGHT.labels(path)
        in_flight.inc()
        code = 200
        try:
            try:
                review = route(request.body, request.headers.get("content-type", ""))
            except BadRequest as err:
                code = 400
                log.debug("bad admission request", extra={"path": path, "error": err.message})
                return status_response(code, err.message)
            except Exception:
                code = 500
                log.exception("admission handler failed", extra={"path": path})
                return status_response(code, "internal error while handling the admission request")
            payload = (
                review
                if isinstance(review, bytes)
                else json.dumps(review, separators=(",", ":")).encode()
            )
            return Response(200, payload)
        finally:
            in_flight.dec()
            REQUESTS_TOTAL.labels(path, str(code)).inc()
            LATENCY_SECONDS.labels(path).observe(time.perf_counter() - started)


def _slots(directory: str) -> LargeBodySlots | None:
    return LargeBodySlots(Path(directory)) if directory else None


def _connection_cap(wanted: int) -> int:
    """Connections we can hold: raise the soft file-descriptor limit toward the hard one if
    needed (as Go does at start-up), and stay below it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    cap = max(16, soft - FD_RESERVE)
    log.warning(
        "file descriptor limit below the connection cap",
        extra={"wanted": wanted, "cap": cap, "nofile": soft},
    )
    return cap


def _log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's own reports: a peer's network error is routine (debug), the rest is not."""
    err = context.get("exception")
    if isinstance(err, (ConnectionError, ssl.SSLError, TimeoutError)):
        log.debug("connection error: %s", context.get("message"), exc_info=err)
        return
    log.warning("event loop: %s", context.get("message"), exc_info=err)
