"""Cluster collection on the real node (issue 17): container log files and the watchdog.

Container log files (item 1): `clusterCollection.logs` turned on with `helm upgrade`, the
operator's cluster agent DaemonSet reads the kubelet's log files and the records reach an OTLP
sink with the cluster token and the pod's owners. One app pod writes numbered lines (and a
multi-line block, and a line longer than the runtime's 16 KiB split) while the agent is
restarted: each numbered line must arrive exactly once. A sidecar container, a namespace excluded
by pattern and the operator's own namespace send nothing.

Node and cluster metrics (item 2), on by default: the same agent scrapes its node's kubelet
(summary and cAdvisor), node-exporter in its pod and the chart's kube-state-metrics shard on its
node; the app's pod and container series arrive enriched, kube-state-metrics' and cAdvisor's
series of the app's pod arrive with the token. Issue 29 item 4: under the reference's Prometheus
names and scrape jobs (`k8s-infra-metrics-cadvisor`, node-exporter's `node_cpu_seconds_total`
with a `node` label, `kube_pod_owner` with its owner's `owner_uid`, `kube_*_labels`, the
collector's `otelcol_*`), and `essentialOnly`, on by default as in the reference, keeps the
series whose names match its regular expressions.

The watchdog (item 4), on by default: installed before its token Secret existed, it reports
once the upgrade creates it, and a crash-looping telemetry proxy shows up in its records.

Issue 29 items 2 and 3: the log-file records come under the reference's scope
`lumigo-operator.log_file_collector`, a JSON line as a map body; the watchdog names itself as the
reference's (`lumigo-kubernetes-operator-watchdog`, the cluster's and namespace's UIDs) and sends
the kubelet's BackOff Event in the reference's shape, its root owner the proxy's Deployment.
With a real metrics-server serving metrics.k8s.io, it sends the reference's resource-usage gauges
of its namespace's containers (`lumigo_operator_pod_container_resource_usage_cpu`/`_memory`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from controller.telemetry.agent_config import (
    ESSENTIAL_METRICS,
    LOG_FILE_SCOPE,
    ROOT_OWNER_KIND,
    ROOT_OWNER_NAME,
    ROOT_OWNER_UID,
)
from controller.telemetry.top import CPU_METRIC, CPU_UNIT, MEMORY_METRIC, MEMORY_UNIT, METER
from controller.telemetry.watchdog import EVENTS_SCOPE, SERVICE_NAME
from controller.telemetry.watchdog import SCOPE as WATCHDOG_SCOPE
from envtest.process import wait_until
from tests.node.conftest import NodeHolder
from tests.support.forward_proxy import reachable_only_locally, tinyproxy, upstream_address
from tests.support.metrics_server import running_metrics_server
from tests.support.network_policies import connects, enforcing
from tests.support.otel import LogSeen, MetricSeen, OTLPSink, Received, attrs
from tests.support.packaging import CHART, get_json
from tests.support.private_ca import private_ca
from tests.support.product import (
    OPERATOR_NS,
    RELEASE,
    Product,
    apply_readme,
    deployment,
    endpoint_values,
    http_get,
    installed_product,
    rolled_out,
    wait_for,
)
from tests.support.prometheus import ScrapeAuth, monitoring_crds, running_prometheus, scrape_jobs

JSON = dict[str, Any]
TOKEN = f"t_{uuid.uuid4().hex[:21]}"
APP_NS, EXCLUDED_NS = "logs-app", "logs-excluded"
STATE_DIR = Path("/var/lib/lumigo-operator/cluster-agent")  # the chart's default, on the node
LINES = 600  # at 20 per second: 30 s of writing, across the agent's restart
# The reference's scrape jobs (the resource's service.name) and the collector's own.
CADVISOR_JOB, NODE_EXPORTER_JOB = "k8s-infra-metrics-cadvisor", "prometheus-node-exporter"
LONG = 20_000  # characters: containerd writes it as a partial record, then the rest
# The app: a multi-line block (continuation lines indented), a long line, a JSON line, numbered
# lines, then it idles. `TAG` makes every line of this run unique.
SCRIPT = """
import json, os, sys, time
tag, lines = os.environ["TAG"], int(os.environ["LINES"])
print(f"{tag} block-start\\n  frame one\\n  frame two", flush=True)
print(json.dumps({"message": f"{tag} structured", "level": "info", "n": 7}), flush=True)
print(f"{tag} long " + "x" * int(os.environ["LONG"]), flush=True)
for i in range(lines):
    print(f"{tag} line-{i}", flush=True)
    time.sleep(0.05)
print(f"{tag} done", flush=True)
time.sleep(100000)
"""
SIDECAR = "import os, time\nwhile True:\n    print(os.environ['TAG'], 'sidecar', flush=True)\n" \
    "    time.sleep(0.5)\n"  # fmt: skip


@pytest.fixture(scope="module")
def product(node_holder: NodeHolder) -> Iterator[Product]:
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    try:
        yield from installed_product(node_holder)
    finally:
        shutil.rmtree(STATE_DIR, ignore_errors=True)


def enable_cluster_logs(product: Product) -> None:
    """`helm upgrade` turning the feature on, as a user of an installed release would."""
    pod_logs = product.node.workdir / "pod-logs"  # this node's kubelet podLogsDir
    product.release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "180s",
        "--set", "clusterCollection.logs.enabled=true",
        "--set", f"clusterCollection.logs.podLogsDir={pod_logs}",
        "--set", f"lumigoToken.value={TOKEN}",
        "--set", "clusterCollection.logs.exclude[0].namespacePattern=logs-excl*",
        "--set", "clusterCollection.logs.exclude[1].containerPattern=chatty",
        # Node metrics are on by default; this node's kubelet listens on a port of its own.
        "--set", f"clusterCollection.metrics.kubeletPort={product.node.kubelet_port}",
        "--set", "clusterCollection.metrics.frequency=5s",
        # Everything first (the reference's default filter comes on in the metrics test).
        "--set", "clusterCollection.metrics.essentialOnly=false",
        "--set", "kubeStateMetrics.install=true",
    )  # fmt: skip


def agent_pods(product: Product) -> list[JSON]:
    """The agent's pods on the real node."""
    pods = product.pods(OPERATOR_NS, "app.kubernetes.io/component=cluster-agent")
    return [p for p in pods if p["spec"].get("nodeName") == product.node.name]


