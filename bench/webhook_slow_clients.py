#!/usr/bin/env python3
"""Admission latency while crowds of idle, trickling or silent clients hold connections, and
peak memory under concurrent maximum-size requests (issue 14 items 3 and 4).

The server runs the real routes with production defaults in its own process. A crowd process
keeps --crowd connections open the whole time (re-opening those the server cuts):
  idle     TLS connections that never send a byte,
  trickle  TLS connections sending a request head at 1 byte/s,
  tcp      TCP connections that never start the TLS handshake;
and --announcers connections (20) that each announce a large body (a fifth of the body budget:
five add up to all of it) and trickle it at 1 byte/s (issue 28 item 3: `announce`).
Meanwhile legitimate admissions run open loop at --rate/s for --duration s, on one keep-alive
connection (as the API server's pool) and on a new connection each (handshake included).
Then --big concurrent maximum-size (7 MiB) requests plus a normal one: the server's peak RSS
(VmHWM) and the normal request's latency. Prints the figures and writes
bench/results/webhook_slow_clients.json.

    .venv/bin/python bench/webhook_slow_clients.py [--crowd 1000] [--rate 50] [--duration 10]
        [--announcers 20] [--only none,idle,trickle,tcp,announce] [--no-big]
        [--workers 1,2,4] [--limit-mib 512]

Last, for each --workers count: that many server processes on one socket (as the admission
workers of a pod) under --big concurrent maximum-size requests, their summed PSS at rest and at
the peak, with the large-body slots of `kube.http.memory` shared and without.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

from webhook_direct import LoadOptions, offered_load, percentile

from bench import benchkit
from kube.http.server import ServerOptions
from tests.support import reviews
from tests.support.webhook_server import (
    Trickler,
    max_size_flood,
    max_size_review,
    raise_fd_limit,
    server_process,
    server_processes,
)

ROOT = benchkit.ROOT

PATH = "/v1alpha1/inject"
RESULTS = benchkit.results_file("webhook_slow_clients")
KINDS = ("idle", "trickle", "tcp", "announce")
ANNOUNCED = ServerOptions().body_budget_bytes // 5  # five announcements add up to the budget
ANNOUNCE_HEAD = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {ANNOUNCED}\r\n\r\n").encode() + b'{"kind":'  # fmt: skip


# --- the crowd (a process of its own, so its threads do not slow the measuring client) ---------


def _open(kind: str, port: int, context: ssl.SSLContext) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    if kind == "tcp":
        return raw
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    if kind == "announce":
        sock.sendall(ANNOUNCE_HEAD)
    return sock


def _cut(sock: socket.socket) -> bool:
    """Closed by the server (it sends a crowd connection nothing but, at most, an error).
    Readable alone is not enough: TLS 1.3 session tickets arrive after the handshake."""
    if sock.fileno() < 0:
        return True
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    sock.settimeout(0)
    try:
        sock.recv(4096)  # data (an error answer) or b"" (closed): cut either way
    except (ssl.SSLWantReadError, BlockingIOError):
        return False  # only TLS housekeeping was pending
    except OSError:
        return True
    finally:
        sock.settimeout(30)
    return True


def crowd(kind: str, port: int, ca: Path, count: int) -> None:
    """Keep `count` connections of `kind` open until stdin closes; print 'ready' once open,
    and at the end how many had to be re-opened (the server cut them)."""
    raise_fd_limit(count + 256)
    context = ssl.create_default_context(cafile=str(ca))
    socks: list[socket.socket | None] = [None] * count
    sent = [0] * count

    def reopen(i: int) -> None:
        old, socks[i], sent[i] = socks[i], None, 0
        if old is not None:
            old.close()
        with contextlib.suppress(OSError):
            socks[i] = _open(kind, port, context)

    for i in range(count):
        reopen(i)
    print("ready", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    reopened = 0
    while not stop.wait(1.0):  # one round a second: the trickle's pace
        for i, sock in enumerate(socks):
            if sock is not None and kind in ("trickle", "announce"):
                try:
                    byte = Trickler.HEAD[sent[i] : sent[i] + 1] if kind == "trickle" else b" "
                    if _cut(sock):  # answered (408) and closed: sending alone may not notice
                        raise ConnectionError
                    sock.sendall(byte)
                    sent[i] += 1
                    continue
                except OSError:
                    pass
            elif sock is not None and not _cut(sock):
                continue
            reopen(i)
            reopened += 1
    print(reopened, flush=True)


@contextlib.contextmanager
def crowd_process(kind: str, port: int, ca: Path, count: int) -> Iterator[dict[str, int]]:
    """The crowd, in a process of its own; yields a dict that gets `reopened` at the end."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--crowd-child", kind, str(port), str(ca), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    stats: dict[str, int] = {}
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {kind} crowd did not open")
        yield stats
    finally:
        child.stdin.close()
        stats["reopened"] = int(child.stdout.readline() or -1)
        child.wait(60)


