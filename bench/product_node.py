"""The product on the real node: how long tracing takes to reach existing apps, what injection
adds to a pod's start, and how many bytes the init container copies. Printed, never asserted.

Installs the chart with the images built here (tests/support/product.py: its own cluster with pod
tokens, a real node, an OTLP sink on the node's bridge address), then:

1. activation: N Flask Deployments run untraced; `kubectl apply` of the README's Lumigo; time
   until every Deployment's pod is a Ready instrumented pod and has delivered its first span
   (requests are sent to each new pod as soon as it is Ready; p50 and max over the N);
2. pod start overhead: the same Flask pod created R times in an untraced namespace and in a
   traced one, with the init container's copy (`--injection-mode=init-container`) and with the
   autotrace image mounted as an image volume (`image-volume`): create -> Ready (p50), the init
   container's copy time (its started -> finished), the app container's started -> Ready
   (tracer start-up included when traced), and the bytes the pod start added to the node's
   disk (`du -sbx` of the node's containerd + kubelet directories before and once Ready);
3. bytes copied per pod start: `du -sb /opt/lumigo` in a traced pod;
4. tracer start-up: inside a traced pod, `python3 -c pass` with the injected environment and
   without LD_PRELOAD (medians of 7);
5. the sink down for 60 s: latency of a traced app's HTTP responses (p50, p99) with the sink up
   and during the outage, and how many of the spans sent during it arrived afterwards.

    .venv/bin/python bench/product_node.py [--deployments 20] [--repeat 10]
    (0 skips that part: `--deployments 0 --repeat 0` measures only bytes and the outage;
    `--init-cpu-limit 500m` times the copy under another CPU limit than the chart's)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench import benchkit
from envtest.process import wait_until
from tests.support.packaging import CHART
from tests.support.product import (
    RELEASE,
    Product,
    deployment,
    http_get,
    installed_product,
    readme_yaml,
    rolled_out,
    switch_injection_mode,
)

ROOT = benchkit.ROOT

JSON = dict[str, Any]


def ts(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def ready_time(pod: JSON) -> float:
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return ts(cond["lastTransitionTime"])


def activation(product: Product, count: int) -> dict[str, float]:
    ns = product.new_namespace(f"bench-{uuid.uuid4().hex[:6]}")
    names = [f"app-{i}" for i in range(count)]
    for name in names:
        obj = deployment(name, product.images["python-app"])
        product.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))
    for name in names:
        rolled_out(product, ns, name, timeout=600)
    token = f"t_{uuid.uuid4().hex[:21]}"
    start = time.time()
    product.kubectl("apply", "-n", ns, "-f", "-", input=readme_yaml(token))
    done: dict[str, float] = {}
    deadline = time.monotonic() + 900
    while len(done) < count and time.monotonic() < deadline:
        seen = {s.resource.get("k8s.pod.name") for s in product.sink.spans()}
        for name in names:
            if name in done:
                continue
            pods = product.pods(ns, f"app={name}")
            if len(pods) != 1 or not pods[0]["spec"].get("initContainers"):
                continue
            pod = pods[0]
            if not any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pod["status"].get("conditions", [])
            ):
                continue
            if pod["metadata"]["name"] in seen:
                done[name] = time.time() - start
                continue
            with contextlib.suppress(AssertionError):
                http_get(product, ns, pod["metadata"]["name"], "/", timeout=5)
        time.sleep(0.5)
    values = sorted(done.values())
    return {
        "deployments": count,
        "traced": len(values),
        "p50_s": statistics.median(values) if values else float("nan"),
        "max_s": values[-1] if values else float("nan"),
    }


def node_disk_bytes(product: Product) -> int:
    """What the node keeps on disk (containerd's root and state, the kubelet's pods), on its
    own file system only (`-x`): a container's overlay root and an image volume are mounts of
    layers already on disk, not bytes a pod start wrote."""
    out = subprocess.run(["du", "-sbx", str(product.node.workdir)], capture_output=True,
                         text=True, check=False)  # fmt: skip
    return int(out.stdout.split()[0])


def _pod_dir(product: Product, uid: str) -> Path:
    """The kubelet's directory of a pod (its volumes): removed once the pod is cleaned up."""
    return product.node.workdir / "kubelet" / "pods" / uid


