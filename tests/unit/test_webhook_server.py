"""The HTTPS admission server on loopback: TLS, keep-alive, errors, limits, hot swap, shutdown."""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import REGISTRY

from envtest.process import wait_until
from kube.http.asgi import INLINE_BYTES
from kube.http.readiness import NotReady
from kube.http.server import AdmissionServer, ServerOptions
from kube.http.tls import InvalidKeyPair, ServingTLS
from tests.support import reviews, standin_handler
from tests.support.webhook_server import (
    client_context,
    exchange,
    message,
    new_pki,
    peer_fingerprint,
    post,
    running,
    tls_socket,
)

PATH = "/v1alpha1/inject"
ROUTES = {PATH: standin_handler.handle}


def loaded_tls() -> tuple[ServingTLS, Any]:
    pki = new_pki()
    tls = ServingTLS()
    tls.load_pem(pki.serving.cert_pem, pki.serving.key_pem)
    return tls, pki


def deployment_body(uid: str = "uid-1") -> bytes:
    return reviews.body_of(reviews.review(reviews.deployment(), uid=uid))


def test_admission_over_tls_with_keep_alive() -> None:
    tls, pki = loaded_tls()
    with running(ROUTES, tls) as server:
        client = reviews.Client(server.port, client_context(pki))
        try:
            first_socket = None
            for i in range(20):
                status, body = client.post(PATH, deployment_body(f"uid-{i}"))
                assert status == 200
                review = json.loads(body)
                assert review["apiVersion"] == "admission.k8s.io/v1"
                assert review["kind"] == "AdmissionReview"
                assert review["response"]["uid"] == f"uid-{i}"
                assert review["response"]["patchType"] == "JSONPatch"
                first_socket = first_socket or client.conn.sock
                assert client.conn.sock is first_socket  # one connection for all 20
            assert first_socket.version() in ("TLSv1.2", "TLSv1.3")
        finally:
            client.close()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_tls_below_1_2_is_refused() -> None:
    tls, pki = loaded_tls()
    old = client_context(pki)
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with running(ROUTES, tls) as server, pytest.raises(ssl.SSLError):  # noqa: SIM117
        with tls_socket(server.port, old):
            pass


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (b"{not json", "application/json", "not valid JSON"),
        (deployment_body(), "text/plain", "Content-Type must be application/json"),
        (b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{}}',
         "application/json", "request.uid is missing"),
        (reviews.body_of(reviews.review({"kind": "Deployment", "spec": []})), "application/json",
         "does not decode"),
        (b"", "application/json", "not valid JSON"),
    ],
)  # fmt: skip
def test_bad_requests_get_400_with_a_clear_message_and_keep_the_connection(
    body: bytes, content_type: str, fragment: str
) -> None:
    tls, pki = loaded_tls()
    with running(ROUTES, tls) as server, tls_socket(server.port, client_context(pki)) as sock:
        status, headers, reply = exchange(sock, post(PATH, body, content_type))
        assert status == 400
        assert fragment in message(reply)
        assert headers.get("connection") != "close"
        status, _, reply = exchange(sock, post(PATH, deployment_body("after")))
        assert status == 200
        assert json.loads(reply)["response"]["uid"] == "after"


