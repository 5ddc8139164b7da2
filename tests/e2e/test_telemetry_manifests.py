"""config/telemetry-proxy on a real API server: consistent names, and RBAC that really suffices.

The manifests are applied; then the reconciler runs with the operator service account's token and
the collector with the proxy service account's token, so a missing verb fails here rather than
in a user's cluster.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.lumigo.resources import LUMIGOES
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.telemetry.config import HEALTH_PORT, OTLP_HTTP_PORT, render
from controller.telemetry.proxy_reconciler import ProxyTarget, TelemetryProxyReconciler
from envtest.cluster import ROOT, LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, SECRETS, SERVICES
from kube.rest import Resource
from tests.support.lumigo import create_lumigo, create_token_secret, random_token, set_active
from tests.support.otel import (
    OTLPSink,
    export_request,
    local_settings,
    running_collector,
    running_sink,
    send_traces,
)

JSON = dict[str, Any]
SYSTEM = "lumigo-system"
FULLNAME = "lumigo-lumigo-operator"
OPERATOR_SA = "lumigo-kubernetes-operator"
PROXY_SA = f"{FULLNAME}-telemetry-proxy"
MANIFESTS = ROOT / "config" / "telemetry-proxy"
SERVICE_ACCOUNTS = Resource("v1", "ServiceAccount", "serviceaccounts")


def docs() -> list[JSON]:
    out: list[JSON] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


@pytest.fixture(scope="module")
def applied(cluster: LocalCluster, crd: object) -> Iterator[str]:
    """config/telemetry-proxy applied in lumigo-system; afterwards its objects and the namespace
    (if this fixture made it) are deleted, so that installs of the whole operator in later
    tests (same names) start clean."""
    created = "created" in cluster.kubectl("create", "namespace", SYSTEM, check=False)
    cluster.kubectl("apply", "-k", str(MANIFESTS))
    try:
        yield SYSTEM
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-k", str(MANIFESTS), check=False)
        for kind in ("clusterrolebinding", "clusterrole"):
            cluster.kubectl("delete", kind, "test-manager-reads", "--ignore-not-found",
                            check=False)  # fmt: skip
        if created:  # without kube-controller-manager it stays Terminating; installs wait
            cluster.kubectl("delete", "namespace", SYSTEM, "--wait=false", check=False)


def token_kubeconfig(cluster: LocalCluster, kube: KubeClient, sa: str, path: Path) -> Path:
    """A kubeconfig authenticating as a service account (TokenRequest), like a pod's."""
    if kube.get_or_none(SERVICE_ACCOUNTS, sa, SYSTEM) is None:
        kube.create(
            SERVICE_ACCOUNTS,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
            SYSTEM,
        )
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    response = kube.request(
        "POST", f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{sa}/token", body=request
    )
    admin = json.loads(cluster.kubeconfig.read_text())
    admin["users"] = [{"name": sa, "user": {"token": response["status"]["token"]}}]
    admin["contexts"] = [{"name": "sa", "context": {"cluster": "local", "user": sa}}]
    admin["current-context"] = "sa"
    path.write_text(json.dumps(admin))
    path.chmod(0o600)
    return path


def test_names_ports_and_image_agree_with_the_operator_and_the_test_build() -> None:
    objects = {(d["kind"], d["metadata"]["name"]): d for d in docs()}
    target = ProxyTarget.for_release(SYSTEM, FULLNAME)
    deployment = objects[("Deployment", target.deployment_name)]
    pod = deployment["spec"]["template"]
    (volume,) = pod["spec"]["volumes"]
    assert volume["secret"]["secretName"] == target.secret_name
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["otlp-http"] == OTLP_HTTP_PORT
    assert ports["health"] == HEALTH_PORT
    service = objects[("Service", f"{FULLNAME}-telemetry-proxy-service")]
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (80, "otlp-http")
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert labels["lumigo.auto-trace"] == "false"
    # The image is the collector the tests build with ocb (hack/tools/otelcol), published at the
    # operator's version; its upstream components are all of one collector release.
    chart = yaml.safe_load((ROOT / "charts/lumigo-operator/Chart.yaml").read_text())
    repository, _, tag = container["image"].rpartition(":")
    assert repository == "quay.io/lumigo/lumigo-operator-telemetry-proxy"
    assert tag == f"v{chart['appVersion']}"
    manifest = yaml.safe_load((ROOT / "hack/tools/otelcol/manifest.yaml").read_text())
    upstream = manifest["dist"]["version"].partition("-")[0]
    assert all(m["gomod"].endswith(f"v{upstream}") for m in manifest["receivers"])


