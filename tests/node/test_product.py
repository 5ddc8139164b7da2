"""The product end to end on the real node (issue 13): `helm install` of the images this project
builds, the seed README's Secret + Lumigo in a namespace running a Flask and an Express app, real
spans through the telemetry proxy pod to an OTLP sink, and the way back when the Lumigo goes.

One install serves the module (tests/support/product.py). The state the tests share is built by
module fixtures: `product` (the install), `original_specs` (the `shop` apps before any Lumigo) and
`shop_traced` (the README's Lumigo applied there, the apps rolled out traced), so any one test
runs alone with `pytest path::name`; in file order the upgrade, removal and uninstall tests come
last. The pod variants use namespaces of their own. The sink listens on the node's
bridge address: the proxy pod reaches the node, never anything off the machine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.telemetry.config import EVENTS_SCOPE, HEARTBEAT_SCOPE, OBJECTS_SCOPE
from controller.telemetry.proxy_reconciler import CONFIG_HASH_ANNOTATION
from envtest.process import wait_until
from tests.node.conftest import NodeHolder
from tests.support.otel import LogSeen
from tests.support.packaging import CHART, deployment_available, get_json, is_injected
from tests.support.pods import BUSYBOX_IMAGE, wait_pod
from tests.support.product import (
    CLUSTER_NAME,
    MANAGER_SELECTOR,
    OPERATOR_NS,
    RELEASE,
    WEBHOOK_SELECTOR,
    Product,
    apply_readme,
    decode,
    deployment,
    http_get,
    installed_product,
    readme_yaml,
    rolled_out,
    switch_injection_mode,
    wait_defaulter,
    wait_for,
)
from webhook.pod_injection import InjectionSettings, inject

JSON = dict[str, Any]
APPS_NS = "shop"
TOKEN = f"t_{uuid.uuid4().hex[:21]}"
BARRIER_TOKEN = f"t_{uuid.uuid4().hex[:21]}"
APPS = {"flask": "python-app", "express": "node-app"}


@pytest.fixture(scope="module")
def product(node_holder: NodeHolder) -> Iterator[Product]:
    yield from installed_product(node_holder)


@pytest.fixture(scope="module")
def original_specs(product: Product) -> dict[str, JSON]:
    """The traced namespace with the two apps running before any Lumigo exists."""
    product.new_namespace(APPS_NS)
    specs = {}
    for name, image in APPS.items():
        product.kubectl(
            "apply", "-n", APPS_NS, "-f", "-",
            input=json.dumps(deployment(name, product.images[image])),
        )  # fmt: skip
    for name in APPS:
        pod = rolled_out(product, APPS_NS, name)
        assert not pod["spec"].get("initContainers")
        specs[name] = get_json(product.cluster, "deployment", name, "-n", APPS_NS)["spec"][
            "template"
        ]
    return specs


@pytest.fixture(scope="module")
def shop_traced(product: Product, original_specs: dict[str, JSON]) -> dict[str, str]:
    """The seed README's Secret + Lumigo applied in the `shop` namespace, once per module, and
    its apps rolled out instrumented: any test of the traced shop runs alone. Returns the names
    of the apps' pods from before the Lumigo, so that the README test can see them replaced."""
    before = {name: product.pods(APPS_NS, f"app={name}")[0]["metadata"]["name"] for name in APPS}
    product.kubectl("apply", "-n", APPS_NS, "-f", "-", input=readme_yaml(TOKEN))
    for name in APPS:

        def new_pod(n: str = name) -> JSON | None:
            pods = product.pods(APPS_NS, f"app={n}")
            if len(pods) == 1 and pods[0]["metadata"]["name"] != before[n]:
                return pods[0]
            return None

        wait_for(new_pod, 180, f"a new pod of {name}")
        rolled_out(product, APPS_NS, name)
    return before


def full(product: Product) -> str:
    return product.release.fullname


def test_helm_install_runs_the_built_operator_and_proxy_and_the_api_server_calls_the_webhooks(
    product: Product,
) -> None:
    fullname = full(product)
    # Operator: Ready through its own probes, on the real node, with the image built here.
    assert deployment_available(product.cluster, OPERATOR_NS, f"{fullname}-controller-manager")
    (manager,) = product.pods(OPERATOR_NS, "control-plane=controller-manager")
    assert manager["spec"]["nodeName"] == product.node.name
    container = manager["spec"]["containers"][0]
    assert container["image"] == product.images["operator"]
    assert container["imagePullPolicy"] == "Never"
    assert {"livenessProbe", "readinessProbe"} <= set(container)
    assert manager["status"]["containerStatuses"][0]["ready"]
    # It has a ServiceAccount token (the cluster's ServiceAccount admission plugin is on).
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts

    # The telemetry proxy: Ready, on the node, with our collector image.
    wait_until(
        lambda: deployment_available(product.cluster, OPERATOR_NS, f"{fullname}-telemetry-proxy"),
        120,
        "the telemetry proxy Available",
    )
    proxy_pods = [
        p
        for p in get_json(product.cluster, "pods", "-n", OPERATOR_NS)["items"]
        if p["metadata"]["name"].startswith(f"{fullname}-telemetry-proxy")
    ]
    assert proxy_pods
    assert all(
        p["spec"]["containers"][0]["image"] == product.images["telemetry-proxy"] for p in proxy_pods
    )

    # The webhooks name the Service (no url:) and trust the CA the operator made itself.
    secret = get_json(
        product.cluster, "secret", f"{fullname}-lumigo-injector-webhook-certs", "-n", OPERATOR_NS
    )
    ca = decode(secret, "ca.crt")
    configs = get_json(product.cluster, "mutatingwebhookconfigurations", "-l",
                       f"app.kubernetes.io/instance={product.release.name}")["items"]  # fmt: skip
    assert len(configs) == 2
    for config in configs:
        for i, hook in enumerate(config["webhooks"]):
            client = hook["clientConfig"]
            assert "url" not in client
            assert client["service"]["name"] == f"{fullname}-webhooks-service"
            assert client["service"]["namespace"] == OPERATOR_NS
            bundle = wait_for(
                lambda c=config, i=i: get_json(
                    product.cluster, "mutatingwebhookconfiguration", c["metadata"]["name"]
                )["webhooks"][i]["clientConfig"].get("caBundle"),
                60,
                "the caBundle written by the operator",
            )
            assert ca.strip() in decode({"data": {"b": bundle}}, "b")

    # The API server calls both through the Service's ClusterIP: the defaulter (failurePolicy
    # Fail) admits a Lumigo, and the injector mutates a Deployment.
    ns = product.new_namespace("webhook-check")
    apply_readme(product, ns, TOKEN)
    created = product.kubectl(
        "apply", "-n", ns, "-o", "json", "-f", "-",
        input=json.dumps(deployment("probe", product.images["python-app"])),
    )  # fmt: skip
    spec = json.loads(created)["spec"]["template"]["spec"]
    assert [c["name"] for c in spec.get("initContainers", [])] == ["lumigo-injector"]
    assert spec["initContainers"][0]["image"] == product.images["autotrace"]
    product.kubectl("delete", "namespace", ns, "--wait=false")

    # Those admissions were served by an admission worker process in the webhook Deployment's
    # container (its own ServiceAccount; non-root, read-only root, no capability): the chart's
    # 500m CPU limit gives one.
    (webhook,) = product.pods(OPERATOR_NS, WEBHOOK_SELECTOR)
    assert webhook["spec"]["serviceAccountName"] == f"{fullname}-webhook"
    assert webhook["status"]["containerStatuses"][0]["ready"]
    lines = product.kubectl("logs", "-n", OPERATOR_NS, webhook["metadata"]["name"]).splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    started = [r for r in records if r.get("msg") == "admission workers started"]
    assert started, lines[-20:]
    assert started[0]["workers"] == 1
    assert any(r.get("msg") == "admission worker starting" for r in records)

    # `helm test`: the chart's check Pod finds the webhook reachable through the API server and
    # the proxy refusing an export without a token (controller/lumigo/install_check.py; the
    # verdicts themselves are tested in tests/unit/test_install_check.py). It is deleted once it
    # passed (so no --logs: Helm would look for it after that, helm/helm#9098).
    out = product.release.helm("test", product.release.name, "--timeout", "180s").stdout
    assert f"TEST SUITE:     {fullname}-check" in out, out
    assert "Phase:          Succeeded" in out, out
    leftovers = product.kubectl(
        "get", "pods,roles,serviceaccounts", "-n", OPERATOR_NS, "-o", "name"
    )
    assert f"{fullname}-check" not in leftovers, leftovers