def agent_ready(product: Product) -> JSON | None:
    pods = agent_pods(product)
    if len(pods) != 1:
        return None
    conditions = pods[0].get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return pods[0] if ready else None


def writer(name: str, tag: str, *, sidecar: bool = False) -> JSON:
    """A Deployment of the Python app image running SCRIPT as a non-root user."""
    obj = deployment(name, "", securityContext={"runAsUser": 1000, "runAsGroup": 1000,
                                                "runAsNonRoot": True})  # fmt: skip
    env = [{"name": "TAG", "value": tag}, {"name": "LINES", "value": str(LINES)},
           {"name": "LONG", "value": str(LONG)}]  # fmt: skip
    app = obj["spec"]["template"]["spec"]["containers"][0]
    app.update(command=["python3", "-u", "-c", SCRIPT], env=env)
    for key in ("ports", "readinessProbe"):
        app.pop(key)
    if sidecar:
        chatty = {**app, "name": "chatty", "command": ["python3", "-u", "-c", SIDECAR]}
        obj["spec"]["template"]["spec"]["containers"].append(chatty)
    return obj


def with_tag(product: Product, tag: str) -> list[LogSeen]:
    return [r for r in product.sink.logs() if isinstance(r.body, str) and r.body.startswith(tag)]


def test_container_log_files_arrive_once_each_with_their_owners(product: Product) -> None:
    image = product.images["python-app"]
    enable_cluster_logs(product)
    first = wait_for(lambda: agent_ready(product), 180, "the cluster agent pod Ready")

    tag = f"run-{uuid.uuid4().hex[:8]}"
    for namespace in (APP_NS, EXCLUDED_NS):
        product.new_namespace(namespace)
        obj = writer("writer", tag, sidecar=namespace == APP_NS)
        for container in obj["spec"]["template"]["spec"]["containers"]:
            container["image"] = image
        product.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))

    def seen(suffix: str) -> list[LogSeen]:
        return [r for r in with_tag(product, tag) if r.body.endswith(suffix)]

    wait_for(lambda: seen(" line-100"), 180, "line 100 of the app through the agent")
    # Restart the agent mid-stream: it resumes from the offsets it kept on the node.
    product.kubectl("delete", "pod", "-n", OPERATOR_NS, first["metadata"]["name"], "--wait=false")
    wait_for(
        lambda: (p := agent_ready(product)) and p["metadata"]["uid"] != first["metadata"]["uid"],
        180, "a new cluster agent pod Ready",
    )  # fmt: skip
    wait_for(lambda: seen(" done"), 180, "the app's last line")

    records = with_tag(product, tag)
    numbered = Counter(r.body for r in records if " line-" in r.body)
    expected = {f"{tag} line-{i}" for i in range(LINES)}
    missing = sorted(expected - set(numbered), key=lambda b: int(b.rsplit("-", 1)[1]))
    repeated = {body: n for body, n in numbered.items() if n > 1}
    assert not missing, f"{len(missing)} lines never arrived, e.g. {missing[:5]}"
    assert not repeated, f"lines that arrived more than once: {list(repeated.items())[:5]}"

    # Multi-line: the indented frames joined to their first line; the long line whole.
    (block,) = seen("frame two")
    assert block.body == f"{tag} block-start\n  frame one\n  frame two"
    (long,) = [r for r in records if " long " in r.body]
    assert long.body == f"{tag} long " + "x" * LONG
    # A JSON line is a map body, as the reference sends it; plain lines stay strings; all under
    # the reference's scope.
    (structured,) = [r for r in product.sink.logs() if isinstance(r.body, dict)
                     and r.body.get("message") == f"{tag} structured"]  # fmt: skip
    assert structured.body == {"message": f"{tag} structured", "level": "info", "n": 7}
    records.append(structured)
    assert {r.scope for r in records} == {LOG_FILE_SCOPE}

    # Enrichment and tenancy, on every record of the app.
    owner = get_json(product.cluster, "deployment", "writer", "-n", APP_NS)["metadata"]
    (pod,) = product.pods(APP_NS, "app=writer")
    for record in records:
        r = record.resource
        assert record.authorization == f"LumigoToken {TOKEN}"
        assert r["k8s.namespace.name"] == APP_NS
        assert r["k8s.pod.name"] == pod["metadata"]["name"]
        assert r["k8s.container.name"] == "app", "the excluded sidecar sent a record"
        assert r["k8s.node.name"] == product.node.name
        assert r["k8s.provider.id"] == product.node.provider_id
        assert r["k8s.deployment.name"] == "writer"
        assert (r[ROOT_OWNER_KIND], r[ROOT_OWNER_NAME], r[ROOT_OWNER_UID]) == (
            "Deployment", "writer", owner["uid"],
        )  # fmt: skip
        assert r["k8s.cluster.name"], "the cluster's name is on every record"

    # Nothing from the excluded namespace, the sidecar or the operator's namespace.
    everything = [r for r in product.sink.logs() if r.scope == LOG_FILE_SCOPE]
    assert not [r for r in everything if r.resource.get("k8s.namespace.name") == EXCLUDED_NS]
    assert not [r for r in everything if r.resource.get("k8s.container.name") == "chatty"]
    assert not [r for r in everything if r.resource.get("k8s.namespace.name") == OPERATOR_NS]


