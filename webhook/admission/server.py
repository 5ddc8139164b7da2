"""Bounded HTTP/1.1 serving (TLS optional) and the HTTPS admission server built on it.

Why a reactor: a thread per connection lets idle, trickling or silent clients take every thread
(128 idle TLS connections blocked every admission, a client sending a byte a second held a
worker forever). Here one asyncio event loop thread owns every socket, and holding a connection
open costs a little memory, never a thread:
- TLS handshakes are non-blocking, each under `handshake_timeout` (3 s, below the 5 s
  `timeoutSeconds` of our webhooks), and new connections use the current certificate of the
  `ServingTLS` (hot swap without restart).
- A request must arrive whole (request line, headers and body) within `request_timeout` of its
  first byte: one deadline for the whole request, not per read. Request line, header count and
  header bytes are capped (414, 431). Idle keep-alive connections wait up to `idle_timeout`
  (120 s, above the API server's 90 s, so the client closes first and no POST races a close).
- At most `max_connections` connections are open (handshaking ones included). When full, the
  connection idle (or unfinished) the longest is closed to make room; a connection whose
  request is being handled is never closed for that.
- Only complete requests reach the `workers` threads that run the handler; the response leaves
  in one write on a TCP_NODELAY socket, flushed under a deadline.

Memory is bounded before bytes are read: the body is refused (413, before any `100 Continue`)
above `max_body_bytes` (7 MiB: the API server caps an object at 3 MiB and a review holds object +
oldObject, like controller-runtime's limit); bodies held at once are capped by `body_budget_bytes`
(claimed by Content-Length before reading); bodies being handled at once by
`handler_budget_bytes`, because a JSON body expands ~24x into Python objects (one 7 MiB review
peaks at ~220 MiB in the inject handler): the default lets one maximum-size request run next to
any number of small ones, so the operator stays under its 512 Mi limit.

Errors use the metav1.Status JSON body (readable with curl; the API server shows its message):
400 for a malformed request (two Content-Length headers included), 408 for a request that did
not arrive in time, 411/413/414/431/505 for framing problems (and the connection is closed), 503
when large requests queued past their deadline. `AdmissionServer` adds: 200 with the route's
AdmissionReview, 400 when the route raises BadRequest, 404/405, and 500 only for a bug in a route
(logged with its stack, never with the body, which can hold secrets from the workload's spec).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import re
import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from webhook.admission.metrics import LATENCY_SECONDS, REQUESTS_IN_FLIGHT, REQUESTS_TOTAL
from webhook.admission.readiness import NotReady
from webhook.admission.review import MAX_BODY_BYTES, quote
from webhook.admission.routing import BadRequest, Route
from webhook.admission.tls import ServingTLS

log = logging.getLogger("lumigo.webhook.server")

MiB = 1024 * 1024
FD_RESERVE = 256  # file descriptors kept for everything but served connections


@dataclass(frozen=True)
class ServerOptions:
    host: str = "0.0.0.0"  # noqa: S104 - the API server reaches us through the Service
    port: int = 9443
    max_connections: int = 2048  # open at once (~21 KiB each when idle); oldest idle closed first
    workers: int = 8  # threads running handlers (CPU-bound under the GIL: more would not help)
    idle_timeout: float = 120.0
    request_timeout: float = 10.0  # first byte of a request -> its body complete
    handshake_timeout: float = 3.0
    max_body_bytes: int = MAX_BODY_BYTES
    body_budget_bytes: int = 32 * MiB  # bodies held at once (claimed before reading)
    handler_budget_bytes: int = MAX_BODY_BYTES + MiB  # bodies being handled at once
    max_request_line: int = 8192
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    shutdown_timeout: float = 10.0
    backlog: int = 1024


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: Mapping[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    content_length: int | None  # None: the request had no Content-Length

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection after this response


RequestHandler = Callable[[Request], Response]


def status_response(
    code: int, message: str, *, close: bool = False, headers: Mapping[str, str] | None = None
) -> Response:
    """A metav1.Status error body, like the API server's own."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": HTTPStatus(code).phrase.replace(" ", ""),
        "code": int(code),
    }
    return Response(code, json.dumps(status).encode(), headers=headers or {}, close=close)