# --- legitimate admissions -----------------------------------------------------------------


def fresh_connections(port: int, context: ssl.SSLContext, body: bytes, rate: float,
                      duration: float) -> dict[str, Any]:  # fmt: skip
    """Open loop, a new TLS connection per admission (as after an idle close)."""
    latencies, errors = [], 0
    total = int(rate * duration)
    start = time.perf_counter() + 0.1
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent = time.perf_counter()
        client = reviews.Client(port, context, timeout=30)
        try:
            status, _ = client.post(PATH, body)
        except OSError:
            status = 0
        finally:
            client.close()
        latencies.append(time.perf_counter() - sent)
        errors += status != HTTPStatus.OK
    return {
        "requests": total,
        "errors": errors,
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "max_ms": round(max(latencies) * 1000, 3),
    }


def admissions(port: int, ca: Path, body: bytes, rate: float, duration: float,
               warmup: int = 200) -> dict[str, Any]:  # fmt: skip
    context = ssl.create_default_context(cafile=str(ca))
    return {
        "keep_alive": offered_load(port, ca, body, rate, duration, LoadOptions(warmup=warmup)),
        "new_connection": fresh_connections(port, context, body, rate, duration),
    }


# --- maximum-size requests -----------------------------------------------------------------


def big_requests(count: int) -> dict[str, Any]:
    with server_process() as proc:
        before = proc.rss_bytes()
        flood = max_size_flood(proc, count)
        time.sleep(1.0)  # let the last responses go before reading the settled RSS
        return {
            "requests": count,
            "request_bytes": len(max_size_review()),
            "outcomes": {o: flood.outcomes.count(o) for o in sorted(set(flood.outcomes))},
            "normal_status": flood.normal_status,
            "normal_ms": round(flood.normal_seconds * 1000, 1),
            "rss_before_mib": round(before / 2**20, 1),
            "peak_rss_mib": round(proc.peak_rss_bytes() / 2**20, 1),
            "rss_after_mib": round(proc.rss_bytes() / 2**20, 1),
        }


