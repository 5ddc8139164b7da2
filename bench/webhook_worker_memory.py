#!/usr/bin/env python3
"""Memory of the real operator (manager + admission workers) under concurrent maximum-size
(7 MiB) admissions, per worker count and memory limit (issue 28 item 3).

For each --workers count and each --limits value the real operator runs against a local API
server with `--webhook-workers=N`, seeing that memory limit through LUMIGO_MEMORY_LIMIT (as the
pod sees its cgroup's; `none`: no limit, so every worker parses a large body on its own, as
before the workers shared the pod's large-body slots). An Active Lumigo makes the admissions
take the full injection path. Then --big concurrent 7 MiB admissions plus a normal one: the
summed PSS of the operator's processes (sampled every 20 ms) at rest and at the peak, and how
many workers the operator started. Prints the figures; writes
bench/results/webhook_worker_memory.json.

    flock /tmp/node-tier.lock .venv/bin/python bench/webhook_worker_memory.py \
        [--workers 1,2,4] [--limits none,512,1024] [--big 20]
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import ssl
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook_busy_controller import CRD, webhook_ca

from bench import benchkit
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.http import memory
from tests.support.checks import TOKEN, is_active, lumigo_yaml
from tests.support.lumigo import create_token_secret
from tests.support.webhook_server import max_size_flood

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("webhook_worker_memory")
MiB = 1024 * 1024


def tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return pids


def workers_of(pid: int) -> int:
    """Admission worker processes under `pid` (not multiprocessing's resource tracker)."""
    count = 0
    for each in tree(pid)[1:]:
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{each}/cmdline").read_bytes()
            count += b"spawn_main" in cmdline and b"resource_tracker" not in cmdline
    return count


def pss(pid: int) -> int:
    """PSS of `pid` and its descendants (shared pages counted once, as the pod's cgroup)."""
    total = 0
    for each in tree(pid):
        with contextlib.suppress(OSError, StopIteration, ValueError):
            rollup = Path(f"/proc/{each}/smaps_rollup").read_text().splitlines()
            total += int(next(x for x in rollup if x.startswith("Pss:")).split()[1]) * 1024
    return total


@dataclass(frozen=True)
class Target:
    """The operator as `max_size_flood` sees a server: its port, and the memory of its tree."""

    port: int
    pid: int
    context: ssl.SSLContext

    def rss_bytes(self) -> int:
        return pss(self.pid)


@contextlib.contextmanager
def peak_sampler(pid: int) -> Iterator[list[int]]:
    peak = [0]
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.02):  # a sampling period
            peak[0] = max(peak[0], pss(pid))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def one(cluster: LocalCluster, kube: KubeClient, tmp: Path, workers: int, limit: int | None,
        big: int) -> dict[str, Any]:  # fmt: skip
    if limit is None:
        os.environ.pop(memory.LIMIT_ENV, None)
    else:
        os.environ[memory.LIMIT_ENV] = str(limit)
    op = OperatorProcess(cluster, kube, operator_version="0.1.0", log_level="info",
                         extra_args=(f"--webhook-workers={workers}",)).setup()  # fmt: skip
    try:
        op.start().wait_ready()
        assert op.proc is not None
        hot = op.new_namespace()
        create_token_secret(kube, hot, TOKEN)
        cluster.kubectl("apply", "-n", hot, "-f", "-", input=lumigo_yaml())
        wait_until(lambda: is_active(kube, hot), 120, "the Lumigo to be Active")
        ca = webhook_ca(kube, op, tmp)
        target = Target(op.webhook_port, op.proc.pid, ssl.create_default_context(cafile=str(ca)))
        started = workers_of(op.proc.pid)
        idle = pss(op.proc.pid)
        with peak_sampler(op.proc.pid) as peak:
            flood = max_size_flood(target, big, namespace=hot)
    finally:
        op.teardown()
        os.environ.pop(memory.LIMIT_ENV, None)
    return {
        "workers_asked": workers,
        "workers_started": started,
        "limit_mib": None if limit is None else limit // MiB,
        "idle_pss_mib": round(idle / MiB, 1),
        "peak_pss_mib": round(peak[0] / MiB, 1),
        "normal_status": flood.normal_status,
        "normal_ms": round(flood.normal_seconds * 1000, 1),
        "outcomes": {o: flood.outcomes.count(o) for o in sorted(set(flood.outcomes))},
    }


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--limits", default="none,512,1024", help="MiB, or none")
    parser.add_argument("--big", type=int, default=20)
    args = parser.parse_args()
    counts = [int(c) for c in args.workers.split(",")]
    limits = [None if x == "none" else int(x) * MiB for x in args.limits.split(",")]
    info = benchkit.machine()
    rows = []
    with LocalCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD))
        cluster.kubectl("wait", "--for=condition=Established", "crd/lumigoes.operator.lumigo.io")
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        for limit in limits:
            for workers in counts:
                row = one(cluster, kube, Path(tmp), workers, limit, args.big)
                rows.append(row)
                print(
                    f"--webhook-workers={workers}, limit {row['limit_mib'] or 'none'} MiB: "
                    f"{row['workers_started']} started; PSS {row['idle_pss_mib']} MiB at rest, "
                    f"peak {row['peak_pss_mib']} MiB under {args.big} x 7 MiB; normal "
                    f"{row['normal_status']} in {row['normal_ms']} ms; large {row['outcomes']}",
                    flush=True,
                )
    result = {
        "benchmark": "webhook_worker_memory",
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**info, "loadavg_after": os.getloadavg()},
        "rows": rows,
    }
    benchkit.save(RESULTS, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
