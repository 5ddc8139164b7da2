#!/usr/bin/env python3
"""Admission throughput and latency of the HTTPS webhook server, called directly over TLS.

The server runs in its own process (as in production), serving a realistic 3-container
Deployment review on keep-alive connections:
  1. offered load: --rate requests/s on one keep-alive connection, open loop (latency counted
     from the scheduled send time, so a stall is not hidden by coordinated omission);
  2. saturation: wrk with --connections keep-alive connections (hack/install-wrk installs it).
Prints the figures and writes bench/results/webhook_direct.json.

    .venv/bin/python bench/webhook_direct.py [--duration 20] [--rate 100] [--connections 8]

--target https://127.0.0.1:<port>/<path> --ca <file> measures another webhook server on this
machine with exactly the same requests instead of ours: the "Go-equivalent" line of the README
comes from the reference operator's webhook, built and started by the reader (see the README).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing.synchronize
import os
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from bench import benchkit
from envtest.process import wait_until
from tests.support import reviews

ROOT = benchkit.ROOT

PATH = "/v1alpha1/inject"
RESULTS = benchkit.results_file("webhook_direct")


class _Discard:
    """Event recorder for a benchmark without an API server (the real one queues, off-path)."""

    def event(self, obj: Any, type: str, reason: str, message: str, component: str) -> None:
        return


def routes() -> tuple[str, dict[str, Any]]:
    """The real handlers, with an Active Lumigo in the namespace of the benchmark's Deployment."""
    from tests.unit.webhook_samples import StaticLister, lumigo
    from webhook.inject_handler import InjectHandler
    from webhook.lumigo_defaulter import MutateHandler
    from webhook.pod_injection import InjectionSettings
    from webhook.routes import admission_routes

    lister = StaticLister({"default": [lumigo(namespace="default")]})
    inject = InjectHandler(lister, _Discard(), InjectionSettings(operator_version="0.1.0"))
    return "real", admission_routes(inject, MutateHandler(lister))


def serve(directory: Path) -> None:
    """Child process: generate a certificate, serve until SIGTERM."""
    from kube import certs
    from kube.http.server import AdmissionServer, ServerOptions
    from kube.http.tls import ServingTLS

    policy = certs.CertPolicy("bench", "bench", extra_ip_addresses=("127.0.0.1",))
    state = certs.bootstrap(policy, dt.datetime.now(dt.UTC))
    tls = ServingTLS()
    tls.load_pem(state.serving.cert_pem, state.serving.key_pem)
    handler_name, table = routes()
    server = AdmissionServer(table, tls, ServerOptions(host="127.0.0.1", port=0))
    server.start()
    (directory / "ca.pem").write_bytes(state.bundle_pem)
    (directory / "handler").write_text(handler_name)
    (directory / "port").write_text(str(server.port))
    stopping = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    while not stopping:
        time.sleep(0.2)
    server.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class LoadOptions:
    """Where an offered load is sent, how many requests warm it up, and what keeps it going."""

    path: str = PATH
    warmup: int = 200
    until: threading.Event | multiprocessing.synchronize.Event | None = None


