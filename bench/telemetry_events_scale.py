#!/usr/bin/env python3
"""The proxy's memory as the number of monitored namespaces grows (events/objects collection).

Each monitored namespace adds one k8s_objects receiver (8 watches), one resource processor, one
exporter and one pipeline to the rendered configuration. For each N in `--counts`, the real
collector runs the configuration the operator renders for N namespaces against a local
kube-apiserver, each namespace holding one Deployment; once the upstream sink has received
records from all N namespaces (every pipeline is up and its initial state delivered), the proxy's
RSS is read.

    .venv/bin/python bench/telemetry_events_scale.py [--counts 0,10,50] [--no-enricher]

Prints a table and writes bench/results/telemetry_events_scale.json (with `--no-enricher`, the
configuration for the upstream image, without lumigo_k8s_enricher:
bench/results/telemetry_events_scale_no_enricher.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from bench import benchkit
from controller.runtime.kube import KubeClient
from controller.telemetry.config import MonitoredNamespace, render
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS
from tests.support.otel import (
    OTLPSink,
    local_settings,
    running_collector,
    running_sink,
)

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("telemetry_events_scale")


def deployment(name: str) -> dict[str, object]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
            },
        },
    }


def delivering(sink: OTLPSink, wanted: set[str]) -> bool:
    return wanted <= {r.resource.get("k8s.namespace.name") for r in sink.logs()}


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--counts", default="0,10,50")
    parser.add_argument("--enricher", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    results = RESULTS if args.enricher else RESULTS.with_stem(RESULTS.stem + "_no_enricher")
    counts = [int(c) for c in args.counts.split(",")]

    rows = []
    with LocalCluster() as cluster:
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        cluster.kubectl("create", "namespace", "bench")
        # Each namespace's heartbeat receiver pulls its Lumigoes: the CRD must be served.
        crd = ROOT / "config" / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"
        cluster.kubectl("apply", "--server-side", "-f", str(crd))
        established = "--for=condition=Established"
        cluster.kubectl("wait", established, "--timeout=60s", "crd/lumigoes.operator.lumigo.io")
        created = 0
        for n in counts:
            while created < n:
                name = f"bench-ns-{created:03d}"
                cluster.kubectl("create", "namespace", name)
                kube.create(DEPLOYMENTS, deployment("app"), name)
                created += 1
            namespaces = [
                MonitoredNamespace(f"bench-ns-{i:03d}", f"uid-{i}", f"t_{i:021x}") for i in range(n)
            ]
            with running_sink() as sink, tempfile.TemporaryDirectory() as workdir:
                settings = local_settings(
                    sink.url, "bench", lease_name=f"bench-{n}", k8s_enricher=args.enricher
                )
                config = render(namespaces, settings)
                started = time.monotonic()
                with running_collector(
                    config, Path(workdir), settings.health_port, cluster.env()
                ) as proxy:
                    wait_until(
                        partial(delivering, sink, {ns.name for ns in namespaces}),
                        300,
                        "records from every monitored namespace",
                    )
                    settled = time.monotonic() - started
                    rss, peak = proxy.rss_kib()
            rows.append(
                {
                    "namespaces": n,
                    "config_bytes": len(config),
                    "rss_mib": round(rss / 1024, 1),
                    "rss_peak_mib": round(peak / 1024, 1),
                    "all_pipelines_delivering_after_s": round(settled, 1),
                }
            )
            print(
                f"namespaces={n:4} config={len(config):7} B  rss={rss / 1024:7.1f} MiB  "
                f"peak={peak / 1024:7.1f} MiB  all delivering after {settled:5.1f} s",
                flush=True,
            )

    figures = {
        "rows": rows,
        "machine": {
            **benchkit.machine(),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
        },
    }
    benchkit.save(results, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