def test_the_seed_readme_flow_traces_a_flask_and_an_express_app_into_the_sink(
    product: Product, shop_traced: dict[str, str]
) -> None:
    before = shop_traced  # the apps' pods before the README's Lumigo was applied

    for name in APPS:
        # The pods roll: a new pod that ran the lumigo-injector init container to exit 0.
        def new_pod(n: str = name) -> JSON | None:
            pods = product.pods(APPS_NS, f"app={n}")
            if len(pods) == 1 and pods[0]["metadata"]["name"] != before[n]:
                return pods[0]
            return None

        wait_for(new_pod, 180, f"a new pod of {name}")
        pod = rolled_out(product, APPS_NS, name)
        (init,) = pod["status"]["initContainerStatuses"]
        assert init["name"] == "lumigo-injector"
        assert init["state"]["terminated"]["exitCode"] == 0
        assert init["image"].endswith(product.images["autotrace"].rpartition(":")[2])

    pods = {name: product.pods(APPS_NS, f"app={name}")[0] for name in APPS}
    for pod in pods.values():
        pod_name = pod["metadata"]["name"]
        http_get(product, APPS_NS, pod_name, "/healthz")  # raises unless 200

    def spans_of(pod_name: str) -> list[Any]:
        return [s for s in product.sink.spans() if s.resource.get("k8s.pod.name") == pod_name]

    cluster_uid = get_json(product.cluster, "namespace", "kube-system")["metadata"]["uid"]
    namespace_uid = get_json(product.cluster, "namespace", APPS_NS)["metadata"]["uid"]
    for name, pod in pods.items():
        pod_name = pod["metadata"]["name"]

        def traced(p: str = pod_name) -> list[Any]:
            http_get(product, APPS_NS, p, "/")
            return spans_of(p)

        spans = wait_for(traced, 180, f"spans of {name} at the sink", interval=2)
        span = spans[0]
        assert span.authorization == f"LumigoToken {TOKEN}"
        resource = span.resource
        assert resource.get("service.name"), resource
        assert resource["k8s.namespace.name"] == APPS_NS
        assert resource["k8s.deployment.name"] == name
        assert resource["k8s.node.name"] == product.node.name
        # The Node's spec.providerID, through the annotation the operator keeps on it.
        assert resource["k8s.provider.id"] == product.node.provider_id
        assert resource["k8s.cluster.name"] == CLUSTER_NAME
        # The rest of the reference's trace resource (docs/wire.md): the cluster's and the
        # namespace's UIDs, the owner's UID, the container (the distro's, from the injected env).
        assert resource["k8s.cluster.uid"] == cluster_uid
        assert resource["k8s.namespace.uid"] == namespace_uid
        owner = get_json(product.cluster, "deployment", name, "-n", APPS_NS)
        assert resource["k8s.deployment.uid"] == owner["metadata"]["uid"]
        assert resource["k8s.pod.uid"] == pod["metadata"]["uid"]
        assert resource["k8s.container.name"] == pod["spec"]["containers"][0]["name"]
        assert resource["lumigo.k8s_operator.deployment_method"] == "Helm"


def test_the_api_server_calls_the_injector_for_an_update_from_anyone_but_the_operator(
    product: Product, original_specs: dict[str, JSON], shop_traced: dict[str, str]
) -> None:
    """The chart's matchConditions name the operator's ServiceAccount as the API server sees it:
    the same update of an instrumented Deployment back to its original template, run on the
    server without storing it, is instrumented again when anyone sends it, and left as sent when
    the operator does (it writes what it means: the instrumentation or its removal)."""
    live = get_json(product.cluster, "deployment", "flask", "-n", APPS_NS)
    assert is_injected(live)
    reverted = json.dumps({**live, "spec": {**live["spec"], "template": original_specs["flask"]}})
    operator = f"system:serviceaccount:{OPERATOR_NS}:lumigo-kubernetes-operator"

    def dry_run_replace(*who: str) -> JSON:
        out = product.kubectl("replace", "--dry-run=server", "-o", "json", *who, "-f", "-",
                              input=reverted)  # fmt: skip
        return dict(json.loads(out))

    assert is_injected(dry_run_replace())
    assert not is_injected(dry_run_replace(f"--as={operator}"))


def the_object(record: LogSeen) -> JSON:
    """The Kubernetes object a k8s_objects/k8s event record carries (watch events wrap it)."""
    body = record.body
    if isinstance(body, str) and body.startswith("{"):
        body = json.loads(body)  # the heartbeat's: the Lumigo as a JSON string
    body = body if isinstance(body, dict) else {}
    obj = body.get("object", body)
    return obj if isinstance(obj, dict) else {}


def records_of(product: Product, namespace: str, kind: str, name: str | None = None) -> list[Any]:
    return [
        r
        for r in product.sink.logs()
        if the_object(r).get("kind") == kind
        and (the_object(r).get("metadata") or {}).get("namespace") == namespace
        and (name is None or the_object(r)["metadata"].get("name") == name)
    ]