def test_kubelet_metrics_arrive_enriched_and_essential_only_filters_them(
    product: Product,
) -> None:
    (pod,) = product.pods(APP_NS, "app=writer")
    owner = get_json(product.cluster, "deployment", "writer", "-n", APP_NS)["metadata"]

    def of_writer() -> list[MetricSeen]:
        return [m for m in product.sink.metrics()
                if m.resource.get("k8s.pod.name") == pod["metadata"]["name"]]  # fmt: skip

    wait_for(
        lambda: {"k8s.pod.cpu.usage", "container.memory.working_set"}
        <= {m.name for m in of_writer()},
        120, "the kubelet's pod and container metrics of the app",
    )  # fmt: skip
    for metric in of_writer():
        r = metric.resource
        assert metric.authorization == f"LumigoToken {TOKEN}"
        assert (r["k8s.namespace.name"], r["k8s.node.name"]) == (APP_NS, product.node.name)
        assert (r[ROOT_OWNER_KIND], r[ROOT_OWNER_UID]) == ("Deployment", owner["uid"])
    node_metrics = {m.name for m in product.sink.metrics() if "k8s.pod.name" not in m.resource}
    assert "k8s.node.cpu.usage" in node_metrics
    everything = {m.name for m in product.sink.metrics()}
    assert len(everything) > 2, everything

    # kube-state-metrics (the chart's shard, scraped by the agent of its node) and cAdvisor: the
    # app's pod by its `pod` label; the node's own figures with the node's name.
    def about_writer(name: str) -> list[MetricSeen]:
        return [m for m in product.sink.metrics() if m.name == name
                and any(p.get("pod") == pod["metadata"]["name"] for p in m.points)]  # fmt: skip

    cluster_series = ("kube_pod_status_phase", "container_cpu_usage_seconds_total")
    wait_for(lambda: all(about_writer(name) for name in cluster_series), 180,
             "kube-state-metrics' and cAdvisor's series of the app's pod")  # fmt: skip
    for metric in [m for name in cluster_series for m in about_writer(name)]:
        assert metric.authorization == f"LumigoToken {TOKEN}"
        assert metric.resource["k8s.cluster.name"], metric.resource
    # node-exporter in the agent's pod: the node's figures under Prometheus' names, each point
    # labelled with the node; cAdvisor's series under the reference's job.
    node_names = {"node_cpu_seconds_total", "node_memory_Active_bytes"}
    wait_for(lambda: node_names <= {m.name for m in product.sink.metrics()}, 120,
             "node-exporter's series")  # fmt: skip
    for metric in [m for m in product.sink.metrics() if m.name == "node_cpu_seconds_total"]:
        assert metric.resource["service.name"] == NODE_EXPORTER_JOB
        assert {p.get("node") for p in metric.points} == {product.node.name}
        assert {"cpu", "mode"} <= set(metric.points[0])
    cadvisor = about_writer("container_cpu_usage_seconds_total")
    assert {m.resource["service.name"] for m in cadvisor} == {CADVISOR_JOB}
    assert not [m for m in product.sink.metrics() if m.name.startswith("system.")], "hostmetrics"
    # kube-state-metrics' owner and labels families (its --metric-labels-allowlist).
    wait_for(lambda: about_writer("kube_pod_owner") and about_writer("kube_pod_labels"), 120,
             "kube_pod_owner and kube_pod_labels of the app's pod")  # fmt: skip
    (owner_point, *_) = [p for m in about_writer("kube_pod_owner") for p in m.points
                         if p.get("pod") == pod["metadata"]["name"]]  # fmt: skip
    assert owner_point["owner_kind"] == "ReplicaSet"
    # Its owner's uid (lumigo_k8s_enricher in the agent, the enricher being on), as the
    # reference's proxy adds it.
    (replica_set,) = pod["metadata"]["ownerReferences"]
    assert owner_point.get("owner_uid") == replica_set["uid"], owner_point
    # (kube-state-metrics exposes no kube_*_labels series without an allowlist.)
    assert [p for m in about_writer("kube_pod_labels") for p in m.points if p.get("uid")]

    # The agent collector's own series (their resource is the collector's own, from its
    # target_info: service.name lumigo-collector as the reference's, not the job), labelled
    # with the node.
    def own() -> list[MetricSeen]:
        return [m for m in product.sink.metrics() if m.name.startswith("otelcol_")
                and m.resource.get("k8s.node.name") == product.node.name]  # fmt: skip

    wait_for(own, 120, "the agent's own otelcol_* series")
    assert {m.resource.get("service.name") for m in own()} == {"lumigo-collector"}

    # The telemetry proxy's own series (no node: it is not an agent), with the cluster token,
    # as the reference's collector-self-metrics pipeline sends them.
    def proxy_own() -> list[MetricSeen]:
        return [m for m in product.sink.metrics() if m.name.startswith("otelcol_")
                and "k8s.node.name" not in m.resource]  # fmt: skip

    wait_for(proxy_own, 180, "the telemetry proxy's own otelcol_* series")
    assert {m.authorization for m in proxy_own()} == {f"LumigoToken {TOKEN}"}
    assert {m.resource.get("service.name") for m in proxy_own()} == {"lumigo-collector"}

    # essentialOnly with the reference's default list (regular expressions matched against
    # whole names): after the agents roll, only matching series arrive, plus the collector's own.
    before = {p["metadata"]["uid"] for p in agent_pods(product)}
    product.release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "180s",
        "--set", "clusterCollection.metrics.essentialOnly=true",
    )  # fmt: skip
    rolled = wait_for(
        lambda: (p := agent_ready(product)) and p["metadata"]["uid"] not in before and p,
        180, "the agent restarted with essentialOnly",
    )  # fmt: skip
    started = rolled["status"]["startTime"]
    seen = len(product.sink.requests)
    expected = {"container_cpu_usage_seconds_total", "node_cpu_seconds_total", "kube_pod_owner",
                "kube_deployment_labels", "kube_pod_status_phase",
                "otelcol_process_uptime"}  # fmt: skip
    wait_for(lambda: expected <= {m.name for m in product.sink.metrics(since=seen)},
             120, "the essential series after the change")  # fmt: skip
    essential = re.compile(f"^(?:{'|'.join(ESSENTIAL_METRICS)})$")
    after = product.sink.metrics(since=seen)
    # (The collector's own series are never filtered by the list, as in the reference.)
    names = {m.name for m in after if not m.name.startswith(("otelcol_", "promhttp_"))}
    assert {n for n in names if not essential.match(n)} == set(), (started, names)
    assert "kube_deployment_labels" in names
    assert "kube_pod_created" in names
    assert "k8s.pod.cpu.usage" not in names
    assert "node_memory_MemFree_bytes" not in names


