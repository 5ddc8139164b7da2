"""Informer memory: RSS growth per cached Deployment, full objects vs a metadata projection.

Starts a local control plane, creates N realistic Deployments (3 containers, env, probes,
resources), then measures — each in a fresh Python process so nothing else is in the heap —
the RSS before and after an informer has listed them all.

    .venv/bin/python bench/informer_memory.py [--count 10000]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench import benchkit
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from kube.kinds import DEPLOYMENTS, NAMESPACES

ROOT = benchkit.ROOT

MEASURE = """
import gc, json, sys, time
from controller.runtime.kube import KubeClient
from controller.runtime.informer import Informer, Selection, metadata_projection
from kube.kinds import DEPLOYMENTS
from api import constants

def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))

client = KubeClient.from_kubeconfig(sys.argv[1])
mode = sys.argv[2]
transform = metadata_projection() if mode == "projection" else None
informer = Informer(client, Selection(DEPLOYMENTS), transform=transform,
                    indexed_labels=(constants.LABEL_AUTO_TRACE,))
gc.collect()
before = rss_kib()
informer.start()
assert informer.wait_for_sync(600)
gc.collect()
time.sleep(1)
after = rss_kib()
print(json.dumps({"before_kib": before, "after_kib": after, "objects": len(informer.store)}))
informer.stop()
"""


def deployment(i: int) -> dict[str, object]:
    containers = [
        {
            "name": f"c{c}",
            "image": f"registry.example.com/team/app-{c}:1.{i % 50}.0",
            "ports": [{"containerPort": 8080 + c, "name": f"http{c}"}],
            "env": [{"name": f"VAR_{k}", "value": f"value-{k}-{i}"} for k in range(6)],
            "resources": {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"cpu": "1", "memory": "512Mi"},
            },
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080 + c}},
        }
        for c in range(3)
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"app-{i:05d}",
            "labels": {"app": f"app-{i}", "team": f"team-{i % 20}"},
            "annotations": {"example.com/owner": f"owner-{i % 7}@example.com"},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": f"app-{i}"}},
            "template": {
                "metadata": {"labels": {"app": f"app-{i}"}},
                "spec": {"containers": containers},
            },
        },
    }


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--namespaces", type=int, default=100)
    args = parser.parse_args()
    with LocalCluster() as cluster:
        client = KubeClient.from_kubeconfig(cluster.kubeconfig)
        for n in range(args.namespaces):
            client.create(
                NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"b{n}"}}
            )
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda i: client.create(DEPLOYMENTS, deployment(i), f"b{i % args.namespaces}"),
                    range(args.count),
                )
            )
        print(f"created {args.count} Deployments in {time.monotonic() - started:.1f}s")
        results: dict[str, dict[str, float]] = {}
        for mode in ("full", "projection"):
            out = subprocess.run(
                [sys.executable, "-c", MEASURE, str(cluster.kubeconfig), mode],
                capture_output=True, text=True, check=True, cwd=ROOT,
                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            ).stdout  # fmt: skip
            data = json.loads(out.strip().splitlines()[-1])
            growth = (data["after_kib"] - data["before_kib"]) * 1024
            results[mode] = {
                "objects": data["objects"],
                "rss_growth_mib": round(growth / 2**20, 1),
                "bytes_per_object": round(growth / data["objects"]),
            }
            print(
                f"{mode:>10}: {data['objects']} objects, RSS +{growth / 2**20:.1f} MiB, "
                f"{growth / data['objects']:.0f} bytes/object"
            )
    benchkit.save("informer_memory", {"count": args.count, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