def test_the_namespace_events_and_objects_reach_the_sink_with_its_token(
    product: Product, original_specs: dict[str, JSON], shop_traced: dict[str, str]
) -> None:
    # The README's Lumigo (the shop_traced fixture) enables Kubernetes events by default.
    deployments = wait_for(
        lambda: records_of(product, APPS_NS, "Deployment", "flask"),
        120,
        "the flask Deployment as an OTLP log record",
    )
    events = wait_for(
        lambda: records_of(product, APPS_NS, "Event"), 120, "an Event of the namespace"
    )
    for record in deployments + events:
        assert record.authorization == f"LumigoToken {TOKEN}"
    # As the reference (issue 29 item 1): its scopes, the object itself as the body, and each
    # Event's farthest owner with its uid (a flask pod's or ReplicaSet's: the Deployment).
    for scope, records in ((OBJECTS_SCOPE, deployments), (EVENTS_SCOPE, events)):
        for record in records:
            assert record.scope == scope
            assert set(record.body) != {"type", "object"}, record.body
    flask = deployments[-1].body["metadata"]
    flask_root = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "flask",
                  "namespace": APPS_NS, "uid": flask["uid"]}  # fmt: skip
    wait_for(
        lambda: [r for r in records_of(product, APPS_NS, "Event")
                 if r.body.get("rootOwnerReference") == flask_root],
        120,
        "an Event (of a flask pod or ReplicaSet) whose root owner is the flask Deployment",
    )  # fmt: skip
    assert all(r.body["rootOwnerReference"]["uid"] for r in records_of(product, APPS_NS, "Event"))
    # The namespace heartbeat: the README's Lumigo, spec and status, at start and every 20 s.
    heartbeats = wait_for(
        lambda: [
            r
            for r in product.sink.logs()
            if r.scope == HEARTBEAT_SCOPE and r.resource.get("k8s.namespace.name") == APPS_NS
        ][1:],
        120,
        "two heartbeats of the namespace",
    )
    for record in heartbeats:
        assert record.authorization == f"LumigoToken {TOKEN}"
        assert isinstance(record.body, str), record.body  # the reference's: a JSON string
        lumigo = json.loads(record.body)
        assert (lumigo["kind"], lumigo["metadata"]["name"]) == ("Lumigo", "lumigo")
        assert lumigo["status"]["conditions"], lumigo
    # Nothing of the operator's namespace (no Lumigo there) is collected.
    assert not [r for r in product.sink.logs() if the_object(r).get("metadata", {}).get(
        "namespace") == OPERATOR_NS]  # fmt: skip


# --- pods that must stay healthy and traced (issue 13, item 4) ---------------------------------

VARIANTS_NS = "variants"
STRICT_NS = "strict"
PER_CONTAINER_RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 1500,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.fixture(scope="module")
def variants_ns(product: Product) -> str:
    """A traced namespace (the README's Lumigo) for the variants, created before them."""
    product.new_namespace(VARIANTS_NS)
    apply_readme(product, VARIANTS_NS, TOKEN)
    return VARIANTS_NS


def run_variant(product: Product, namespace: str, obj: JSON) -> JSON:
    """Create the Deployment; its pod is Ready after the lumigo-injector init container exited
    0, and the app answers HTTP. The pod."""
    product.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))
    name = obj["metadata"]["name"]
    pod = rolled_out(product, namespace, name)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["lumigo-injector"]
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0, init
    assert all(c["ready"] and c["restartCount"] == 0 for c in pod["status"]["containerStatuses"])
    http_get(product, namespace, pod["metadata"]["name"], "/healthz")
    return pod


def spans_arrive(product: Product, namespace: str, pod: JSON, language: str = "python") -> None:
    """Requests to the pod's app produce spans at the sink, with the namespace's token."""
    pod_name = pod["metadata"]["name"]

    def seen() -> list[Any]:
        http_get(product, namespace, pod_name, "/")
        return [
            s
            for s in product.sink.spans()
            if s.resource.get("k8s.pod.name") == pod_name
            and s.resource.get("telemetry.sdk.language") == language
        ]

    spans = wait_for(seen, 180, f"{language} spans of {namespace}/{pod_name}", interval=2)
    assert spans[0].authorization == f"LumigoToken {TOKEN}"
    assert spans[0].resource["k8s.namespace.name"] == namespace


def with_container(obj: JSON, **fields: Any) -> JSON:
    obj["spec"]["template"]["spec"]["containers"][0].update(fields)
    return obj


@pytest.mark.parametrize("fs_group", [2000, None], ids=["fsGroup", "no-fsGroup"])
def test_an_app_running_as_another_uid_is_traced(
    product: Product, variants_ns: str, fs_group: int | None
) -> None:
    context: JSON = {"runAsUser": 1500, "runAsGroup": 1500}
    if fs_group is not None:
        context["fsGroup"] = fs_group
    name = f"uid-{'fsgroup' if fs_group else 'plain'}"
    obj = deployment(name, product.images["python-app"], securityContext=context)
    pod = run_variant(product, variants_ns, obj)
    spans_arrive(product, variants_ns, pod)


# The first UID of a namespace's range, as OpenShift's restricted-v2 SCC assigns it.
RANGE_UID = 1000680000


@pytest.mark.parametrize("fs_group", [RANGE_UID, None], ids=["fsGroup", "no-fsGroup"])
def test_a_pod_given_its_uid_by_the_platform_is_traced_by_an_init_container_naming_none(
    product: Product, variants_ns: str, fs_group: int | None
) -> None:
    """Issue 34, item 3. On OpenShift (`--init-container-user=auto` sees security.openshift.io)
    the injection names no user for ours: the product's own mutation with that setting, then
    what restricted-v2's admission does (every container gets the namespace's UID, the pod its
    fsGroup when the SCC sets one), run on the real node. A bare Pod: neither the webhook nor the
    controller touches it, so this is exactly the SCC's pod."""
    settings = InjectionSettings(
        injector_image=product.images["autotrace"],
        injector_pull_policy="Never",
        telemetry_proxy_endpoint=(
            f"http://{full(product)}-telemetry-proxy-service.{OPERATOR_NS}.svc.cluster.local"
        ),
        init_container_user="unset",
    )
    name = f"scc-{'fsgroup' if fs_group else 'plain'}"
    template = deployment(name, product.images["python-app"])
    injected = inject(template, settings)["spec"]["template"]
    init = injected["spec"]["initContainers"][0]
    assert {"runAsUser", "runAsGroup"}.isdisjoint(init["securityContext"])
    # What the SCC's admission adds: a UID for every container, the pod's fsGroup.
    for container in injected["spec"]["initContainers"] + injected["spec"]["containers"]:
        container.setdefault("securityContext", {})["runAsUser"] = RANGE_UID
    pod_context = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if fs_group is not None:
        pod_context["fsGroup"] = fs_group
    injected["spec"]["securityContext"] = pod_context
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**injected["metadata"], "name": name},
           "spec": injected["spec"]}  # fmt: skip
    product.kubectl("apply", "-n", variants_ns, "-f", "-", input=json.dumps(pod))
    try:
        wait_pod(product.cluster, variants_ns, name, timeout=180)
        running = get_json(product.cluster, "pod", name, "-n", variants_ns)
        (status,) = running["status"]["initContainerStatuses"]
        assert status["state"]["terminated"]["exitCode"] == 0, status
        http_get(product, variants_ns, name, "/healthz")
        uid = product.kubectl("exec", "-n", variants_ns, name, "--", "python3", "-c",
                              "import os; print(os.getuid())").strip()  # fmt: skip
        assert uid == str(RANGE_UID)
        spans_arrive(product, variants_ns, running)
    finally:
        product.kubectl("delete", "pod", name, "-n", variants_ns, "--wait=false")


# A non-root app container with a read-only root and every capability dropped.
LOCKED_DOWN = {
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "allowPrivilegeEscalation": False,
    "runAsUser": 1500,
}


