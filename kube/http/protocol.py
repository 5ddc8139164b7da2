"""uvicorn's httptools protocol with the deadlines and caps a webhook facing the network needs.

uvicorn (llhttp through httptools) does the HTTP/1.1 work: parsing, keep-alive, pipelining,
`100 Continue`, flow control, graceful shutdown. What it leaves open, this subclass closes:
- a connection that never sends a request is closed after `idle_timeout` (uvicorn arms its
  keep-alive timer only after a first response);
- a request must arrive whole (request line, headers, body) within `request_timeout` of its
  first byte: one deadline, not per read, so a client trickling a byte a second is cut (408);
- the request line and the header block are capped while they arrive (414, 431), before
  llhttp buffers them;
- at most `cap` connections are open: when full, the connection idle the longest is closed to
  make room (one being served never is);
- parse errors are answered with the API server's metav1.Status JSON, like every other error.
TLS handshakes that never complete are counted by `Connections.handshake_watch`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from kube.http.messages import quote, status_bytes

log = logging.getLogger("lumigo.webhook.server")
LOG_INTERVAL = 60.0  # seconds between two log lines about failed handshakes


@dataclass
class Connections:
    """Per-server connection bookkeeping shared by its protocols (event loop thread only)."""

    cap: int
    idle_timeout: float
    request_timeout: float
    handshake_timeout: float
    max_request_line: int
    max_header_bytes: int
    max_headers: int
    name: str = "http-server"
    accepted: int = 0
    evicted: int = 0
    handshake_failures: int = 0
    # Connections waiting for a request, the one idle the longest first.
    idle: collections.OrderedDict[BoundedProtocol, None] = field(
        default_factory=collections.OrderedDict
    )
    # Protocols created for accepted sockets whose TLS handshake is not over: (created, made?).
    handshaking: collections.deque[tuple[float, list[bool]]] = field(
        default_factory=collections.deque
    )
    _failures_logged: int = 0
    _logged_at: float = -LOG_INTERVAL

    def handshake_watch(self) -> list[bool]:
        """Called for every accepted socket; the flag is set once its handshake is over."""
        self.sweep_handshakes()
        made = [False]
        self.handshaking.append((time.monotonic(), made))
        return made

    def sweep_handshakes(self) -> None:
        """Sockets whose handshake did not finish within its deadline failed (asyncio aborts a
        late one; a refused one never reaches `connection_made`). Logged once a minute at most:
        a client that does not trust our certificate (a stale caBundle) shows up here, a port
        scanner must not flood the log."""
        horizon = time.monotonic() - self.handshake_timeout - 0.5
        failed = 0
        while self.handshaking and (self.handshaking[0][1][0] or self.handshaking[0][0] < horizon):
            _, made = self.handshaking.popleft()
            failed += not made[0]
        if not failed:
            return
        self.handshake_failures += failed
        now = time.monotonic()
        if now - self._logged_at < LOG_INTERVAL:
            return
        self._logged_at = now
        count = self.handshake_failures - self._failures_logged
        self._failures_logged = self.handshake_failures
        log.warning(
            "TLS handshakes failing or not completed (an untrusted certificate, a stale "
            "caBundle, or a client that connects and says nothing)",
            extra={"server": self.name, "failures": count},
        )


class BoundedProtocol(HttpToolsProtocol):
    """One connection: uvicorn's protocol plus the deadlines and caps of `Connections`."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        limits: Connections,
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self._handshaken = limits.handshake_watch()
        self._deadline: asyncio.TimerHandle | None = None
        self._in_head = True  # the next bytes are a request line or headers
        self._head_bytes = 0  # of the head being read
        self._header_bytes = 0  # of the header fields parsed so far
        self._completed = 0  # requests read whole on this connection

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._handshaken[0] = True
        super().connection_made(transport)
        limits = self.limits
        limits.accepted += 1
        if len(self.connections) > limits.cap:
            victim = next(iter(limits.idle), None)
            if victim is None:  # every connection is being served: refuse the new one
                transport.abort()
                return
            limits.evicted += 1
            limits.idle.pop(victim, None)  # not chosen again before its connection_lost
            victim.transport.abort()
        self._mark_idle()
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.idle.pop(self, None)
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        whole_chunk_is_head = self._in_head
        completed = self._completed
        try:
            self.parser.feed_data(data)
        except _Refused as refused:
            self._refuse(refused.status, refused.message)
        except httptools.HttpParserCallbackError as err:
            cause = err.__context__
            if not isinstance(cause, _Refused):
                raise
            self._refuse(cause.status, cause.message)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as err:
            self._parse_error(err)
        if not self._in_head or self.transport.is_closing():
            return
        if not whole_chunk_is_head or completed != self._completed:
            self._head_bytes = 0  # part of this chunk was a body: at most one chunk uncounted
            return
        # llhttp buffers a header until it is whole: cap the head while it arrives.
        self._head_bytes += len(data)
        if self._head_bytes > self.limits.max_request_line + self.limits.max_header_bytes:
            self._refuse(431, "request header fields too large")

    # -- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.limits.idle.pop(self, None)
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.request_timeout, self._expired)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_request_line:
            raise _Refused(414, "request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._header_bytes += len(name) + len(value) + 4
        if len(self.headers) > self.limits.max_headers:
            raise _Refused(431, "Too many headers")
        if self._header_bytes > self.limits.max_header_bytes:
            raise _Refused(431, "request header fields too large")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = self._header_bytes = 0
        version = self.parser.get_http_version()
        if not version.startswith("1."):
            raise _Refused(505, f"Invalid HTTP version ({quote('HTTP/' + version)})")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._completed += 1
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._mark_idle()

    # -- helpers -----------------------------------------------------------------------------------
    def _mark_idle(self) -> None:
        self.limits.idle[self] = None
        self.limits.idle.move_to_end(self)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        """The request did not arrive whole in time: 408, unless its answer has begun."""
        self._deadline = None
        if self.cycle is not None and self.cycle.response_started:
            return
        self._refuse(408, "the request did not arrive in time")

    def _parse_error(self, err: httptools.HttpParserError) -> None:
        reason = str(err) or type(err).__name__
        if "version" in reason.lower():
            self._refuse(505, f"Invalid HTTP version ({quote(reason)})")
        else:
            self._refuse(400, f"Bad request: {quote(reason)}")

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, f"Bad request: {quote(msg)}")

    def _refuse(self, status: int, message: str) -> None:
        """Answer with a metav1.Status error and close: the stream can no longer be trusted."""
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the application's answer, if any, is dropped
            self.cycle.message_event.set()
        self.transport.write(status_bytes(status, message))
        self.transport.close()


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
