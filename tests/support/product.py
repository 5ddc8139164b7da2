"""The product as a user installs it, on the real node: the chart with the images this project
builds, an OTLP sink the telemetry proxy forwards to, and the test apps as Deployments.

The node tier's shared cluster runs without the ServiceAccount admission plugin (no pod token),
so an operator pod could not reach the API server there: `installed_product` starts a cluster of
its own with `service_accounts=True` and a node on it (only one local node runs per machine, so
it releases the tier's shared node first; the next test that needs that one starts it again).
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envtest.cluster import FAKE_NODE, LocalCluster
from envtest.node import LocalNode
from envtest.process import wait_until
from tests.node.conftest import NodeHolder
from tests.support.otel import OTLPSink
from tests.support.packaging import CHART, HelmRelease, get_json
from tests.support.pods import wait_pod

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "build" / "images" / "manifest.json"
BUILD_IMAGES = ROOT / "hack" / "build-images"
SAMPLE = ROOT / "config" / "samples" / "operator_v1alpha1_lumigo.yaml"
SAMPLE_TOKEN = "t_123456789012345678901"
RELEASE, OPERATOR_NS = "lumigo", "lumigo-system"  # the seed README's names
CLUSTER_NAME = "node-e2e"
IMAGES = (
    "operator",
    "autotrace",
    "telemetry-proxy",
    "kube-state-metrics",
    "node-exporter",
    "python-app",
    "node-app",
    "jvm-app",
    "musl-app",
)
JSON = dict[str, Any]


def built_images(names: tuple[str, ...] = IMAGES) -> dict[str, JSON]:
    """Build what changed (`make images`; a warm run only hashes inputs): name -> manifest entry
    (`ref`, `tar`). The operator image is built from the working tree, as a release would be."""
    proc = subprocess.run(
        [sys.executable, str(BUILD_IMAGES), *names], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise AssertionError(f"hack/build-images failed:\n{tail}")
    images = json.loads(MANIFEST.read_text())["images"]
    return {name: dict(images[name]) for name in names}


def split_ref(ref: str) -> tuple[str, str]:
    repository, _, tag = ref.rpartition(":")
    return repository, tag


def node_sink(address: str) -> OTLPSink:
    """The tests' OTLPSink, listening on the node's bridge address instead of loopback: the
    proxy pod reaches the node itself (INPUT), never anything off the machine."""
    return OTLPSink(host=address).start()


@dataclass
class Product:
    """A Helm release of the chart on a real node, forwarding to `sink`."""

    cluster: LocalCluster
    node: LocalNode
    release: HelmRelease
    sink: OTLPSink
    images: dict[str, str]

    @property
    def sink_url(self) -> str:
        return f"http://{self.node.node_ip}:{self.sink.port}"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.cluster.kubectl(*args, input=input, check=check)

    def pods(self, namespace: str, selector: str) -> list[JSON]:
        items = get_json(self.cluster, "pods", "-n", namespace, "-l", selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def new_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """A namespace whose `default` ServiceAccount exists (the admission plugin rejects a
        pod before it does)."""
        self.kubectl("create", "namespace", name)
        for key, value in (labels or {}).items():
            self.kubectl("label", "namespace", name, f"{key}={value}")
        wait_until(
            lambda: bool(self.kubectl("get", "sa", "default", "-n", name, check=False).strip()),
            60,
            f"the default ServiceAccount of {name}",
        )
        return name


HEARTBEAT_INTERVAL = "20s"
MANAGER_SELECTOR = "control-plane=controller-manager"
WEBHOOK_SELECTOR = "control-plane=webhook"  # the webhook Deployment (serves admissions)


def endpoint_values(sink_url: str) -> list[str]:
    """`--set` flags sending traces, logs and metrics to `sink_url`. logs_url with its path: the
    operator passes it to the collector as `logs_endpoint`, a full URL (the chart's default, the
    bare host, would post events to "/": reported on issue 13)."""
    return [
        "--set", f"endpoint.otlp.url={sink_url}",
        "--set", f"endpoint.otlp.logs_url={sink_url}/v1/logs",
        "--set", f"endpoint.otlp.metrics_url={sink_url}/v1/metrics",
    ]  # fmt: skip


def helm_values(images: dict[str, str], sink_url: str) -> list[str]:
    """`--set` flags: our images, never pulled (pull policy Never), upstream = the sink."""
    flags: list[str] = []
    for key, name in (
        ("controllerManager.manager.image", "operator"),
        ("injectorWebhook.lumigoInjector.image", "autotrace"),
        ("telemetryProxy.image", "telemetry-proxy"),
        ("kubeStateMetrics.image", "kube-state-metrics"),
        ("prometheusNodeExporter.image", "node-exporter"),
    ):
        repository, tag = split_ref(images[name])
        flags += ["--set", f"{key}.repository={repository}", "--set", f"{key}.tag={tag}"]
        flags += ["--set", f"{key}.pullPolicy=Never"]
    flags += endpoint_values(sink_url)
    flags += ["--set", f"cluster.name={CLUSTER_NAME}"]
    # telemetryProxy.enricher: the chart's default (true), as our telemetry-proxy image has
    # lumigo_k8s_enricher (Events' root owners from the API).
    # The init container's copy (the chart's `auto` would mount the image on this node): most
    # tests check that path; test_product switches to `auto` to check the other.
    flags += ["--set", "injectorWebhook.lumigoInjector.mode=init-container"]
    # kube-state-metrics only where a test turns it on (the cluster-collection test).
    flags += ["--set", "kubeStateMetrics.install=false"]
    # The namespace heartbeat every 20 s instead of hourly, so that tests see several.
    flags += ["--set", f"telemetryProxy.heartbeatInterval={HEARTBEAT_INTERVAL}"]
    return flags


@contextlib.contextmanager
def node_cluster(
    holder: NodeHolder | None,
) -> Iterator[tuple[LocalCluster, LocalNode, dict[str, JSON]]]:
    """A cluster of its own (with pod tokens) and a real node holding the built images:
    (cluster, node, name -> manifest entry). `holder`: the test tier's shared node, released
    first (one local node at a time); None for a benchmark, which has none."""
    built = built_images()
    if holder is not None:
        holder.release()
    with LocalCluster(full=True, service_accounts=True) as cluster:
        cluster.kubectl("delete", "node", FAKE_NODE)  # the real node is the only one
        with LocalNode(cluster) as node:
            for entry in built.values():
                node.import_image(Path(entry["tar"]))
            yield cluster, node, built


def installed_product(holder: NodeHolder | None) -> Generator[Product]:
    """Cluster (with pod tokens) + node + images + sink + `helm install`; all gone afterwards."""
    with node_cluster(holder) as (cluster, node, built):
        images = {name: str(entry["ref"]) for name, entry in built.items()}
        sink = node_sink(node.node_ip)
        release = HelmRelease(cluster, RELEASE, OPERATOR_NS)
        product = Product(cluster, node, release, sink, images)
        try:
            release.install("--create-namespace", *helm_values(images, product.sink_url))
            wait_defaulter(product, OPERATOR_NS)
            yield product
        finally:
            sink.stop()


def deployment(name: str, image: str, **pod_spec: Any) -> JSON:
    """A Deployment of one of the test app images (they answer /healthz, / and /call on $PORT)."""
    container: JSON = {
        "name": "app",
        "image": image,
        "imagePullPolicy": "Never",
        "env": [{"name": "PORT", "value": "8080"}],
        "ports": [{"containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [container],
                    "terminationGracePeriodSeconds": 1,
                    **pod_spec,
                },
            },
        },
    }


def rolled_out(
    product: Product, namespace: str, name: str, timeout: float = 300, *, selector: str = ""
) -> JSON:
    """Wait until the Deployment's newest pods are all Ready and the old ones gone; its one pod.

    `selector` picks its pods (default `app=<name>`, the test apps' label)."""
    selector = selector or f"app={name}"

    def done() -> bool:
        obj = get_json(product.cluster, "deployment", name, "-n", namespace)
        status, spec = obj.get("status", {}), obj["spec"]
        pods = product.pods(namespace, selector)
        return bool(
            status.get("observedGeneration") == obj["metadata"]["generation"]
            and status.get("updatedReplicas") == spec["replicas"]
            and status.get("readyReplicas") == spec["replicas"]
            and status.get("replicas") == spec["replicas"]
            and len(pods) == spec["replicas"]
        )

    try:
        wait_until(done, timeout, f"deployment {namespace}/{name} rolled out")
    except Exception:
        for pod in product.pods(namespace, selector):
            wait_pod(product.cluster, namespace, pod["metadata"]["name"], ready=True, timeout=1)
        raise
    return product.pods(namespace, selector)[0]


def http_get(
    product: Product, namespace: str, pod: str, path: str, *, timeout: float = 60, port: int = 8080
) -> str:
    """GET a path of the app in `pod` from the node (it reaches pod IPs directly); retried until
    it answers 200 (a first request on a busy 2-core machine can take seconds)."""
    ip = get_json(product.cluster, "pod", pod, "-n", namespace)["status"]["podIP"]
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=15) as resp:
                return str(resp.read().decode())
        except OSError as err:
            if time.monotonic() > deadline:
                raise AssertionError(f"{namespace}/{pod} {path} never answered: {err}") from err
            time.sleep(0.5)