@pytest.mark.parametrize(
    ("raw", "status", "fragment", "closes"),
    [
        (b"GET /v1alpha1/inject HTTP/1.1\r\nHost: x\r\n\r\n", 405, "GET is not supported", False),
        (b"PATCH /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 405, "PATCH", False),
        (post("/nowhere", b"{}"), 404, "no admission webhook is served at '/nowhere'", False),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nHost: x\r\n\r\n", 411, "Content-Length", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         411, "Content-Length", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400,
         "Invalid character in Content-Length", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400,
         "Invalid character in Content-Length", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", 413, "larger",
         True),
        (b"BLAH\r\n\r\n", 400, "Bad request", True),
        (b"POST /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414, "too long", True),
        (b"POST / HTTP/1.1\r\n" + b"X: y\r\n" * 150 + b"\r\n", 431, "Too many headers", True),
        (b"POST / HTTP/1.1\r\n" + b"X: " + b"y" * 70000 + b"\r\n\r\n", 431, "too large", True),
        # Two Content-Length headers, equal or not, are a request-smuggling shape: refused.
        (b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
         400, "Duplicate Content-Length", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 9\r\n\r\n{}",
         400, "Duplicate Content-Length", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n{}", 400,
         "Invalid character in Content-Length", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length : 2\r\n\r\n{}", 400,
         "Invalid header field char", True),
        (b"POST /v1alpha1/inject HTTP/1.1\r\nX: a\r\n b\r\nContent-Length: 2\r\n\r\n{}", 400,
         "Unexpected whitespace after header value", True),
        (b"POST /v1alpha1/inject HTTP/2.0\r\n\r\n", 505, "Invalid HTTP version", True),
    ],
)  # fmt: skip
def test_protocol_mistakes_get_4xx_never_5xx(
    raw: bytes, status: int, fragment: str, closes: bool
) -> None:
    tls, pki = loaded_tls()
    with running(ROUTES, tls) as server, tls_socket(server.port, client_context(pki)) as sock:
        got, headers, reply = exchange(sock, raw)
        assert got == status
        assert fragment in message(reply)
        if status == 405:
            assert headers["allow"] == "POST"
        if closes:
            assert headers.get("connection") == "close"
            assert sock.recv(1) == b""  # the server closed its end
        else:
            got, _, _ = exchange(sock, post(PATH, deployment_body()))
            assert got == 200


def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    tls, pki = loaded_tls()
    body = deployment_body("expect")
    with running(ROUTES, tls) as server, tls_socket(server.port, client_context(pki)) as sock:
        head = (
            f"POST {PATH} HTTP/1.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
        )
        sock.sendall(head.encode())
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):  # the body is sent only after the 100
            chunk = sock.recv(1)
            assert chunk, "closed while waiting for 100 Continue"
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100")
        status, _, reply = exchange(sock, body)
        assert status == 200
        assert json.loads(reply)["response"]["uid"] == "expect"


def test_expect_100_continue_is_not_answered_when_the_body_is_too_large() -> None:
    tls, pki = loaded_tls()
    with running(ROUTES, tls) as server, tls_socket(server.port, client_context(pki)) as sock:
        head = (
            f"POST {PATH} HTTP/1.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 999999999\r\nExpect: 100-continue\r\n\r\n"
        )
        sock.sendall(head.encode())
        answer = b""
        while chunk := sock.recv(65536):  # http.client would skip a 100: read it raw
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 413 ")  # the first answer, no 100 before it
        head_part, _, reply = answer.partition(b"\r\n\r\n")
        assert b"connection: close" in head_part.lower()
        assert "larger than the" in message(reply)


def test_failed_handshakes_are_counted() -> None:
    tls, pki = loaded_tls()
    stranger = new_pki()
    with running(ROUTES, tls) as server:
        with pytest.raises(ssl.SSLError), tls_socket(server.port, client_context(stranger)):
            pass
        wait_until(lambda: server.handshake_failures >= 1, 30, "the failure to be counted")
        with tls_socket(server.port, client_context(pki)) as sock:
            assert exchange(sock, post(PATH, deployment_body()))[0] == 200


def test_a_crashing_handler_is_a_500_and_the_server_keeps_serving() -> None:
    def broken(body: bytes, content_type: str) -> Mapping[str, Any]:
        raise KeyError("a bug")

    tls, pki = loaded_tls()
    with (
        running({**ROUTES, "/broken": broken}, tls) as server,
        tls_socket(server.port, client_context(pki)) as sock,
    ):
        status, _, reply = exchange(sock, post("/broken", b"{}"))
        assert status == 500
        assert "internal error" in message(reply)
        status, _, _ = exchange(sock, post(PATH, deployment_body()))
        assert status == 200


def test_a_request_that_never_completes_gets_408_instead_of_hanging() -> None:
    tls, pki = loaded_tls()
    with (
        running(ROUTES, tls, request_timeout=0.5) as server,
        tls_socket(server.port, client_context(pki)) as sock,
    ):
        head = f"POST {PATH} HTTP/1.1\r\nContent-Type: application/json\r\n"
        status, headers, reply = exchange(
            sock, (head + "Content-Length: 100\r\n\r\n").encode() + b'{"kind":'
        )
        assert status == 408
        assert "did not arrive in time" in message(reply)
        assert headers["connection"] == "close"
        assert sock.recv(1) == b""


