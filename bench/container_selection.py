#!/usr/bin/env python3
"""Container selection time: a workload whose per-container annotation names 40,000 containers,
in a pod of 3,000 containers (issue 28, item 9: the lookups were quadratic).

Times `webhook.containers.select` as it is in the work tree, and, with `--before REV`, the same
function as it was at a git revision (its file loaded from `git show`), so both figures come
from one run on one machine. Prints a table and writes bench/results/container_selection.json.

    .venv/bin/python bench/container_selection.py [--names 40000] [--containers 3000]
        [--repeats 3] [--before 6bc21bd]
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from api import constants
from bench import benchkit
from webhook import containers

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("container_selection")
Select = Callable[[Mapping[str, Any], list[str]], object]


def select_at(rev: str) -> Select:
    """`select` from webhook/containers.py at git revision `rev`."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:webhook/containers.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "containers_before.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("containers_before", path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    fn: Select = module.select
    return fn


def cases(names: int, count: int) -> dict[str, tuple[dict[str, str], list[str]]]:
    present = [f"c{i}" for i in range(count)]
    unknown = ", ".join(f"x{i}" for i in range(names))
    known = ", ".join(f"c{i % count}" for i in range(names))
    exclude = constants.ANNOTATION_EXCLUDE_CONTAINERS
    include = constants.ANNOTATION_INCLUDE_CONTAINERS
    return {
        "exclude, no name a container": ({exclude: unknown}, present),
        "include, every name a container": ({include: known}, present),
    }


def seconds(fn: Select, annotations: dict[str, str], present: list[str], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(annotations, present)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--names", type=int, default=40_000)
    parser.add_argument("--containers", type=int, default=3_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", metavar="REV", help="also time select() at this revision")
    args = parser.parse_args()

    versions: dict[str, Select] = {"work tree": containers.select}
    if args.before:
        versions[f"at {args.before}"] = select_at(args.before)
    machine = {
        **benchkit.machine(),
        "load_avg_1m_at_start": os.getloadavg()[0],
    }
    print(f"{args.names:,} names x {args.containers:,} containers, median of {args.repeats}, "
          f"{machine['cpus']} CPUs, Python {machine['python']}, load average "
          f"{machine['load_avg_1m_at_start']:.2f}")  # fmt: skip
    print(f"{'case':<34} {'version':<16} {'seconds':>10}")
    results = []
    for case, (given, present) in cases(args.names, args.containers).items():
        for version, fn in versions.items():
            elapsed = seconds(fn, given, present, args.repeats)
            results.append({"case": case, "version": version, "seconds": round(elapsed, 6)})
            print(f"{case:<34} {version:<16} {elapsed:>10.4f}")
    benchkit.save(
        RESULTS,
        {
            "benchmark": "container_selection",
            "what": "seconds of webhook.containers.select for one workload",
            "command": " ".join(["python", *sys.argv]),
            "names": args.names,
            "containers": args.containers,
            "machine": machine,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