class BoundedHTTPServer:
    """Serves `handler` over HTTP/1.1 with keep-alive, over TLS when `tls` is given."""

    def __init__(
        self,
        handler: RequestHandler,
        options: ServerOptions,
        *,
        tls: ServingTLS | None = None,
        name: str = "http-server",
    ) -> None:
        self.handler = handler
        self.options = options
        self.tls = tls
        self.name = name
        self.accepted = 0  # connections accepted so far (tells keep-alive reuse apart from churn)
        self.evicted = 0  # connections closed to make room for new ones
        self.handshake_failures = 0
        self._handshake_failures_logged = 0
        self._handshake_logged_at = -60.0
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._server: asyncio.AbstractServer | None = None
        self._stopping = threading.Event()
        self._cap = options.max_connections
        # Loop-thread state: every open connection, and the evictable ones, longest idle first.
        self._connections: set[_Connection] = set()
        self._evictable: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self._lingering: set[_Connection] = set()  # closed by us, waiting for the client's FIN
        self._drained: asyncio.Event | None = None
        self._bodies = _ByteBudget(max(options.body_budget_bytes, options.max_body_bytes))
        self._handling = _ByteBudget(max(options.handler_budget_bytes, options.max_body_bytes))

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the server is not started")
        return int(self._listener.getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open right now (handshaking ones included)."""
        return len(self._connections)

    def is_stopping(self) -> bool:
        return self._stopping.is_set()

    def listening(self) -> bool:
        return self._listener is not None and not self._stopping.is_set()

    def start(self) -> None:
        if self._listener is not None:
            return
        opts = self.options
        self._cap = _connection_cap(opts.max_connections)
        family = socket.AF_INET6 if ":" in opts.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((opts.host, opts.port))
        listener.setblocking(False)
        self._listener = listener
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=opts.workers, thread_name_prefix=f"{self.name}-worker"
        )
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_log_loop_error)
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(listener), loop).result()
        log.info(
            "server listening",
            extra={
                "server": self.name,
                "address": f"{opts.host}:{self.port}",
                "tls": bool(self.tls),
            },
        )

    async def _listen(self, listener: socket.socket) -> None:
        self._drained = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), sock=listener, backlog=self.options.backlog
        )

    def stop(self) -> None:
        """Stop accepting, close idle connections, let requests under way finish (bounded)."""
        if self._loop is None or self._stopping.is_set():
            return
        self._stopping.set()
        loop = self._loop
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join()
        loop.close()
        log.info("server stopped", extra={"server": self.name})

    async def _shutdown(self) -> None:
        assert self._server is not None
        assert self._drained is not None
        self._server.close()
        for conn in list(self._connections):
            conn.close_if_idle()
        if self._connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self.options.shutdown_timeout)
        for conn in list(self._connections) + list(self._lingering):  # past the deadline
            conn.abort()

    # -- connection accounting (loop thread) ----------------------------------------------------
    def _admit(self, conn: _Connection) -> bool:
        """Make room for `conn`: close the connection idle the longest if we are full."""
        if self._stopping.is_set():
            return False
        if len(self._connections) >= self._cap:
            if not self._evictable:
                return False  # every connection is being served: refuse the new one
            victim = next(iter(self._evictable))
            self.evicted += 1
            victim.abort()
        self.accepted += 1
        self._connections.add(conn)
        self._evictable[conn] = None
        return True

    def _idle(self, conn: _Connection) -> None:
        """`conn` waits for its next request: evictable, and the newest idle one."""
        if conn in self._connections:
            self._evictable[conn] = None
            self._evictable.move_to_end(conn)

    def _linger(self, conn: _Connection) -> None:
        self._lingering.add(conn)
        assert self._loop is not None
        self._loop.call_later(_LINGER, conn.abort)

    def _busy(self, conn: _Connection) -> None:
        self._evictable.pop(conn, None)

    def _forget(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        self._evictable.pop(conn, None)
        if not self._connections and self._stopping.is_set() and self._drained is not None:
            self._drained.set()

    def _handshake_failed(self, peer: Any, err: BaseException) -> None:
        """Log failed handshakes at most once a minute: a client that does not trust our
        certificate (a stale caBundle) shows up here, a port scanner must not flood the log."""
        self.handshake_failures += 1
        now = time.monotonic()
        if now - self._handshake_logged_at < 60.0:
            return
        self._handshake_logged_at = now
        count = self.handshake_failures - self._handshake_failures_logged
        self._handshake_failures_logged = self.handshake_failures
        log.warning(
            "TLS handshakes failing",
            extra={
                "server": self.name,
                "failures": count,
                "last_peer": str(peer),
                "last_error": str(err) or type(err).__name__,
            },
        )

    # -- handling (worker threads) --------------------------------------------------------------
    def _run_handler(self, request: Request) -> Response:
        try:
            return self.handler(request)
        except Exception:
            log.exception("request handler failed", extra={"server": self.name})
            return status_response(500, "internal error while handling the request")


class AdmissionServer(BoundedHTTPServer):
    """Serves `routes` (path -> Route) over HTTPS with the certificate held by `tls`."""

    def __init__(
        self, routes: Mapping[str, Route], tls: ServingTLS, options: ServerOptions | None = None
    ) -> None:
        super().__init__(self._admit_request, options or ServerOptions(), tls=tls, name="webhook")
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


# --- one connection -------------------------------------------------------------------------

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)")
_DIGITS = re.compile(r"[0-9]+")
_READ_AHEAD = 256 * 1024  # bytes buffered past what is being read before reading pauses
_TLS_READ = 64 * 1024  # plaintext taken from TLS at a time
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LINGER = 0.5  # seconds a closed connection's late input is dropped (Go: rstAvoidanceDelay)
_MAX_METHOD = 32


class _Refused(Exception):
    """A request answered with an error before reaching the handler."""

    def __init__(self, response: Response) -> None:
        self.response = response


class _PeerGone(Exception):
    pass


@dataclass(frozen=True)
class _Head:
    method: str
    target: str
    headers: dict[str, str]
    content_length: int | None
    keep_alive: bool
    http10: bool
    expects_continue: bool


class _Connection(asyncio.Protocol):
    """One client connection: a coroutine reads requests, the server's workers answer them.

    The protocol callbacks only decrypt, buffer bytes and wake the coroutine; reading pauses
    when more than `_READ_AHEAD` bytes wait unread, so a client cannot grow the buffer at will.
    TLS runs over a pair of memory BIOs (asyncio's own TLS transport keeps a 256 KiB buffer per
    connection: 1,000 idle clients would cost 250 MiB).
    """

    def __init__(self, server: BoundedHTTPServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.buffer = bytearray()  # received, decrypted, not consumed yet
        self.eof = False
        self.idle = False
        self.task: asyncio.Task[None] | None = None
        self.tls: ssl.SSLObject | None = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._handshake: asyncio.Future[None] | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._secure = False
        self._data: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        self._paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._lingering = False

    # -- protocol callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Nagle would hold a response behind unacknowledged bytes (TLS 1.3 session
            # tickets) for the client's delayed ACK: +40 ms on a new connection.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.server._admit(self):
            transport.abort()
            return
        if self.server.tls is not None:
            context = self.server.tls.server_context()
            self.tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
            self._handshake = self.loop.create_future()
            self._handshake_timer = self.loop.call_later(
                self.server.options.handshake_timeout, self._handshake_timed_out
            )
        self.task = self.loop.create_task(self._run())

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # closing: what the client still sends is dropped
        if self.tls is None:
            self._received(data)
            return
        self._incoming.write(data)
        try:
            if not self._secure:
                self.tls.do_handshake()
                self._secure = True
                self._handshake_over(None)
            while self._incoming.pending or self.tls.pending():
                self._received(self.tls.read(_TLS_READ))
        except ssl.SSLWantReadError:  # the rest of a record is still on its way
            pass
        except ssl.SSLZeroReturnError:  # the client's close_notify
            self._peer_closed()
        except ssl.SSLError as err:
            if self._secure:
                self.abort()
            else:
                self._handshake_over(err)
        self._flush()

    def _received(self, data: bytes) -> None:
        self.buffer += data
        if self._data is not None and not self._data.done():
            self._data.set_result(None)
        elif len(self.buffer) > _READ_AHEAD and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._peer_closed()
        return not self._lingering  # a half-closed client still gets its answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._lingering.discard(self)
        self._peer_closed()
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _peer_closed(self) -> None:
        self.eof = True
        if self._data is not None and not self._data.done():
            self._data.set_result(None)
        if not self._secure:
            self._handshake_over(EOFError("closed during the TLS handshake"))

    def _handshake_timed_out(self) -> None:
        timeout = self.server.options.handshake_timeout
        self._handshake_over(TimeoutError(f"no TLS handshake within {timeout:g} s"))

    def _handshake_over(self, err: BaseException | None) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._handshake is None or self._handshake.done():
            return
        if err is None:
            self._handshake.set_result(None)
        else:
            self._handshake.set_exception(err)

    # -- writing and closing ---------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise _PeerGone
        if self.tls is None:
            self.transport.write(data)
            return
        self.tls.write(data)
        self._flush()

    def _flush(self) -> None:
        """Send what TLS has produced (handshake, records, alerts)."""
        if self._outgoing.pending and self.transport is not None:
            self.transport.write(self._outgoing.read())

    def _close(self) -> None:
        """Close politely: TLS close_notify, a FIN once our writes are out, then drop what the
        client still sends for a moment before closing. Closing a socket with unread input
        sends a reset, which can destroy our last answer (a 413 or 414 to a client still
        sending) before the client reads it; Go's net/http lingers the same way."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.tls is not None and self._secure:
            with contextlib.suppress(ssl.SSLError):
                self.tls.unwrap()  # sends close_notify; the client's answer is not awaited
        self._flush()
        if self.eof or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the client is gone already
            transport.abort()
            return
        self._lingering = True
        if self._paused:
            transport.resume_reading()
        self.server._linger(self)

    def abort(self) -> None:
        """Cut the connection now (eviction, or past the shutdown deadline)."""
        self.server._forget(self)
        if self.transport is not None:
            self.transport.abort()
        if self.task is not None:
            self.task.cancel()

    def close_if_idle(self) -> None:
        """On stop: a connection waiting for a request (or still handshaking) is closed now."""
        if self.idle or (self.tls is not None and not self._secure):
            self.server._forget(self)
            if self.task is not None:
                self.task.cancel()

    # -- the request loop ------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            if self._handshake is not None:
                try:
                    await self._handshake
                except (OSError, EOFError) as err:  # ssl.SSLError and TimeoutError included
                    self.server._handshake_failed(self.peer, err)
                    return
            self.server._idle(self)
            while await self._serve_one():
                pass
        except (asyncio.CancelledError, _PeerGone, ConnectionError):
            pass
        except Exception:
            log.exception("connection failed", extra={"server": self.server.name})
        finally:
            self.server._forget(self)
            for timer in (self._timer, self._handshake_timer):
                if timer is not None:
                    timer.cancel()
            self._close()

    async def _fill(self) -> bool:
        """Wait for more bytes; False once the peer has closed and nothing new came. Raises
        TimeoutError once the connection's deadline (`_arm`) has passed."""
        if self._expired:
            raise TimeoutError
        if self.eof:
            return False
        assert self.transport is not None
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        before = len(self.buffer)
        self._data = self.loop.create_future()
        try:
            await self._data
        finally:
            self._data = None
        if self._expired:
            raise TimeoutError
        return len(self.buffer) > before or not self.eof

    def _arm(self, deadline: float) -> None:
        """One timer per connection (cheaper than a timeout context per read): reads fail
        with TimeoutError from `deadline` on."""
        if self._timer is not None:
            self._timer.cancel()
        self._expired = False
        self._timer = self.loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._expired = True
        self._timer = None
        if self._data is not None and not self._data.done():
            self._data.set_result(None)

    async def _serve_one(self) -> bool:
        """Read, handle and answer one request; False when the connection is done."""
        opts = self.server.options
        self.idle = True
        if not self.buffer:
            if self.server.is_stopping():
                return False
            self._arm(self.loop.time() + opts.idle_timeout)
            try:
                if not await self._fill():
                    return False
            except TimeoutError:
                return False
        self.idle = False
        deadline = self.loop.time() + opts.request_timeout
        self._arm(deadline)
        head: _Head | None = None
        claimed = 0
        try:
            try:
                head = await self._read_head()
                length = head.content_length or 0
                if not await _claim(self.server._bodies, length, deadline):
                    raise TimeoutError
                claimed = length
                if length and head.expects_continue:  # only now: the size was checked
                    self._write(_CONTINUE)
                body = await self._read_body(length)
                request = Request(head.method, head.target, head.headers, body, head.content_length)
                del body
                response = await self._handle(request, deadline)
            except TimeoutError:
                response = status_response(408, "the request did not arrive in time", close=True)
            except _Refused as refused:
                response = refused.response
            return await self._respond(response, head)
        finally:
            self.server._bodies.release(claimed)

    async def _read_head(self) -> _Head:
        opts = self.server.options
        scanned = 0
        while True:
            while self.buffer.startswith(b"\r\n"):  # tolerated before a request line
                del self.buffer[:2]
            end = self.buffer.find(b"\r\n\r\n", max(0, scanned - 3))
            scanned = len(self.buffer) if end < 0 else end
            if self.buffer.find(b"\r\n", 0, opts.max_request_line + 2) < 0 and (
                scanned > opts.max_request_line
            ):
                raise _Refused(status_response(414, "request line too long", close=True))
            if scanned > opts.max_header_bytes:
                raise _Refused(status_response(431, "request header fields too large", close=True))
            if end >= 0:
                break
            if not await self._fill():
                raise _PeerGone
        head = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        return _parse_head(head, opts)

    async def _read_body(self, length: int) -> bytes:
        while len(self.buffer) < length:
            if not await self._fill():
                raise _PeerGone
        if len(self.buffer) == length:
            body, self.buffer = bytes(self.buffer), bytearray()
            return body
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return body

    async def _handle(self, request: Request, deadline: float) -> Response:
        """Run the handler on a worker once the body fits the handling budget."""
        size = len(request.body)
        if not await _claim(self.server._handling, size, deadline):
            return status_response(503, "too many large requests at once: try again")
        pool = self.server._pool
        assert pool is not None
        self.server._busy(self)
        answered: asyncio.Future[Response] = self.loop.create_future()
        try:
            job = pool.submit(self.server._run_handler, request)
        except RuntimeError:  # the pool is shutting down
            self.server._handling.release(size)
            raise _PeerGone from None
        del request
        job.add_done_callback(
            lambda job: self.loop.call_soon_threadsafe(self._handled, job, answered, size)
        )
        return await answered

    def _handled(
        self,
        job: concurrent.futures.Future[Response],
        answered: asyncio.Future[Response],
        size: int,
    ) -> None:
        """Back on the loop: the budget is given back when the handler returns, even if this
        connection is gone meanwhile."""
        self.server._handling.release(size)
        if answered.done():
            return
        if job.cancelled():
            answered.set_exception(_PeerGone())
        elif (err := job.exception()) is not None:
            answered.set_exception(err)
        else:
            answered.set_result(job.result())

    async def _respond(self, response: Response, head: _Head | None) -> bool:
        keep_alive = head is not None and head.keep_alive
        close = response.close or not keep_alive or self.server.is_stopping()
        connection = "close" if close else "keep-alive" if head is not None and head.http10 else ""
        lines = [
            f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            *(f"{name}: {value}" for name, value in response.headers.items()),
            f"Connection: {connection}" if connection else "",
        ]
        data = ("\r\n".join(line for line in lines if line) + "\r\n\r\n").encode("latin-1")
        head_only = head is not None and head.method == "HEAD"
        self._write(data if head_only else data + response.body)
        if self._write_paused:  # a client that does not read: give it the request deadline
            self._drain = self.loop.create_future()
            try:
                async with asyncio.timeout(self.server.options.request_timeout):
                    await self._drain
            except TimeoutError:
                self.abort()
                return False
            finally:
                self._drain = None
        if close or self.eof:
            return False
        self.server._idle(self)
        return True


def _parse_head(head: bytes, opts: ServerOptions) -> _Head:
    """Request line and headers, strictly: anything ambiguous is refused and the connection
    closed (two Content-Length headers, Transfer-Encoding, folded or malformed lines)."""
    lines = head.split(b"\r\n")
    method, target, http10 = _parse_request_line(lines[0], opts)
    if len(lines) - 1 > opts.max_headers:
        raise _Refused(status_response(431, "Too many headers", close=True))
    headers, lengths = _parse_headers(lines[1:])
    if "transfer-encoding" in headers:
        raise _Refused(status_response(411, "send the body with a Content-Length", close=True))
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    return _Head(
        method=method,
        target=target,
        headers=headers,
        content_length=_content_length(lengths, opts),
        keep_alive="keep-alive" in tokens if http10 else "close" not in tokens,
        http10=http10,
        expects_continue=headers.get("expect", "").lower() == "100-continue",
    )


def _parse_request_line(request_line: bytes, opts: ServerOptions) -> tuple[str, str, bool]:
    """Method, target and whether the version is HTTP/1.0 (only HTTP/1.x is served)."""
    if len(request_line) > opts.max_request_line:
        raise _Refused(status_response(414, "request line too long", close=True))
    parts = request_line.split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or len(parts[0]) > _MAX_METHOD:
        raise _bad(f"Bad request syntax ({quote(request_line.decode('latin-1'))})")
    method, target, version = parts
    matched = _VERSION.fullmatch(version)
    if matched is None or not target:
        raise _bad(f"Bad request version ({quote(version.decode('latin-1'))})")
    if matched.group(1) != b"1":
        raise _Refused(
            status_response(
                505, f"Invalid HTTP version ({quote(version.decode('latin-1'))})", close=True
            )
        )
    return method.decode("ascii"), target.decode("latin-1"), matched.group(2) == b"0"


def _parse_headers(lines: list[bytes]) -> tuple[dict[str, str], list[str]]:
    """Headers by lower-case name (repeats joined with ", ") and every Content-Length given."""
    headers: dict[str, str] = {}
    lengths: list[str] = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or b"\r" in value or b"\n" in value:
            raise _bad(f"Bad header line ({quote(line.decode('latin-1'))})")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1").strip(" \t")
        if key == "content-length":
            lengths.append(text)
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers, lengths


def _content_length(lengths: list[str], opts: ServerOptions) -> int | None:
    """The one Content-Length, within the body limit (None: no body announced)."""
    if len(lengths) > 1:
        raise _bad("the request has more than one Content-Length header")
    if not lengths:
        return None
    raw = lengths[0]
    if not _DIGITS.fullmatch(raw):
        raise _bad(f"invalid Content-Length {quote(raw)}")
    if len(raw) > 15 or int(raw) > opts.max_body_bytes:
        shown = raw if len(raw) <= 15 else "more than 10^15"
        raise _Refused(
            status_response(
                413,
                f"the body ({shown} bytes) is larger than the {opts.max_body_bytes} bytes accepted",
                close=True,
            )
        )
    return int(raw)


def _bad(message: str) -> _Refused:
    return _Refused(status_response(400, message, close=True))


async def _claim(budget: _ByteBudget, size: int, deadline: float) -> bool:
    """Take `size` bytes of `budget`, waiting until `deadline` at the most."""
    if budget.try_acquire(size):
        return True
    try:
        async with asyncio.timeout_at(deadline):
            await budget.acquire(size)
    except TimeoutError:
        return False
    return True


class _ByteBudget:
    """At most `capacity` bytes held at once (loop thread only). Waiters are served in order,
    but one that does not fit yet does not hold back smaller ones behind it: a normal
    admission never queues behind a 7 MiB one."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def try_acquire(self, size: int) -> bool:
        if size <= self.free:
            self.free -= max(size, 0)
            return True
        return False

    async def acquire(self, size: int) -> None:
        if self.try_acquire(size):
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._waiters.append(entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(size)  # granted just as we were cancelled
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    def release(self, size: int) -> None:
        if size <= 0:
            return
        self.free += size
        for entry in list(self._waiters):
            wanted, granted = entry
            if granted.done():
                continue
            if wanted <= self.free:
                self.free -= wanted
                granted.set_result(None)


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