def test_the_handshake_happens_off_the_accept_thread() -> None:
    tls, pki = loaded_tls()
    with running(ROUTES, tls, handshake_timeout=120) as server:
        # A client that connects and never says hello must not block anyone else.
        silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        try:
            client = reviews.Client(server.port, client_context(pki), timeout=10)
            try:
                status, _ = client.post(PATH, deployment_body())
                assert status == 200
            finally:
                client.close()
        finally:
            for sock in silent:
                sock.close()


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed its end (nothing else is due on an idle connection)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1) == b""


def test_when_full_the_connection_idle_the_longest_makes_room() -> None:
    tls, pki = loaded_tls()
    ctx = client_context(pki)
    with running(ROUTES, tls, max_connections=3) as server:
        holders = [reviews.Client(server.port, ctx) for _ in range(3)]
        try:
            for holder in holders:  # three idle keep-alive connections fill the server
                assert holder.post(PATH, deployment_body())[0] == 200
            late = reviews.Client(server.port, ctx, timeout=10)
            holders.append(late)
            assert late.post(PATH, deployment_body())[0] == 200
            oldest = holders[0].conn.sock
            assert oldest is not None
            wait_until(lambda: closed_by_server(oldest), 30, "the oldest idle one to be closed")
            for holder in holders[1:]:  # the others kept their connection
                sock = holder.conn.sock
                assert holder.post(PATH, deployment_body())[0] == 200
                assert holder.conn.sock is sock
            assert server.connections == 3
            assert server.evicted == 1
        finally:
            for holder in holders:
                holder.close()


def test_certificate_hot_swap_without_restart() -> None:
    tls, first = loaded_tls()
    second = new_pki()  # another CA entirely
    ctx = client_context(first, second)
    with running(ROUTES, tls) as server:
        with tls_socket(server.port, ctx) as old_conn:
            assert exchange(old_conn, post(PATH, deployment_body()))[0] == 200
            assert peer_fingerprint(old_conn) == first.serving.cert.fingerprint(_sha256())
            assert tls.load_pem(second.serving.cert_pem, second.serving.key_pem)
            with tls_socket(server.port, ctx) as new_conn:
                assert peer_fingerprint(new_conn) == second.serving.cert.fingerprint(_sha256())
                assert exchange(new_conn, post(PATH, deployment_body()))[0] == 200
            # The live keep-alive connection keeps working on the certificate it started with.
            assert exchange(old_conn, post(PATH, deployment_body()))[0] == 200
            assert peer_fingerprint(old_conn) == first.serving.cert.fingerprint(_sha256())
        assert not tls.load_pem(second.serving.cert_pem, second.serving.key_pem)  # same pair


def test_a_mismatched_pair_is_refused_and_the_previous_one_kept() -> None:
    tls, first = loaded_tls()
    other = new_pki()
    with pytest.raises(InvalidKeyPair) as err:
        tls.load_pem(other.serving.cert_pem, first.serving.key_pem)
    assert "PRIVATE" not in str(err.value)
    with pytest.raises(InvalidKeyPair, match="not valid PEM"):
        tls.load_pem(b"garbage", first.serving.key_pem)
    with running(ROUTES, tls) as server, tls_socket(server.port, client_context(first)) as sock:
        assert peer_fingerprint(sock) == first.serving.cert.fingerprint(_sha256())


def test_a_draining_server_serves_on_and_closes_each_connection_after_its_response() -> None:
    """Between SIGTERM and the stop, a keep-alive connection the client still uses is told
    `Connection: close` and closed by the server after that response, so the client dials a
    pod that stays instead of racing the stop's close of an idle connection with a POST."""
    tls, pki = loaded_tls()
    with running(ROUTES, tls) as server:
        client = reviews.Client(server.port, client_context(pki))
        try:
            assert client.post(PATH, deployment_body("before"))[0] == 200
            assert client.last_headers is not None
            assert client.last_headers.get("connection") is None  # kept alive
            server.drain()
            status, body = client.post(PATH, deployment_body("draining"))
            assert status == 200
            assert json.loads(body)["response"]["uid"] == "draining"
            assert client.last_headers.get("connection") == "close"
            wait_until(lambda: server.connections == 0, 10, "the connection to be closed")
            fresh = reviews.Client(server.port, client_context(pki))  # still accepting
            try:
                assert fresh.post(PATH, deployment_body("new"))[0] == 200
                assert fresh.last_headers is not None
                assert fresh.last_headers.get("connection") == "close"
            finally:
                fresh.close()
        finally:
            client.close()


