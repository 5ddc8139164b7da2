#!/usr/bin/env python3
"""What lumigo_k8s_enricher costs the proxy per Kubernetes Event (issue 29 item 1).

One monitored namespace holding a Deployment, a ReplicaSet it controls and a Pod of that
ReplicaSet (made by hand); the real collector runs the configuration the operator renders, with
and without the enricher, against a local kube-apiserver; `--events` Events about the Pod, the
ReplicaSet and the Deployment in turn (each naming its object's resourceVersion) are posted, and
the collector's CPU time (user + system, from /proc) is read from the first post until the sink
has every Event. Also its RSS at the end.

    .venv/bin/python bench/telemetry_events_enricher.py [--events 2000]

Prints a table and writes bench/results/telemetry_events_enricher.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import benchkit
from controller.runtime.kube import KubeClient
from controller.telemetry.config import MonitoredNamespace, render
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import EVENTS, NAMESPACES, REPLICASETS
from tests.e2e.test_telemetry_events import owned_pod
from tests.support.otel import local_settings, running_collector, running_sink

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("telemetry_events_enricher")
INITIAL_RECORDS = 3  # object records the proxy sends at start, before the Events


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    with LocalCluster() as cluster:
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        crd = ROOT / "config" / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"
        cluster.kubectl("apply", "--server-side", "-f", str(crd))
        established = "--for=condition=Established"
        cluster.kubectl("wait", established, "--timeout=60s", "crd/lumigoes.operator.lumigo.io")
        cluster.kubectl("create", "namespace", "bench")
        for enricher in (False, True):
            ns = f"bench-{'enricher' if enricher else 'upstream'}"
            cluster.kubectl("create", "namespace", ns)
            uid = kube.get(NAMESPACES, ns)["metadata"]["uid"]
            deploy, pod = owned_pod(kube, ns)
            replicaset = kube.get(REPLICASETS, "shop-5d8f7c9b4", ns)
            objects = [pod, replicaset, deploy]
            with running_sink() as sink, tempfile.TemporaryDirectory() as workdir:
                settings = local_settings(
                    sink.url, "bench", lease_name=f"bench-{ns}", k8s_enricher=enricher
                )
                config = render([MonitoredNamespace(ns, uid, f"t_{0:021x}")], settings)
                with running_collector(
                    config, Path(workdir), settings.health_port, cluster.env()
                ) as proxy:
                    assert proxy.popen is not None
                    wait_until(
                        lambda: len(sink.logs()) >= INITIAL_RECORDS, 60, "the initial objects"
                    )
                    before = cpu_seconds(proxy.popen.pid)
                    started = time.monotonic()
                    for i in range(args.events):
                        obj = objects[i % 3]
                        meta = obj["metadata"]
                        involved = {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                    "name": meta["name"], "namespace": ns, "uid": meta["uid"],
                                    "resourceVersion": meta["resourceVersion"]}  # fmt: skip
                        kube.create(
                            EVENTS,
                            {"apiVersion": "v1", "kind": "Event",
                             "metadata": {"name": f"e-{i}"}, "involvedObject": involved,
                             "reason": "Bench", "type": "Normal", "message": f"event {i}",
                             "source": {"component": "bench"}, "count": 1},
                            ns,
                        )  # fmt: skip

                    def all_events() -> bool:
                        names = {
                            r.body.get("metadata", {}).get("name")
                            for r in sink.logs()
                            if isinstance(r.body, dict) and r.body.get("kind") == "Event"
                        }
                        return len(names) >= args.events  # fmt: skip

                    wait_until(all_events, 300, "every Event at the sink")
                    elapsed = time.monotonic() - started
                    cpu = cpu_seconds(proxy.popen.pid) - before
                    rss, peak = proxy.rss_kib()
            with_root = sum(1 for r in sink.logs() if isinstance(r.body, dict)
                            and r.body.get("kind") == "Event"
                            and r.body.get("rootOwnerReference"))  # fmt: skip
            row = {
                "enricher": enricher,
                "events": args.events,
                "collector_cpu_s": round(cpu, 2),
                "collector_cpu_ms_per_event": round(1000 * cpu / args.events, 3),
                "events_with_root_owner": with_root,
                "rss_mib": round(rss / 1024, 1),
                "rss_peak_mib": round(peak / 1024, 1),
                "post_and_deliver_s": round(elapsed, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    figures = {
        "rows": rows,
        "machine": {
            **benchkit.machine(),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
        },
    }
    benchkit.save(RESULTS, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
