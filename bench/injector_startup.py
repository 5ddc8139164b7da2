#!/usr/bin/env python3
"""Start-up cost of the injector, measured on this machine.

1. A non-target process: /bin/true with vs without LD_PRELOAD=lumigo_injector.so (the injector's
   own cost on every process of an injected container), and with an empty library linked the
   same way (the dynamic loader's floor for preloading anything). Runs interleave the three arms
   so that machine noise hits them alike; reported as medians and the differences.
2. The Python (Flask, CPython 3.11), Node.js and JVM (OpenJDK, the node tier's jvm-app) test
   apps: time from spawn to the first served HTTP response, untraced vs traced, interleaved (the
   cost of loading the Lumigo distros and the OpenTelemetry Java agent).

Usage: .venv/bin/python bench/injector_startup.py [--runs 2000] [--app-runs 21] [--jvm-runs 11]
Writes bench/results/injector_startup.json. Needs `make payload`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench import benchkit
from tests.support.injector import (
    PROGRAMS,
    OtlpReceiver,
    base_env,
    flask_python,
    python_interpreters,
    running_app,
    webhook_env,
)

ROOT = benchkit.ROOT

PAYLOAD = ROOT / "build" / "payload"
RESULTS = benchkit.results_file("injector_startup")


def spawn_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter_ns() - started
    if status != 0:
        raise SystemExit(f"{argv} exited with status {status}")
    return elapsed / 1e6  # ms


def empty_library(directory: Path) -> Path:
    """A library with no code, linked with the injector's own flags: what preloading *any*
    library costs the dynamic loader (open, mmap, relocate), the floor under our overhead."""
    loader = importlib.machinery.SourceFileLoader(
        "build_payload", str(ROOT / "injector/build-payload")
    )
    build_payload = importlib.util.module_from_spec(
        importlib.util.spec_from_loader(loader.name, loader)
    )
    loader.exec_module(build_payload)
    source = directory / "empty.c"
    source.write_text("int lumigo_bench_empty;\n")
    out = directory / "empty.so"
    flags = [f for f in build_payload.CFLAGS if not f.startswith("-Wl,-soname")]
    subprocess.run(["gcc", *flags, "-o", str(out), str(source)], check=True)
    return out


def non_target(runs: int, home: Path) -> dict[str, float]:
    env_without = {**base_env(home), "LUMIGO_TRACER_TOKEN": "t_0123456789abcdef01234"}
    env_with = {**env_without, "LD_PRELOAD": str(PAYLOAD / "injector" / "lumigo_injector.so")}
    env_empty = {**env_without, "LD_PRELOAD": str(empty_library(home))}
    arms = {"without": env_without, "with": env_with, "empty": env_empty}
    argv = ["/bin/true"]
    for _ in range(50):  # warm the page cache and the dynamic loader's caches
        for env in arms.values():
            spawn_once(argv, env)
    times: dict[str, list[float]] = {name: [] for name in arms}
    order = list(arms)
    for i in range(runs):
        # Rotate the order so that machine noise hits every arm alike.
        for name in order[i % 3 :] + order[: i % 3]:
            times[name].append(spawn_once(argv, arms[name]))
    med = {name: statistics.median(values) for name, values in times.items()}
    return {
        "runs": runs,
        "median_ms_without": round(med["without"], 4),
        "median_ms_with": round(med["with"], 4),
        "mean_ms_without": round(statistics.fmean(times["without"]), 4),
        "mean_ms_with": round(statistics.fmean(times["with"]), 4),
        "median_overhead_ms": round(med["with"] - med["without"], 4),
        "median_overhead_percent": round(100 * (med["with"] - med["without"]) / med["without"], 2),
        "median_ms_empty_library": round(med["empty"], 4),
        "empty_library_overhead_ms": round(med["empty"] - med["without"], 4),
        "empty_library_overhead_percent": round(
            100 * (med["empty"] - med["without"]) / med["without"], 2
        ),
    }


def first_response_ms(args: list[str], env: dict[str, str], home: Path) -> float:
    started = time.perf_counter()
    # Port polled every 2 ms: the default 100 ms would quantise the figure to 100 ms steps.
    with running_app(args, env, home, poll_interval=0.002) as app:
        with urllib.request.urlopen(f"http://127.0.0.1:{app.port}/hello", timeout=60) as r:
            r.read()
        return (time.perf_counter() - started) * 1000


def jvm_app(home: Path) -> list[str] | None:
    """The node tier's JVM test app (hack/images/jvm-app), compiled here; None without a JDK."""
    if shutil.which("javac") is None:
        print("no javac: the JVM figure is skipped", file=sys.stderr)
        return None
    out = home / "jvm-app"
    source = ROOT / "hack" / "images" / "jvm-app" / "App.java"
    subprocess.run(["javac", "-d", str(out), str(source)], check=True)
    return ["java", "-cp", str(out), "App"]


def apps(runs: int, jvm_runs: int, home: Path) -> dict[str, dict[str, float]]:
    python = str(flask_python(python_interpreters()["3.11"]))
    cases = {
        "python-flask-3.11": ([python, str(PROGRAMS / "flask_app.py")], runs),
        "node-http": (["node", str(PROGRAMS / "http_app.js")], runs),
    }
    java = jvm_app(home)
    if java is not None and jvm_runs:
        cases["jvm-http"] = (java, jvm_runs)
    results = {}
    with OtlpReceiver() as receiver:
        traced_env = {**base_env(home), **webhook_env(PAYLOAD, receiver.endpoint, "bench")}
        plain_env = {k: v for k, v in traced_env.items() if k != "LD_PRELOAD"}
        for name, (args, count) in cases.items():
            first_response_ms(args, traced_env, home)  # warm caches (.pyc of the app, disk)
            plain: list[float] = []
            traced: list[float] = []
            for _ in range(count):  # interleaved, so that machine noise hits both alike
                plain.append(first_response_ms(args, plain_env, home))
                traced.append(first_response_ms(args, traced_env, home))
            med_plain, med_traced = statistics.median(plain), statistics.median(traced)
            results[name] = {
                "runs": count,
                "median_ms_untraced": round(med_plain, 1),
                "median_ms_traced": round(med_traced, 1),
                "median_overhead_ms": round(med_traced - med_plain, 1),
            }
    return results


def main() -> None:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    # Start-up times are noisy: the median of many runs.
    parser.add_argument("--app-runs", type=int, default=21)
    parser.add_argument("--jvm-runs", type=int, default=11, help="0 skips the JVM (seconds each)")
    args = parser.parse_args()
    if not (PAYLOAD / "injector" / "lumigo_injector.so").exists():
        raise SystemExit("run `make payload` first")
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"lumigo-bench-{os.getpid()}"
    home.mkdir(parents=True, exist_ok=True)

    result = {
        "machine": {
            **benchkit.machine(),
        },
        "non_target_bin_true": non_target(args.runs, home),
        "apps_first_response": apps(args.app_runs, args.jvm_runs, home),
    }
    benchkit.save(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
