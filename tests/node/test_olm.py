"""The OLM install on the real node (issue 13, item 6): the project's catalog served by
`opm serve`, OLM's olm and catalog operators as local processes, a Subscription; the CSV's
Deployments run as real pods from the images built here, with the certificates OLM made, and a
Deployment created afterwards in a namespace with the README's Lumigo is traced into a sink.

The CSV names the published images; the built ones are tagged with those names in the node's
containerd (pull policy IfNotPresent), so nothing is pulled.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import yaml

from api.marks import parse_time
from controller.telemetry.proxy_reconciler import CONFIG_HASH_ANNOTATION
from controller.telemetry.restart import last_write
from envtest.cluster import LocalCluster
from tests.node.conftest import NodeHolder
from tests.support.olm import (
    CSV_NAME,
    PACKAGE,
    running_olm,
    subscribe,
    wait_for_subscription_env,
)
from tests.support.packaging import ROOT, deployment_available, get_json
from tests.support.product import (
    Product,
    apply_readme,
    deployment,
    http_get,
    node_cluster,
    node_sink,
    rolled_out,
    wait_for,
)

CSV = ROOT / "bundle" / "manifests" / f"{PACKAGE}.clusterserviceversion.yaml"
# relatedImages name -> the image hack/build-images builds for it
BUILT_FOR = {
    "lumigo-operator": "operator",
    "lumigo-autotrace": "autotrace",
    "lumigo-operator-telemetry-proxy": "telemetry-proxy",
    "node-exporter": "node-exporter",  # the manager runs it in the cluster agent's pods
}
FULLNAME = "lumigo-lumigo-operator"
JSON = dict[str, Any]


def normalized(ref: str) -> str:
    """The name the kubelet asks containerd for (`otel/x:1` is `docker.io/otel/x:1`)."""
    first, _, rest = ref.partition("/")
    if not rest:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def csv_images() -> dict[str, str]:
    """Built image name -> the reference the CSV uses for it."""
    csv = yaml.safe_load(CSV.read_text())
    return {BUILT_FOR[i["name"]]: normalized(i["image"]) for i in csv["spec"]["relatedImages"]}


def diagnosis(cluster: LocalCluster, namespace: str) -> str:
    """What the operator's namespace looks like: pods and ReplicaSets (with the env OLM gave
    them), the proxy configuration's writes and endpoints, the last log lines of the manager
    and the proxy."""
    lines = [cluster.kubectl("get", "pods,replicasets", "-n", namespace, "-o", "wide",
                             check=False)]  # fmt: skip
    env_names = ("jsonpath={range .items[*]}{.metadata.name} env: "
                 "{.spec.template.spec.containers[*].env[*].name}{'\\n'}{end}")  # fmt: skip
    lines.append(cluster.kubectl("get", "replicasets", "-n", namespace, "-o", env_names,
                                 check=False))  # fmt: skip
    lines.append(cluster.kubectl("get", "pods", "-n", namespace, "-o",
                                 "custom-columns=NAME:.metadata.name,CREATED:.metadata."
                                 "creationTimestamp,DELETED:.metadata.deletionTimestamp",
                                 check=False))  # fmt: skip
    try:
        secret = get_json(cluster, "secret", f"{FULLNAME}-telemetry-proxy-config", "-n",
                          namespace, "--show-managed-fields")  # fmt: skip
    except Exception as err:  # a diagnosis never hides the failure it explains
        lines.append(f"proxy configuration: {err}")
    else:
        writes = [f"{m.get('manager')} {m.get('operation')} {m.get('time')}"
                  for m in secret["metadata"].get("managedFields") or []]  # fmt: skip
        data = next(iter((secret.get("data") or {}).values()), "")
        config = base64.b64decode(data).decode()
        endpoints = sorted({line.strip() for line in config.splitlines() if "endpoint:" in line})
        lines.append(f"proxy configuration: written {writes}; endpoints {endpoints}")
    for selector in (
        "control-plane=controller-manager",
        "control-plane=webhook",
        "app.kubernetes.io/component=telemetry-proxy",
    ):
        lines.append(cluster.kubectl("logs", "-n", namespace, "-l", selector, "--tail=40",
                                     check=False))  # fmt: skip
    return "\n".join(lines)


def test_olm_installs_the_operator_on_the_node_and_a_deployment_created_afterwards_is_traced(
    node_holder: NodeHolder,
) -> None:
    token = f"t_{uuid.uuid4().hex[:21]}"
    with node_cluster(node_holder) as (cluster, node, built):
        for name, ref in csv_images().items():
            node.ctr("images", "tag", "--force", str(built[name]["ref"]), ref)
        sink = node_sink(node.node_ip)
        try:
            with running_olm(cluster) as olm:
                ns = olm.operator_namespace
                url = f"http://{node.node_ip}:{sink.port}"
                env = [
                    {"name": "LUMIGO_ENDPOINT", "value": url},
                    {"name": "LUMIGO_LOGS_ENDPOINT", "value": f"{url}/v1/logs"},
                    {"name": "KUBERNETES_CLUSTER_NAME", "value": "olm-node"},
                ]
                subscribe(olm, env=env)
                wait_for_subscription_env(olm, {e["name"] for e in env})
                csv = get_json(cluster, "csv", CSV_NAME, "-n", ns)
                assert csv["status"]["phase"] == "Succeeded"

                # The manager: a real pod on the node, Ready, serving with OLM's certificate.
                manager = f"{FULLNAME}-controller-manager"
                wait_for(lambda: deployment_available(cluster, ns, manager), 180, "the manager")
                pods = get_json(cluster, "pods", "-n", ns, "-l",
                                "control-plane=controller-manager")["items"]  # fmt: skip
                (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
                assert pod["spec"]["nodeName"] == node.name
                (status,) = pod["status"]["containerStatuses"]
                assert status["ready"]
                # The CSV's image name, which the node resolves to the image built here.
                assert pod["spec"]["containers"][0]["image"] == csv_images()[
                    "operator"
                ].removeprefix("docker.io/")
                # The webhook Deployment serves admissions under its own ServiceAccount, with
                # the certificate OLM mounted into it (the webhookdefinitions name it).
                webhook = f"{FULLNAME}-webhook"
                wait_for(lambda: deployment_available(cluster, ns, webhook), 180, "the webhook")
                webhook_pod = get_json(cluster, "deployment", webhook, "-n", ns)["spec"]["template"]
                assert webhook_pod["spec"]["serviceAccountName"] == webhook
                assert get_json(cluster, "secret", f"{webhook}-service-cert", "-n", ns)["data"]
                proxy = f"{FULLNAME}-telemetry-proxy"
                wait_for(lambda: deployment_available(cluster, ns, proxy), 180, "the proxy")

                # A Deployment created after the install, in a namespace with the Lumigo.
                app_ns = "olm-app"
                # The product helpers, without a Helm release (OLM installed this one).
                product = Product(cluster, node, None, sink, {})  # type: ignore[arg-type]
                product.new_namespace(app_ns)
                apply_readme(product, app_ns, token)
                image = str(built["python-app"]["ref"])
                product.kubectl("apply", "-n", app_ns, "-f", "-",
                                input=json.dumps(deployment("flask", image)))  # fmt: skip
                app = rolled_out(product, app_ns, "flask")
                # --injection-mode=auto (the CSV's default): this node's kubelet 1.36 and
                # containerd 2.2 mount the autotrace image, and the API server kept the field in
                # the manager's dry-run (the bundle's namespaced Role allows it): no copy.
                assert not app["spec"].get("initContainers")
                (volume,) = [v for v in app["spec"]["volumes"] if v["name"] == "lumigo-injector"]
                assert volume["image"]["reference"] == csv_images()["autotrace"].removeprefix(
                    "docker.io/"
                )
                pod_name = app["metadata"]["name"]

                def traced() -> list[Any]:
                    http_get(product, app_ns, pod_name, "/")
                    return [s for s in sink.spans() if s.resource.get("k8s.pod.name") == pod_name]

                try:
                    spans = wait_for(traced, 300, "the app's spans at the sink", interval=2)
                except AssertionError as err:
                    raise AssertionError(f"{err}\n{diagnosis(cluster, ns)}") from err
                assert spans[0].authorization == f"LumigoToken {token}"
                assert spans[0].resource["k8s.cluster.name"] == "olm-node"

                # The proxy took its configuration by a restart of its pods: OLM undoes a
                # pod-template rollout of the Deployments it installed, so the operator never
                # starts one here.
                template = get_json(cluster, "deployment", proxy, "-n", ns)["spec"]["template"]
                annotations = template["metadata"].get("annotations") or {}
                assert CONFIG_HASH_ANNOTATION not in annotations
                selector = "app.kubernetes.io/component=telemetry-proxy"

                def restarted_after_last_write() -> bool:
                    """Every live proxy pod is younger than the configuration's last write: a
                    write that lands after the spans (the Secret is rewritten as the operator
                    learns more) is followed by a restart too, so this is checked eventually."""
                    secret = get_json(cluster, "secret", f"{proxy}-config", "-n", ns,
                                  "--show-managed-fields")  # fmt: skip
                    written = last_write(secret)
                    assert written is not None
                    pods = get_json(cluster, "pods", "-n", ns, "-l", selector)["items"]
                    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
                    created = [parse_time(p["metadata"]["creationTimestamp"]) for p in running]
                    return bool(running) and all(c is not None and c > written for c in created)

                try:
                    wait_for(restarted_after_last_write, 180, "proxy pods restarted after the "
                             "configuration's last write", interval=2)  # fmt: skip
                except AssertionError as err:
                    raise AssertionError(f"{err}\n{diagnosis(cluster, ns)}") from err
                annotations = get_json(cluster, "deployment", proxy, "-n", ns)["spec"][
                    "template"]["metadata"].get("annotations") or {}  # fmt: skip
                assert CONFIG_HASH_ANNOTATION not in annotations

                # A change of the Subscription's config: OLM updates both Deployments, and those
                # UPDATEs reach our webhook (a CSV's webhook cannot be scoped to other
                # namespaces). Our own pods are labelled `lumigo.auto-trace=false`: the opt-out
                # path must not take the LUMIGO_* variables OLM gave them (it once did).
                env.append({"name": "LUMIGO_TEST_CONFIG_CHANGE", "value": "1"})
                patch = {"spec": {"config": {"env": env}}}
                cluster.kubectl("patch", "subscription", PACKAGE, "-n", ns, "--type=merge",
                                "-p", json.dumps(patch))  # fmt: skip
                wait_for_subscription_env(olm, {e["name"] for e in env})
                before = len(traced())  # every earlier span is in: 10 s settled since

                def traced_again() -> bool:
                    return len(traced()) > before + 1

                try:
                    wait_for(traced_again, 180, "spans after the Subscription's change", interval=2)
                except AssertionError as err:
                    raise AssertionError(f"{err}\n{diagnosis(cluster, ns)}") from err
        finally:
            sink.stop()
