"""The Lumigo controller at scale, against a local control plane and the real operator process.

instrument  Time from `Lumigo` creation until N existing Deployments are instrumented (the
            status lists N), API calls per workload, compared with N sequential PUTs on the
            same API server (the practical limit).
rss         Operator RSS with W workloads across M monitored namespaces.

.venv/bin/python bench/operator_scale.py instrument [--count 1000]
.venv/bin/python bench/operator_scale.py rss [--workloads 10000 --namespaces 100]
"""

from __future__ import annotations

import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import benchkit
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS
from tests.support.checks import TOKEN, lumigo_yaml
from tests.support.lumigo import create_token_secret
from tests.support.workloads import workload

# No controller-manager runs here, so no rollout ever completes: without a budget the operator's
# own pace is measured (bench/safe_rollouts.py measures the budget on the real node).
UNPACED = lumigo_yaml(tracing={"injection": {"maxConcurrentRollouts": 0}})

ROOT = benchkit.ROOT

CRD = ROOT / "config" / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"


def rest_calls(op: OperatorProcess) -> dict[str, float]:
    """rest_client_requests_total by method, from the operator's /metrics."""
    _, text = op.probe("/metrics")
    totals: dict[str, float] = {}
    for match in re.finditer(r"^rest_client_requests_total\{([^}]*)\} (\S+)$", text, re.M):
        method = re.search(r'method="([^"]+)"', match.group(1))
        if method:
            totals[method.group(1)] = totals.get(method.group(1), 0) + float(match.group(2))
    return totals


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def install_crd(cluster: LocalCluster) -> KubeClient:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/lumigoes.operator.lumigo.io")
    return KubeClient.from_kubeconfig(cluster.kubeconfig)


def bench_instrument(count: int) -> dict[str, Any]:
    with LocalCluster() as cluster:
        kube = install_crd(cluster)
        op = OperatorProcess(cluster, kube, operator_version="0.1.0", resync_period="30s",
                             log_level="info").setup()  # fmt: skip
        try:
            # The practical limit: N sequential PUTs of a Deployment-sized object.
            raw_ns = op.new_namespace()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, f"r{i}"),
                                                    raw_ns), range(count)))  # fmt: skip
            items, _ = kube.list(DEPLOYMENTS, raw_ns)
            started = time.monotonic()
            for obj in items:
                obj["metadata"].setdefault("annotations", {})["bench"] = "1"
                kube.replace(DEPLOYMENTS, obj, raw_ns)
            put_seconds = time.monotonic() - started

            op.start().wait_ready()
            ns = op.new_namespace()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, f"d{i}"),
                                                    ns), range(count)))  # fmt: skip
            create_token_secret(kube, ns, TOKEN)
            before = rest_calls(op)
            started = time.monotonic()
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=UNPACED)

            def done() -> bool:
                status = kube.get(LUMIGOES, "lumigo", ns).get("status") or {}
                return len(status.get("instrumentedResources") or []) == count

            wait_until(done, 1800, f"{count} instrumented", interval=0.2)
            op_seconds = time.monotonic() - started
            after = rest_calls(op)
        finally:
            op.teardown()
    calls = {m: round((after.get(m, 0) - before.get(m, 0)) / count, 2) for m in after}
    result = {
        "count": count,
        "operator_seconds": round(op_seconds, 2),
        "operator_workloads_per_s": round(count / op_seconds, 1),
        "sequential_put_seconds": round(put_seconds, 2),
        "sequential_puts_per_s": round(count / put_seconds, 1),
        "fraction_of_limit": round(put_seconds / op_seconds, 2),
        "api_calls_per_workload": calls,
    }
    print(json.dumps(result, indent=2))
    return result


def bench_rss(workloads: int, namespaces: int) -> dict[str, Any]:
    with LocalCluster() as cluster:
        kube = install_crd(cluster)
        op = OperatorProcess(cluster, kube, operator_version="0.1.0", resync_period="30s",
                             log_level="info").setup()  # fmt: skip
        try:
            op.start().wait_ready()
            assert op.proc is not None
            idle = rss_mib(op.proc.pid)
            names = [op.new_namespace(f"scale-{n:03d}") for n in range(namespaces)]
            for ns in names:
                create_token_secret(kube, ns, TOKEN)
                cluster.kubectl("apply", "-n", ns, "-f", "-", input=UNPACED)
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(
                    lambda i: kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, f"w{i}"),
                                          names[i % namespaces]),
                    range(workloads),
                ))  # fmt: skip
            create_seconds = time.monotonic() - started

            def all_listed() -> bool:
                total = 0
                for ns in names:
                    status = kube.get(LUMIGOES, "lumigo", ns).get("status") or {}
                    total += len(status.get("instrumentedResources") or [])
                return total == workloads

            wait_until(all_listed, 1800, "every workload listed", interval=2)
            time.sleep(35)  # one resync period of steady state before measuring
            peak_rss = rss_mib(op.proc.pid)
        finally:
            op.teardown()
    result = {
        "workloads": workloads,
        "namespaces": namespaces,
        "idle_rss_mib": round(idle, 1),
        "rss_mib": round(peak_rss, 1),
        "create_seconds_through_webhook": round(create_seconds, 1),
    }
    print(json.dumps(result, indent=2))
    return result


def main() -> int:
    parser = benchkit.parser(__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    instrument = sub.add_parser("instrument")
    instrument.add_argument("--count", type=int, default=1000)
    rss = sub.add_parser("rss")
    rss.add_argument("--workloads", type=int, default=10000)
    rss.add_argument("--namespaces", type=int, default=100)
    args = parser.parse_args()
    if args.what == "instrument":
        result = bench_instrument(args.count)
    else:
        result = bench_rss(args.workloads, args.namespaces)
    benchkit.save(f"operator_{args.what}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
