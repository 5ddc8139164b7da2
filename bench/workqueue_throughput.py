#!/usr/bin/env python3
"""Work queue throughput: keys/s through add -> get -> done, with 1 and 4 worker threads.

One producer thread adds N distinct (namespace, name) keys while the workers get and mark them
done. Two workloads:

- `noop`: no reconcile work, so the figure is the queue's own ceiling: locking, de-duplication
  bookkeeping and, for a named queue, the seven client-go metrics;
- `io-1ms`: each reconcile blocks 1 ms without holding the GIL, like a reconcile waiting on one
  API call; this shows what several workers buy a real controller.

Prints a table and writes bench/results/workqueue_throughput.json.

    .venv/bin/python bench/workqueue_throughput.py [--keys 100000] [--io-keys 2000] [--repeats 3]
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Hashable
from pathlib import Path

from bench import benchkit
from controller.runtime.workqueue import RateLimitingQueue

RESULTS = Path(__file__).resolve().parent / "results" / "workqueue_throughput.json"


def _work(queue: RateLimitingQueue[Hashable], counts: list[int], index: int, io_s: float) -> None:
    while True:
        key, shutdown = queue.get()
        if shutdown:
            return
        if io_s:
            time.sleep(io_s)  # stands for a blocking API call (releases the GIL)
        counts[index] += 1
        queue.done(key)


def run_once(keys: list[Hashable], workers: int, named: bool, io_seconds: float) -> float:
    """Seconds for every key to go through add -> get -> (simulated reconcile) -> done."""
    queue = RateLimitingQueue[Hashable]("bench" if named else "")
    counts = [0] * workers

    def produce() -> None:
        for key in keys:
            queue.add(key)

    threads = [
        threading.Thread(target=_work, args=(queue, counts, i, io_seconds), daemon=True)
        for i in range(workers)
    ]
    producer = threading.Thread(target=produce, daemon=True)
    start = time.perf_counter()
    try:
        for thread in threads:
            thread.start()
        producer.start()
        producer.join()
        queue.shut_down()  # workers still take every queued key, then see shutdown
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    finally:
        queue.shut_down()
        producer.join()
        for thread in threads:
            thread.join()
    if sum(counts) != len(keys):
        raise SystemExit(f"lost keys: {sum(counts)} of {len(keys)} processed")
    return elapsed


def main() -> None:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--keys", type=int, default=100_000, help="keys for the noop workload")
    parser.add_argument("--io-keys", type=int, default=2_000, help="keys for the io-1ms workload")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    machine = {
        **benchkit.machine(),
        "load_avg_1m_at_start": os.getloadavg()[0],
    }
    print(f"{args.repeats} runs each, {machine['cpus']} CPUs, Python {machine['python']}, "
          f"load average {machine['load_avg_1m_at_start']:.2f} (shared machine)")  # fmt: skip
    header = f"{'workload':>8} {'keys':>7} {'workers':>7} {'metrics':>7}"
    print(f"{header} {'keys/s median':>14} {'min':>9} {'max':>9}")
    results = []
    for workload, count, io_seconds in (("noop", args.keys, 0.0), ("io-1ms", args.io_keys, 1e-3)):
        keys: list[Hashable] = [(f"ns-{i % 50}", f"obj-{i}") for i in range(count)]
        for named in (True, False):
            for workers in (1, 4):
                rates = [
                    count / run_once(keys, workers, named, io_seconds) for _ in range(args.repeats)
                ]
                row = {
                    "workload": workload,
                    "keys": count,
                    "workers": workers,
                    "metrics": named,
                    "keys_per_second_median": round(statistics.median(rates)),
                    "keys_per_second_min": round(min(rates)),
                    "keys_per_second_max": round(max(rates)),
                }
                results.append(row)
                print(f"{workload:>8} {count:>7} {workers:>7} {'on' if named else 'off':>7} "
                      f"{row['keys_per_second_median']:>14,} {row['keys_per_second_min']:>9,} "
                      f"{row['keys_per_second_max']:>9,}")  # fmt: skip
    benchkit.save(
        RESULTS,
        {
            "benchmark": "workqueue_throughput",
            "what": "keys/s through add -> get -> done; 1 producer thread; "
            "noop = no reconcile work, io-1ms = 1 ms GIL-free wait per key",
            "command": " ".join(["python", *sys.argv]),
            "repeats": args.repeats,
            "machine": machine,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