def pod_starts(product: Product, ns: str, repeat: int, prefix: str = "start") -> dict[str, float]:
    totals, copies, app_to_ready, written = [], [], [], []
    for i in range(repeat):
        name = f"{prefix}-{i}"
        # A Deployment, as users run apps: the webhook instruments workloads, never bare pods.
        obj = deployment(name, product.images["python-app"])
        disk_before = node_disk_bytes(product)
        created = time.time()
        product.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj))
        while True:
            pods = product.pods(ns, f"app={name}")
            got = pods[0] if pods else {}
            conds = got.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                break
            time.sleep(0.1)
        totals.append(time.time() - created)
        written.append(node_disk_bytes(product) - disk_before)
        app = got["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        app_to_ready.append(ready_time(got) - ts(app))
        for init in got["status"].get("initContainerStatuses", []):
            term = init["state"]["terminated"]
            copies.append(ts(term["finishedAt"]) - ts(term["startedAt"]))
        # Gone, volumes and all, before the next one is measured: a pod being removed meanwhile
        # would subtract its own emptyDir from the next pod's disk figure.
        product.kubectl("delete", "deployment", name, "-n", ns, "--cascade=foreground")
        selector, uid = f"app={name}", got["metadata"]["uid"]
        wait_until(lambda s=selector: not product.pods(ns, s), 60, f"{name}'s pod gone")
        wait_until(lambda u=uid: not _pod_dir(product, u).exists(), 60, f"{name}'s volumes gone")
    return {
        "create_to_ready_p50_s": statistics.median(totals),
        "app_started_to_ready_p50_s": statistics.median(app_to_ready),
        "init_copy_p50_s": statistics.median(copies) if copies else 0.0,
        "init_containers": len(copies),
        "node_disk_bytes_added_p50": statistics.median(written),
    }


def latencies(url: str, seconds: float, marker: str = "") -> tuple[list[float], list[str]]:
    """GET `url` back to back for `seconds` (from the node); each response's latency (s), and
    the query of every request (a marker to find their spans)."""
    out: list[float] = []
    queries: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        query = f"{marker}-{len(queries)}" if marker else ""
        start = time.perf_counter()
        with urllib.request.urlopen(f"{url}?q={query}", timeout=10) as resp:
            resp.read()
        out.append(time.perf_counter() - start)
        queries.append(query)
        time.sleep(0.05)
    return out, queries


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def sink_outage(product: Product, namespace: str, pod: JSON) -> dict[str, float]:
    url = f"http://{pod['status']['podIP']}:8080/"
    latencies(url, 10)  # warm-up: the first requests of a new pod and proxy are slow
    before, _ = latencies(url, 30)
    marker = uuid.uuid4().hex[:10]
    with product.sink.outage():
        during, queries = latencies(url, 60, marker)
    wanted = {f"q={q}" for q in queries}

    def arrived() -> set[str]:
        return {
            v.split("?", 1)[-1]
            for s in product.sink.spans()
            for v in s.attributes.values()
            if isinstance(v, str) and marker in v
        } & wanted

    deadline = time.monotonic() + 300
    while len(arrived()) < len(wanted) and time.monotonic() < deadline:
        time.sleep(2)
    return {
        "requests_during_outage": len(during),
        "p50_ms_sink_up": 1000 * statistics.median(before),
        "p99_ms_sink_up": 1000 * p99(before),
        "p50_ms_sink_down": 1000 * statistics.median(during),
        "p99_ms_sink_down": 1000 * p99(during),
        "spans_sent_during_outage": len(wanted),
        "delivered_afterwards": len(arrived()),
    }


# Run inside the traced container: start `python3 -c pass` with the injected environment and
# without LD_PRELOAD, alternately; the medians (s). The difference is the tracer's start-up.
STARTUP_PROBE = """
import os, statistics, subprocess, sys, time
# This interpreter was started traced: the injector added the bootstrap to its PYTHONPATH.
# "plain" drops LD_PRELOAD and that entry, so nothing of Lumigo loads.
plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
kept = [p for p in plain.get("PYTHONPATH", "").split(":") if p and "/opt/lumigo" not in p]
plain["PYTHONPATH"] = ":".join(kept)
runs = {"traced": [], "plain": []}
for _ in range(7):
    for name, env in (("traced", dict(os.environ)), ("plain", plain)):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        runs[name].append(time.perf_counter() - start)
print(statistics.median(runs["traced"]), statistics.median(runs["plain"]))
"""


def tracer_startup(product: Product, namespace: str, pod: JSON) -> dict[str, float]:
    out = product.kubectl(
        "exec", "-n", namespace, pod["metadata"]["name"], "--", "python3", "-c", STARTUP_PROBE
    )
    traced, plain = (float(v) for v in out.split())
    return {"python_start_traced_s": traced, "python_start_plain_s": plain}


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--deployments", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--init-cpu-limit", default="", help="the lumigo-injector init container's CPU limit "
        "(injectorWebhook.lumigoInjector.resources.limits.cpu; default: the chart's)",
    )  # fmt: skip
    args = parser.parse_args()
    results: JSON = {}
    generator = installed_product(None)
    product = next(generator)
    try:
        if args.init_cpu_limit:
            results["init_cpu_limit"] = args.init_cpu_limit
            limit = f"injectorWebhook.lumigoInjector.resources.limits.cpu={args.init_cpu_limit}"
            product.release.helm(
                "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "180s",
                "--set", limit,
            )  # fmt: skip
        if args.deployments:
            results["activation"] = activation(product, args.deployments)
        if args.repeat:
            plain = product.new_namespace("bench-plain")
            results["untraced"] = pod_starts(product, plain, args.repeat)
        traced = product.new_namespace("bench-traced")
        token = f"t_{uuid.uuid4().hex[:21]}"
        product.kubectl("apply", "-n", traced, "-f", "-", input=readme_yaml(token))
        wait_until(
            lambda: "True" in product.kubectl(
                "get", "lumigo", "lumigo", "-n", traced,
                "-o", "jsonpath={.status.conditions[?(@.type=='Active')].status}",
            ),
            60, "the Lumigo Active",
        )  # fmt: skip
        if args.repeat:
            results["traced"] = pod_starts(product, traced, args.repeat)
            switch_injection_mode(product, "image-volume")
            results["traced_image_volume"] = pod_starts(product, traced, args.repeat, "volume")
            switch_injection_mode(product, "init-container")
        probe = deployment("bytes", product.images["python-app"])
        product.kubectl("apply", "-n", traced, "-f", "-", input=json.dumps(probe))
        pod = rolled_out(product, traced, "bytes")
        du = product.kubectl(
            "exec", "-n", traced, pod["metadata"]["name"], "--", "du", "-sb", "/opt/lumigo"
        )
        results["bytes_copied_per_pod"] = int(du.split()[0])
        results["tracer_startup"] = tracer_startup(product, traced, pod)
        results["sink_down_60s"] = sink_outage(product, traced, pod)
    finally:
        generator.close()
    print(json.dumps(results, indent=2))
    out = benchkit.results_file("product_node")
    benchkit.save(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