# A connection attempt from a pod; prints how it ended.
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as err:
    print("blocked:", err)
"""


def upgrade(product: Product, *flags: str) -> None:
    product.release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "180s", *flags
    )  # fmt: skip


def from_writer(product: Product, address: str, port: int) -> str:
    (app,) = product.pods(APP_NS, "app=writer")
    return product.kubectl("exec", "-n", APP_NS, app["metadata"]["name"], "--",
                           "python3", "-c", CONNECT, address, str(port)).strip()  # fmt: skip


def test_behind_a_forward_proxy_the_proxy_agent_and_watchdog_reach_a_private_ca_upstream(
    product: Product, tmp_path: Path
) -> None:
    """Issue 34, item 2. A corporate network made here: the upstream (an address of this
    machine other than the node's) speaks TLS with a certificate from a private CA; pods cannot
    reach it (a firewall rule), only the forward proxy (Debian's tinyproxy, allowing CONNECT to
    that port only) can. With `egress.httpsProxy` and `egress.caBundle` (a ConfigMap), the
    telemetry proxy's, the cluster agent's and the watchdog's exports all arrive through it."""
    with upstream_address() as address:
        ca = private_ca(tmp_path / "pki", address)
        upstream = OTLPSink(host=address, tls=ca.server_context()).start()
        product.kubectl("create", "configmap", "corp-ca", "-n", OPERATOR_NS,
                        f"--from-file=bundle.pem={ca.ca_pem}")  # fmt: skip
        agents_before = {p["metadata"]["uid"] for p in agent_pods(product)}
        # Reachable from a pod until the firewall rule, which is what blocks it.
        assert from_writer(product, address, upstream.port) == "connected"
        try:
            with (
                reachable_only_locally(address, upstream.port),
                tinyproxy(product.node.node_ip, (upstream.port,), tmp_path / "fwd") as forward,
            ):
                direct = from_writer(product, address, upstream.port)
                assert direct.startswith("blocked:"), direct
                upgrade(
                    product, *endpoint_values(upstream.url),
                    "--set", f"egress.httpsProxy={forward.url}",
                    "--set", "egress.caBundle.configMap=corp-ca",
                    "--set", "egress.caBundle.key=bundle.pem",
                )  # fmt: skip

                def rolled() -> bool:
                    pod = agent_ready(product)
                    return pod is not None and pod["metadata"]["uid"] not in agents_before

                wait_for(rolled, 180, "the agent rolled with the egress settings")

                def arrived() -> dict[str, bool]:
                    metrics = upstream.metrics()
                    return {
                        "agent": any("k8s.node.name" in m.resource for m in metrics),
                        "telemetry proxy": any(
                            m.name.startswith("otelcol_") and "k8s.node.name" not in m.resource
                            for m in metrics
                        ),
                        "watchdog": any(r.scope == WATCHDOG_SCOPE for r in upstream.logs()),
                    }

                try:
                    wait_for(lambda: all(arrived().values()), 240, "every export upstream")
                except AssertionError as err:
                    raise AssertionError(f"{err}: {arrived()}") from err
                assert {m.authorization for m in upstream.metrics()} == {f"LumigoToken {TOKEN}"}
                tunnels = forward.connects(address, upstream.port)
                assert tunnels >= 1, forward.log.read_text()[-2000:]
                print(f"egress: {tunnels} CONNECT tunnels, {len(upstream.requests)} requests")
        finally:
            upgrade(product, *endpoint_values(product.sink_url), "--set", "egress.httpsProxy=",
                    "--set", "egress.caBundle.configMap=")  # fmt: skip
            wait_for(lambda: agent_ready(product), 180, "the agent back on the plain sink")
            product.kubectl("delete", "configmap", "corp-ca", "-n", OPERATOR_NS)
            upstream.stop()


FOR_SCALE = 30  # the shipped rules' `for` durations, divided by this in the Prometheus test


def scaled_for(groups: list[JSON]) -> list[JSON]:
    """The rule groups with every `for` divided by FOR_SCALE (at least 5 s): 10m becomes 20s,
    so that an alert fires within a test. Expressions, labels and annotations are untouched."""
    units = {"s": 1, "m": 60, "h": 3600}
    scaled: list[JSON] = json.loads(json.dumps(groups))
    for rule in (r for g in scaled for r in g["rules"] if "for" in r):
        amount, unit = re.fullmatch(r"(\d+)([smh])", rule["for"]).groups()  # type: ignore[union-attr]
        rule["for"] = f"{max(5, int(amount) * units[unit] // FOR_SCALE)}s"
    return scaled


def test_a_real_prometheus_scrapes_every_component_and_fires_operator_down(
    product: Product, tmp_path: Path
) -> None:
    """Issue 34, item 6. Debian's Prometheus, configured from the ServiceMonitor, PodMonitor and
    PrometheusRule the chart installed (tests/support/prometheus.py plays the Prometheus
    operator), scrapes the manager and the webhook (HTTPS, the token of a ServiceAccount the
    chart binds to the metrics reader), the telemetry proxy and the cluster agent; all the
    shipped rules load. Scaling the manager to zero fires LumigoOperatorDown."""
    reader_ns = product.new_namespace("monitoring")
    product.kubectl("create", "serviceaccount", "prometheus", "-n", reader_ns)
    product.kubectl("apply", "-f", "-", input=monitoring_crds())
    upgrade(product, "--set", "monitoring.serviceMonitor.enabled=true",
            "--set", "monitoring.serviceMonitor.readerServiceAccount.name=prometheus",
            "--set", f"monitoring.serviceMonitor.readerServiceAccount.namespace={reader_ns}",
            "--set", "monitoring.podMonitor.enabled=true",
            "--set", "monitoring.prometheusRule.enabled=true")  # fmt: skip
    token = tmp_path / "token"
    token.write_text(product.kubectl("create", "token", "prometheus", "-n", reader_ns).strip())
    monitors = [m for kind in ("servicemonitors", "podmonitors")
                for m in get_json(product.cluster, kind, "-n", OPERATOR_NS)["items"]]  # fmt: skip
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    jobs = [j for m in monitors for j in scrape_jobs(m, ScrapeAuth(token), workdir)]
    (rule,) = get_json(product.cluster, "prometheusrules", "-n", OPERATOR_NS)["items"]
    shipped = rule["spec"]["groups"]
    manager = f"{product.release.fullname}-controller-manager"
    with running_prometheus(product.cluster, workdir, jobs, scaled_for(shipped)) as prometheus:

        def up_by_component() -> dict[str, int]:
            """Targets up, by Service (ServiceMonitor) or by pod component (PodMonitor)."""
            seen: dict[str, int] = {}
            for target in prometheus.targets():
                labels = target["labels"]
                component = labels.get("service") or next(
                    c for c in ("telemetry-proxy", "cluster-agent", "?") if c in labels["pod"] + "?"
                )
                seen[component] = seen.get(component, 0) + (target["health"] == "up")
            return seen

        wanted = {f"{manager}-metrics-service", "telemetry-proxy", "cluster-agent",
                  f"{product.release.fullname}-webhook-metrics-service"}  # fmt: skip
        try:
            wait_for(lambda: all(up_by_component().get(w) for w in wanted), 120,
                     "every component's target up")  # fmt: skip
        except AssertionError as err:
            raise AssertionError(f"{err}: {prometheus.targets()}") from err
        shipped_names = {r["alert"] for g in shipped for r in g["rules"]}
        wait_for(lambda: {r["name"] for r in prometheus.rules()} == shipped_names, 30,
                 "every shipped rule loaded")  # fmt: skip
        assert all(r["health"] != "err" for r in prometheus.rules()), prometheus.rules()
        leader = 'leader_election_master_status{name="1447aab8.lumigo.io"} == 1'
        wait_for(lambda: prometheus.query(leader), 60, "the manager's leader series")  # fmt: skip
        firing = {a["labels"]["alertname"] for a in prometheus.alerts() if a["state"] == "firing"}
        assert not firing & {"LumigoOperatorDown", "LumigoOperatorNoLeader",
                             "LumigoTelemetryProxyDown"}, firing  # fmt: skip

        def operator_down() -> bool:
            return any(a["labels"]["alertname"] == "LumigoOperatorDown" and a["state"] == "firing"
                       for a in prometheus.alerts())  # fmt: skip

        fault = time.monotonic()
        product.kubectl("scale", "deployment", manager, "-n", OPERATOR_NS, "--replicas=0")
        try:
            wait_for(operator_down, 180, "LumigoOperatorDown firing")
            elapsed = time.monotonic() - fault
            rule_for = next(r["for"] for g in scaled_for(shipped) for r in g["rules"]
                            if r["alert"] == "LumigoOperatorDown")  # fmt: skip
            print(f"LumigoOperatorDown: fault -> firing {elapsed:.1f} s with for={rule_for}")
        finally:
            product.kubectl("scale", "deployment", manager, "-n", OPERATOR_NS, "--replicas=1")
            product.kubectl("rollout", "status", "deployment", manager, "-n", OPERATOR_NS,
                            "--timeout=180s")  # fmt: skip
        wait_for(lambda: not operator_down(), 120, "LumigoOperatorDown resolved")
    upgrade(product, "--set", "monitoring.serviceMonitor.enabled=false",
            "--set", "monitoring.podMonitor.enabled=false",
            "--set", "monitoring.prometheusRule.enabled=false")  # fmt: skip


# Run in a pod: a TCP relay from :8080 to argv[1]:argv[2] (the "internet" in front of the sink).
RELAY = """
import socket, sys, threading
target = (sys.argv[1], int(sys.argv[2]))
def pipe(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
server = socket.create_server(("", 8080))
while True:
    client, _ = server.accept()
    try:
        upstream = socket.create_connection(target, timeout=5)
    except OSError:
        client.close()
        continue
    for a, b in ((client, upstream), (upstream, client)):
        threading.Thread(target=pipe, args=(a, b), daemon=True).start()
"""
SLEEP = "import time\nwhile True: time.sleep(3600)\n"
NP_APP_NS, NP_SCRAPER_NS, NP_INTERNET_NS = "np-app", "np-scraper", "np-internet"


def default_deny(namespace: str) -> str:
    spec = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    return json.dumps({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": "default-deny", "namespace": namespace},
                       "spec": spec})  # fmt: skip


def tenant_egress_to_the_proxy(namespace: str) -> str:
    """What docs/operations.md tells a namespace that denies egress to add: its pods may send
    OTLP to the telemetry proxy (by name: DNS too)."""
    rule = {"to": [{"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": OPERATOR_NS}},
                    "podSelector": {"matchLabels": {
                        "app.kubernetes.io/component": "telemetry-proxy"}}}],
            "ports": [{"protocol": "TCP", "port": 4318}]}  # fmt: skip
    dns = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    return json.dumps({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": "to-lumigo", "namespace": namespace},
                       "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                                "egress": [rule, dns]}})  # fmt: skip


def python_pod(product: Product, namespace: str, name: str, script: str, *args: str) -> JSON:
    """A pod of the python-app image running `script`; returned once Running with an IP."""
    labels = {"app": name, "lumigo.auto-trace": "false"}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "labels": labels},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
               "name": "main", "image": product.images["python-app"], "imagePullPolicy": "Never",
               "command": ["python3", "-c", script, *args]}]}}  # fmt: skip
    product.kubectl("apply", "-f", "-", input=json.dumps(pod))
    product.kubectl("wait", "pod", name, "-n", namespace, "--for=condition=Ready",
                    "--timeout=120s")  # fmt: skip
    running: JSON = get_json(product.cluster, "pod", name, "-n", namespace)
    return running