@pytest.fixture
def monitored(cluster: LocalCluster) -> Iterator[str]:
    name = f"t-rbac-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def sink() -> Iterator[OTLPSink]:
    with running_sink() as s:
        yield s


def test_operator_and_proxy_service_accounts_have_what_they_need(
    cluster: LocalCluster,
    kube: KubeClient,
    *,
    applied: str,
    monitored: str,
    sink: OTLPSink,
    tmp_path: Path,
) -> None:
    # What the manager's ClusterRole (config/rbac, another part) grants and this part relies on.
    cluster.kubectl(
        "create", "clusterrole", "test-manager-reads", "--verb=get,list,watch",
        "--resource=lumigoes.operator.lumigo.io,secrets,namespaces", check=False,
    )  # fmt: skip
    cluster.kubectl(
        "create", "clusterrolebinding", "test-manager-reads", "--clusterrole=test-manager-reads",
        f"--serviceaccount={SYSTEM}:{OPERATOR_SA}", check=False,
    )  # fmt: skip
    token = random_token()
    create_token_secret(kube, monitored, token)
    create_lumigo(kube, monitored)
    set_active(kube, monitored)

    operator = KubeClient.from_kubeconfig(
        token_kubeconfig(cluster, kube, OPERATOR_SA, tmp_path / "operator.kubeconfig")
    )
    lumigoes = Informer(operator, Selection(LUMIGOES, namespace=monitored))
    lumigoes.start()
    settings = local_settings(sink.url, SYSTEM)
    target = ProxyTarget.for_release(SYSTEM, FULLNAME)
    try:
        assert lumigoes.wait_for_sync(30)
        wait_until(
            lambda: bool((lumigoes.get(monitored, "lumigo") or {}).get("status")),
            30,
            "the active Lumigo in the cache",
        )
        reconciler = TelemetryProxyReconciler(operator, lumigoes, target, settings)
        reconciler.sync()
        namespaces = reconciler.monitored_namespaces()
    finally:
        lumigoes.stop()
    assert [n.name for n in namespaces] == [monitored]
    written = kube.get(SECRETS, target.secret_name, SYSTEM)
    rendered = yaml.safe_load(base64.b64decode(written["data"]["config.yaml"]))
    # The Lease the operator tells the proxy to use is the one the proxy's Role names.
    lease = rendered["extensions"]["k8s_leader_elector"]["lease_name"]
    settings = replace(settings, lease_name=lease)
    deployment = kube.get(DEPLOYMENTS, target.deployment_name, SYSTEM)
    assert deployment["spec"]["template"]["metadata"]["annotations"]
    assert kube.get(SERVICES, f"{FULLNAME}-telemetry-proxy-service", SYSTEM)

    # The proxy with its own service account: enrichment, leader election and collection.
    env = cluster.env()
    env["KUBECONFIG"] = str(token_kubeconfig(cluster, kube, PROXY_SA, tmp_path / "proxy.kc"))
    with running_collector(
        render(namespaces, settings), tmp_path, settings.health_port, env
    ) as proxy:
        labels = {"app": "rbac"}
        kube.create(
            DEPLOYMENTS,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "rbac", "namespace": monitored},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
                    },
                },
            },
            monitored,
        )
        rbac_span = export_request("rbac")
        assert send_traces(settings.otlp_port, rbac_span, f"LumigoToken {token}") == 200
        wait_until(
            lambda: (
                any(r.authorization == f"LumigoToken {token}" for r in sink.logs())
                and any(s.name == "rbac" for s in sink.spans())
            ),
            90,
            "objects of the monitored namespace and the span at the sink",
        )
        log = proxy.log_text().lower()
        assert "forbidden" not in log, proxy.log_tail()
