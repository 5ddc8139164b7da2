#!/usr/bin/env python3
"""The event poster's cost while events wait for objects that never appear (issue 28, item 2:
the pending list grew without bound and every poster iteration scanned it).

Feeds N admission events about objects that do not exist to an EventRecorder, as its poster
thread handles them: each is posted (set aside: its object is not found), and each poster
iteration looks for events due again (`_retry_unresolved`) and for the next deadline
(`_until_next_retry`). No API call is made (the objects are looked up in an empty cache; the
wait is long). Times the work tree's recorder, and with `--before REV` the recorder of that
git revision (its file loaded from `git show`), in one run on one machine. Prints a table and
writes bench/results/event_pending.json.

    .venv/bin/python bench/event_pending.py [--events 1000 10000 40000] [--before 6bc21bd]
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pykube

from bench import benchkit
from controller.lumigo.resources import WORKLOADS_BY_KIND
from controller.runtime import events
from controller.runtime.kube import KubeClient

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("event_pending")
DEAD = "https://127.0.0.1:1"  # nothing listens: an API call would fail, none is made


def events_at(rev: str) -> ModuleType:
    """controller/runtime/events.py at git revision `rev`."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:controller/runtime/events.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events_before.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("events_before", path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def run(module: ModuleType, count: int, *, unbounded: bool = False) -> dict[str, Any]:
    client = KubeClient(pykube.KubeConfig.from_url(DEAD), timeout=2.0, retry_attempts=1)
    rec = module.EventRecorder(
        client, resources=WORKLOADS_BY_KIND, resolve_uid_timeout=3600.0, lookup=lambda k, n, m: None
    )
    if unbounded:  # every event kept: the cost of the heap alone, against the list's scans
        rec.max_pending = count
    start = time.perf_counter()
    for i in range(count):
        ref = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "ns", "name": f"d{i}"}
        rec._post(module.PendingEvent(ref, "Normal", "R", "m", "c"))  # set aside
        rec._retry_unresolved()  # one poster iteration, as `_run` does per event
        rec._until_next_retry()
    elapsed = time.perf_counter() - start
    return {
        "events": count,
        "seconds": round(elapsed, 4),
        "microseconds_per_event": round(elapsed / count * 1e6, 1),
        "waiting_at_end": len(rec._unresolved),
    }


def main() -> None:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--events", type=int, nargs="+", default=[1_000, 10_000, 40_000])
    parser.add_argument("--before", metavar="REV", help="also time the recorder at this revision")
    args = parser.parse_args()

    versions: dict[str, tuple[ModuleType, bool]] = {
        "work tree": (events, False),
        "work tree, no bound": (events, True),
    }
    if args.before:
        versions[f"at {args.before}"] = (events_at(args.before), False)
    machine = {
        **benchkit.machine(),
        "load_avg_1m_at_start": os.getloadavg()[0],
    }
    print(f"{machine['cpus']} CPUs, Python {machine['python']}, load average "
          f"{machine['load_avg_1m_at_start']:.2f}")  # fmt: skip
    print(f"{'version':<24} {'events':>8} {'seconds':>10} {'us/event':>10} {'waiting':>8}")
    results = []
    for count in args.events:
        for version, (module, unbounded) in versions.items():
            result = {"version": version, **run(module, count, unbounded=unbounded)}
            results.append(result)
            row = (f"{version:<24} {count:>8} {result['seconds']:>10.4f} "
                   f"{result['microseconds_per_event']:>10.1f}")  # fmt: skip
            print(f"{row} {result['waiting_at_end']:>8}")
    benchkit.save(
        RESULTS,
        {
            "benchmark": "event_pending",
            "what": "seconds for the event poster to take N events about objects that never"
            " appear (set aside, plus one retry scan and one deadline lookup per event)",
            "command": " ".join(["python", *sys.argv]),
            "machine": machine,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