def flows(product: Product, pods: dict[str, tuple[str, str]],
          targets: dict[str, str]) -> dict[tuple[str, str], bool]:  # fmt: skip
    """(source, target) -> whether a TCP connection opened, for every source pod (name ->
    (namespace, pod)) and target (name -> "ip:port"); the sources probe side by side."""
    with ThreadPoolExecutor(len(pods)) as pool:
        results = dict(zip(pods, pool.map(
            lambda where: connects(product.cluster, where[0], where[1], list(targets.values())),
            pods.values(),
        ), strict=True))  # fmt: skip
    # (A pod's connections to its own address never leave it: nothing can filter them.)
    return {(source, name): results[source][address]
            for source in pods for name, address in targets.items()
            if name.split()[0] != source}  # fmt: skip


@pytest.mark.timeout(1200)  # two upgrades, each rolling the proxy and the agent
def test_network_policies_allow_exactly_the_product_flows(product: Product, tmp_path: Path) -> None:
    """Issue 34, item 1. kube-router's policy controller enforces NetworkPolicy on the node; every
    namespace of the test denies all ingress and egress. Without the chart's policies the
    product's flows are cut; with them (networkPolicy.enabled, narrowed to this cluster's
    addresses) exactly those flows are open and a traced request's span reaches the upstream
    (a relay pod standing for the internet) through the telemetry proxy. Traffic to the node
    itself (the API server, the kubelet, DNS: local processes here) and from it (the kubelet's
    probes, the API server's webhook calls) is not filtered, as NetworkPolicy specifies for a
    pod's node; the flows table says so."""
    for namespace in (NP_APP_NS, NP_SCRAPER_NS, NP_INTERNET_NS):
        product.new_namespace(namespace)
    relay = python_pod(product, NP_INTERNET_NS, "relay", RELAY, product.node.node_ip,
                       str(product.sink.port))  # fmt: skip
    relay_address = f"{relay['status']['podIP']}:8080"
    python_pod(product, NP_SCRAPER_NS, "scraper", SLEEP)
    apply_readme(product, NP_APP_NS, TOKEN)
    product.kubectl("apply", "-n", NP_APP_NS, "-f", "-",
                    input=json.dumps(deployment("shop", product.images["python-app"])))  # fmt: skip
    rolled_out(product, NP_APP_NS, "shop")
    app = product.pods(NP_APP_NS, "app=shop")[0]["metadata"]["name"]
    api_ip = get_json(product.cluster, "service", "kubernetes", "-n", "default")["spec"][
        "clusterIP"
    ]

    def current() -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
        """Sources (name -> (namespace, pod)) and targets (name -> ip:port) as the pods are now
        (an upgrade replaces the proxy's and the manager's)."""
        component = "app.kubernetes.io/component"
        selectors = {
            "manager": "control-plane=controller-manager",
            "watchdog": f"{component}=watchdog",
            "proxy": f"{component}=telemetry-proxy",
        }

        def settled() -> dict[str, tuple[str, str]] | None:
            """Each component's one pod, once no rollout is under way."""
            found = {}
            for name, selector in selectors.items():
                pods = product.pods(OPERATOR_NS, selector)
                if len(pods) != 1 or pods[0]["metadata"].get("deletionTimestamp"):
                    return None
                found[name] = (pods[0]["metadata"]["name"], pods[0]["status"].get("podIP", ""))
            return found

        ips = wait_for(settled, 180, "one pod of each component")
        sources = {"app": (NP_APP_NS, app), "scraper": (NP_SCRAPER_NS, "scraper"),
                   "manager": (OPERATOR_NS, ips["manager"][0]),
                   "watchdog": (OPERATOR_NS, ips["watchdog"][0])}  # fmt: skip
        proxy, manager = ips["proxy"][1], ips["manager"][1]
        targets = {"proxy otlp": f"{proxy}:4318", "proxy health": f"{proxy}:13133",
                   "proxy metrics": f"{proxy}:8888", "manager metrics": f"{manager}:8080",
                   "manager health": f"{manager}:8081", "upstream": relay_address,
                   "api server": f"{api_ip}:443"}  # fmt: skip
        return sources, targets

    def now() -> dict[tuple[str, str], bool]:
        return flows(product, *current())

    open_before = now()
    assert all(open_before.values()), open_before
    # The product's flows, and the ones the other namespaces' own policies open (the scraper's
    # namespace lets it out; the relay's has no policy); every other pair must be refused.
    ours = {"proxy otlp", "proxy health", "proxy metrics", "manager metrics", "manager health"}
    wanted = ({("app", "proxy otlp"), ("watchdog", "upstream")}
              | {("scraper", t) for t in ("proxy otlp", "proxy metrics", "manager metrics")}
              | {("scraper", "upstream"), ("scraper", "api server")}
              | {("manager", "api server"), ("watchdog", "api server")}
              | {(s, t) for s in ("manager", "watchdog") for t in ours
                 if t.split()[0] != s})  # fmt: skip
    with enforcing(product.cluster, product.node, tmp_path):
        for namespace in (OPERATOR_NS, NP_APP_NS, NP_SCRAPER_NS):
            product.kubectl("apply", "-f", "-", input=default_deny(namespace))
        product.kubectl("apply", "-f", "-", input=tenant_egress_to_the_proxy(NP_APP_NS))
        scraper_out = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": "scrape", "namespace": NP_SCRAPER_NS},
                       "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                                "egress": [{}]}}  # fmt: skip
        product.kubectl("apply", "-f", "-", input=json.dumps(scraper_out))
        try:
            try:
                denied = wait_for(
                    lambda: (f := now()) and {k for k, v in f.items() if v}
                    == {("scraper", "upstream"), ("scraper", "api server")} and f,
                    240, "every flow cut by default-deny (but the scraper's to the internet)",
                )  # fmt: skip
            except AssertionError as err:
                still = sorted(k for k, v in now().items() if v)
                log = (tmp_path / "kube-router.log").read_text()[-3000:]
                raise AssertionError(f"{err}: open {still}; kube-router:\n{log}") from err
            upgrade(product, *endpoint_values(f"http://{relay_address}"),
                    "--set", "networkPolicy.enabled=true",
                    "--set", f"networkPolicy.upstream.cidrs[0]={relay['status']['podIP']}/32",
                    "--set", "networkPolicy.upstream.ports[0]=8080",
                    # This node sends the API Service to the API server on its own loopback
                    # port, and its kubelet listens on a port of its own.
                    "--set", f"networkPolicy.apiServer.ports[0]={product.cluster.apiserver_port}",
                    "--set", f"networkPolicy.kubeletPorts[0]={product.node.kubelet_port}",
            )  # fmt: skip
            try:
                allowed = wait_for(lambda: (f := now()) and {k for k, v in f.items() if v} == wanted
                                   and f, 300, "exactly the product's flows open")  # fmt: skip
            except AssertionError as err:
                raise AssertionError(f"{err}: {now()}") from err
            # End to end through the policies: a traced request's span reaches the upstream.
            before = len(product.sink.spans())
            wait_for(lambda: http_get(product, NP_APP_NS, app, "/")
                     and [s for s in product.sink.spans()[before:]
                          if s.resource.get("k8s.pod.name") == app],
                     120, "the app's span through the proxy and the relay")  # fmt: skip
            print_flows(open_before, denied, allowed)
        finally:
            for namespace in (OPERATOR_NS, NP_APP_NS, NP_SCRAPER_NS):
                product.kubectl("delete", "networkpolicy", "--all", "-n", namespace)
            upgrade(product, *endpoint_values(product.sink_url),
                    "--set", "networkPolicy.enabled=false")  # fmt: skip
    for namespace in (NP_APP_NS, NP_SCRAPER_NS, NP_INTERNET_NS):
        product.kubectl("delete", "namespace", namespace, "--wait=false")


