"""Running the admission server in tests: certificates, client contexts, raw TLS exchanges,
crowds of idle connections, and the real handlers in a server process of their own.

    python -m tests.support.webhook_server DIR   # serve the real routes until SIGTERM; writes
                                                 # DIR/port and DIR/ca.pem
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import multiprocessing
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envtest.process import wait_until
from kube import certs
from kube.http import memory
from kube.http.messages import MAX_BODY_BYTES
from kube.http.routing import Route
from kube.http.server import AdmissionServer, ServerOptions, bind
from kube.http.tls import ServingTLS
from tests.support import reviews

ROOT = Path(__file__).resolve().parents[2]

POLICY = certs.CertPolicy("webhook", "tests", extra_ip_addresses=("127.0.0.1",))


def new_pki() -> certs.CertState:
    return certs.bootstrap(POLICY, dt.datetime.now(dt.UTC))


def client_context(*states: certs.CertState) -> ssl.SSLContext:
    """A client trusting the bundles of `states` and checking the name (127.0.0.1)."""
    return ssl.create_default_context(cadata="".join(s.bundle_pem.decode() for s in states))


@contextlib.contextmanager
def running(
    routes: Mapping[str, Route], tls: ServingTLS, **options: Any
) -> Iterator[AdmissionServer]:
    server = AdmissionServer(routes, tls, ServerOptions(host="127.0.0.1", port=0, **options))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def tls_socket(
    port: int, context: ssl.SSLContext, timeout: float = 30.0
) -> Iterator[ssl.SSLSocket]:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        yield sock
    finally:
        sock.close()


def exchange(sock: ssl.SSLSocket, raw_request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read one HTTP response: (status, headers, body)."""
    sock.sendall(raw_request)
    resp = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    resp.begin()
    body = resp.read()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def post(path: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def message(body: bytes) -> str:
    return str(json.loads(body)["message"])


def peer_fingerprint(sock: ssl.SSLSocket) -> bytes:
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    return x509.load_der_x509_certificate(der).fingerprint(hashes.SHA256())


# --- crowds of connections -------------------------------------------------------------------


def raise_fd_limit(needed: int) -> None:
    """Client and server sockets of a crowd live in one test process: make room for them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def tls_connections(port: int, context: ssl.SSLContext, count: int) -> list[ssl.SSLSocket]:
    """`count` TLS connections, handshake done, that send nothing."""
    socks = []
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        socks.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
    return socks


def tcp_connections(port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections that never start a TLS handshake."""
    return [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]


class Trickler:
    """Sends a request head one byte per connection per `interval` seconds, as a slowloris
    client does, until stopped (a connection the server closed is left alone)."""

    HEAD = b"POST /v1alpha1/inject HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: x\r\n" * 1000

    def __init__(self, socks: list[ssl.SSLSocket], interval: float = 1.0) -> None:
        self.socks = list(socks)
        self.interval = interval
        self.sent = 0  # bytes sent per connection so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickler", daemon=True)

    def __enter__(self) -> Trickler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set() and self.sent < len(self.HEAD):
            byte = self.HEAD[self.sent : self.sent + 1]
            for sock in list(self.socks):
                try:
                    sock.sendall(byte)
                except OSError:
                    self.socks.remove(sock)
            self.sent += 1
            self._stop.wait(self.interval)  # the trickle's pace, not a wait for a condition


def close_all(socks: list[socket.socket] | list[ssl.SSLSocket]) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()


# --- the real handlers in a process of their own ------------------------------------------------


class _DiscardEvents:
    def event(self, obj: Any, type: str, reason: str, message: str, component: str) -> None:
        return


def real_routes() -> dict[str, Route]:
    """The operator's two routes with its real handlers, an Active Lumigo in `default`."""
    from tests.unit.webhook_samples import StaticLister, lumigo
    from webhook.inject_handler import InjectHandler
    from webhook.lumigo_defaulter import MutateHandler
    from webhook.pod_injection import InjectionSettings
    from webhook.routes import admission_routes

    lister = StaticLister({"default": [lumigo(namespace="default")]})
    settings = InjectionSettings(operator_version="0.1.0")
    inject = InjectHandler(lister, _DiscardEvents(), settings)
    return admission_routes(inject, MutateHandler(lister))


@dataclass(frozen=True)
class ServerProcess:
    port: int
    pid: int
    ca_file: Path
    context: ssl.SSLContext  # trusts ca_file

    def peak_rss_bytes(self) -> int:
        """VmHWM: the kernel's record of the most memory the process ever had resident."""
        return _status_kib(self.pid, "VmHWM") * 1024

    def rss_bytes(self) -> int:
        return _status_kib(self.pid, "VmRSS") * 1024


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@contextlib.contextmanager
def server_process() -> Iterator[ServerProcess]:
    """The real routes served with production defaults in a child process (as in the pod)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        path = os.pathsep.join([str(ROOT), str(ROOT / "hack"), os.environ.get("PYTHONPATH", "")])
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.webhook_server", str(directory)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
        )
        try:
            wait_until(lambda: (directory / "port").exists() or child.poll() is not None, 60,
                       "the server process to listen")  # fmt: skip
            if child.poll() is not None:
                raise RuntimeError(f"the server process exited with {child.returncode}")
            ca_file = directory / "ca.pem"
            context = ssl.create_default_context(cafile=str(ca_file))
            yield ServerProcess(int((directory / "port").read_text()), child.pid, ca_file, context)
        finally:
            child.terminate()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _serve(directory: Path) -> None:
    state = new_pki()
    tls = ServingTLS()
    tls.load_pem(state.serving.cert_pem, state.serving.key_pem)
    server = AdmissionServer(real_routes(), tls, ServerOptions(host="127.0.0.1", port=0))
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    server.start()
    (directory / "ca.pem").write_bytes(state.bundle_pem)
    (directory / "port.tmp").write_text(str(server.port))
    (directory / "port.tmp").rename(directory / "port")
    while not stopped.wait(0.2):
        pass
    server.stop()


# --- admission worker processes on one socket, as in the pod ----------------------------------


class ServerGroup:
    """`count` processes serving the real routes on one listening socket, as the admission
    workers of a pod do, with the body budget and the pod-wide large-body slots of
    `kube.http.memory.plan` for `limit` (`shared_slots=False`: each process on its
    own, as before issue 28). Memory is the sum of the processes' PSS (shared pages counted
    once, as the pod's cgroup does), sampled every 20 ms: `peak_bytes`."""

    def __init__(self, directory: Path, count: int, limit: int, shared_slots: bool) -> None:
        self.plan = memory.plan(count, limit, MAX_BODY_BYTES)
        slots = ""
        if shared_slots:
            (directory / "slots").mkdir()
            memory.LargeBodySlots.create(directory / "slots", self.plan.large_slots)
            slots = str(directory / "slots")
        options = ServerOptions(host="127.0.0.1", port=0, large_body_slots=slots,
                                body_budget_bytes=self.plan.body_budget_bytes)  # fmt: skip
        state = new_pki()
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(state.bundle_pem)
        self.context = ssl.create_default_context(cafile=str(self.ca_file))
        pem = (state.serving.cert_pem, state.serving.key_pem)
        self.listener = bind("127.0.0.1", 0)
        self.port = int(self.listener.getsockname()[1])
        ctx = multiprocessing.get_context("spawn")
        self.processes = [
            ctx.Process(target=_serve_on, args=(self.listener, pem, options, directory / str(i)))
            for i in range(count)
        ]
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="pss-sampler", daemon=True)

    def start(self) -> None:
        for process in self.processes:
            process.start()
        directory = self.ca_file.parent

        def gone() -> list[int | None]:
            return [p.exitcode for p in self.processes if not p.is_alive()]

        def listening() -> bool:
            return all((directory / str(i)).exists() for i in range(len(self.processes)))

        wait_until(lambda: listening() or bool(gone()), 60, "the server processes to listen")
        if gone():
            raise RuntimeError(f"server processes exited with {gone()}")
        self._sampler.start()

    def stop(self) -> None:
        self._stop.set()
        if self._sampler.is_alive():
            self._sampler.join()
        started = [p for p in self.processes if p.pid is not None]
        for process in started:
            process.terminate()
        for process in started:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
        self.listener.close()

    def rss_bytes(self) -> int:
        """The processes' memory now (PSS, summed)."""
        total = 0
        for process in self.processes:
            with contextlib.suppress(OSError, ValueError, TypeError):
                total += _pss_bytes(process.pid or 0)
        return total

    def _sample(self) -> None:
        while not self._stop.wait(0.02):  # a sampling period, not a wait for a condition
            self.peak_bytes = max(self.peak_bytes, self.rss_bytes())