def worker_memory(counts: list[int], limit: int, requests: int) -> list[dict[str, Any]]:
    """`requests` concurrent maximum-size requests (and a normal one) on `count` server processes
    sharing one socket, as the admission workers of a pod: their summed PSS, at rest and at the
    peak, with the pod's large-body slots shared (now) and without (each process on its own, as
    before issue 28)."""
    rows = []
    for count in counts:
        for shared in (False, True):
            with server_processes(count, limit, shared_slots=shared) as group:
                idle = group.rss_bytes()
                flood = max_size_flood(group, requests)
                peak = group.peak_bytes
                rows.append({
                    "workers": count,
                    "shared_slots": shared,
                    "plan": group.plan.describe(),
                    "idle_pss_mib": round(idle / 2**20, 1),
                    "peak_pss_mib": round(peak / 2**20, 1),
                    "normal_status": flood.normal_status,
                    "normal_ms": round(flood.normal_seconds * 1000, 1),
                    "outcomes": {o: flood.outcomes.count(o) for o in sorted(set(flood.outcomes))},
                })  # fmt: skip
    return rows


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--crowd", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--big", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=200,
                        help="keep-alive admissions before measuring")  # fmt: skip
    parser.add_argument("--no-big", action="store_true", help="skip the maximum-size requests")
    parser.add_argument("--announcers", type=int, default=20,
                        help="connections announcing a large body and trickling it")  # fmt: skip
    parser.add_argument("--workers", default="1,2,4",
                        help="worker counts whose memory is measured ('' skips it)")  # fmt: skip
    parser.add_argument("--limit-mib", type=int, default=512, help="the memory limit planned for")
    parser.add_argument("--only", default=",".join(("none", *KINDS)),
                        help="comma-separated scenarios to run")  # fmt: skip
    parser.add_argument("--crowd-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.crowd_child:
        kind, port, ca, count = args.crowd_child
        crowd(kind, int(port), Path(ca), int(count))
        return 0
    body = reviews.body_of(reviews.review(reviews.deployment(), uid="bench"))
    info = benchkit.machine()
    scenarios: dict[str, Any] = {}
    only = args.only.split(",")
    with server_process() as proc:
        if "none" in only:
            scenarios["none"] = admissions(proc.port, proc.ca_file, body, args.rate,
                                           args.duration, args.warmup)  # fmt: skip
        for kind in (k for k in KINDS if k in only):
            count = args.announcers if kind == "announce" else args.crowd
            with crowd_process(kind, proc.port, proc.ca_file, count) as stats:
                scenarios[kind] = admissions(
                    proc.port, proc.ca_file, body, args.rate, args.duration, args.warmup
                )
            scenarios[kind]["crowd"] = count
            scenarios[kind]["crowd_reopened"] = stats["reopened"]
        server_peak = proc.peak_rss_bytes() / 2**20
    big = None if args.no_big else big_requests(args.big)
    counts = [int(c) for c in args.workers.split(",") if c]
    workers = worker_memory(counts, args.limit_mib * 2**20, args.big)
    result = {
        "benchmark": "webhook_slow_clients",
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**info, "loadavg_after": os.getloadavg()},
        "crowd": args.crowd,
        "announcers": args.announcers,
        "announced_bytes": ANNOUNCED,
        "rate": args.rate,
        "duration_s": args.duration,
        "admissions": scenarios,
        "server_peak_rss_mib_under_crowds": round(server_peak, 1),
        "max_size_requests": big,
        "worker_memory": workers,
        "targets": {"p99_ms_under_crowd": 100, "peak_rss_mib": 512},
    }
    benchkit.save(RESULTS, result)
    print(f"{info['cpus']} CPUs ({info['cpu_model']}); admissions at {args.rate:.0f}/s for "
          f"{args.duration:.0f} s with {args.crowd} connections of each crowd open "
          f"({args.announcers} for announce: {ANNOUNCED} bytes each)")  # fmt: skip
    for kind, figures in scenarios.items():
        ka, new = figures["keep_alive"], figures["new_connection"]
        print(
            f"  crowd {kind:8}: keep-alive p50 {ka['p50_ms']} ms p99 {ka['p99_ms']} ms "
            f"(errors {ka['errors']}); new connection p50 {new['p50_ms']} ms "
            f"p99 {new['p99_ms']} ms (errors {new['errors']})"
            + (f"; crowd re-opened {figures['crowd_reopened']}x" if kind != "none" else "")
        )
    for row in workers:
        print(
            f"{row['workers']} worker process(es), large-body slots "
            f"{'shared' if row['shared_slots'] else 'per process'}: PSS {row['idle_pss_mib']} MiB "
            f"at rest, peak {row['peak_pss_mib']} MiB under {args.big} concurrent 7 MiB requests "
            f"(+ the supervising process); normal {row['normal_status']} in {row['normal_ms']} "
            f"ms; large: {row['outcomes']}; plan for {args.limit_mib} MiB: {row['plan']}"
        )
    if big is None:
        return 0
    print(
        f"{big['requests']} concurrent {big['request_bytes']}-byte requests + a normal one: "
        f"peak RSS {big['peak_rss_mib']} MiB (before {big['rss_before_mib']}, after "
        f"{big['rss_after_mib']}); normal {big['normal_status']} in {big['normal_ms']} ms; "
        f"large: {big['outcomes']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