def print_flows(*tables: dict[tuple[str, str], bool]) -> None:
    """The flows table of the closing note: no policy / default-deny / default-deny + ours."""
    print("\n| source → target | no policy | default-deny | + chart policies |")
    print("|---|---|---|---|")
    for key in sorted(tables[0]):
        marks = " | ".join("open" if t[key] else "refused" for t in tables)
        print(f"| {key[0]} → {key[1]} | {marks} |")


def test_turning_cluster_collection_off_removes_the_agent(product: Product) -> None:
    product.release.helm(
        "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout", "180s",
        "--set", "clusterCollection.logs.enabled=false",
        "--set", "clusterCollection.metrics.enabled=false",
    )  # fmt: skip
    name = f"{product.release.fullname}-cluster-agent"
    wait_until(
        lambda: not product.kubectl("get", "daemonset", name, "-n", OPERATOR_NS,
                                    "--ignore-not-found").strip(),
        120, "the cluster agent DaemonSet deleted",
    )  # fmt: skip
    assert not product.kubectl(
        "get", "secret", f"{name}-config", "-n", OPERATOR_NS, "--ignore-not-found"
    ).strip()
    assert not product.kubectl(
        "get",
        "statefulset",
        f"{product.release.fullname}-kube-state-metrics",
        "-n",
        OPERATOR_NS,
        "--ignore-not-found",
    ).strip(), "kube-state-metrics outlived cluster metrics"