def offered_load(
    port: int,
    ca: Path,
    body: bytes,
    rate: float,
    duration: float,
    options: LoadOptions = LoadOptions(),
) -> dict[str, Any]:
    """Open loop at `rate`/s on one keep-alive connection for `duration` seconds, and then on
    until `options.until` is set when given (a load measured while some other work runs)."""
    path, warmup, until = options.path, options.warmup, options.until
    ctx = ssl.create_default_context(cafile=str(ca))
    client = reviews.Client(port, ctx)
    for _ in range(warmup):  # warm up the connection and the server's code paths
        client.post(path, body)
    latencies: list[float] = []  # send -> response: what a caller waits
    lags: list[float] = []  # scheduled send -> response: adds the generator's own wake-up lag
    errors = 0
    total = int(rate * duration)
    start = time.perf_counter() + 0.1
    i = 0
    while i < total or (until is not None and not until.is_set()):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent = time.perf_counter()
        status, _ = client.post(path, body)
        done = time.perf_counter()
        latencies.append(done - sent)
        lags.append(done - scheduled)
        errors += status != HTTPStatus.OK
        i += 1
    client.close()
    elapsed = time.perf_counter() - start
    return {
        "offered_rps": rate,
        "achieved_rps": round(i / elapsed, 1),
        "requests": i,
        "seconds": round(elapsed, 1),
        "errors": errors,
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "max_ms": round(max(latencies) * 1000, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
        "from_schedule_p50_ms": round(percentile(lags, 0.50) * 1000, 3),
        "from_schedule_p99_ms": round(percentile(lags, 0.99) * 1000, 3),
    }


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip()).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def saturation(
    port: int, body: bytes, connections: int, duration: float, path: str = PATH
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is missing: run hack/install-wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(body.decode())}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
    try:
        out = subprocess.run(
            [
                wrk,
                f"-t{min(2, connections)}",
                f"-c{connections}",
                f"-d{int(duration)}s",
                "--latency",
                "-s",
                script.name,
                f"https://127.0.0.1:{port}{path}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(script.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    dist = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.M))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors:(.*)", out)
    return {
        "connections": connections,
        "wrk_threads": min(2, connections),
        "duration_s": duration,
        "rps": round(rps, 1),
        "p50_ms": _ms(dist["50"]),
        "p99_ms": _ms(dist["99"]),
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": socket_errors.group(1).strip() if socket_errors else "",
    }


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def local_target(url: str) -> tuple[int, str]:
    """(port, path) of an https URL on this machine: the load generators dial 127.0.0.1."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "https" or parsed.hostname not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"--target must be https://127.0.0.1:<port>/<path>, not {url!r}")
    if parsed.port is None:
        raise SystemExit(f"--target needs a port: {url!r}")
    return parsed.port, parsed.path or "/"


def measure_ours(body: bytes, args: argparse.Namespace) -> tuple[str, Any, Any]:
    """Our server in its own process (as in production): offered load, then saturation."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(directory)])
        try:
            wait_until((directory / "port").exists, 30, "the server to start")
            port = int((directory / "port").read_text())
            handler = (directory / "handler").read_text()
            ca = directory / "ca.pem"
            offered = offered_load(port, ca, body, args.rate, args.duration)
            saturated = saturation(port, body, args.connections, args.duration)
        finally:
            child.terminate()
            child.wait(30)
    return handler, offered, saturated


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--target", help="https://127.0.0.1:<port>/<path> of another webhook")
    parser.add_argument("--ca", type=Path, help="with --target: the CA of its certificate")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    body = reviews.body_of(reviews.review(reviews.deployment(), uid="bench"))
    info = benchkit.machine()
    if args.target:
        port, path = local_target(args.target)
        if args.ca is None:
            parser.error("--target needs --ca (the CA that signed the target's certificate)")
        handler = f"target {args.target}"
        offered = offered_load(port, args.ca, body, args.rate, args.duration, LoadOptions(path))
        saturated = saturation(port, body, args.connections, args.duration, path)
    else:
        handler, offered, saturated = measure_ours(body, args)
    result = {
        "benchmark": "webhook_direct",
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "handler": handler,
        "request_bytes": len(body),
        "machine": {**info, "loadavg_after": loadavg()},
        "offered": offered,
        "saturation": saturated,
        "targets": {"p99_ms_at_100rps": 5.0, "min_rps_saturated": 1500},
    }
    results = RESULTS.with_name("webhook_direct_target.json") if args.target else RESULTS
    benchkit.save(results, result)
    print(
        f"handler: {handler}; request {len(body)} bytes; {info['cpus']} CPUs ({info['cpu_model']})"
    )
    print(
        f"offered {offered['offered_rps']:.0f}/s: p50 {offered['p50_ms']} ms, "
        f"p99 {offered['p99_ms']} ms, max {offered['max_ms']} ms, errors {offered['errors']} "
        f"(from the scheduled send time: p50 {offered['from_schedule_p50_ms']} ms, "
        f"p99 {offered['from_schedule_p99_ms']} ms)"
    )
    print(
        f"saturation, {saturated['connections']} connections: {saturated['rps']} admissions/s, "
        f"p50 {saturated['p50_ms']} ms, p99 {saturated['p99_ms']} ms, "
        f"non-2xx {saturated['non_2xx']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
