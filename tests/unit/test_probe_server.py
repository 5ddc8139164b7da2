"""The probe/metrics server (issue 14 item 6): bounded like the webhook, over real sockets.

Before, every connection got a thread forever and the backlog was 5: idle clients piled up
threads, and enough of them kept the kubelet's probes from being accepted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.runtime.probe_server import PROBE_OPTIONS, CheckFailed, ProbeServer
from envtest.process import wait_until
from tests.support.webhook_server import close_all, raise_fd_limit

CROWD = 300


CAP = 64


@contextlib.contextmanager
def serving(**options: Any) -> Iterator[ProbeServer]:
    raise_fd_limit(4 * CROWD + 1024)
    server = ProbeServer("127.0.0.1:0", options=dataclasses.replace(PROBE_OPTIONS, **options))
    server.healthz["ping"] = lambda: None
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def probes() -> Iterator[ProbeServer]:
    with serving(max_connections=CAP, idle_timeout=1.0, request_timeout=1.0) as server:
        yield server


def get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def closed_by_server(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # closed to make room: cut without ceremony
        return True


def test_probes_and_metrics(probes: ProbeServer) -> None:
    def failing() -> None:
        raise CheckFailed("caches not synced")

    probes.readyz["caches"] = failing
    assert get(probes.port, "/healthz") == (200, "ok")
    assert get(probes.port, "/livez") == (200, "ok")
    assert get(probes.port, "/healthz?verbose") == (200, "[+]ping ok\nok\n")
    assert get(probes.port, "/readyz") == (500, "[-]caches failed: caches not synced\nfailed\n")
    status, text = get(probes.port, "/metrics")
    assert status == 200
    assert "# TYPE" in text
    assert get(probes.port, "/nowhere")[0] == 404
    assert get(probes.port, "/healthz", method="POST")[0] == 405


def test_healthz_answers_with_more_idle_connections_open_than_the_cap() -> None:
    with serving(max_connections=CAP) as probes:  # idle connections are not timed out here
        crowd = [socket.create_connection(("127.0.0.1", probes.port)) for _ in range(CROWD)]
        try:
            assert get(probes.port, "/healthz") == (200, "ok")
            # The server holds at most CAP of them: the longest idle were closed for newcomers.
            wait_until(
                lambda: sum(closed_by_server(sock) for sock in crowd) >= CROWD - CAP,
                30,
                "the connections over the cap to be closed",
            )
        finally:
            close_all(crowd)


def test_idle_connections_are_closed(probes: ProbeServer) -> None:
    crowd = [socket.create_connection(("127.0.0.1", probes.port)) for _ in range(20)]
    still_open = set(crowd)

    def all_closed() -> bool:
        still_open.difference_update({sock for sock in still_open if closed_by_server(sock)})
        return not still_open

    try:
        wait_until(all_closed, 30, "the idle connections to be closed")
    finally:
        close_all(crowd)


def test_a_request_trickled_to_the_probe_port_is_cut_at_its_deadline(
    probes: ProbeServer,
) -> None:
    with socket.create_connection(("127.0.0.1", probes.port), timeout=30) as sock:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: x\r\n" * 1000
        answer = b""
        deadline = time.monotonic() + 60
        for i in range(len(head)):
            if time.monotonic() > deadline:
                break
            sock.sendall(head[i : i + 1])
            readable, _, _ = select.select([sock], [], [], 0.05)  # the pace of the trickle
            if readable:
                while chunk := sock.recv(65536):
                    answer += chunk
                break
        assert answer.startswith(b"HTTP/1.1 408 ")
