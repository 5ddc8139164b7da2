#!/usr/bin/env python3
"""Legitimate spans' delivery latency through the telemetry proxy, with and without a flood of
requests carrying forged tokens (issue 28, item 5).

The real pieces: a local kube-apiserver (the proxy's k8s_attributes enrichment watches it), the
project's collector binary running exactly the rendered proxy configuration with one tenant (a
namespace with an active Lumigo), and an OTLP/HTTP sink as upstream that records when each
request arrives. A legitimate tracer sends one span per request, `--rate` requests per second,
for the whole of each phase; its delivery latency is the sink's arrival time minus the span's
start time (set when the request is built, just before it is sent). Phases:

1. baseline: the legitimate tracer alone for `--seconds`;
2. flood: the same, while `--forged` requests with random token-shaped Authorization values
   (a hostile pod) are sent on `--threads` keep-alive connections as fast as the proxy answers.

The proxy batches each tenant for up to 1 s (`ProxySettings.batch_timeout`), so latencies sit
near that timeout; what matters is the difference between the phases, and that every
legitimate span arrives. Generator, proxy and sink share the machine's cores.

    .venv/bin/python bench/telemetry_forged_tokens.py [--forged 10000] [--seconds 15]

Prints a summary and writes bench/results/telemetry_forged_tokens.json.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections import Counter
from http import HTTPStatus
from pathlib import Path
from typing import Any

from bench import benchkit
from controller.telemetry.config import MonitoredNamespace, Origin, render
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from tests.support.otel import (
    OTLPSink,
    export_request,
    flood_with_forged_tokens,
    local_settings,
    running_collector,
    running_sink,
    send_traces,
)

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("telemetry_forged_tokens")
TOKEN = "t_0123456789abcdef01234"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class LegitimateTracer:
    """Sends span `<phase>-<i>` at `rate` per second until stopped; remembers the statuses."""

    def __init__(self, port: int, phase: str, rate: float) -> None:
        self.port, self.phase, self.rate = port, phase, rate
        self.sent: list[str] = []
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            name = f"{self.phase}-{i}"
            status = send_traces(self.port, export_request(name), f"LumigoToken {TOKEN}")
            self.statuses[status] += 1
            if status == HTTPStatus.OK:
                self.sent.append(name)
            i += 1
            next_at += 1 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> LegitimateTracer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def latencies(sink: OTLPSink, names: list[str]) -> list[float]:
    """Seconds from each named span's start time to its request's arrival at the sink."""
    wanted = set(names)
    return [s.arrived - s.start for s in sink.spans() if s.name in wanted]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 1),
        "p99_ms": round(percentile(values, 99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--forged", type=int, default=10_000, help="forged-token requests")
    parser.add_argument("--threads", type=int, default=4, help="flooding connections")
    parser.add_argument("--seconds", type=float, default=15.0, help="baseline phase length")
    parser.add_argument("--rate", type=float, default=20.0, help="legitimate requests per s")
    args = parser.parse_args()

    with LocalCluster() as cluster, running_sink() as sink:
        cluster.kubectl("create", "namespace", "bench")
        settings = local_settings(sink.url, "bench", origin=Origin("local-test", "bench-cluster"))
        config = render([MonitoredNamespace("bench", "uid", TOKEN, kube_events=False)], settings)
        with (
            tempfile.TemporaryDirectory() as workdir,
            running_collector(config, Path(workdir), settings.health_port, cluster.env()) as proxy,
        ):
            assert proxy.popen is not None
            pid = proxy.popen.pid
            port = settings.otlp_port
            with LegitimateTracer(port, "baseline", args.rate) as baseline:
                time.sleep(args.seconds)  # the phase's length: a load, not a wait
            cpu_before = cpu_seconds(pid)
            with LegitimateTracer(port, "flood", args.rate) as flooded:
                started = time.monotonic()
                statuses = flood_with_forged_tokens(port, args.forged, args.threads)
                flood_s = time.monotonic() - started
            cpu_flood = cpu_seconds(pid) - cpu_before
            expected = set(baseline.sent) | set(flooded.sent)
            wait_until(
                lambda: expected <= {s.name for s in sink.spans()}, 120, "every legitimate span"
            )
            _, rss_peak = proxy.rss_kib()

    base, flood = latencies(sink, baseline.sent), latencies(sink, flooded.sent)
    figures: dict[str, Any] = {
        "legitimate_rate_per_s": args.rate,
        "baseline": {"spans": len(base), "statuses": dict(baseline.statuses), **summary(base)},
        "with_forged_tokens": {
            "spans": len(flood),
            "statuses": dict(flooded.statuses),
            **summary(flood),
            "forged_requests": args.forged,
            "forged_statuses": dict(statuses),
            "flood_s": round(flood_s, 1),
            "forged_per_s": round(args.forged / flood_s),
            "proxy_cpu_s_per_10k_forged": round(cpu_flood / args.forged * 10_000, 2),
        },
        "forged_spans_upstream": sum(
            1 for s in sink.spans() if s.authorization != f"LumigoToken {TOKEN}"
        ),
        "proxy_rss_peak_mib": round(rss_peak / 1024, 1),
        "batch_timeout": settings.batch_timeout,
        "machine": {
            **benchkit.machine(),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
        },
    }
    benchkit.save(RESULTS, figures)
    for key, value in figures.items():
        print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
