"""Idle, trickling and silent clients cannot keep a legitimate admission from being served.

Issue 14 item 3: with failurePolicy Fail on the defaulter, a webhook whose threads are all held
by idle or slow connections blocks every `Lumigo` change. Each test opens a crowd of 1,000
connections, then checks that an ordinary admission still succeeds (the latency figures are
printed by bench/webhook_slow_clients.py; tests do not assert on time).
"""

from __future__ import annotations

import re
import select
import ssl
import time
from pathlib import Path

import pytest

from envtest.process import wait_until
from kube.http.server import ServerOptions
from kube.http.tls import ServingTLS
from tests.support import reviews, standin_handler
from tests.support.webhook_server import (
    Trickler,
    client_context,
    close_all,
    message,
    new_pki,
    raise_fd_limit,
    running,
    tcp_connections,
    tls_connections,
    tls_socket,
)

PATH = "/v1alpha1/inject"
ROUTES = {PATH: standin_handler.handle}
CROWD = 1000
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _room_for_a_crowd() -> None:
    raise_fd_limit(4 * CROWD + 1024)  # client and server ends live in this process


def loaded_tls() -> tuple[ServingTLS, ssl.SSLContext]:
    pki = new_pki()
    tls = ServingTLS()
    tls.load_pem(pki.serving.cert_pem, pki.serving.key_pem)
    return tls, client_context(pki)


def admit(port: int, context: ssl.SSLContext) -> int:
    """One admission on a new connection, as the API server makes after an idle close."""
    client = reviews.Client(port, context, timeout=20)
    try:
        body = reviews.body_of(reviews.review(reviews.deployment(), uid="legit"))
        return client.post(PATH, body)[0]
    finally:
        client.close()


def test_an_admission_is_served_among_1000_idle_tls_connections() -> None:
    tls, context = loaded_tls()
    with running(ROUTES, tls) as server:
        crowd = tls_connections(server.port, context, CROWD)
        try:
            assert admit(server.port, context) == 200
            assert server.connections >= CROWD  # kept open: idle connections cost no thread
        finally:
            close_all(crowd)


def test_an_admission_is_served_among_1000_connections_trickling_a_request() -> None:
    tls, context = loaded_tls()
    with running(ROUTES, tls) as server:
        crowd = tls_connections(server.port, context, CROWD)
        try:
            with Trickler(crowd, interval=1.0) as trickler:
                wait_until(lambda: trickler.sent >= 2, 30, "every connection to start a request")
                assert admit(server.port, context) == 200
        finally:
            close_all(crowd)


def test_an_admission_is_served_among_1000_tcp_connections_that_never_handshake() -> None:
    tls, context = loaded_tls()
    with running(ROUTES, tls) as server:
        crowd = tcp_connections(server.port, CROWD)
        try:
            assert admit(server.port, context) == 200
        finally:
            close_all(crowd)


def trickle_until_answered(sock: ssl.SSLSocket, data: bytes, pace: float) -> bytes:
    """Send `data` a byte at a time until the server answers; return what it answered."""
    deadline = time.monotonic() + 60
    for i in range(len(data)):
        if time.monotonic() > deadline:
            break
        sock.sendall(data[i : i + 1])
        readable, _, _ = select.select([sock], [], [], pace)  # the pace of the trickle
        if readable or sock.pending():
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer
    raise AssertionError("the server never answered a request trickled byte by byte")


def test_a_request_trickled_byte_by_byte_is_cut_at_one_total_deadline() -> None:
    tls, context = loaded_tls()
    with (
        running(ROUTES, tls, request_timeout=1.0) as server,
        tls_socket(server.port, context) as sock,
    ):
        answer = trickle_until_answered(sock, Trickler.HEAD, pace=0.05)
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 408 Request Timeout"
        assert b"Connection: close" in rest
        assert "did not arrive in time" in message(rest.partition(b"\r\n\r\n")[2])


def test_the_handshake_deadline_is_below_the_webhook_timeout() -> None:
    """A silent client must be dropped before the API server gives up on the webhook call."""
    manifests = [
        ROOT / "config" / "webhook" / "manifests.yaml",
        ROOT / "charts" / "lumigo-operator" / "templates" / "webhooks.yaml",
    ]
    timeouts = [
        int(found)
        for path in manifests
        for found in re.findall(r"timeoutSeconds: (\d+)", path.read_text())
    ]
    assert timeouts
    assert ServerOptions().handshake_timeout < min(timeouts)