def test_a_read_only_root_with_all_capabilities_dropped_is_traced(
    product: Product, variants_ns: str
) -> None:
    obj = with_container(
        deployment("readonly", product.images["python-app"]),
        securityContext=LOCKED_DOWN,
    )
    pod = run_variant(product, variants_ns, obj)
    spans_arrive(product, variants_ns, pod)


def test_a_restricted_namespace_with_run_as_non_root_per_container_is_traced(
    product: Product,
) -> None:
    ns = product.new_namespace(
        STRICT_NS,
        {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        },
    )
    apply_readme(product, ns, TOKEN)
    obj = with_container(
        deployment("strict", product.images["python-app"]),
        securityContext=PER_CONTAINER_RESTRICTED,
    )
    assert "runAsNonRoot" not in obj["spec"]["template"]["spec"].get("securityContext", {})
    pod = run_variant(product, ns, obj)
    spans_arrive(product, ns, pod)


def test_a_jvm_app_is_traced_by_the_opentelemetry_java_agent(
    product: Product, variants_ns: str
) -> None:
    """Debian's OpenJDK 17 in a container: the injector activates the payload's Java agent."""
    pod = run_variant(product, variants_ns, deployment("jvm", product.images["jvm-app"]))
    described = json.loads(http_get(product, variants_ns, pod["metadata"]["name"], "/"))
    assert described["traced"] is True
    assert described["env"]["JAVA_TOOL_OPTIONS"] == (
        "-javaagent:/opt/lumigo/java/opentelemetry-javaagent.jar"
    )
    spans_arrive(product, variants_ns, pod, language="java")


def test_a_jvm_with_its_own_javaagent_keeps_it_and_works(
    product: Product, variants_ns: str
) -> None:
    own = "-javaagent:/app/own-agent.jar"
    obj = with_container(
        deployment("jvm-own-agent", product.images["jvm-app"]),
        env=[{"name": "PORT", "value": "8080"}, {"name": "JAVA_TOOL_OPTIONS", "value": own}],
    )
    pod = run_variant(product, variants_ns, obj)
    name = pod["metadata"]["name"]
    for _ in range(5):
        described = json.loads(http_get(product, variants_ns, name, "/"))
    assert described["env"]["JAVA_TOOL_OPTIONS"] == own
    assert "own agent loaded" in product.kubectl("logs", "-n", variants_ns, name)
    time.sleep(10)  # longer than the agent's batch delay (5 s): nothing of ours was exported
    assert not [s for s in product.sink.spans() if s.resource.get("k8s.pod.name") == name]


def test_an_app_with_its_own_ld_preload_and_pythonpath_is_traced_and_keeps_them(
    product: Product, variants_ns: str
) -> None:
    obj = deployment("own-env", product.images["python-app"])
    obj["spec"]["template"]["spec"]["containers"][0]["env"] += [
        {"name": "LD_PRELOAD", "value": "libm.so.6"},
        {"name": "PYTHONPATH", "value": "/opt/user-site"},
    ]
    pod = run_variant(product, variants_ns, obj)
    spans_arrive(product, variants_ns, pod)
    environ = product.kubectl(
        "exec", "-n", variants_ns, pod["metadata"]["name"], "--",
        "python3", "-c", "import os; print(os.environ['LD_PRELOAD'], os.environ['PYTHONPATH'])",
    ).split()  # fmt: skip
    assert environ[0].endswith(":libm.so.6"), environ
    assert environ[0].startswith("/opt/lumigo/"), environ
    assert "/opt/user-site" in environ[1].split(":"), environ


def test_an_express_app_with_its_own_node_options_is_traced_and_keeps_them(
    product: Product, variants_ns: str
) -> None:
    obj = deployment("own-node-options", product.images["node-app"])
    obj["spec"]["template"]["spec"]["containers"][0]["env"] += [
        {"name": "NODE_OPTIONS", "value": "--max-old-space-size=200"},
    ]
    pod = run_variant(product, variants_ns, obj)
    spans_arrive(product, variants_ns, pod, language="nodejs")
    heap = product.kubectl(
        "exec", "-n", variants_ns, pod["metadata"]["name"], "--", "node", "-e",
        "console.log(require('v8').getHeapStatistics().heap_size_limit >> 20)",
    )  # fmt: skip
    assert int(heap.split()[-1]) < 300, heap  # the user's --max-old-space-size still applies
    # A process of the app's that requires the distro by name (it is not in the image) gets the
    # injected one, and its own span reaches the sink with the pod's resource (issue 29 item 6).
    own_span = (
        "require('@lumigo/opentelemetry').init.then(async ({ tracerProvider }) => {"
        " tracerProvider.getTracer('app').startSpan('own-span-by-name').end();"
        " await tracerProvider.forceFlush(); console.log('flushed'); })"
    )
    ran = product.kubectl(
        "exec", "-n", variants_ns, pod["metadata"]["name"], "--", "node", "-e", own_span
    )  # fmt: skip
    assert "flushed" in ran, ran
    (own,) = wait_for(
        lambda: [s for s in product.sink.spans() if s.name == "own-span-by-name"], 60, "own span"
    )
    assert own.resource.get("k8s.pod.name") == pod["metadata"]["name"]
    assert own.authorization == f"LumigoToken {TOKEN}"


def test_two_app_containers_and_a_sidecar_are_all_traced_or_left_running(
    product: Product, variants_ns: str
) -> None:
    obj = deployment("multi", product.images["python-app"])
    containers = obj["spec"]["template"]["spec"]["containers"]
    express = json.loads(json.dumps(containers[0]))
    express.update(name="express", image=product.images["node-app"])
    express["env"] = [{"name": "PORT", "value": "8081"}]
    express["ports"] = [{"containerPort": 8081}]
    express["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 8081}}
    sidecar = {
        "name": "sidecar",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", "while true; do sleep 5; done"],
    }
    containers += [express, sidecar]
    pod = run_variant(product, variants_ns, obj)
    spans_arrive(product, variants_ns, pod, language="python")

    def express_spans() -> list[Any]:
        http_get(product, variants_ns, pod["metadata"]["name"], "/", port=8081)
        return [
            s
            for s in product.sink.spans()
            if s.resource.get("k8s.pod.name") == pod["metadata"]["name"]
            and s.resource.get("telemetry.sdk.language") == "nodejs"
        ]

    wait_for(express_spans, 180, "spans of the second app container", interval=2)
    mounts = {
        c["name"]: [m["mountPath"] for m in c.get("volumeMounts", [])]
        for c in pod["spec"]["containers"]
    }
    assert all("/opt/lumigo" in paths for paths in mounts.values()), mounts


def test_a_job_and_a_cronjob_created_after_activation_run_injected_to_completion(
    product: Product, variants_ns: str
) -> None:
    script = "import sys; print('job ran with', sys.version_info[:2])"
    template: JSON = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "task",
                    "image": product.images["python-app"],
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script],
                }
            ],
        }
    }
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"},
           "spec": {"backoffLimit": 0, "template": template}}  # fmt: skip
    every_minute = {
        "schedule": "* * * * *",
        "jobTemplate": {"spec": {"backoffLimit": 0, "template": template}},
    }
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "every-minute"},
            "spec": every_minute}  # fmt: skip
    for obj in (job, cron):
        product.kubectl("apply", "-n", variants_ns, "-f", "-", input=json.dumps(obj))

    def finished(job_name_prefix: str) -> JSON | None:
        for pod in get_json(product.cluster, "pods", "-n", variants_ns)["items"]:
            owner = (pod["metadata"].get("ownerReferences") or [{}])[0]
            if (
                owner.get("kind") == "Job"
                and owner["name"].startswith(job_name_prefix)
                and pod["status"].get("phase") in ("Succeeded", "Failed")
            ):
                return dict(pod)
        return None

    for prefix in ("once", "every-minute-"):
        pod = wait_for(lambda p=prefix: finished(p), 150, f"a finished pod of {prefix}")
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        (init,) = pod["status"]["initContainerStatuses"]
        assert (init["name"], init["state"]["terminated"]["exitCode"]) == ("lumigo-injector", 0)
        out = product.kubectl("logs", "-n", variants_ns, pod["metadata"]["name"])
        assert "job ran with" in out, out
        assert "Traceback" not in out, out


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("musl-dynamic", ["/usr/bin/httpd"]),
        ("static", ["/usr/bin/httpd-static"]),
    ],
)
def test_musl_and_static_binaries_run_unchanged(
    product: Product, variants_ns: str, name: str, command: list[str]
) -> None:
    obj = with_container(deployment(name, product.images["musl-app"]), command=command)
    pod = run_variant(product, variants_ns, obj)
    assert http_get(product, variants_ns, pod["metadata"]["name"], "/")
    out = product.kubectl("logs", "-n", variants_ns, pod["metadata"]["name"])
    assert "rror" not in out, out


