#!/usr/bin/env python3
"""The real operator's admission: saturated throughput, and latency while the controller is busy.

For each --workers value (`--webhook-workers` of `lumigo-operator run`; 0 serves admission in the
manager process, next to the informers and reconcilers and under their GIL), against a local
control plane: open-loop admissions at --rate/s on one connection, sent directly over TLS to the
webhook port (a realistic 3-container Deployment in a namespace with an Active Lumigo), first
with the controller idle, then while it instruments --count existing Deployments in another
namespace and removes the instrumentation again (--cycles times: apply the Lumigo, wait until
all are instrumented, delete it, wait until all are clean); then wrk saturation over
--connections keep-alive connections; and the operator's RSS (its whole process tree) idle and
after the load. Latency is counted from each request's scheduled send time as well, so a stall
is not hidden by coordinated omission. The API server's own metrics say how many injector calls
the cycles caused and how many the injector's matchConditions spared (the operator's writes).
The Go-equivalent webhook (bin/webhook-go, see webhook_servers.py) gets the same load at the same
time, each load from a process of its own: what this machine allows a webhook that shares nothing
with our controller, so what is ours can be told from what is the machine's (--no-go skips it).

    .venv/bin/python bench/webhook_busy_controller.py [--workers 0 2] [--count 1000] [--cycles 3]

Writes bench/results/webhook_busy_controller.json. Issue 18's goals: p99 <= 5 ms while busy,
>= 4,000 admissions/s saturated with 8 connections on 2 cores.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import multiprocessing
import os
import queue
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import webhook_servers
from webhook_direct import LoadOptions, offered_load, saturation
from webhook_servers import tree_rss_mib

from bench import benchkit
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, MUTATING_WEBHOOK_CONFIGURATIONS
from tests.support import reviews
from tests.support.checks import TOKEN, clean, is_active, lumigo_yaml
from tests.support.lumigo import create_token_secret
from tests.support.workloads import workload

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("webhook_busy_controller")
CRD = ROOT / "config" / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"
# No controller-manager runs here, so no rollout completes: the controller's own pace, unpaced.
GO = "go-controller-runtime"
UNPACED = lumigo_yaml(tracing={"injection": {"maxConcurrentRollouts": 0}})


def instrumented_count(kube: KubeClient, namespace: str) -> int:
    status = kube.get(LUMIGOES, "lumigo", namespace).get("status") or {}
    return len(status.get("instrumentedResources") or [])


def clean_count(kube: KubeClient, namespace: str) -> int:
    items, _ = kube.list(DEPLOYMENTS, namespace)
    return sum(1 for d in items if clean(d))


def busy_cycles(
    cluster: LocalCluster, kube: KubeClient, namespace: str, count: int, cycles: int
) -> list[dict[str, float]]:
    """Instrument `count` Deployments and remove the instrumentation again, `cycles` times."""
    timings = []
    for _ in range(cycles):
        started = time.monotonic()
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=UNPACED)
        wait_until(lambda: instrumented_count(kube, namespace) == count, 1800, "instrumented",
                   interval=0.5)  # fmt: skip
        instrumented = time.monotonic() - started
        started = time.monotonic()
        cluster.kubectl("delete", "lumigo", "lumigo", "-n", namespace, "--wait=true",
                        "--timeout=1800s")  # fmt: skip
        wait_until(lambda: clean_count(kube, namespace) == count, 1800, "clean", interval=0.5)
        timings.append(
            {
                "instrument_s": round(instrumented, 2),
                "remove_s": round(time.monotonic() - started, 2),
            }
        )
    return timings


def injector_calls(cluster: LocalCluster) -> dict[str, float]:
    """What the API server did with the injector so far: calls made, and calls its
    matchConditions spared (the operator's own writes)."""
    text = cluster.kubectl("get", "--raw", "/metrics")
    names = {
        "called": "apiserver_admission_webhook_admission_duration_seconds_count{",
        "excluded": "apiserver_admission_match_condition_exclusions_total{",
    }
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        for key, prefix in names.items():
            if line.startswith(prefix) and 'name="lumigoinjector.kb.io"' in line:
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


def webhook_ca(kube: KubeClient, op: OperatorProcess, directory: Path) -> Path:
    """The operator's own CA, as it wrote it into its webhook configuration."""
    config = kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, op.config_name)
    bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    path = directory / "ca.pem"
    path.write_bytes(bundle)
    return path


