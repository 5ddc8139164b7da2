#!/usr/bin/env python3
"""Candidate HTTP servers for the admission routes, measured side by side (issue 18, item 1).

Each candidate serves exactly the operator's admission routes (`webhook_direct.routes()`: the real
inject and mutate handlers, an Active `Lumigo` in the review's namespace) over TLS with a
certificate made like the operator's, in a process of its own; then the same two measurements as
bench/webhook_direct.py: --rate admissions/s on one keep-alive connection (open loop), and wrk
saturation over --connections keep-alive connections. Idle RSS of the server's processes is read
before the load.

Candidates: ours (kube/http/server.py, asyncio + worker threads), uvicorn (httptools,
uvloop; 1 and 2 worker processes), hypercorn (h11, asyncio) and cheroot (WSGI, a thread pool).
The libraries come from PyPI, pinned below, installed once into the tool cache (never into the
project's venv: the product does not depend on them).

The Go-equivalent line (`go-controller-runtime`, issue 18 item 5): hack/tools/webhook-go, the
same injection served the way the reference operator serves its own (controller-runtime's webhook
server, k8s.io/api types, admission.PatchResponseFromRaw), built from the Go module proxy by
`hack/install-tools webhook-go` (the bench builds it when missing). The reference operator itself
is not built here (its repository is not reachable from this machine); to compare with it, build
its manager from its source (`go build ./...` in its repository at the version you run), start it
with its webhook certificates and run `wrk` against its /v1alpha1/inject the same way
(`webhook_direct.saturation` shows the exact command).

    .venv/bin/python bench/webhook_servers.py [--duration 10] [--rate 100] [--connections 8]

Writes bench/results/webhook_servers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import webhook_direct

from bench import benchkit
from envtest.process import free_port, wait_until
from tests.support import reviews

ROOT = benchkit.ROOT
BENCH = ROOT / "bench"

PINS = (
    "uvicorn==0.54.0",
    "httptools==0.9.0",
    "uvloop==0.23.0",
    "hypercorn==0.18.0",
    "cheroot==11.1.2",
)
LIBS = (
    Path.home()
    / ".cache"
    / "lumigo-operator"
    / "bench-servers"
    / "-".join(p.replace("==", "-") for p in PINS)
)
RESULTS = benchkit.results_file("webhook_servers")
# name -> (library, worker processes)
CANDIDATES: dict[str, tuple[str, int]] = {
    "ours": ("ours", 1),
    "uvicorn": ("uvicorn", 1),
    "uvicorn-2-workers": ("uvicorn", 2),
    "hypercorn": ("hypercorn", 1),
    "cheroot": ("cheroot", 1),
    "go-controller-runtime": ("go", 1),
}
WEBHOOK_GO = ROOT / "bin" / "webhook-go"

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def install_go_equivalent() -> None:
    """bin/webhook-go, built once from hack/tools/webhook-go (cached by hack/install-tools)."""
    if not WEBHOOK_GO.exists():
        subprocess.run([sys.executable, str(ROOT / "hack" / "install-tools"), "webhook-go"],
                       check=True)  # fmt: skip


@contextlib.contextmanager
def go_equivalent_server(cert_dir: Path) -> Iterator[int]:
    """bin/webhook-go serving tls.crt/tls.key of `cert_dir` on a free loopback port: its port."""
    install_go_equivalent()
    port = free_port()
    server = subprocess.Popen([str(WEBHOOK_GO), f"-cert-dir={cert_dir}", f"-port={port}"],
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_until(lambda: listening(port), 30, "the Go webhook")
        yield port
    finally:
        server.terminate()
        server.wait(10)


def install_libraries() -> None:
    """The pinned libraries, into the tool cache (once)."""
    if (LIBS / ".complete").exists():
        return
    LIBS.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
            str(LIBS),
            *PINS,
        ],
        check=True,
    )
    (LIBS / ".complete").write_text("\n".join(PINS) + "\n")


# --- the routes, behind each library's interface (imported by the server processes) ----------


@functools.cache
def _routes() -> dict[str, Any]:
    return webhook_direct.routes()[1]


def _answer(path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    route = _routes().get(path)
    if route is None:
        return 404, b'{"message":"no admission webhook here"}'
    review = route(body, content_type)
    return 200, review if isinstance(review, bytes) else json.dumps(review).encode()


async def asgi_app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """ASGI (uvicorn, hypercorn): the handler runs on the event loop, as it is ~0.2 ms of CPU."""
    if scope["type"] != "http":
        return
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    headers = dict(scope.get("headers") or [])
    content_type = headers.get(b"content-type", b"").decode("latin-1")
    status, payload = _answer(scope["path"], b"".join(chunks), content_type)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def wsgi_app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    """WSGI (cheroot): one request per pool thread."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length)
    status, payload = _answer(environ["PATH_INFO"], body, environ.get("CONTENT_TYPE", ""))
    start_response(
        f"{status} {'OK' if status == HTTPStatus.OK else 'Not Found'}",
        [("Content-Type", "application/json")],
    )
    return [payload]


# --- server processes ------------------------------------------------------------------------