def test_a_shell_script_runs_unchanged(product: Product, variants_ns: str) -> None:
    script = (
        "mkdir -p /tmp/www && echo ok > /tmp/www/healthz && echo hello > /tmp/www/index.html && "
        "exec httpd -f -p 8080 -h /tmp/www"
    )
    obj = with_container(deployment("shell", BUSYBOX_IMAGE), command=["sh", "-c", script])
    obj["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] = "/"
    pod = run_variant(product, variants_ns, obj)
    assert http_get(product, variants_ns, pod["metadata"]["name"], "/").strip() == "hello"
    out = product.kubectl("logs", "-n", variants_ns, pod["metadata"]["name"])
    assert "rror" not in out, out


# --- activation that never breaks the app (issue 19, item 4) -----------------------------------

NOT_ACTIVATED = "lumigo-injector: python: tracing not activated: "


def untraced_and_said_once(product: Product, namespace: str, pod: JSON, reason: str) -> None:
    """The app serves, without our tracer, and its log says why in exactly one line."""
    name = pod["metadata"]["name"]
    described = json.loads(http_get(product, namespace, name, "/"))
    assert described["traced"] is False, described
    out = product.kubectl("logs", "-n", namespace, name)
    said = [line for line in out.splitlines() if line.startswith(NOT_ACTIVATED)]
    assert len(said) == 1, out
    assert said[0].startswith(NOT_ACTIVATED + reason), said
    assert "Traceback" not in out, out


def test_an_incompatible_protobuf_in_the_apps_environment_leaves_it_untraced_and_says_so(
    product: Product, variants_ns: str
) -> None:
    """protobuf 3.20.3 on the app's PYTHONPATH, ahead of the payload: the tracer's exporters would
    import it and fail (they need >= 5). The bootstrap checks before importing anything."""
    script = (
        "mkdir -p /deps/google/protobuf /deps/protobuf-3.20.3.dist-info && "
        "echo '__version__ = \"3.20.3\"' > /deps/google/protobuf/__init__.py && "
        "printf 'Metadata-Version: 2.1\\nName: protobuf\\nVersion: 3.20.3\\n' "
        "> /deps/protobuf-3.20.3.dist-info/METADATA && exec python3 /app/app.py"
    )
    obj = with_container(
        deployment("old-protobuf", product.images["python-app"]),
        command=["sh", "-c", script],
        env=[{"name": "PORT", "value": "8080"}, {"name": "PYTHONPATH", "value": "/deps"}],
        volumeMounts=[{"name": "deps", "mountPath": "/deps"}],
    )
    obj["spec"]["template"]["spec"]["volumes"] = [{"name": "deps", "emptyDir": {}}]
    pod = run_variant(product, variants_ns, obj)
    reason = "the application's protobuf 3.20.3 (in /deps) does not satisfy"
    untraced_and_said_once(product, variants_ns, pod, reason)
    # The same, once, at the backend: a span-less record through the proxy, which adds the pod.
    name = pod["metadata"]["name"]

    def reported() -> list[LogSeen]:
        return [r for r in product.sink.logs() if r.scope == "lumigo-injector"
                and r.resource.get("k8s.pod.name") == name]  # fmt: skip

    (record,) = wait_for(reported, 60, "the stand-down record of the pod")
    assert record.body.startswith(f"tracing not activated: {reason}")
    assert record.authorization == f"LumigoToken {TOKEN}"
    assert record.resource["k8s.deployment.name"] == "old-protobuf"
    assert record.resource["k8s.container.name"] == "app"


def test_a_payload_cut_short_by_a_full_volume_lets_the_pod_start_untraced_and_says_so(
    product: Product,
) -> None:
    """The payload's volume holds 4 MiB of its ~140 MB: the copier says the payload is
    incomplete and exits 0 (the pod starts), the injector it did copy sees no completion marker
    and activates nothing. Built by hand in a namespace without a Lumigo."""
    ns = product.new_namespace("small-volume")
    obj = deployment("small-volume", product.images["python-app"])
    spec = obj["spec"]["template"]["spec"]
    spec["volumes"] = [{"name": "lumigo", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}}]
    spec["initContainers"] = [
        {
            "name": "copy-payload",
            "image": product.images["autotrace"],
            "imagePullPolicy": "Never",
            "env": [{"name": "TARGET_DIRECTORY", "value": "/target"}],
            "volumeMounts": [{"name": "lumigo", "mountPath": "/target"}],
            "securityContext": {"runAsUser": 1234, "runAsGroup": 1234},
        }
    ]
    app = spec["containers"][0]
    app["env"] += [
        {"name": "LD_PRELOAD", "value": "/opt/lumigo/injector/lumigo_injector.so"},
        {"name": "LUMIGO_TRACER_TOKEN", "value": TOKEN},
    ]
    app["volumeMounts"] = [{"name": "lumigo", "mountPath": "/opt/lumigo", "readOnly": True}]
    product.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))
    pod = rolled_out(product, ns, "small-volume")
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0, init
    copier_log = product.kubectl("logs", "-n", ns, pod["metadata"]["name"], "-c", "copy-payload")
    assert "No space left on device" in copier_log, copier_log
    assert "the payload in /target is incomplete" in copier_log, copier_log
    untraced_and_said_once(product, ns, pod, "the payload is incomplete or missing at /opt/lumigo")


# --- faults, upgrade and operator outage (issue 13) ---------------------------------------------

PROXY_SELECTOR = "app.kubernetes.io/component=telemetry-proxy"


