"""A plain `Request -> Response` handler as an ASGI application, with bounded bodies.

The framing rules of a webhook are checked before a byte of body is read (so `100 Continue` is
only sent for a body we accept): one Content-Length, no chunked body (411), at most
`max_body_bytes` (413, 7 MiB: the API server caps an object at 3 MiB and a review holds object +
oldObject, like controller-runtime's limit). Memory stays bounded whatever the clients do, and
no client can make another wait for room:
- A large body (above `INLINE_BYTES`) is counted against `body_budget_bytes` as its bytes arrive,
  a quantum ahead of them, never by what its Content-Length announces: a client that announces
  7 MiB and trickles holds only what it sent. A body that needs room when the budget is full is
  refused at once (503, Retry-After) and its bytes are released, so bodies never wait for each
  other (with room for four, five that each hold a fifth would otherwise all wait forever).
- A small body (almost every admission: a few KiB) is never counted and never waits: uvicorn
  stops reading a connection with more than 64 KiB (`INLINE_BYTES`) of body unread, so the
  connection cap already bounds what small bodies hold.
- A body must keep arriving: no pause longer than `body_grace`, and after the first
  `body_grace` seconds at least `min_body_rate` bytes/s on average (408 otherwise, closing), so
  a trickling client gives its connection and its bytes back within seconds, well before the
  request deadline of the protocol.
- Bodies being handled at once are capped by `handler_budget_bytes`, because a JSON body
  expands ~24x into Python objects (one 7 MiB review peaks at ~235 MiB in the inject handler),
  and, when the processes of a pod share `large_slots`, by those across the pod
  (`kube.http.memory`).
Small requests (~0.2 ms of CPU) are handled on the event loop; large ones on a thread, so they
never hold up the small ones behind them.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from kube.http.memory import QUANTUM, LargeBodySlots
from kube.http.messages import Request, RequestHandler, Response, quote, status_response

log = logging.getLogger("lumigo.webhook.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

INLINE_BYTES = 64 * 1024  # bodies up to this size are never counted, and handled on the loop
LATE = 0.25  # seconds past a body deadline that mean this loop, not the client, was held up
_DIGITS = re.compile(r"[0-9]+")
_MAX_LENGTH_DIGITS = 15  # a Content-Length longer than this is refused unread (and not shown)


@dataclass(frozen=True)
class BodyLimits:
    max_body_bytes: int
    body_budget_bytes: int  # bytes of large bodies held at once, counted as they arrive
    handler_budget_bytes: int  # bytes of large bodies being handled at once
    wait_timeout: float  # the longest a body waits for room to be handled (then 503)
    min_body_rate: float  # bytes/s a body must arrive at on average, after `body_grace`
    body_grace: float  # seconds a body may pause, or lag behind `min_body_rate`
    # Shared with the other processes of the pod: one is held while a large body is handled.
    large_slots: LargeBodySlots | None = None


class HandlerApp:
    """Serves `handler` as an ASGI application (HTTP only; no lifespan, no websockets)."""

    def __init__(
        self,
        handler: RequestHandler,
        limits: BodyLimits,
        pool: concurrent.futures.Executor,
        name: str = "http-server",
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.pool = pool
        self.name = name
        self._bodies = ByteBudget(max(limits.body_budget_bytes, limits.max_body_bytes))
        self._handling = ByteBudget(max(limits.handler_budget_bytes, limits.max_body_bytes))
        # Draining (see HTTPServer.drain): every response closes its connection.
        self.closing = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            headers, lengths = _headers(scope["headers"])
            if "transfer-encoding" in headers:
                raise _Refused(
                    status_response(411, "send the body with a Content-Length", close=True)
                )
            length = _content_length(lengths, self.limits.max_body_bytes)
        except _Refused as refused:
            await _send(send, refused.response)
            return
        target = scope["raw_path"].decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        held = _Held(self._bodies if (length or 0) > INLINE_BYTES else None)
        try:
            body = await self._read_body(receive, length or 0, held)
            if body is None:
                return  # the client went away
            request = Request(scope["method"], target, headers, body, length)
            del body
            response = await self._handle(request)
        except _Refused as refused:
            response = refused.response
        finally:
            held.release()
        if self.closing and not response.close:
            response = dataclasses.replace(response, close=True)
        await _send(send, response)

    @property
    def body_bytes_held(self) -> int:
        """Bytes of large bodies counted against the budget right now."""
        return self._bodies.capacity - self._bodies.free

    async def _read_body(self, receive: Receive, size: int, held: _Held) -> bytes | None:
        """The body, counted in `held` a quantum ahead of its bytes; None if the client left.
        Raises _Refused when the budget has no room (503) or the body is too slow (408)."""
        if not size:
            return b""
        limits = self.limits
        chunks: list[bytes] = []
        received = 0
        loop = asyncio.get_running_loop()
        started = last = loop.time()
        not_before = started
        while True:
            if not held.cover(min(size, received + QUANTUM)):
                message = (
                    f"too many large request bodies at once ({self._bodies.capacity} "
                    f"bytes held): try again"
                )
                raise _Refused(
                    status_response(503, message, headers={"Retry-After": "1"}, close=True)
                )
            deadline = min(last, started + received / limits.min_body_rate) + limits.body_grace
            try:
                async with asyncio.timeout_at(max(deadline, not_before)):
                    event = await receive()
            except TimeoutError:
                now = loop.time()
                if now - max(deadline, not_before) > LATE:
                    # This loop was held up (a large parse holding the GIL; a starved CPU):
                    # what the client sent meanwhile is not read yet. Look again first.
                    not_before = now + LATE
                    continue
                message = (
                    f"the request body arrives too slowly ({received} of {size} bytes; "
                    f"at least {limits.min_body_rate:.0f} bytes/s, with pauses of at "
                    f"most {limits.body_grace:g} s)"
                )
                raise _Refused(status_response(408, message, close=True)) from None
            if event["type"] == "http.disconnect":
                return None
            if chunk := event.get("body", b""):
                chunks.append(chunk)
                received += len(chunk)
                last = loop.time()
                held.take_at_least(received)
            if not event.get("more_body", False):
                return b"".join(chunks)

    async def _handle(self, request: Request) -> Response:
        size = len(request.body)
        if size <= INLINE_BYTES:
            return self._run(request)
        if not await self._handling.claim(size, self.limits.wait_timeout):
            return status_response(503, "too many large requests at once: try again")
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.pool, self._run_large, request)
        finally:
            self._handling.release(size)

    def _run_large(self, request: Request) -> Response:
        """On a pool thread: handled once a slot of the pod is ours (if slots are shared)."""
        slots = self.limits.large_slots
        if slots is None:
            return self._run(request)
        with slots.hold(self.limits.wait_timeout) as held:
            if not held:
                return status_response(
                    503, "too many large requests at once: try again", headers={"Retry-After": "1"}
                )
            return self._run(request)

    def _run(self, request: Request) -> Response:
        try:
            return self.handler(request)
        except Exception:
            log.exception("request handler failed", extra={"server": self.name})
            return status_response(500, "internal error while handling the request")


async def _send(send: Send, response: Response) -> None:
    headers = [
        (b"content-type", response.content_type.encode("latin-1")),
        (b"content-length", str(len(response.body)).encode("ascii")),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()),
    ]
    if response.close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def _headers(raw: list[tuple[bytes, bytes]]) -> tuple[dict[str, str], list[str]]:
    """Headers by lower-case name (repeats joined with ", ") and every Content-Length given."""
    headers: dict[str, str] = {}
    lengths: list[str] = []
    for name, value in raw:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip(" \t")
        if key == "content-length":
            lengths.append(text)
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers, lengths


def _content_length(lengths: list[str], max_body_bytes: int) -> int | None:
    """The one Content-Length, within the body limit (None: no body announced)."""
    if len(lengths) > 1:
        raise _Refused(
            status_response(400, "the request has more than one Content-Length header", close=True)
        )
    if not lengths:
        return None
    raw = lengths[0]
    if not _DIGITS.fullmatch(raw):
        raise _Refused(status_response(400, f"invalid Content-Length {quote(raw)}", close=True))
    if len(raw) > _MAX_LENGTH_DIGITS or int(raw) > max_body_bytes:
        shown = raw if len(raw) <= _MAX_LENGTH_DIGITS else f"more than 10^{_MAX_LENGTH_DIGITS}"
        message = f"the body ({shown} bytes) is larger than the {max_body_bytes} bytes accepted"
        raise _Refused(status_response(413, message, close=True))
    return int(raw)


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


class _Held:
    """The bytes one request holds in a budget (None: a small body, never counted)."""

    def __init__(self, budget: ByteBudget | None) -> None:
        self.budget = budget
        self.bytes = 0

    def cover(self, total: int) -> bool:
        """Hold `total` bytes, if the budget has room for what that adds."""
        if self.budget is None or total <= self.bytes:
            return True
        if not self.budget.try_acquire(total - self.bytes):
            return False
        self.bytes = total
        return True

    def take_at_least(self, total: int) -> None:
        """Bytes that arrived beyond what was covered (uvicorn reads ahead up to 64 KiB) are
        here already: counted even when they overdraw the budget."""
        if self.budget is not None and total > self.bytes:
            self.budget.overdraw(total - self.bytes)
            self.bytes = total

    def release(self) -> None:
        if self.budget is not None:
            self.budget.release(self.bytes)
        self.bytes = 0


class ByteBudget:
    """At most `capacity` bytes held at once (event loop thread only). Waiters are served in
    order, but one that does not fit yet does not hold back smaller ones behind it: a normal
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

    async def claim(self, size: int, timeout: float) -> bool:
        """Take `size` bytes, waiting `timeout` seconds at the most."""
        if self.try_acquire(size):
            return True
        try:
            async with asyncio.timeout(timeout):
                await self.acquire(size)
        except TimeoutError:
            return False
        return True

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

    def overdraw(self, size: int) -> None:
        """Count bytes that are held already, even beyond the capacity."""
        self.free -= size

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