def certificates(directory: Path) -> tuple[Path, Path]:
    """A serving pair made by the operator's own certificate code; the CA goes to ca.pem."""
    from kube import certs

    policy = certs.CertPolicy("bench", "bench", extra_ip_addresses=("127.0.0.1",))
    state = certs.bootstrap(policy, dt.datetime.now(dt.UTC))
    (directory / "ca.pem").write_bytes(state.bundle_pem)
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(state.serving.cert_pem)
    key.write_bytes(state.serving.key_pem)
    return cert, key


def serve(library: str, workers: int, directory: Path) -> None:
    """Child process: serve on the port in `directory/port` until SIGTERM."""
    cert, key = certificates(directory)
    port = int((directory / "port").read_text())
    if library == "go":
        os.execv(WEBHOOK_GO, [str(WEBHOOK_GO), f"-cert-dir={directory}", f"-port={port}"])
    if library == "uvicorn":
        import uvicorn

        uvicorn.run(
            "webhook_servers:asgi_app",
            host="127.0.0.1",
            port=port,
            workers=workers,
            http="httptools",
            loop="uvloop",
            ssl_certfile=str(cert),
            ssl_keyfile=str(key),
            log_level="warning",
            access_log=False,
        )
    elif library == "hypercorn":
        from hypercorn.asyncio import serve as hypercorn_serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.certfile, config.keyfile = str(cert), str(key)
        config.accesslog = None
        stop = asyncio.Event()

        async def main() -> None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await hypercorn_serve(asgi_app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

        asyncio.run(main())
    elif library == "cheroot":
        from cheroot import wsgi
        from cheroot.ssl.builtin import BuiltinSSLAdapter

        server = wsgi.Server(("127.0.0.1", port), wsgi_app, numthreads=8)
        server.ssl_adapter = BuiltinSSLAdapter(str(cert), str(key))
        signal.signal(signal.SIGTERM, lambda *_: server.stop())
        server.start()
    else:
        raise SystemExit(f"unknown library {library!r}")


def tree_rss_mib(pid: int) -> float:
    """RSS of a process and its descendants (worker processes), MiB."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, StopIteration):
            continue
    return round(total / 1024, 1)


def listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def measure(name: str, body: bytes, args: argparse.Namespace) -> dict[str, Any]:
    library, workers = CANDIDATES[name]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if library == "ours":
            argv = [sys.executable, str(BENCH / "webhook_direct.py"), "--serve", str(directory)]
            ready: Callable[[], bool] = (directory / "port").exists
        else:
            port = free_port()
            (directory / "port").write_text(str(port))
            argv = [
                sys.executable,
                __file__,
                "--serve",
                library,
                "--workers",
                str(workers),
                "--dir",
                str(directory),
            ]
            ready = lambda: (directory / "ca.pem").exists() and listening(port)  # noqa: E731
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(LIBS), str(ROOT), str(ROOT / "hack"), str(BENCH)]),
        }
        log = (directory / "server.log").open("wb")  # closing clients make some servers chatty
        child = subprocess.Popen(argv, env=env, start_new_session=True, stdout=log, stderr=log)
        try:
            try:
                wait_until(ready, 60, f"{name} to listen")
            except TimeoutError:
                print((directory / "server.log").read_text()[-3000:], file=sys.stderr)
                raise
            port = int((directory / "port").read_text())
            time.sleep(1.0 + workers)  # every worker up before the idle RSS and the load
            idle_rss = tree_rss_mib(child.pid)
            ca = directory / "ca.pem"
            offered = webhook_direct.offered_load(port, ca, body, args.rate, args.duration)
            saturated = webhook_direct.saturation(port, body, args.connections, args.duration)
            loaded_rss = tree_rss_mib(child.pid)
        finally:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(10)
            log.close()
    return {
        "library": library,
        "workers": workers,
        "idle_rss_mib": idle_rss,
        "rss_after_load_mib": loaded_rss,
        "offered": offered,
        "saturation": saturated,
    }


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--only", nargs="*", choices=sorted(CANDIDATES), help="a subset")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.workers, args.dir)
        return 0
    install_libraries()
    if "go-controller-runtime" in (args.only or CANDIDATES):
        install_go_equivalent()
    body = reviews.body_of(reviews.review(reviews.deployment(), uid="bench"))
    results: dict[str, Any] = {}
    for name in args.only or list(CANDIDATES):
        results[name] = figures = measure(name, body, args)
        offered, saturated = figures["offered"], figures["saturation"]
        print(
            f"{name:18} idle RSS {figures['idle_rss_mib']:6.1f} MiB | {args.rate:.0f}/s: p50 "
            f"{offered['p50_ms']} ms, p99 {offered['p99_ms']} ms, errors {offered['errors']} | "
            f"saturated ({saturated['connections']} conns): {saturated['rps']}/s, p99 "
            f"{saturated['p99_ms']} ms, non-2xx {saturated['non_2xx']} "
            f"{saturated['socket_errors']}",
            flush=True,
        )
    benchkit.save(
        RESULTS,
        {
            "benchmark": "webhook_servers",
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "pins": list(PINS),
            "machine": benchkit.machine(),
            "request_bytes": len(body),
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
