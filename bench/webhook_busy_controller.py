#!/usr/bin/env python3
"""Admission latency while the controller is busy, in the real operator process.

The webhook shares its process (and its GIL) with the informers and reconcilers. This measures
what that costs: open-loop admissions at --rate/s, sent directly over TLS to the operator's
webhook port (a realistic 3-container Deployment in a namespace with an Active Lumigo), first
with the controller idle, then while it instruments --count existing Deployments in another
namespace and removes the instrumentation again (--cycles times: apply the Lumigo, wait until
all are instrumented, delete it, wait until all are clean). Latency is counted from each
request's scheduled send time as well, so a stall is not hidden by coordinated omission.

    .venv/bin/python bench/webhook_busy_controller.py [--count 1000] [--cycles 3] [--rate 100]

Writes bench/results/webhook_busy_controller.json. Issue 18's goal: p99 <= 5 ms while busy.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "hack"), str(ROOT / "bench")]

from webhook_direct import machine, offered_load  # noqa: E402

from controller.lumigo.resources import LUMIGOES  # noqa: E402
from controller.runtime.kube import KubeClient  # noqa: E402
from controller.runtime.resources import DEPLOYMENTS, MUTATING_WEBHOOK_CONFIGURATIONS  # noqa: E402
from localcluster import LocalCluster, wait_until  # noqa: E402
from localoperator import OperatorProcess  # noqa: E402
from tests.support import reviews  # noqa: E402
from tests.support.checks import TOKEN, clean, is_active, lumigo_yaml  # noqa: E402
from tests.support.lumigo import create_token_secret  # noqa: E402
from tests.support.workloads import workload  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "webhook_busy_controller.json"
CRD = ROOT / "config" / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"
# No controller-manager runs here, so no rollout completes: the controller's own pace, unpaced.
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


def webhook_ca(kube: KubeClient, op: OperatorProcess, directory: Path) -> Path:
    """The operator's own CA, as it wrote it into its webhook configuration."""
    config = kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, op.config_name)
    bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    path = directory / "ca.pem"
    path.write_bytes(bundle)
    return path


def measure(
    port: int,
    ca: Path,
    body: bytes,
    rate: float,
    idle_seconds: float,
    work: Callable[[], None],
) -> dict[str, Any]:
    """Admissions with the controller idle, then while `work` runs in another thread."""
    idle = offered_load(port, ca, body, rate, idle_seconds)
    done = threading.Event()
    failure: list[BaseException] = []

    def run_work() -> None:
        try:
            work()
        except BaseException as err:  # re-raised after the measurement
            failure.append(err)
        finally:
            done.set()

    worker = threading.Thread(target=run_work, daemon=True)
    worker.start()
    busy = offered_load(port, ca, body, rate, 0, until=done)
    worker.join()
    if failure:
        raise failure[0]
    return {"idle": idle, "busy": busy}


@contextlib.contextmanager
def separate_server(directory: Path) -> Iterator[tuple[int, Path]]:
    """bench/webhook_direct.py's server (the real handlers) in a child process."""
    directory.mkdir()
    script = ROOT / "bench" / "webhook_direct.py"
    child = subprocess.Popen([sys.executable, str(script), "--serve", str(directory)])
    try:
        wait_until((directory / "port").exists, 30, "the separate server to start")
        yield int((directory / "port").read_text()), directory / "ca.pem"
    finally:
        child.terminate()
        child.wait(30)


def run(count: int, cycles: int, rate: float, idle_seconds: float) -> dict[str, Any]:
    info = machine()
    with LocalCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD))
        cluster.kubectl("wait", "--for=condition=Established", "crd/lumigoes.operator.lumigo.io")
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        op = OperatorProcess(cluster, kube, operator_version="0.1.0", log_level="info").setup()
        try:
            op.start().wait_ready()
            hot = op.new_namespace()  # where the admissions are for: an Active Lumigo
            create_token_secret(kube, hot, TOKEN)
            cluster.kubectl("apply", "-n", hot, "-f", "-", input=lumigo_yaml())
            wait_until(lambda: is_active(kube, hot), 120, "the Lumigo to be Active")
            busy = op.new_namespace()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, f"d{i}"),
                                                    busy), range(count)))  # fmt: skip
            create_token_secret(kube, busy, TOKEN)
            ca = webhook_ca(kube, op, Path(tmp))
            body = reviews.body_of(reviews.review(reviews.deployment(namespace=hot)))
            timings: list[dict[str, float]] = []

            def cycle_work() -> None:
                timings.extend(busy_cycles(cluster, kube, busy, count, cycles))

            in_process = measure(op.webhook_port, ca, body, rate, idle_seconds, cycle_work)
            # The same load on a webhook server in a process of its own (the handlers of
            # bench/webhook_direct.py): what isolating admission from the controller can give
            # on this machine, where the API server and etcd share the same two cores.
            with separate_server(Path(tmp) / "separate") as (port, separate_ca):
                # Its handlers see an Active Lumigo in "default": the same instrumenting path.
                same_work = reviews.body_of(reviews.review(reviews.deployment()))
                separate = measure(port, separate_ca, same_work, rate, idle_seconds, cycle_work)
        finally:
            op.teardown()
    return {
        "benchmark": "webhook_busy_controller",
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**info, "loadavg_after": os.getloadavg()},
        "count": count,
        "cycles": timings,
        "rate": rate,
        "in_process": in_process,
        "separate_process": separate,
        "targets": {"p99_ms_while_busy": 5.0},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args()
    result = run(args.count, args.cycles, args.rate, args.idle_seconds)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    m = result["machine"]
    print(f"{m['cpus']} CPUs ({m['cpu_model']}); {args.rate:.0f} admissions/s on one connection")
    for where in ("in_process", "separate_process"):
        for name in ("idle", "busy"):
            r = result[where][name]
            print(
                f"{where} {name}: {r['requests']} admissions in {r['seconds']} s: "
                f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms (p99 from "
                f"the scheduled send {r['from_schedule_p99_ms']} ms), errors {r['errors']}"
            )
    for i, t in enumerate(result["cycles"], 1):
        print(f"cycle {i}: {args.count} Deployments instrumented in {t['instrument_s']} s, "
              f"cleaned in {t['remove_s']} s")  # fmt: skip
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