def watchdog_pods(product: Product, component: str) -> list[JSON]:
    """The watchdog's latest records about the pods of one component."""
    records = [r for r in product.sink.logs() if r.scope == WATCHDOG_SCOPE]
    return [r.body for r in records if r.body.get("component") == component]


def test_the_watchdog_reports_a_crash_looping_proxy(product: Product) -> None:
    # Installed before the token Secret existed (the upgrade above created it): reporting on.
    wait_for(lambda: watchdog_pods(product, "telemetry-proxy"), 120, "a watchdog record")
    records = [r for r in product.sink.logs() if r.scope == WATCHDOG_SCOPE]
    assert {r.authorization for r in records} == {f"LumigoToken {TOKEN}"}
    # Named as the reference's watchdog, with the cluster's and the namespace's identity (its
    # RBAC lets it read both UIDs).
    namespaces = {n: get_json(product.cluster, "namespace", n)["metadata"]["uid"]
                  for n in ("kube-system", OPERATOR_NS)}  # fmt: skip
    resource = records[0].resource
    assert resource["service.name"] == SERVICE_NAME
    assert resource["k8s.namespace.name"] == OPERATOR_NS
    assert resource["k8s.namespace.uid"] == namespaces[OPERATOR_NS]
    assert resource["k8s.cluster.uid"] == namespaces["kube-system"]
    assert resource["k8s.cluster.version"].startswith("v1.")

    def scraped(component: str, prefix: str) -> list[JSON]:
        """Records of `component` whose scraped metrics have a series named `prefix…` (a pod
        that is starting may not answer yet: that record says lumigo_watchdog_scrape_failed)."""
        return [b for b in watchdog_pods(product, component)
                if any(k.startswith(prefix) for k in b.get("metrics") or {})]  # fmt: skip

    wait_for(lambda: scraped("controller-manager", "workqueue_depth"), 120,
             "the manager's work-queue depth in a watchdog record")  # fmt: skip
    # No Lumigo here: the proxy has no tenant, so no exporter (its pipelines end in `nop`) and
    # no otelcol_exporter_* series; its process series show the scrape.
    wait_for(lambda: scraped("telemetry-proxy", "otelcol_process_uptime"), 120,
             "the proxy's process metrics in a watchdog record")  # fmt: skip

    # The proxy's new pods crash at start (a configuration file that does not exist).
    name = f"{product.release.fullname}-telemetry-proxy"
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args",
              "value": ["--config=/etc/otelcol/missing.yaml"]}]  # fmt: skip
    product.kubectl("patch", "deployment", name, "-n", OPERATOR_NS, "--type=json",
                    "-p", json.dumps(patch))  # fmt: skip

    def crash_looping() -> list[JSON]:
        return [
            b for b in watchdog_pods(product, "telemetry-proxy")
            if not b["ready"] and b["restarts"] >= 1
            and any(c.get("lastTerminationReason") == "Error" for c in b["containers"])
        ]  # fmt: skip

    (report, *_) = wait_for(crash_looping, 180, "the crash-looping proxy in the watchdog's data")
    assert report["phase"] == "Running"

    def backoff_events() -> list[LogSeen]:
        return [
            r for r in product.sink.logs()
            if r.scope == EVENTS_SCOPE and r.resource.get("service.name") == SERVICE_NAME
            and r.body["reason"] == "BackOff"
            and r.body["involvedObject"]["name"] == report["pod"]
        ]  # fmt: skip

    (backoff, *_) = wait_for(backoff_events, 180, "the kubelet's BackOff Event from the watchdog")
    # The reference's Event record: Warning, the pod's fields, the root owner walked from the
    # pod through its ReplicaSet (the watchdog's own RBAC) to the proxy's Deployment.
    proxy = get_json(product.cluster, "deployment", name, "-n", OPERATOR_NS)["metadata"]
    assert backoff.severity == "Warning"
    assert backoff.body["involvedObject"]["uid"]
    assert backoff.body["involvedObject"]["fieldPath"]
    assert backoff.body["source"]["component"] == "kubelet"
    assert backoff.body["rootOwnerReference"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": name, "namespace": OPERATOR_NS,
        "uid": proxy["uid"],
    }  # fmt: skip
    product.kubectl("rollout", "undo", f"deployment/{name}", "-n", OPERATOR_NS)