def readme_yaml(token: str) -> str:
    """The seed README's Secret + Lumigo (config/samples), with the token replaced."""
    text = SAMPLE.read_text()
    assert text.count(SAMPLE_TOKEN + " #") == 1
    return text.replace(SAMPLE_TOKEN + " #", token + " #")


def wait_defaulter(product: Product, namespace: str) -> None:
    """Wait until the API server reaches the defaulter webhook (failurePolicy Fail): a Lumigo
    create, dry-run on the server, goes through. Right after `helm install --wait` or a manager
    restart, kube-proxy may not route the webhook Service to the new pod yet."""

    def answers() -> bool:
        out = product.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                              input=readme_yaml(SAMPLE_TOKEN), check=False)  # fmt: skip
        return "lumigo.operator.lumigo.io/lumigo" in out and "Error" not in out

    wait_until(answers, 120, "the defaulter webhook reachable through its Service")


def switch_injection_mode(product: Product, mode: str) -> None:
    """helm upgrade to another `injectorWebhook.lumigoInjector.mode`; returns once the one
    manager and the one webhook pod left run with it and the API server reaches its webhooks."""
    product.release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "180s",
        "--set", f"injectorWebhook.lumigoInjector.mode={mode}",
    )  # fmt: skip

    def one_pod_with_the_mode(selector: str) -> bool:
        pods = get_json(product.cluster, "pods", "-n", OPERATOR_NS, "-l", selector)
        if len(pods["items"]) != 1:
            return False
        (pod,) = pods["items"]
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        statuses = pod["status"].get("containerStatuses", [])
        ready = bool(statuses) and all(c["ready"] for c in statuses)
        return ready and env.get("LUMIGO_INJECTION_MODE") == mode

    for selector in (MANAGER_SELECTOR, WEBHOOK_SELECTOR):
        wait_until(lambda s=selector: one_pod_with_the_mode(s), 180, f"{selector} in {mode} mode")
    wait_defaulter(product, OPERATOR_NS)


def apply_readme(product: Product, namespace: str, token: str) -> None:
    """The README's Secret + Lumigo, then wait until the Lumigo is Active: only then does the
    webhook inject at admission (before, the controller instruments what was admitted). The
    defaulter must answer first: a manager just restarted or not yet routed refuses a Lumigo."""
    wait_defaulter(product, namespace)
    product.kubectl("apply", "-n", namespace, "-f", "-", input=readme_yaml(token))
    wait_until(
        lambda: "True" in product.kubectl(
            "get", "lumigo", "lumigo", "-n", namespace,
            "-o", "jsonpath={.status.conditions[?(@.type=='Active')].status}",
        ),
        120, f"the Lumigo of {namespace} Active",
    )  # fmt: skip


def wait_for(check: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    """Poll `check` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def decode(secret: JSON, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


__all__ = ["CHART", "Product"]
