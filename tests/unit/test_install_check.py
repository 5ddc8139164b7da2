"""`lumigo-operator check` (the chart's `helm test`) against real HTTP servers on loopback: a proxy
that refuses an export without a token passes; one that accepts it, answers something else, or
does not answer fails, saying which; a failing check does not hide the others."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from controller.lumigo import install_check


def serving(status: int) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def refusing() -> Iterator[str]:
    yield from serving(401)


@pytest.fixture
def accepting() -> Iterator[str]:
    yield from serving(200)


@pytest.fixture
def broken() -> Iterator[str]:
    yield from serving(503)


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_proxy_that_refuses_an_export_without_a_token_passes(refusing: str) -> None:
    said = install_check.proxy_refuses_the_unauthenticated(refusing + "/", timeout=5)
    assert said == f"the telemetry proxy at {refusing}/v1/traces refuses an export without a token"


def test_a_proxy_that_takes_spans_from_anyone_fails_at_once(accepting: str) -> None:
    with pytest.raises(ValueError, match=r"accepted an export without a token \(HTTP 200\)"):
        install_check.proxy_refuses_the_unauthenticated(accepting, timeout=30)


def test_a_proxy_that_answers_an_error_or_nothing_fails_after_the_timeout(broken: str) -> None:
    with pytest.raises(TimeoutError, match="did not answer: HTTP 503"):
        install_check.proxy_refuses_the_unauthenticated(broken, timeout=0.5)
    with pytest.raises(TimeoutError, match=r"did not answer: .*[Cc]onnection refused"):
        install_check.proxy_refuses_the_unauthenticated(closed_port(), timeout=0.5)


def test_every_check_runs_and_each_failure_is_named() -> None:
    def fails() -> str:
        raise TimeoutError("no answer")

    report = install_check.run({"webhook": fails, "telemetry proxy": lambda: "fine"})
    assert report.passed == ["fine"]
    assert report.failed == ["webhook: no answer"]