def _pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no Pss in smaps_rollup")


@contextlib.contextmanager
def server_processes(count: int, limit: int, *, shared_slots: bool = True) -> Iterator[ServerGroup]:
    with tempfile.TemporaryDirectory() as tmp:
        group = ServerGroup(Path(tmp), count, limit, shared_slots)
        try:
            group.start()
            yield group
        finally:
            group.stop()


def _serve_on(listener: socket.socket, pem: tuple[bytes, bytes], options: ServerOptions,
              ready: Path) -> None:  # fmt: skip
    """A server process of a `ServerGroup`: serves until SIGTERM."""
    tls = ServingTLS()
    tls.load_pem(*pem)
    server = AdmissionServer(real_routes(), tls, options, listener=listener)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    server.start()
    ready.touch()
    while not stopped.wait(0.2):
        pass
    server.stop()


def max_size_review(namespace: str = "default") -> bytes:
    """An AdmissionReview of exactly the size the server accepts, its bulk in the first
    container's env: the inject handler copies and rewrites env, the costliest shape found
    (~220 MiB resident to handle one)."""
    obj = reviews.deployment(namespace=namespace)
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = "@ENV@"
    skeleton = reviews.body_of(reviews.review(obj, uid="max-size"))
    item = b'{"name": "E%07d", "value": "v"}, '
    room = MAX_BODY_BYTES - len(skeleton) + len(b'"@ENV@"') - 2
    count = room // len(item % 0)
    env = b"[" + b"".join(item % i for i in range(count))[:-2]
    env += b" " * (room + 1 - len(env)) + b"]"
    body = skeleton.replace(b'"@ENV@"', env)
    assert len(body) == MAX_BODY_BYTES, len(body)
    return body


