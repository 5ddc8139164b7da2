#!/usr/bin/env python3
"""Spans per second through the telemetry proxy, and its memory, on loopback.

The real pieces: a local kube-apiserver (the proxy's k8s_attributes enrichment watches it), the
project's collector binary running exactly the rendered proxy configuration (batch settings of
`ProxySettings`), and an OTLP/HTTP sink as upstream that decodes every request to count spans.
Load: `--threads` OTLP/HTTP protobuf clients on keep-alive connections, each request carrying
`--spans` spans (a tracer's export batch), alternating two tenants' `Authorization` headers, for
`--seconds`. Both tokens are tenants (namespaces `bench` and `bench-b` with active Lumigoes); every
span finds its pod (a Pod of `bench` with podIP 127.0.0.1 matches the connection), and the other
tenant's spans then lose that enrichment (the pod is not in its namespace).

Figures: spans/s accepted by the proxy, spans/s delivered to upstream (first send to last
delivery, after draining), the proxy's CPU seconds per 100k spans, its RSS at rest and after the
run (peak). Generator, proxy and sink share the machine's cores, so this is a floor for the proxy.

    .venv/bin/python bench/telemetry_proxy.py [--seconds 20] [--threads 4] [--spans 100]

Prints a summary and writes bench/results/telemetry_proxy.json.
"""

from __future__ import annotations

import http.client
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import benchkit
from controller.runtime.kube import KubeClient
from controller.telemetry.config import MonitoredNamespace, Origin, render
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import PODS
from tests.support.otel import (
    export_request,
    local_settings,
    running_collector,
    running_sink,
)

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("telemetry_proxy")
TOKENS = ("LumigoToken t_0123456789abcdef01234", "LumigoToken t_fedcba9876543210fedcb")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(port: int, payload: bytes, spans: int, seconds: float, threads: int) -> dict[str, int]:
    stop_at = time.monotonic() + seconds
    counts = {"requests": 0, "spans": 0, "rejected": 0}
    lock = threading.Lock()

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        sent = accepted = rejected = 0
        while time.monotonic() < stop_at:
            headers = {
                "Content-Type": "application/x-protobuf",
                "Authorization": TOKENS[(index + sent) % 2],
            }
            conn.request("POST", "/v1/traces", body=payload, headers=headers)
            response = conn.getresponse()
            response.read()
            sent += 1
            if response.status == http.client.OK:
                accepted += spans
            else:
                rejected += 1
        conn.close()
        with lock:
            counts["requests"] += sent
            counts["spans"] += accepted
            counts["rejected"] += rejected

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return counts


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--spans", type=int, default=100, help="spans per request")
    args = parser.parse_args()

    with LocalCluster() as cluster, running_sink(count_only=True) as sink:
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        cluster.kubectl("create", "namespace", "bench")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "app", "namespace": "bench"},
            "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
        }
        kube.create(PODS, pod, "bench")
        status = {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
        kube.merge_patch(PODS, "app", status, "bench", "status")

        settings = local_settings(sink.url, "bench", origin=Origin("local-test", "bench-cluster"))
        tenants = [
            MonitoredNamespace(name, "uid", token.removeprefix("LumigoToken "), kube_events=False)
            for name, token in zip(("bench", "bench-b"), TOKENS, strict=True)
        ]
        config = render(tenants, settings)
        with (
            tempfile.TemporaryDirectory() as workdir,
            running_collector(config, Path(workdir), settings.health_port, cluster.env()) as proxy,
        ):
            assert proxy.popen is not None
            pid = proxy.popen.pid
            rss_idle, _ = proxy.rss_kib()
            payload = export_request("GET /bench", spans=args.spans).SerializeToString()
            cpu_before = cpu_seconds(pid)
            started = time.monotonic()
            counts = load(settings.otlp_port, payload, args.spans, args.seconds, args.threads)
            sent_for = time.monotonic() - started
            wait_until(lambda: sink.spans_received >= counts["spans"], 120, "upstream to drain")
            delivered_for = time.monotonic() - started
            cpu = cpu_seconds(pid) - cpu_before
            rss_after, rss_peak = proxy.rss_kib()

    figures: dict[str, Any] = {
        "spans_per_request": args.spans,
        "client_threads": args.threads,
        "duration_s": round(sent_for, 1),
        "requests": counts["requests"],
        "spans_accepted": counts["spans"],
        "requests_rejected": counts["rejected"],
        "spans_delivered": sink.spans_received,
        "accepted_spans_per_s": round(counts["spans"] / sent_for),
        "delivered_spans_per_s": round(sink.spans_received / delivered_for),
        "proxy_cpu_s_per_100k_spans": round(cpu / max(counts["spans"], 1) * 100_000, 2),
        "proxy_rss_idle_mib": round(rss_idle / 1024, 1),
        "proxy_rss_after_mib": round(rss_after / 1024, 1),
        "proxy_rss_peak_mib": round(rss_peak / 1024, 1),
        "batch": {
            "send_batch_size": settings.batch_size,
            "send_batch_max_size": settings.batch_max_size,
            "timeout": settings.batch_timeout,
            "per": "tenant (its own exporter and queue)",
        },
        "machine": {
            **benchkit.machine(),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
        },
    }
    benchkit.save(RESULTS, figures)
    for key, value in figures.items():
        print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