def _load_in_child(load: tuple[int, Path, bytes, float, float], until: Any, results: Any) -> None:
    results.put(offered_load(*load, LoadOptions(until=until)))


def _result(child: BaseProcess, results: Any) -> dict[str, Any]:
    while True:
        with contextlib.suppress(queue.Empty):
            found: dict[str, Any] = results.get(timeout=1.0)
            child.join()
            return found
        if not child.is_alive():
            raise RuntimeError(f"the load generator exited ({child.exitcode}) without figures")


def measure(
    targets: dict[str, tuple[int, Path]],
    body: bytes,
    rate: float,
    idle_seconds: float,
    work: Callable[[], None],
) -> dict[str, dict[str, Any]]:
    """Admissions at `rate`/s to each target (name: port, CA) at once, with the controller idle,
    then while `work` runs here. Each target's load comes from a process of its own: in this one,
    the work's JSON (1,000 Deployments listed every half second) would hold the generator's GIL
    and its pauses would be counted as the webhook's."""
    ctx = multiprocessing.get_context("spawn")

    def load(seconds: float, until: Any) -> dict[str, tuple[BaseProcess, Any]]:
        started = {}
        for name, (port, ca) in targets.items():
            results = ctx.Queue()
            child = ctx.Process(target=_load_in_child,
                                args=((port, ca, body, rate, seconds), until, results))  # fmt: skip
            child.start()
            started[name] = (child, results)
        return started

    idle = {name: _result(*started) for name, started in load(idle_seconds, None).items()}
    done = ctx.Event()
    children = load(0, done)
    time.sleep(3.0)  # the children's start and warm-up, before the work begins
    try:
        work()
    finally:
        done.set()
        busy = {name: _result(*started) for name, started in children.items()}
    return {name: {"idle": idle[name], "busy": busy[name]} for name in targets}


