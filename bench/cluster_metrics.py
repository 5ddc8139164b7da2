"""Node and cluster metrics on the real node: series per node with `essentialOnly` off and on, by
source (the kubelet's summary, and the scrape jobs: the kubelet's own, cAdvisor and resource
endpoints, node-exporter, kube-state-metrics and the collector's own metrics),
and the collectors' and kube-state-metrics' memory as the kubelet itself reports it. Printed,
never asserted.

Installs the chart with the images built here (tests/support/product.py: its own cluster, a real
node, an OTLP sink on the node's bridge address) with a token, so the cluster agent runs and
scrapes the node's kubelet every 5 s; `--pods` plain app pods run meanwhile. For each setting it
waits for the agent (re)started with it, then counts the distinct series (metric name, resource
attributes, data-point attributes) that arrive in one scrape window, and the metric names.

    .venv/bin/python bench/cluster_metrics.py [--pods 10]
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from bench import benchkit
from tests.support.otel import attrs
from tests.support.packaging import CHART
from tests.support.product import (
    OPERATOR_NS,
    RELEASE,
    Product,
    deployment,
    installed_product,
    wait_for,
)

ROOT = benchkit.ROOT

JSON = dict[str, Any]
TOKEN = "t_0123456789abcdef01234"
FREQUENCY = 5.0  # seconds between scrapes


def agent_pod(product: Product) -> JSON | None:
    pods = product.pods(OPERATOR_NS, "app.kubernetes.io/component=cluster-agent")
    mine = [p for p in pods if p["spec"].get("nodeName") == product.node.name]
    ready = [
        p for p in mine
        if any(c["type"] == "Ready" and c["status"] == "True"
               for c in p.get("status", {}).get("conditions") or [])
    ]  # fmt: skip
    return ready[0] if len(mine) == 1 and ready else None


def source_of(name: str, resource: JSON) -> str:
    """Which receiver sent a series: the Prometheus scrapes name their job in service.name."""
    if resource.get("service.name"):
        return str(resource["service.name"])
    return "kubeletstats"


def series_since(product: Product, index: int) -> tuple[set[tuple[Any, ...]], set[str], JSON]:
    """Distinct series (by source first), metric names and the last memory working set per
    pod of the operator's namespace."""
    series: set[tuple[Any, ...]] = set()
    names: set[str] = set()
    memory: JSON = {}
    for request in product.sink.requests[index:]:
        if request.path != "/v1/metrics":
            continue
        for rm in request.message.resource_metrics:
            resource = attrs(rm.resource.attributes)
            key = tuple(sorted((k, str(v)) for k, v in resource.items()))
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    names.add(metric.name)
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        labels = tuple(
                            sorted((k, str(v)) for k, v in attrs(point.attributes).items())
                        )
                        series.add((source_of(metric.name, resource), metric.name, key, labels))
                        if (
                            metric.name == "container.memory.working_set"
                            and resource.get("k8s.namespace.name") == OPERATOR_NS
                        ):
                            pod = str(resource.get("k8s.pod.name", ""))
                            memory[pod] = round(point.as_int / 2**20, 1)
    return series, names, memory


def measure(product: Product, values: list[str], window: float) -> JSON:
    before = (agent_pod(product) or {}).get("metadata", {}).get("uid")
    product.release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "180s", *values
    )
    pod = wait_for(
        lambda: (p := agent_pod(product)) and p["metadata"]["uid"] != before and p,
        180, "the agent (re)started",
    )  # fmt: skip
    time.sleep(2 * FREQUENCY)  # its first scrapes, its batches
    start = len(product.sink.requests)
    time.sleep(window)
    series, names, memory = series_since(product, start)
    # One window holds about window/FREQUENCY scrapes of the same series.
    return {
        "agent_pod": pod["metadata"]["name"],
        "series_per_node": len(series),
        "series_by_source": {
            source: sum(1 for s in series if s[0] == source)
            for source in sorted({s[0] for s in series})
        },
        "metric_names": len(names),
        "names": sorted(names),
        "collector_working_set_mib": memory,
    }


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--pods", type=int, default=10)
    args = parser.parse_args()
    results: JSON = {"pods": args.pods, "frequency_s": FREQUENCY}
    generator = installed_product(None)
    product = next(generator)
    try:
        apps = product.new_namespace("bench-apps")
        app = deployment("app", product.images["python-app"])
        app["spec"]["replicas"] = args.pods
        product.kubectl("apply", "-n", apps, "-f", "-", input=json.dumps(app))
        wait_for(lambda: len(product.pods(apps, "app=app")) == args.pods, 300, "the app pods")
        common = [
            "--set", f"lumigoToken.value={TOKEN}",
            "--set", f"clusterCollection.metrics.kubeletPort={product.node.kubelet_port}",
            "--set", f"clusterCollection.metrics.frequency={FREQUENCY:.0f}s",
            "--set", "kubeStateMetrics.install=true",
            "--set", "clusterCollection.metrics.essentialOnly=false",
        ]  # fmt: skip
        window = FREQUENCY + 1
        results["all"] = measure(product, common, window)
        results["essential_only"] = measure(
            product, ["--set", "clusterCollection.metrics.essentialOnly=true"], window
        )
    finally:
        generator.close()
    print(json.dumps(results, indent=2))
    out = benchkit.results_file("cluster_metrics")
    benchkit.save(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