def proxy_metric(product: Product, name: str, exporter: str = "otlp_http/tenant-") -> float:
    """The sum of one collector metric over the proxy pods (their :8888), for the exporters
    whose name starts with `exporter` (default: every tenant's)."""
    total = 0.0
    for pod in product.pods(OPERATOR_NS, PROXY_SELECTOR):
        ip = pod["status"].get("podIP")
        if not ip:
            continue
        with urllib.request.urlopen(f"http://{ip}:8888/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(name) and f'exporter="{exporter}' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def traced_app(product: Product, namespace: str, token: str, name: str = "flask") -> str:
    """A namespace with the README's Lumigo (`token`) and a traced Flask app; its pod name."""
    product.new_namespace(namespace)
    apply_readme(product, namespace, token)
    product.kubectl(
        "apply", "-n", namespace, "-f", "-",
        input=json.dumps(deployment(name, product.images["python-app"])),
    )  # fmt: skip
    pod = rolled_out(product, namespace, name)
    assert [c["name"] for c in pod["spec"].get("initContainers", [])] == ["lumigo-injector"]
    return str(pod["metadata"]["name"])


def test_a_token_the_upstream_refuses_leaves_the_app_serving_and_shows_in_the_proxy_log_and_metric(
    product: Product,
) -> None:
    wrong = f"t_{uuid.uuid4().hex[:21]}"
    product.sink.refused_tokens.add(wrong)
    pod_name = traced_app(product, "wrong-token", wrong)
    failed_before = proxy_metric(product, "otelcol_exporter_send_failed_spans")

    def refused() -> bool:
        http_get(product, "wrong-token", pod_name, "/")  # answers 200 every time, or raises
        return product.sink.refused > 0

    wait_for(refused, 180, "the sink refusing the wrong token's spans", interval=2)
    # Refused is final (401 is a permanent error): the spans are counted as failed and dropped
    # at once, not retried in the background (that would count them only after minutes).
    wait_for(
        lambda: proxy_metric(product, "otelcol_exporter_send_failed_spans") > failed_before,
        60,
        "the proxy's send_failed_spans metric to grow",
    )
    logs = product.kubectl("logs", "-n", OPERATOR_NS, "-l", PROXY_SELECTOR, "--tail=-1")
    assert "401" in logs, logs[-2000:]
    assert wrong not in logs  # the token itself never appears in the proxy's log
    (pod,) = product.pods("wrong-token", "app=flask")
    assert all(c["restartCount"] == 0 for c in pod["status"]["containerStatuses"])


def test_the_sink_down_for_60_s_leaves_the_apps_answering_and_the_spans_arrive_afterwards(
    product: Product, original_specs: dict[str, JSON], shop_traced: dict[str, str]
) -> None:
    # The queue is in memory: a proxy rolled during the outage (the namespaces earlier tests
    # activated change its configuration) would lose what it held. This is about retries.
    active = [item["metadata"]["namespace"]
              for item in get_json(product.cluster, "lumigoes", "-A")["items"]
              if not item["metadata"].get("deletionTimestamp")]  # fmt: skip
    proxy_settled(product, lambda text: all(f"k8s_objects/{ns}" in text for ns in active),
                  f"the proxy configuration with {active}")  # fmt: skip
    (pod,) = product.pods(APPS_NS, "app=flask")
    pod_name = pod["metadata"]["name"]
    marker = uuid.uuid4().hex[:12]
    sent: list[str] = []
    with product.sink.outage():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            query = f"outage={marker}-{len(sent)}"
            http_get(product, APPS_NS, pod_name, f"/?{query}", timeout=10)  # 200, or raises
            sent.append(query)
            time.sleep(1)

    def delivered() -> set[str]:
        return {
            query
            for s in product.sink.spans()
            if s.resource.get("k8s.pod.name") == pod_name
            for value in s.attributes.values()
            for query in sent
            if isinstance(value, str) and value.endswith(query)
        }

    # The proxy's sending queue holds them and its exporter retries: every one arrives.
    try:
        wait_for(lambda: delivered() == set(sent), 180, "the spans sent during the outage")
    except AssertionError as err:
        proxies = [(p["metadata"]["name"], p["metadata"]["creationTimestamp"])
                   for p in product.pods(OPERATOR_NS, PROXY_SELECTOR)]  # fmt: skip
        failed = proxy_metric(product, "otelcol_exporter_send_failed_spans")
        raise AssertionError(
            f"{err}: {len(set(sent) - delivered())} of {len(sent)} missing; proxy pods "
            f"{proxies}, send_failed_spans {failed}"
        ) from err


@contextlib.contextmanager
def admissions_meanwhile(product: Product) -> Iterator[list[bool]]:
    """Create a traced Deployment again and again (dry-run on the server: the webhook runs,
    nothing is stored) while the block runs; the list says, for each, whether it was injected."""
    admitted: list[bool] = []
    done = threading.Event()
    body = json.dumps(deployment("during-upgrade", product.images["python-app"]))

    def create() -> None:
        while not done.is_set():
            out = product.kubectl("create", "--dry-run=server", "-o", "json", "-n", APPS_NS,
                                  "-f", "-", input=body)  # fmt: skip
            admitted.append(is_injected(json.loads(out)))
            time.sleep(0.2)

    thread = threading.Thread(target=create, daemon=True)
    thread.start()
    try:
        yield admitted
    finally:
        done.set()
        thread.join(30)


def webhook_failures(product: Product) -> list[str]:
    """The API server's log lines about webhook calls that failed open (why an admission went
    uninstrumented), to explain a failure."""
    log = product.cluster.workdir / "logs" / "kube-apiserver.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [line[-400:] for line in lines if "failing open" in line][-5:]


def test_helm_upgrade_to_a_changed_chart_keeps_the_certificate_instrumentation_and_lumigoes(
    product: Product,
    original_specs: dict[str, JSON],
    shop_traced: dict[str, str],
    tmp_path: Path,
) -> None:
    fullname = full(product)
    certs = f"{fullname}-lumigo-injector-webhook-certs"
    secret_before = get_json(product.cluster, "secret", certs, "-n", OPERATOR_NS)["data"]
    (manager_before,) = product.pods(OPERATOR_NS, MANAGER_SELECTOR)
    apps_before = {n: product.pods(APPS_NS, f"app={n}")[0]["metadata"]["uid"] for n in APPS}

    # A changed chart (a new version) and a changed value (the manager's pod annotations).
    chart = tmp_path / "lumigo-operator"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = f"{meta['version']}-upgrade"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    with admissions_meanwhile(product) as admitted:
        product.release.helm(
            "upgrade", RELEASE, str(chart), "--reuse-values", "--wait", "--timeout", "180s",
            "--set", "controllerManager.podAnnotations.upgraded=yes",
        )  # fmt: skip

        # Until the old manager is gone: it is terminating while kube-proxy still routes to it.
        def one_manager_left() -> bool:
            pods = get_json(product.cluster, "pods", "-n", OPERATOR_NS, "-l", MANAGER_SELECTOR)
            return len(pods["items"]) == 1

        wait_until(one_manager_left, 60, "the old manager pod gone")
        time.sleep(2)
    # Every workload created during the rollout was instrumented by one manager or the other.
    assert len(admitted) >= 5
    missed = admitted.count(False)
    assert not missed, (
        f"{missed} of {len(admitted)} created during the rollout not injected; "
        f"the API server's webhook failures: {webhook_failures(product)}"
    )

    def new_manager_ready() -> bool:
        pods = product.pods(OPERATOR_NS, MANAGER_SELECTOR)
        return (
            len(pods) == 1
            and pods[0]["metadata"]["uid"] != manager_before["metadata"]["uid"]
            and all(c["ready"] for c in pods[0]["status"].get("containerStatuses", []))
        )

    wait_until(new_manager_ready, 180, "the upgraded manager pod Ready")
    (manager,) = product.pods(OPERATOR_NS, MANAGER_SELECTOR)
    assert manager["metadata"]["annotations"]["upgraded"] == "yes"
    # The certificate is the same, and so is the CA the webhooks trust.
    assert get_json(product.cluster, "secret", certs, "-n", OPERATOR_NS)["data"] == secret_before
    ca = base64.b64decode(secret_before["ca.crt"]).strip()
    for config in get_json(product.cluster, "mutatingwebhookconfigurations", "-l",
                           f"app.kubernetes.io/instance={RELEASE}")["items"]:  # fmt: skip
        assert ca in base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    # The Lumigo and the instrumentation stay: the apps' pods were not even restarted.
    lumigo = get_json(product.cluster, "lumigo", "lumigo", "-n", APPS_NS)
    assert not lumigo["metadata"].get("deletionTimestamp")
    for name, uid in apps_before.items():
        (pod,) = product.pods(APPS_NS, f"app={name}")
        assert pod["metadata"]["uid"] == uid, f"{name} was restarted by the upgrade"
        assert is_injected(get_json(product.cluster, "deployment", name, "-n", APPS_NS))
    # The upgraded manager serves the injector with that certificate.
    product.kubectl(
        "apply", "-n", APPS_NS, "-f", "-",
        input=json.dumps(deployment("after-upgrade", product.images["python-app"])),
    )  # fmt: skip
    assert is_injected(get_json(product.cluster, "deployment", "after-upgrade", "-n", APPS_NS))
    product.kubectl("delete", "deployment", "after-upgrade", "-n", APPS_NS, "--wait=false")


def test_auto_mode_mounts_the_image_and_traces_a_locked_down_app_without_a_copy(
    product: Product, variants_ns: str
) -> None:
    """`injectorWebhook.lumigoInjector.mode=auto` on a cluster that supports image volumes
    (kubelet 1.36, containerd 2.2): the autotrace image is mounted read-only as an `image`
    volume, the pod has no init container and nothing is copied, and a non-root app with a
    read-only root and every capability dropped is traced from it."""
    switch_injection_mode(product, "auto")  # this node (kubelet 1.36, containerd 2.2) can
    try:
        obj = with_container(
            deployment("image-volume", product.images["python-app"]),
            securityContext=LOCKED_DOWN,
        )
        product.kubectl("apply", "-n", variants_ns, "-f", "-", input=json.dumps(obj))
        pod = rolled_out(product, variants_ns, "image-volume")
        assert "initContainers" not in pod["spec"]
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "lumigo-injector"]
        assert volume == {
            "name": "lumigo-injector",
            "image": {"reference": product.images["autotrace"], "pullPolicy": "Never"},
        }
        assert all(
            c["ready"] and c["restartCount"] == 0 for c in pod["status"]["containerStatuses"]
        )
        spans_arrive(product, variants_ns, pod)
    finally:
        switch_injection_mode(product, "init-container")


