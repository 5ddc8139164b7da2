"""The OLM bundle and catalog, checked by the ecosystem's own tools; a real Subscription install.

- `operator-sdk bundle validate --select-optional suite=operatorframework`: no error, no warning.
- The six scorecard built-ins: `operator-sdk scorecard` runs them as pods (it needs a kubelet and
  image pulls), so we run the very binary of their image, scorecard-test, which reads the bundle
  from the hard-coded /bundle: it runs chrooted (`unshare --root`) in a directory holding only
  itself and a copy of bundle/, so no path outside the test's temporary directory is touched.
- `opm validate catalog/`, and the catalog is what `make catalog` generates.
- OLM v0's olm and catalog operators as local processes, `opm serve catalog/`, a CatalogSource
  with spec.address, an OperatorGroup and a Subscription: the CSV reaches Succeeded and OLM has
  created both Deployments (manager and telemetry proxy; kwok runs their pods), the proxy's
  Service and ServiceAccount, RBAC that lets both ServiceAccounts do their work, the webhook
  Service/Secret and both webhooks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from envtest.cluster import LocalCluster
from envtest.process import wait_until
from tests.support.olm import CSV_NAME, PACKAGE, LocalOlm, running_olm, subscribe
from tests.support.packaging import (
    CRD_NAME,
    OPERATOR_SA,
    ROOT,
    can_i,
    denied,
    deployment_available,
    exists,
    get_json,
    load_file,
    run,
    telemetry_proxy_requests,
    telemetry_reconciler_requests,
    tool,
)

FULLNAME = "lumigo-lumigo-operator"
DEPLOYMENT = f"{FULLNAME}-controller-manager"
PROXY = f"{FULLNAME}-telemetry-proxy"
WEBHOOK = f"{FULLNAME}-webhook"  # the webhook Deployment and its ServiceAccount
SCORECARD_TESTS = [
    "basic-check-spec",
    "olm-bundle-validation",
    "olm-crds-have-validation",
    "olm-crds-have-resources",
    "olm-spec-descriptors",
    "olm-status-descriptors",
]
JSON = dict[str, Any]


# --- static validation by the ecosystem's tools -------------------------------------------


def test_operator_sdk_bundle_validate_has_no_errors_and_no_warnings() -> None:
    proc = run(
        [
            tool("operator-sdk"), "bundle", "validate", str(ROOT / "bundle"),
            "--select-optional", "suite=operatorframework", "-o", "json-alpha1",
        ],
        check=False,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert report["passed"] is True, proc.stdout + proc.stderr
    assert not report["outputs"], f"errors or warnings: {json.dumps(report['outputs'], indent=2)}"
    assert proc.returncode == 0


def test_scorecard_config_lists_the_six_tests() -> None:
    (config,) = load_file(ROOT / "bundle" / "tests" / "scorecard" / "config.yaml")
    tests = [t for stage in config["stages"] for t in stage["tests"]]
    assert [t["entrypoint"] for t in tests] == [
        ["scorecard-test", name] for name in SCORECARD_TESTS
    ]
    for test in tests:
        assert test["image"].startswith("quay.io/operator-framework/scorecard-test:v")
        assert test["labels"]["test"] == f"{test['entrypoint'][1]}-test"
    annotations = load_file(ROOT / "bundle" / "metadata" / "annotations.yaml")[0]["annotations"]
    assert annotations["operators.operatorframework.io.test.config.v1"] == "tests/scorecard/"


def run_scorecard_test(name: str, bundle: Path, workdir: Path) -> dict[str, Any]:
    """One built-in scorecard test against `bundle`, seen by the binary as /bundle."""
    root = workdir / "root"
    root.mkdir()
    shutil.copytree(bundle, root / "bundle")
    shutil.copy2(os.path.realpath(tool("scorecard-test")), root / "scorecard-test")
    prefix = ["unshare", "--root", str(root)]
    if os.geteuid() != 0:  # a user namespace grants chroot to an unprivileged user
        prefix = ["unshare", "--user", "--map-root-user", "--root", str(root)]
    proc = subprocess.run([*prefix, "/scorecard-test", name], capture_output=True, text=True)
    if proc.returncode != 0 and not proc.stdout.strip():
        raise AssertionError(
            f"cannot run scorecard-test chrooted ({' '.join(prefix)}): {proc.stderr}\n"
            "it needs root or unprivileged user namespaces (kernel.unprivileged_userns_clone=1)"
        )
    status: dict[str, Any] = json.loads(proc.stdout)
    return status


@pytest.mark.parametrize("name", SCORECARD_TESTS)
def test_scorecard_builtin_passes(name: str, tmp_path: Path) -> None:
    status = run_scorecard_test(name, ROOT / "bundle", tmp_path)
    (result,) = status["results"]
    assert result["name"] == name
    assert result["state"] == "pass", json.dumps(result, indent=2)
    assert not result.get("errors")


def test_scorecard_spec_descriptors_fails_on_a_bundle_missing_one(tmp_path: Path) -> None:
    """The scorecard harness is not vacuous: a descriptor removed makes its test fail."""
    bundle = tmp_path / "bundle"
    shutil.copytree(ROOT / "bundle", bundle)
    csv_path = bundle / "manifests" / f"{PACKAGE}.clusterserviceversion.yaml"
    csv = yaml.safe_load(csv_path.read_text())
    owned = csv["spec"]["customresourcedefinitions"]["owned"][0]
    owned["specDescriptors"] = [d for d in owned["specDescriptors"] if d["path"] != "lumigoToken"]
    csv_path.write_text(yaml.safe_dump(csv))
    workdir = tmp_path / "run"
    workdir.mkdir()
    (result,) = run_scorecard_test("olm-spec-descriptors", bundle, workdir)["results"]
    assert result["state"] == "fail"
    assert "lumigoToken" in json.dumps(result)


def test_opm_validate_catalog_and_catalog_is_generated() -> None:
    run([tool("opm"), "validate", str(ROOT / "catalog")])
    proc = run([sys.executable, str(ROOT / "hack" / "gen-catalog"), "--check"], check=False)
    assert proc.returncode == 0, proc.stderr
    blobs = load_file(ROOT / "catalog" / PACKAGE / "catalog.yaml")
    schemas = [b["schema"] for b in blobs]
    assert schemas == ["olm.package", "olm.channel", "olm.bundle"]
    package, channel, bundle = blobs
    assert package["defaultChannel"] == channel["name"] == "stable"
    assert channel["entries"] == [{"name": CSV_NAME}]
    assert bundle["name"] == CSV_NAME
    assert bundle["image"] == "", "bundle objects travel in the catalog: no bundle image to pull"
    assert {p["type"] for p in bundle["properties"]} >= {
        "olm.package",
        "olm.gvk",
        "olm.bundle.object",
    }


# --- the OLM Subscription install ---------------------------------------------------------


@pytest.fixture
def local_olm(full_cluster: LocalCluster) -> Iterator[LocalOlm]:
    with running_olm(full_cluster) as olm:
        yield olm


def test_olm_subscription_installs_the_operator(local_olm: LocalOlm) -> None:
    cluster, ns = local_olm.cluster, local_olm.operator_namespace
    # How an OLM user names the cluster (README): env of every container.
    subscribe(local_olm, env=[{"name": "KUBERNETES_CLUSTER_NAME", "value": "olm-test"}])

    csv = get_json(cluster, "csv", CSV_NAME, "-n", ns)
    for requirement in csv["status"]["requirementStatus"]:
        assert requirement["status"] in ("Present", "Satisfied"), requirement
    assert exists(cluster, "crd", CRD_NAME)

    # The Subscription's env reaches every container. OLM finds the Subscription of a CSV by its
    # status.installedCSV, which the catalog operator may set after OLM first created the
    # Deployments: then OLM adds the env on a later pass (a second rollout), so wait for it.
    cluster_name = {"name": "KUBERNETES_CLUSTER_NAME", "value": "olm-test"}

    def manager_container() -> JSON:
        deployment = get_json(cluster, "deployment", DEPLOYMENT, "-n", ns)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return dict(container)

    wait_until(lambda: cluster_name in manager_container()["env"], 120, "the Subscription's env")

    # The operator Deployment OLM created, running with OLM-managed certificates.
    assert deployment_available(cluster, ns, DEPLOYMENT)
    deployment = get_json(cluster, "deployment", DEPLOYMENT, "-n", ns)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--cert-mode=files" in container["args"]
    assert "--no-serve-webhooks" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--cert-secret")]
    assert deployment["metadata"]["labels"]["lumigo.auto-trace"] == "false"
    # Admissions: the webhook Deployment, its own ServiceAccount, OLM's certificate mounted
    # there (the webhookdefinitions name it).
    assert deployment_available(cluster, ns, WEBHOOK)
    webhook = get_json(cluster, "deployment", WEBHOOK, "-n", ns)
    assert webhook["spec"]["template"]["spec"]["serviceAccountName"] == WEBHOOK
    (webhook_container,) = webhook["spec"]["template"]["spec"]["containers"]
    assert webhook_container["command"] == ["lumigo-operator", "webhook"]
    assert "--cert-mode=files" in webhook_container["args"]
    mounts = {m["mountPath"] for m in webhook_container["volumeMounts"]}
    assert "/tmp/k8s-webhook-server/serving-certs" in mounts
    assert webhook["metadata"]["labels"]["lumigo.auto-trace"] == "false"
    assert "olmcahash" in webhook["spec"]["template"]["metadata"]["annotations"]
    assert not can_i(cluster, ns, WEBHOOK, "get", "secrets", "-n", ns)
    assert not can_i(cluster, ns, WEBHOOK, "update", "deployments.apps", "-n", "some-app")
    assert "--deployment-method=OLM" in container["args"]
    assert cluster_name in container["env"]
    assert f"--telemetry-proxy-deployment={PROXY}" in container["args"]

    # The telemetry proxy: its Deployment, the Service from the bundle, the ServiceAccount OLM
    # made, and RBAC that lets the operator configure it and the collector read what it needs.
    assert deployment_available(cluster, ns, PROXY)
    proxy = get_json(cluster, "deployment", PROXY, "-n", ns)
    assert proxy["spec"]["template"]["spec"]["serviceAccountName"] == PROXY
    assert proxy["metadata"]["labels"]["lumigo.auto-trace"] == "false"
    service = get_json(cluster, "service", f"{PROXY}-service", "-n", ns)
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(80, "otlp-http")]
    assert exists(cluster, "serviceaccount", PROXY, "-n", ns)
    assert denied(cluster, ns, OPERATOR_SA, telemetry_reconciler_requests(ns, FULLNAME)) == []
    assert denied(cluster, ns, PROXY, telemetry_proxy_requests(ns, FULLNAME)) == []
    assert not can_i(cluster, ns, PROXY, "get", "secrets", "-n", ns)
    assert not can_i(cluster, ns, OPERATOR_SA, "list", "secrets", "-n", ns)
    # Under AllNamespaces OLM turns CSV `permissions` into ClusterRoles. The operator may read
    # every Secret by name (token validation), so creating Secrets must stay limited to its own
    # namespace (a bundle Role), or it could mint a token for any ServiceAccount; and the proxy's
    # Lease rights stay limited to its own Lease, or it could take over the control plane's.
    assert exists(cluster, "role", f"{PROXY}-config", "-n", ns)
    assert not can_i(cluster, ns, OPERATOR_SA, "create", "secrets", "-n", "kube-system")
    assert not can_i(cluster, ns, OPERATOR_SA, "create", "secrets", "-n", "some-app")
    for lease in ("kube-controller-manager", "kube-scheduler"):
        resource = f"leases.coordination.k8s.io/{lease}"
        assert not can_i(cluster, ns, PROXY, "update", resource, "-n", "kube-system"), lease

    # OLM's webhook plumbing: serving Secret + Service for the deployment, both webhooks with a
    # caBundle, the paths and policies of the bundle's webhookdefinitions.
    assert exists(cluster, "secret", f"{WEBHOOK}-service-cert", "-n", ns)
    for other in (DEPLOYMENT, PROXY):
        assert not exists(cluster, "secret", f"{other}-service-cert", "-n", ns), "no webhook"
    service = get_json(cluster, "service", f"{WEBHOOK}-service", "-n", ns)
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(443, 9443)]
    configs = get_json(cluster, "mutatingwebhookconfigurations", "-l", f"olm.owner.namespace={ns}")[
        "items"
    ]
    webhooks = {w["name"].split("-")[0]: w for c in configs for w in c["webhooks"]}
    assert set(webhooks) == {"lumigoinjector.kb.io", "lumigodefaulter.kb.io"}
    inject, default = webhooks["lumigoinjector.kb.io"], webhooks["lumigodefaulter.kb.io"]
    assert inject["clientConfig"]["service"]["path"] == "/v1alpha1/inject"
    assert inject["failurePolicy"] == "Ignore"
    assert default["clientConfig"]["service"]["path"] == "/v1alpha1/mutate"
    assert default["failurePolicy"] == "Fail"
    for webhook in webhooks.values():
        assert webhook["clientConfig"]["caBundle"]
        assert webhook["clientConfig"]["service"]["name"] == f"{WEBHOOK}-service"
        assert webhook["timeoutSeconds"] == 5
