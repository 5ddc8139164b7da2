"""ChildMetrics (issue 28 item 8): the multiprocess metric files of processes that exited are
folded into retired files, so restarts never pile files up, and the totals stay exact. Real
child processes write real prometheus_client multiprocess files."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controller.runtime.process_metrics import ChildMetrics

LIVES = 6


def child_life(life: int) -> None:
    """One process's life: counts, observes and sets gauges, then exits."""
    Counter("t_requests_total", "requests", ["code"], registry=None).labels("200").inc(2)
    Histogram("t_latency_seconds", "latency", buckets=(0.1, 1.0), registry=None).observe(0.5)
    Gauge("t_in_flight", "in flight", multiprocess_mode="livesum", registry=None).set(1)
    Gauge("t_peak", "peak", multiprocess_mode="max", registry=None).set(life)
    Gauge("t_each", "each", multiprocess_mode="all", registry=None).set(life)


def scrape(metrics: ChildMetrics) -> str:
    registry = CollectorRegistry()
    registry.register(metrics)
    return generate_latest(registry).decode()


def test_retired_processes_leave_bounded_files_and_exact_totals(tmp_path: Path) -> None:
    metrics = ChildMetrics(tmp_path)
    context = multiprocessing.get_context("spawn")
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    try:
        for life in range(1, LIVES + 1):
            process = context.Process(target=child_life, args=(life,))
            process.start()
            process.join(60)
            assert process.exitcode == 0
            assert process.pid is not None
            assert any(tmp_path.glob(f"*_{process.pid}.db"))
            metrics.retire(process.pid)
            assert not any(tmp_path.glob(f"*_{process.pid}.db"))
            # One retired file per type and mode, whatever the number of lives so far.
            assert sorted(p.name for p in metrics.files()) == [
                "counter_retired.db", "gauge_max_retired.db", "histogram_retired.db",
            ]  # fmt: skip
    finally:
        if previous is None:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = previous

    text = scrape(metrics)
    assert f't_requests_total{{code="200"}} {2.0 * LIVES}' in text
    assert f"t_latency_seconds_count {float(LIVES)}" in text
    assert f't_latency_seconds_bucket{{le="1.0"}} {float(LIVES)}' in text
    assert 't_latency_seconds_bucket{le="0.1"} 0.0' in text
    assert f"t_peak {float(LIVES)}" in text  # the highest any life set
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    # The live gauges and the per-process ones went with their processes.
    assert not [line for line in samples if line.startswith(("t_in_flight", "t_each"))]