def test_with_the_operator_down_deployments_are_admitted_and_instrumented_once_it_is_back(
    product: Product,
) -> None:
    ns = "outage"
    traced_app(product, ns, TOKEN, name="before")
    doomed = "outage-delete"
    product.new_namespace(doomed)
    product.kubectl("apply", "-n", doomed, "-f", "-", input=readme_yaml(TOKEN))
    manager = f"{full(product)}-controller-manager"
    webhook = f"{full(product)}-webhook"
    for name in (manager, webhook):
        product.kubectl("scale", "deployment", name, "-n", OPERATOR_NS, "--replicas=0")

    def no_operator_pod() -> bool:
        return not any(
            get_json(product.cluster, "pods", "-n", OPERATOR_NS, "-l", selector)["items"]
            for selector in (MANAGER_SELECTOR, WEBHOOK_SELECTOR)
        )

    wait_until(no_operator_pod, 120, "no manager or webhook pod")
    try:
        # The injector's failurePolicy is Ignore: admitted, not (yet) instrumented.
        created = product.kubectl(
            "apply", "-n", ns, "-o", "json", "-f", "-",
            input=json.dumps(deployment("during", product.images["python-app"])),
        )  # fmt: skip
        assert not json.loads(created)["spec"]["template"]["spec"].get("initContainers")
        # The defaulter's failurePolicy Fail does not block deleting a Lumigo.
        product.kubectl("delete", "lumigo", "lumigo", "-n", doomed, "--wait=false")
        lumigo = get_json(product.cluster, "lumigo", "lumigo", "-n", doomed)
        assert lumigo["metadata"]["deletionTimestamp"]
    finally:
        for name in (manager, webhook):
            product.kubectl("scale", "deployment", name, "-n", OPERATOR_NS, "--replicas=1")

    wait_until(
        lambda: is_injected(get_json(product.cluster, "deployment", "during", "-n", ns)),
        180,
        "the Deployment created during the outage instrumented",
    )
    pod = rolled_out(product, ns, "during")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["lumigo-injector"]
    wait_until(
        lambda: not product.kubectl("get", "lumigo", "-n", doomed, "-o", "name").strip(),
        120,
        "the deleted Lumigo gone once its finalizer ran",
    )
    # Back to normal: the manager Available and the defaulter reachable through its Service
    # again (until kube-proxy routes to the new pod, a Lumigo create is refused: failurePolicy
    # Fail, by design).
    for name in (manager, webhook):
        wait_until(lambda n=name: deployment_available(product.cluster, OPERATOR_NS, n), 120,
                   f"{name} Available")  # fmt: skip
    wait_defaulter(product, ns)


def traced_barrier(product: Product) -> tuple[str, str]:
    """A second traced namespace with a Flask app: its spans and objects prove the proxy still
    forwards while the first namespace sends nothing (an absence is only meaningful next to a
    presence that went through the same pipeline)."""
    ns = product.new_namespace("barrier")
    apply_readme(product, ns, BARRIER_TOKEN)
    product.kubectl(
        "apply", "-n", ns, "-f", "-",
        input=json.dumps(deployment("flask", product.images["python-app"])),
    )  # fmt: skip
    pod = rolled_out(product, ns, "flask")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["lumigo-injector"]
    return ns, pod["metadata"]["name"]


