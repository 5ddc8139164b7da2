"""Clients that announce large bodies and trickle them cannot starve normal admissions.

Issue 28 item 3: every request used to reserve its announced Content-Length from the shared body
budget before a byte of its body arrived, so five connections announcing 6.4 MiB each held the
whole 32 MiB and every admission waited for room until it was refused (the defaulter's
failurePolicy Fail then refuses every `Lumigo` change). Bytes are now counted as they arrive,
small bodies never wait behind large ones, a body that arrives too slowly is cut, and a large
body that finds the budget full is refused at once. Figures: bench/webhook_slow_clients.py.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from envtest.process import wait_until
from kube.http.server import ServerOptions
from kube.http.tls import ServingTLS
from tests.support import reviews, standin_handler
from tests.support.webhook_server import (
    client_context,
    close_all,
    exchange,
    message,
    new_pki,
    post,
    running,
    tls_connections,
    tls_socket,
)

PATH = "/v1alpha1/inject"
ROUTES = {PATH: standin_handler.handle}
SLOW = 20


def loaded_tls() -> tuple[ServingTLS, ssl.SSLContext]:
    pki = new_pki()
    tls = ServingTLS()
    tls.load_pem(pki.serving.cert_pem, pki.serving.key_pem)
    return tls, client_context(pki)


def head(length: int) -> bytes:
    return (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()  # fmt: skip


@contextlib.contextmanager
def trickling(socks: list[ssl.SSLSocket], first: bytes) -> Iterator[None]:
    """Each connection sends `first`, then a body byte a second until the block ends."""
    stop = threading.Event()

    def run() -> None:
        for sock in list(socks):
            with contextlib.suppress(OSError):
                sock.sendall(first)
        while not stop.wait(1.0):  # the trickle's pace, not a wait for a condition
            for sock in list(socks):
                try:
                    sock.sendall(b" ")
                except OSError:
                    socks.remove(sock)

    thread = threading.Thread(target=run, name="trickler", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def admit(port: int, context: ssl.SSLContext) -> tuple[int, bytes]:
    client = reviews.Client(port, context, timeout=30)
    try:
        return client.post(PATH, reviews.body_of(reviews.review(reviews.deployment(), uid="ok")))
    finally:
        client.close()


def test_an_admission_is_served_while_20_connections_announce_large_bodies_and_trickle() -> None:
    announced = ServerOptions().body_budget_bytes // 5  # five of them add up to the budget
    assert announced <= ServerOptions().max_body_bytes
    tls, context = loaded_tls()
    with running(ROUTES, tls, request_timeout=60.0) as server:
        slow = tls_connections(server.port, context, SLOW)
        try:
            with trickling(slow, head(announced) + b'{"kind":' + b" " * 16384):
                for _ in range(3):
                    status, reply = admit(server.port, context)
                    assert status == 200, message(reply)
                    assert json.loads(reply)["response"]["uid"] == "ok"
        finally:
            close_all(slow)


def test_a_body_trickled_slower_than_the_minimum_rate_is_cut_before_the_request_deadline() -> None:
    """A byte every 0.2 s never stalls for long, but is far below the minimum rate."""
    tls, context = loaded_tls()
    with (
        running(ROUTES, tls, request_timeout=600.0) as server,
        tls_socket(server.port, context) as sock,
    ):
        sock.sendall(head(1_000_000) + b'{"kind":')
        sock.settimeout(0.2)  # the trickle's pace
        reply = b""
        for _ in range(600):  # 120 s: the answer must come long before the 600 s deadline
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    sock.sendall(b" ")
                continue
            if not chunk:
                break
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert b"connection: close" in rest.lower()
    assert "too slowly" in message(rest.partition(b"\r\n\r\n")[2])


def test_a_large_body_that_finds_the_budget_full_is_refused_at_once_with_503() -> None:
    """A body that does not fit next to the bytes another one holds is refused at once, instead
    of both waiting for each other; the one holding the room completes."""
    size = 3 * 1024 * 1024
    body = reviews.body_of(reviews.review(reviews.deployment(), uid="big"))
    body += b" " * (size - len(body))
    tls, context = loaded_tls()
    options = {"max_body_bytes": size, "body_budget_bytes": 4 * 1024 * 1024,
               "request_timeout": 600.0}  # fmt: skip
    with (
        running(ROUTES, tls, **options) as server,
        tls_socket(server.port, context) as first,
        tls_socket(server.port, context) as second,
    ):
        first.sendall(head(size) + body[:-1])
        wait_until(lambda: server.body_bytes_held >= size - 2**17, 30, "the first body to arrive")
        status, headers, reply = exchange(second, head(size) + body[: 2 * 1024 * 1024])
        assert status == 503
        assert headers["connection"] == "close"
        assert "too many large request bodies" in message(reply)
        status, _, reply = exchange(first, body[-1:])
        assert status == 200
        assert json.loads(reply)["response"]["uid"] == "big"


def test_a_body_is_not_cut_for_the_time_the_server_itself_was_held_up() -> None:
    """The client sends its whole body while the server's event loop is busy (here a handler
    that blocks it for 3 s, longer than the 2 s a body may pause): when the loop runs again, the
    body's deadline has passed, but what arrived meanwhile is read before anything is cut."""
    held, release = threading.Event(), threading.Event()

    def hold(body: bytes, content_type: str) -> Mapping[str, Any]:
        held.set()
        release.wait(3)  # blocks the event loop (small bodies are handled on it)
        return standin_handler.handle(body, content_type)

    body = reviews.body_of(reviews.review(reviews.deployment(), uid="late"))
    body += b" " * (256 * 1024 - len(body))
    tls, context = loaded_tls()
    with (
        running({"/hold": hold, **ROUTES}, tls, request_timeout=600.0) as server,
        tls_socket(server.port, context) as large,
        tls_socket(server.port, context) as small,
    ):
        large.sendall(head(len(body)) + body[:100_000])
        wait_until(lambda: server.body_bytes_held > 0, 30, "the large body to be read")
        small.sendall(post("/hold", reviews.body_of(reviews.review(reviews.deployment()))))
        assert held.wait(30)
        large.sendall(body[100_000:])  # all of it, while the loop is held up
        status, _, reply = exchange(large, b"")
        assert status == 200, message(reply)
        assert json.loads(reply)["response"]["uid"] == "late"