@contextlib.contextmanager
def go_equivalent(directory: Path) -> Iterator[tuple[int, Path]]:
    """bin/webhook-go (the README's Go-equivalent of the reference's webhook server) with the
    bench's certificate: its port and CA."""
    directory.mkdir()
    webhook_servers.certificates(directory)
    with webhook_servers.go_equivalent_server(directory) as port:
        yield port, directory / "ca.pem"


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of these processes and of their descendants onto `cpus`."""
    todo = list(pids)
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), cpus)
                    todo.extend(int(c) for c in (task / "children").read_text().split())


def one_operator(
    cluster: LocalCluster, kube: KubeClient, tmp: Path, workers: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The real operator with `workers` admission workers (0: in the manager process)."""
    op = OperatorProcess(cluster, kube, operator_version="0.1.0", log_level="info",
                         extra_args=(f"--webhook-workers={workers}",)).setup()  # fmt: skip
    try:
        op.start().wait_ready()
        assert op.proc is not None
        if args.pin:  # the operator (and this client) on the last CPU, the control plane not
            pin([op.proc.pid, os.getpid()], {os.cpu_count() - 1})  # type: ignore[operator]
        hot = op.new_namespace()  # where the admissions are for: an Active Lumigo
        create_token_secret(kube, hot, TOKEN)
        cluster.kubectl("apply", "-n", hot, "-f", "-", input=lumigo_yaml())
        wait_until(lambda: is_active(kube, hot), 120, "the Lumigo to be Active")
        busy = op.new_namespace()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, f"d{i}"),
                                                busy), range(args.count)))  # fmt: skip
        create_token_secret(kube, busy, TOKEN)
        ca = webhook_ca(kube, op, tmp)
        body = reviews.body_of(reviews.review(reviews.deployment(namespace=hot)))
        time.sleep(2.0)
        idle_rss = tree_rss_mib(op.proc.pid)
        timings: list[dict[str, float]] = []

        def cycle_work() -> None:
            timings.extend(busy_cycles(cluster, kube, busy, args.count, args.cycles))

        calls_before = injector_calls(cluster)
        with contextlib.ExitStack() as stack:
            targets = {"ours": (op.webhook_port, ca)}
            if args.go:
                # Started from here, it shares this process's CPUs (--pin) with the operator.
                targets[GO] = stack.enter_context(go_equivalent(tmp / "go"))
            latency = measure(targets, body, args.rate, args.idle_seconds, cycle_work)
        calls = {k: v - calls_before[k] for k, v in injector_calls(cluster).items()}
        time.sleep(5.0)  # the last cycle's events and relists settle
        saturated = saturation(op.webhook_port, body, args.connections, args.duration)
        loaded_rss = tree_rss_mib(op.proc.pid)
    finally:
        op.teardown()
    return {
        "workers": workers,
        "operator_rss_mib": {"idle": idle_rss, "after_saturation": loaded_rss},
        "saturation": saturated,
        **latency.pop("ours"),
        "alongside": latency,
        "cycles": timings,
        "api_server_injector_calls": calls,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    info = benchkit.machine()
    results: dict[str, Any] = {}
    with LocalCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD))
        cluster.kubectl("wait", "--for=condition=Established", "crd/lumigoes.operator.lumigo.io")
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        if args.pin:
            pin(cluster.pids(), set(range((os.cpu_count() or 2) - 1)))
        for workers in args.workers:
            directory = Path(tmp) / f"workers-{workers}"
            directory.mkdir()
            results[str(workers)] = one_operator(cluster, kube, directory, workers, args)
    return {
        "benchmark": "webhook_busy_controller",
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**info, "loadavg_after": os.getloadavg()},
        "count": args.count,
        "rate": args.rate,
        "by_workers": results,
        "pinned": args.pin,
        "targets": {"p99_ms_while_busy": 5.0, "saturated_rps": 4000},
    }


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[0, 2],
        help="--webhook-workers values to measure (0: in the manager process)",
    )
    parser.add_argument(
        "--no-go",
        dest="go",
        action="store_false",
        help="skip the Go-equivalent webhook (bin/webhook-go) measured alongside ours, at the "
        "same rate through the same busy cycles: what this machine allows any webhook",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="wrk seconds")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the control plane (etcd, API server, controller manager) on every CPU but the "
        "last, the operator and the admission client on the last, as when the control plane "
        "runs on other machines: what the operator's own controller does to admission latency",
    )
    args = parser.parse_args()
    result = run(args)
    results = RESULTS.with_name(f"{RESULTS.stem}_pinned.json") if args.pin else RESULTS
    benchkit.save(results, result)
    m = result["machine"]
    print(f"{m['cpus']} CPUs ({m['cpu_model']}); {args.rate:.0f} admissions/s on one connection")
    for workers, figures in result["by_workers"].items():
        sat, rss = figures["saturation"], figures["operator_rss_mib"]
        print(f"--webhook-workers={workers}: operator RSS {rss['idle']} MiB idle, "
              f"{rss['after_saturation']} MiB after saturation; saturated "
              f"({sat['connections']} conns): {sat['rps']}/s, p99 {sat['p99_ms']} ms, "
              f"non-2xx {sat['non_2xx']} {sat['socket_errors']}")  # fmt: skip
        for target, phases in [("ours", figures), *figures["alongside"].items()]:
            for name in ("idle", "busy"):
                r = phases[name]
                print(
                    f"  {target}, {name}: {r['requests']} admissions in {r['seconds']} s: "
                    f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms (p99 "
                    f"from the scheduled send {r['from_schedule_p99_ms']} ms), errors {r['errors']}"
                )
        for i, t in enumerate(figures["cycles"], 1):
            print(f"  cycle {i}: {args.count} Deployments instrumented in {t['instrument_s']} s, "
                  f"cleaned in {t['remove_s']} s")  # fmt: skip
        calls = figures["api_server_injector_calls"]
        print(f"  the API server, during the cycles: {calls['called']:.0f} injector calls, "
              f"{calls['excluded']:.0f} spared by its matchConditions")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