def proxy_settled(product: Product, config_ok: Callable[[str], bool], what: str) -> None:
    """Wait until the proxy's configuration satisfies `config_ok` and every proxy pod runs it.

    A configuration change is a rolling restart: until the old pod is gone (terminating pods
    included) it still runs the old configuration, and whatever its in-memory queue holds goes
    with it."""
    fullname = full(product)
    proxy = f"{fullname}-telemetry-proxy"

    def config_rolled() -> bool:
        secret = get_json(product.cluster, "secret", f"{proxy}-config", "-n", OPERATOR_NS)
        text = base64.b64decode(secret["data"]["config.yaml"]).decode()
        template = get_json(product.cluster, "deployment", proxy, "-n", OPERATOR_NS)["spec"]
        annotations = template["template"]["metadata"].get("annotations", {})
        stored = secret["metadata"]["annotations"].get(CONFIG_HASH_ANNOTATION)
        rolled_to = annotations.get(CONFIG_HASH_ANNOTATION)
        return config_ok(text) and rolled_to == stored

    wait_until(config_rolled, 120, what)
    rolled_out(product, OPERATOR_NS, proxy, selector=PROXY_SELECTOR)

    def no_old_pods() -> bool:
        items = get_json(product.cluster, "pods", "-n", OPERATOR_NS, "-l", PROXY_SELECTOR)["items"]
        return not any(p["metadata"].get("deletionTimestamp") for p in items)

    wait_until(no_old_pods, 120, "the old proxy pods gone")


def proxy_settled_without(product: Product, namespace: str) -> None:
    """The proxy no longer watches `namespace`: "nothing arrives afterwards" holds from there
    on, not from the moment the Lumigo is deleted."""
    proxy_settled(product, lambda text: f"k8s_objects/{namespace}" not in text,
                  f"the proxy configuration without {namespace}")  # fmt: skip


def apps_settled(product: Product) -> None:
    """Wait until the instrumented pods are gone, not just terminating, and their last spans are
    in: a traced pod answers readiness probes until it exits and flushes those spans as it
    exits (one such /healthz span once landed after the baseline of "nothing arrives")."""

    def gone() -> bool:
        items = get_json(product.cluster, "pods", "-n", APPS_NS)["items"]
        return not any(p["metadata"].get("deletionTimestamp") for p in items)

    wait_until(gone, 240, f"the terminating pods of {APPS_NS} gone")
    last = {"count": -1, "since": time.monotonic()}

    def quiet() -> bool:
        count = sum(
            1 for s in product.sink.spans() if s.resource.get("k8s.namespace.name") == APPS_NS
        )
        if count != last["count"]:
            last.update(count=count, since=time.monotonic())
        return time.monotonic() - last["since"] >= 3.0

    wait_until(quiet, 60, f"no more spans of {APPS_NS} for 3 s")


def test_deleting_the_lumigo_rolls_the_apps_back_and_nothing_arrives_afterwards(
    product: Product, original_specs: dict[str, JSON], shop_traced: dict[str, str]
) -> None:
    barrier_ns, barrier_pod = traced_barrier(product)
    product.kubectl("delete", "lumigo", "lumigo", "-n", APPS_NS, "--timeout=120s")

    for name, original in original_specs.items():

        def back(n: str = name, o: JSON = original) -> bool:
            template = get_json(product.cluster, "deployment", n, "-n", APPS_NS)["spec"]["template"]
            return bool(template["spec"] == o["spec"])

        wait_until(back, 120, f"{name}'s pod template back to the original spec")
        pod = rolled_out(product, APPS_NS, name)
        assert not pod["spec"].get("initContainers")
        env = [e["name"] for c in pod["spec"]["containers"] for e in c.get("env", [])]
        assert "LD_PRELOAD" not in env
    proxy_settled_without(product, APPS_NS)
    pods = {name: product.pods(APPS_NS, f"app={name}")[0]["metadata"]["name"] for name in APPS}
    apps_settled(product)

    # After the removal: requests to the apps, a Deployment created in the namespace; then the
    # barrier's span and Deployment arrive, and nothing of the first namespace does.
    logs_before, spans_before = len(product.sink.logs()), len(product.sink.spans())
    for pod_name in pods.values():
        http_get(product, APPS_NS, pod_name, "/healthz")
        http_get(product, APPS_NS, pod_name, "/")
    product.kubectl(
        "apply", "-n", APPS_NS, "-f", "-",
        input=json.dumps(deployment("after-removal", product.images["python-app"])),
    )  # fmt: skip
    product.kubectl(
        "apply", "-n", barrier_ns, "-f", "-",
        input=json.dumps(deployment("marker", product.images["python-app"])),
    )  # fmt: skip

    def barrier_span() -> bool:
        http_get(product, barrier_ns, barrier_pod, "/")
        return any(
            s.resource.get("k8s.pod.name") == barrier_pod
            for s in product.sink.spans()[spans_before:]
        )

    wait_for(barrier_span, 120, "a span of the barrier namespace", interval=2)
    wait_for(lambda: records_of(product, barrier_ns, "Deployment", "marker"), 120, "the marker")
    after = [s for s in product.sink.spans()[spans_before:]
             if s.resource.get("k8s.namespace.name") == APPS_NS]  # fmt: skip
    assert not after, after[:3]
    assert not records_of(product, APPS_NS, "Deployment", "after-removal")
    assert not [r for r in product.sink.logs()[logs_before:]
                if r.resource.get("k8s.namespace.name") == APPS_NS
                or the_object(r).get("metadata", {}).get("namespace") == APPS_NS]  # fmt: skip
    assert not get_json(product.cluster, "deployment", "after-removal", "-n", APPS_NS)["spec"][
        "template"]["spec"].get("initContainers")  # fmt: skip


def test_helm_uninstall_runs_the_pre_delete_job_and_leaves_nothing_behind(product: Product) -> None:
    """Last: the release goes. The barrier namespace still has its Lumigo and a traced app."""
    fullname = full(product)
    instrumented = [
        d for d in get_json(product.cluster, "deployments", "-A")["items"] if is_injected(d)
    ]
    assert instrumented  # something for the hook to undo
    product.release.uninstall()

    # The hook ran as a real Job on the node: its events outlive it (deleted on success).
    def job_events() -> set[str]:
        events = get_json(product.cluster, "events", "-n", OPERATOR_NS)["items"]
        return {
            e["reason"]
            for e in events
            if e["involvedObject"]["kind"] == "Job"
            and e["involvedObject"]["name"] == f"{fullname}-uninstall-hook"
        }

    reasons = wait_for(lambda: {"SuccessfulCreate", "Completed"} <= job_events(), 60,
                       "the uninstall Job's events")  # fmt: skip
    assert reasons
    # No Lumigo, no instrumented workload, no webhook configuration, no pod of the release.
    assert not product.kubectl("get", "lumigoes", "-A", "-o", "name").strip()
    assert not [
        d["metadata"]["name"]
        for d in get_json(product.cluster, "deployments", "-A")["items"]
        if is_injected(d)
    ]
    for d in instrumented:
        meta = d["metadata"]
        pod = rolled_out(product, meta["namespace"], meta["name"])
        assert not pod["spec"].get("initContainers"), meta
    assert product.release.cluster_scoped_leftovers() == []
    wait_until(
        lambda: not get_json(product.cluster, "pods", "-n", OPERATOR_NS)["items"],
        120,
        f"no pod left in {OPERATOR_NS}",
    )
