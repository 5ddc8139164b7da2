"""The real node: start-up time, pod create -> Running latency, and the node's idle memory.

Starts a full local control plane and a real node (envtest/node), then creates N plain pods
(the static busybox test image, `sleep`) one after the other and times each from the create
call's answer until the API shows it Running. Also prints the node's start-up steps and the RSS
of kubelet + containerd + kube-proxy + CoreDNS after the node has been idle (no pod) a while.

    .venv/bin/python bench/node_pod_startup.py [--pods 20] [--idle 15]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from bench import benchkit
from envtest.cluster import FAKE_NODE, LocalCluster
from envtest.node import LocalNode
from envtest.ociimage import BUSYBOX_IMAGE

ROOT = benchkit.ROOT

NAMESPACE = "bench"
POD_START_TIMEOUT = 120.0  # seconds for a plain pod to run before the bench gives up


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--idle", type=float, default=15, help="seconds idle before RSS")
    args = parser.parse_args()

    with LocalCluster(full=True) as cluster:
        cluster.kubectl("cordon", FAKE_NODE)
        node = LocalNode(cluster)
        with node:
            time.sleep(args.idle)
            rss = {
                name: rss_kib(proc.popen.pid)
                for name, proc in node.processes.items()
                if proc.popen is not None
            }
            cluster.kubectl("create", "namespace", NAMESPACE)
            base = f"/api/v1/namespaces/{NAMESPACE}/pods"
            latencies = []
            for i in range(args.pods):
                name = f"p{i}"
                cluster.request(base, "POST", pod(name))
                created = time.monotonic()
                while cluster.request(f"{base}/{name}")["status"].get("phase") != "Running":
                    if time.monotonic() - created > POD_START_TIMEOUT:
                        raise SystemExit(f"pod {name} not Running after 120s")
                    time.sleep(0.02)
                latencies.append(time.monotonic() - created)
            result = {
                "node_start_s": {k: round(v, 2) for k, v in node.timings.items()},
                "pods": args.pods,
                "create_to_running_s": {
                    "p50": round(statistics.median(latencies), 3),
                    "p95": round(percentile(latencies, 0.95), 3),
                    "max": round(max(latencies), 3),
                },
                "idle_rss_mib": {k: round(v / 1024, 1) for k, v in rss.items()}
                | {"total": round(sum(rss.values()) / 1024, 1)},
            }
    print(json.dumps(result, indent=2))
    out = benchkit.results_file("node_pod_startup")
    out.parent.mkdir(exist_ok=True)
    benchkit.save(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