def watchdog_top_points(product: Product, pod: str) -> list[tuple[Received, Any, Any, Any]]:
    """(request, resource metrics, scope metrics, metric) of the watchdog's resource-usage
    gauges about `pod`."""
    return [
        (r, rm, sm, m)
        for r in list(product.sink.requests) if r.path == "/v1/metrics"
        for rm in r.message.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name in (CPU_METRIC, MEMORY_METRIC)
        and any(attrs(p.attributes).get("pod") == pod for p in m.gauge.data_points)
    ]  # fmt: skip


def test_the_watchdog_sends_its_containers_usage_from_a_real_metrics_server(
    product: Product,
) -> None:
    """Issue 29: with metrics.k8s.io served by a real metrics-server (scraping the real
    kubelet), the watchdog sends the reference's two gauges for each container of its namespace
    (its own pod among them): names, units, kinds, the attributes namespace/pod/container, the
    watchdog's resource and the cluster token, to the metrics endpoint. The API is read under
    the chart's RBAC for the watchdog (get/list pods.metrics.k8s.io)."""
    if not product.kubectl("get", "secret", "lumigo-credentials", "-n", OPERATOR_NS,
                           "--ignore-not-found").strip():  # fmt: skip
        product.release.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--wait",
                             "--set", f"lumigoToken.value={TOKEN}")  # fmt: skip
    (dog,) = product.pods(OPERATOR_NS, "app.kubernetes.io/component=watchdog")
    name = dog["metadata"]["name"]
    with running_metrics_server(product.cluster):
        wait_for(
            lambda: {m.name for *_, m in watchdog_top_points(product, name)} >= {CPU_METRIC,
                                                                              MEMORY_METRIC},
            120, "the watchdog's CPU and memory gauges about its own pod",
        )  # fmt: skip
    points = watchdog_top_points(product, name)
    request, resource, scope, _ = points[-1]
    assert request.headers["authorization"] == f"LumigoToken {TOKEN}"
    identity = attrs(resource.resource.attributes)
    assert identity["service.name"] == SERVICE_NAME
    assert identity["k8s.namespace.name"] == OPERATOR_NS
    assert identity["k8s.cluster.uid"]
    assert scope.scope.name == METER
    by_name = {m.name: m for *_, m in points}
    cpu, memory = by_name[CPU_METRIC], by_name[MEMORY_METRIC]
    assert (cpu.unit, memory.unit) == (CPU_UNIT, MEMORY_UNIT) == ("m", "By")
    assert cpu.WhichOneof("data") == memory.WhichOneof("data") == "gauge"
    (own_cpu,) = [p for p in cpu.gauge.data_points if attrs(p.attributes)["pod"] == name]
    (own_memory,) = [p for p in memory.gauge.data_points if attrs(p.attributes)["pod"] == name]
    assert attrs(own_cpu.attributes) == {"namespace": OPERATOR_NS, "pod": name,
                                         "container": "watchdog"}  # fmt: skip
    assert attrs(own_memory.attributes) == attrs(own_cpu.attributes)
    assert own_cpu.WhichOneof("value") == "as_double"
    assert own_cpu.as_double >= 0
    assert own_memory.WhichOneof("value") == "as_int"
    assert own_memory.as_int > 1_000_000