def test_graceful_stop_finishes_in_flight_requests_and_closes_idle_ones() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(body: bytes, content_type: str) -> Mapping[str, Any]:
        entered.set()
        release.wait(30)
        return standin_handler.handle(body, content_type)

    tls, pki = loaded_tls()
    ctx = client_context(pki)
    server = AdmissionServer({"/slow": slow, **ROUTES}, tls, ServerOptions("127.0.0.1", 0))
    server.start()
    stopper = threading.Thread(target=server.stop)
    try:
        idle = reviews.Client(server.port, ctx)
        assert idle.post(PATH, deployment_body())[0] == 200
        busy = reviews.Client(server.port, ctx)
        result: dict[str, Any] = {}
        # Above INLINE_BYTES, so it is handled on a thread (small ones run on the event loop,
        # where a handler that blocks would hold up the stop itself).
        large = deployment_body("slow") + b" " * INLINE_BYTES
        caller = threading.Thread(target=lambda: result.update(reply=busy.post("/slow", large)))
        caller.start()
        assert entered.wait(30)
        stopper.start()
        assert idle.conn.sock is not None
        wait_until(lambda: idle.conn.sock.recv(1) == b"", 30, "the idle connection to be closed")
        release.set()
        caller.join(30)
        status, body = result["reply"]
        assert status == 200
        assert json.loads(body)["response"]["uid"] == "slow"
        stopper.join(30)
        assert not stopper.is_alive()
        with pytest.raises(NotReady):
            server.ready()
    finally:
        release.set()
        if not stopper.is_alive():
            server.stop()


def test_metrics_per_route() -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    tls, pki = loaded_tls()
    before_ok = sample("controller_runtime_webhook_requests_total", webhook=PATH, code="200")
    before_bad = sample("controller_runtime_webhook_requests_total", webhook=PATH, code="400")
    before_count = sample("controller_runtime_webhook_latency_seconds_count", webhook=PATH)
    with running(ROUTES, tls) as server, tls_socket(server.port, client_context(pki)) as sock:
        for _ in range(3):
            assert exchange(sock, post(PATH, deployment_body()))[0] == 200
        assert exchange(sock, post(PATH, b"nope"))[0] == 400
    assert sample("controller_runtime_webhook_requests_total", webhook=PATH, code="200") == (
        before_ok + 3
    )
    assert sample("controller_runtime_webhook_requests_total", webhook=PATH, code="400") == (
        before_bad + 1
    )
    assert sample("controller_runtime_webhook_latency_seconds_count", webhook=PATH) == (
        before_count + 4
    )
    assert sample("controller_runtime_webhook_requests_in_flight", webhook=PATH) == 0


def test_ready_only_when_listening_with_a_certificate() -> None:
    tls = ServingTLS()
    server = AdmissionServer(ROUTES, tls, ServerOptions("127.0.0.1", 0))
    with pytest.raises(NotReady, match="not listening"):
        server.ready()
    server.start()
    try:
        with pytest.raises(NotReady, match="no serving certificate"):
            server.ready()
        pki = new_pki()
        # Before a certificate is loaded, handshakes fail fast instead of hanging.
        with pytest.raises(ssl.SSLError), tls_socket(server.port, client_context(pki)):
            pass
        tls.load_pem(pki.serving.cert_pem, pki.serving.key_pem)
        server.ready()
    finally:
        server.stop()


def _sha256() -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


def test_stop_is_idempotent_and_safe_before_start() -> None:
    server = AdmissionServer(ROUTES, ServingTLS(), ServerOptions("127.0.0.1", 0))
    server.stop()
    server.start()
    assert server.port > 0
    server.stop()
    server.stop()