@dataclass(frozen=True)
class Flood:
    outcomes: list[str]  # of the large requests: HTTP status, or the error that cut one
    normal_status: int
    normal_reply: bytes
    normal_seconds: float


def max_size_flood(proc: ServerProcess | ServerGroup, count: int, path: str = "/v1alpha1/inject",
                   namespace: str = "default") -> Flood:  # fmt: skip
    """`count` concurrent maximum-size admissions, and a normal one sent while they are being
    parsed (the server's memory has grown by 100 MiB)."""
    big = max_size_review(namespace)
    normal = reviews.body_of(reviews.review(reviews.deployment(namespace=namespace), uid="normal"))
    outcomes: list[str] = []
    baseline = proc.rss_bytes()

    def send(body: bytes) -> None:
        client = reviews.Client(proc.port, proc.context, timeout=120)
        try:
            outcomes.append(str(client.post(path, body)[0]))
        except (OSError, http.client.HTTPException) as err:  # cut while still sending
            outcomes.append(type(err).__name__)
        finally:
            client.close()

    senders = [threading.Thread(target=send, args=(big,)) for _ in range(count)]
    for sender in senders:
        sender.start()
    try:
        wait_until(lambda: proc.rss_bytes() > baseline + 100 * 2**20, 60, "a large parse")
        client = reviews.Client(proc.port, proc.context, timeout=120)
        try:
            started = time.perf_counter()
            status, reply = client.post(path, normal)
            elapsed = time.perf_counter() - started
        finally:
            client.close()
    finally:
        for sender in senders:
            sender.join(300)
    return Flood(outcomes, status, reply, elapsed)


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
