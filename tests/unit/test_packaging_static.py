"""Static checks of the install artifacts (config/, the chart's files, bundle/, Dockerfile, locks).

Pure file reading: the tools that validate them (helm, opm, operator-sdk, scorecard) and the real
installs are in tests/e2e/test_packaging_*.py.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from api import constants
from api.crd import crd_manifest
from api.lumigo import load_spec
from controller.options import RunOptions
from controller.telemetry.agent import AgentTarget

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config"
BUNDLE = ROOT / "bundle"
CHART = ROOT / "charts" / "lumigo-operator"
CSV_FILE = BUNDLE / "manifests" / "lumigo-operator.clusterserviceversion.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OPERATOR_IMAGE = f"quay.io/lumigo/lumigo-operator:v{VERSION}"
INJECTOR_IMAGE = f"quay.io/lumigo/lumigo-autotrace:v{VERSION}"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in load(path) if d["kind"] == kind]
    return doc


def hack_module(name: str) -> ModuleType:
    """Import a hack/ script (no .py suffix) to call its functions."""
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(ROOT / "hack" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def config_rbac() -> list[dict[str, Any]]:
    """Every RBAC object of config/default: the manager's, the webhook's and the telemetry
    proxy's."""
    docs: list[dict[str, Any]] = []
    paths = [
        *sorted((CONFIG / "rbac").glob("*.yaml")),
        *WEBHOOK_RBAC,
        CONFIG / "telemetry-proxy" / "rbac.yaml",
    ]
    for path in paths:
        if path.name != "kustomization.yaml":
            docs += load(path)
    return docs


def manager_deployment() -> dict[str, Any]:
    return one(CONFIG / "manager" / "manager.yaml", "Deployment")


def webhook_deployment() -> dict[str, Any]:
    return one(CONFIG / "webhook" / "deployment.yaml", "Deployment")


def flags_of(deployment: dict[str, Any]) -> dict[str, str]:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return dict(a.split("=", 1) for a in args if "=" in a)


def proxy_deployment() -> dict[str, Any]:
    return one(CONFIG / "telemetry-proxy" / "deployment.yaml", "Deployment")


def csv() -> dict[str, Any]:
    return one(CSV_FILE, "ClusterServiceVersion")


def csv_deployment(name: str) -> dict[str, Any]:
    (deployment,) = [
        d for d in csv()["spec"]["install"]["spec"]["deployments"] if d["name"] == name
    ]
    return deployment


def csv_permissions(kind: str, sa: str) -> list[dict[str, Any]]:
    """The rules of `clusterPermissions` or `permissions` for one ServiceAccount."""
    (entry,) = [p for p in csv()["spec"]["install"]["spec"][kind] if p["serviceAccountName"] == sa]
    rules: list[dict[str, Any]] = entry["rules"]
    return rules


MANAGER = "lumigo-lumigo-operator-controller-manager"
WEBHOOK = "lumigo-lumigo-operator-webhook"  # the webhook Deployment and its ServiceAccount
WEBHOOK_RBAC = (CONFIG / "webhook" / "rbac.yaml", CONFIG / "webhook" / "self_cert_rbac.yaml")
PROXY = "lumigo-lumigo-operator-telemetry-proxy"
WATCHDOG = "lumigo-lumigo-operator-watchdog"
OPERATOR_SA = "lumigo-kubernetes-operator"
# This repository's collector build (hack/tools/otelcol, with lumigo_k8s_enricher), as released.
PROXY_IMAGE = f"quay.io/lumigo/lumigo-operator-telemetry-proxy:v{VERSION}"


# --- one source of truth ------------------------------------------------------------------


@pytest.mark.parametrize(
    "copy",
    [
        CHART / "files" / "operator.lumigo.io_lumigoes.yaml",
        BUNDLE / "manifests" / "operator.lumigo.io_lumigoes.yaml",
    ],
    ids=["chart", "bundle"],
)
def test_crd_copies_are_generated_from_the_schemas(copy: Path) -> None:
    assert yaml.safe_load(copy.read_text()) == crd_manifest(), "run `make manifests`"
    original = CONFIG / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"
    assert copy.read_text() == original.read_text()


def test_committed_bundle_is_what_make_bundle_generates() -> None:
    gen = hack_module("gen-bundle")
    rendered: dict[Path, str] = gen.render()
    for path, text in rendered.items():
        assert path.exists(), f"{path.relative_to(ROOT)} missing: run `make bundle`"
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `make bundle`"
    on_disk = {p for p in BUNDLE.rglob("*") if p.is_file()}
    assert on_disk == gen.owned_files() - {ROOT / "bundle.Dockerfile"}, "stale files in bundle/"


@pytest.mark.parametrize("hash_seed", ["0", "1", "4242"])
def test_bundle_generation_is_deterministic(hash_seed: str) -> None:
    """Fresh processes with other string hashes (set and dict orders) render the same bundle as
    the one committed; one process rendering twice would repeat its own order."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-bundle"), "--check"],
        env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_kustomizations_list_every_manifest() -> None:
    for part in ("crd", "rbac", "manager", "webhook", "telemetry-proxy", "default"):
        directory = CONFIG / part
        (kustomization,) = load(directory / "kustomization.yaml")
        listed = kustomization["resources"] + kustomization.get("configurations", [])
        for entry in listed:
            assert (directory / entry).exists(), f"{part}: {entry} does not exist"
        local = {p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml"}
        assert local <= set(listed), f"{part}: not listed: {local - set(listed)}"


def test_config_default_installs_the_telemetry_proxy() -> None:
    (kustomization,) = load(CONFIG / "default" / "kustomization.yaml")
    assert "../telemetry-proxy" in kustomization["resources"]


def test_versions_and_images_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    assert csv()["spec"]["version"] == VERSION
    assert csv()["metadata"]["name"] == f"lumigo-operator.v{VERSION}"
    container = manager_deployment()["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == OPERATOR_IMAGE
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LUMIGO_INJECTOR_IMAGE"] == INJECTOR_IMAGE
    assert env["LUMIGO_OPERATOR_VERSION"] == VERSION
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    manager_image = values["controllerManager"]["manager"]["image"]
    injector_image = values["injectorWebhook"]["lumigoInjector"]["image"]
    assert f"{manager_image['repository']}:v{VERSION}" == OPERATOR_IMAGE
    assert f"{injector_image['repository']}:v{VERSION}" == INJECTOR_IMAGE
    # The binary's own default (make run, a bare `lumigo-operator run`) is the same pinned image.
    assert constants.DEFAULT_INJECTOR_IMAGE == INJECTOR_IMAGE
    assert injector_image["pullPolicy"] == constants.DEFAULT_INJECTOR_PULL_POLICY
    assert csv()["spec"]["minKubeVersion"] == chart["kubeVersion"].strip(">=").removesuffix("-0")
    # The webhooks' matchConditions exist from Kubernetes 1.28 (beta, on by default; GA in 1.30):
    # an older API server would drop them and call the webhooks for what they spare.
    assert "matchConditions" in (CONFIG / "webhook" / "manifests.yaml").read_text()
    minimum = csv()["spec"]["minKubeVersion"].split(".")
    assert (int(minimum[0]), int(minimum[1])) >= (1, 28)
    proxy_image = values["telemetryProxy"]["image"]
    assert proxy_image["tag"] == "", "an empty tag is v<appVersion>, as the operator's"
    assert f"{proxy_image['repository']}:v{VERSION}" == PROXY_IMAGE
    # That image has lumigo_k8s_enricher: the chart, the kustomize manager and the CSV's turn it
    # on (the binary's own default stays off: a bare `lumigo-operator run` knows no proxy image).
    assert values["telemetryProxy"]["enricher"] is True
    assert "--telemetry-proxy-enricher" in container["args"]
    (csv_manager,) = [
        c
        for d in csv()["spec"]["install"]["spec"]["deployments"]
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "manager"
    ]
    assert "--telemetry-proxy-enricher" in csv_manager["args"]
    assert RunOptions().telemetry_proxy_enricher is False
    assert proxy_deployment()["spec"]["template"]["spec"]["containers"][0]["image"] == PROXY_IMAGE


# --- least privilege ----------------------------------------------------------------------


def test_rbac_has_no_wildcards_and_no_escalation() -> None:
    for doc in config_rbac():
        for rule in doc.get("rules", []):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), (doc["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "customresourcedefinitions" not in rule.get("resources", [])


def test_secrets_are_never_listed_or_watched_cluster_wide() -> None:
    for doc in config_rbac():
        for rule in doc.get("rules", []):
            if "secrets" not in rule.get("resources", []):  # nonResourceURLs rules have none
                continue
            if doc["kind"] == "ClusterRole":
                assert rule["verbs"] == ["get"], "token Secrets: GET by name only"
            elif {"list", "watch"} & set(rule["verbs"]):
                assert rule.get("resourceNames"), "list/watch only of the named cert Secret"


def test_self_managed_certificate_rbac_is_limited_to_the_owned_objects() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in config_rbac()}
    webhooks = docs[("ClusterRole", "lumigo-lumigo-operator-webhook-configurations-role")]
    (rule,) = webhooks["rules"]
    assert rule["resources"] == ["mutatingwebhookconfigurations"]
    assert sorted(rule["resourceNames"]) == sorted(
        d["metadata"]["name"] for d in load(CONFIG / "webhook" / "manifests.yaml")
    )
    cert = docs[("Role", "lumigo-lumigo-operator-webhook-cert-role")]
    named = [r for r in cert["rules"] if r.get("resourceNames")]
    unnamed = [r for r in cert["rules"] if not r.get("resourceNames")]
    assert [r["verbs"] for r in unnamed] == [["create"]]
    flags = flags_of(manager_deployment())
    assert named[0]["resourceNames"] == [flags["--cert-secret"], flags["--serving-cert-secret"]]


def test_admission_is_served_by_its_own_deployment_and_identity() -> None:
    """Issue 28 item 7: the webhook Service selects the webhook Deployment's pods, never the
    manager's; the manager does not serve admissions; both name the same certificate objects;
    the webhook's ServiceAccount reads only the serving Secret (not the CA Secret) and writes
    nothing but Events."""
    manager, webhook = manager_deployment(), webhook_deployment()
    service = one(CONFIG / "webhook" / "service.yaml", "Service")
    selector = service["spec"]["selector"]
    webhook_labels = webhook["spec"]["template"]["metadata"]["labels"]
    manager_labels = manager["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= webhook_labels.items()
    assert not selector.items() <= manager_labels.items()
    assert not manager["spec"]["selector"]["matchLabels"].items() <= webhook_labels.items()
    container = webhook["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["lumigo-operator", "webhook"]
    manager_args = manager["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-serve-webhooks" in manager_args
    manager_flags, webhook_flags = flags_of(manager), flags_of(webhook)
    for flag in ("--cert-secret", "--serving-cert-secret", "--webhook-service",
                 "--webhook-configurations", "--injection-mode-configmap"):  # fmt: skip
        assert manager_flags[flag] == webhook_flags[flag], flag
    assert webhook_flags["--serving-cert-secret"] != webhook_flags["--cert-secret"]
    sa = webhook["spec"]["template"]["spec"]["serviceAccountName"]
    assert sa == WEBHOOK != manager["spec"]["template"]["spec"]["serviceAccountName"]
    docs = [d for path in WEBHOOK_RBAC for d in load(path)]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    bound = [
        roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        for b in docs
        if b["kind"].endswith("Binding") and b["subjects"] == [
            {"kind": "ServiceAccount", "name": sa, "namespace": "lumigo-system"}
        ]
    ]  # fmt: skip
    assert len(bound) == len(roles) == 4
    rules = [r for role in bound for r in role["rules"]]
    for rule in rules:
        writes = set(rule["verbs"]) - {"get", "list", "watch"}
        assert not writes or rule["resources"] in (
            ["events"], ["tokenreviews"], ["subjectaccessreviews"]
        ), rule  # fmt: skip
        if "secrets" in rule["resources"]:
            assert rule["resourceNames"] == [webhook_flags["--serving-cert-secret"]]
        if {"list", "watch"} & set(rule["verbs"]) and rule["resources"] != ["lumigoes"]:
            assert rule.get("resourceNames"), rule


def test_the_bundle_grants_no_certificate_rbac() -> None:
    spec = csv()["spec"]["install"]["spec"]
    # Rules on resources (not the watchdog's /metrics).
    granted = spec["clusterPermissions"] + spec["permissions"]
    rules = [r for p in granted for r in p["rules"] if "resources" in r]
    assert not [r for r in rules if "mutatingwebhookconfigurations" in r["resources"]]
    # Token Secrets: GET by name. OLM (AllNamespaces) makes `permissions` cluster-wide, so no
    # Secret may be created through them: with GET on every Secret, creating one anywhere would
    # mint a token for any ServiceAccount.
    assert [r["verbs"] for r in rules if "secrets" in r["resources"]] == [["get"]]


def test_the_bundle_keeps_secret_creation_in_the_install_namespace() -> None:
    paths = (BUNDLE / "manifests").glob("*.yaml")
    manifests = {(d["kind"], d["metadata"]["name"]): d for p in paths for d in load(p)}
    config = {(d["kind"], d["metadata"]["name"]): d for d in config_rbac()}
    role = manifests[("Role", f"{PROXY}-config")]
    # config/'s rules, plus restarting the proxy's pods there (OLM undoes template rollouts).
    olm_restart = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]}
    assert role["rules"] == [*config[("Role", f"{PROXY}-config")]["rules"], olm_restart]
    assert "namespace" not in role["metadata"], "OLM puts it in the install namespace"
    binding = manifests[("RoleBinding", f"{PROXY}-config")]
    assert binding["roleRef"]["name"] == f"{PROXY}-config"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR_SA}]


# --- the manager workload -----------------------------------------------------------------


def test_manager_pod_meets_the_restricted_pod_security_standard() -> None:
    deployment = manager_deployment()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not pod.get("hostNetwork")
    assert not pod.get("hostPID")
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "add" not in sc["capabilities"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        assert set(container["resources"]) == {"requests", "limits"}
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert all("emptyDir" in v for v in pod["volumes"])


def test_operator_workloads_are_never_instrumented() -> None:
    label = constants.LABEL_AUTO_TRACE
    for deployment in (manager_deployment(), proxy_deployment()):
        assert deployment["metadata"]["labels"][label] == constants.AUTO_TRACE_FALSE
        assert deployment["spec"]["template"]["metadata"]["labels"][label] == "false"


def test_proxy_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = proxy_deployment()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert (sc["allowPrivilegeEscalation"], sc["readOnlyRootFilesystem"], sc["runAsNonRoot"]) == (
        False, True, True,
    )  # fmt: skip
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_manager_is_wired_to_the_telemetry_proxy() -> None:
    """The names the manager is given are the objects config/telemetry-proxy installs, and the
    operator's Role there lets it write exactly those."""
    args = manager_deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(a.split("=", 1) for a in args if "=" in a)
    proxy = proxy_deployment()
    (volume,) = proxy["spec"]["template"]["spec"]["volumes"]
    assert flags["--telemetry-proxy-deployment"] == proxy["metadata"]["name"]
    assert flags["--telemetry-proxy-config-secret"] == volume["secret"]["secretName"]
    assert flags["--deployment-method"] == "Kustomize"
    assert flags["--telemetry-upstream-endpoint"].startswith("https://")
    assert flags["--telemetry-upstream-logs-endpoint"].startswith("https://")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in config_rbac()}
    role = docs[("Role", f"{PROXY}-config")]
    named = {n for r in role["rules"] for n in r.get("resourceNames", [])}
    agent = flags["--cluster-agent-daemonset"]
    assert named == {
        proxy["metadata"]["name"],
        volume["secret"]["secretName"],
        agent,
        AgentTarget("lumigo-system", agent, proxy["metadata"]["name"], "-").secret_name,
    }
    binding = docs[("RoleBinding", f"{PROXY}-config")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": "lumigo-system"}
    ]
    assert proxy["spec"]["template"]["spec"]["serviceAccountName"] == PROXY


def test_manager_flags_follow_the_contract() -> None:
    container = manager_deployment()["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert "--cert-mode=self" in args
    assert "--leader-elect" in args
    flags = dict(a.split("=", 1) for a in args if "=" in a)
    assert (
        flags["--webhook-service"]
        == one(CONFIG / "webhook" / "service.yaml", "Service")["metadata"]["name"]
    )
    assert flags["--webhook-configurations"].split(",") == [
        d["metadata"]["name"] for d in load(CONFIG / "webhook" / "manifests.yaml")
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # $(POD_NAMESPACE) is only expanded when defined earlier in the list.
    names = [e["name"] for e in container["env"]]
    assert "$(POD_NAMESPACE)" in env["TELEMETRY_PROXY_OTLP_SERVICE"]["value"]
    assert names.index("POD_NAMESPACE") < names.index("TELEMETRY_PROXY_OTLP_SERVICE")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    webhook = webhook_deployment()["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in webhook["ports"]}
    assert ports == {"webhook-server": 9443, "metrics": 8080, "health": 8081}
    service = one(CONFIG / "webhook" / "service.yaml", "Service")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (443, "webhook-server")
    ]


def test_webhooks_follow_the_contract() -> None:
    injector, defaulter = load(CONFIG / "webhook" / "manifests.yaml")
    inject, opted_in = injector["webhooks"]
    (default,) = defaulter["webhooks"]
    # The second injector entry: labelled workloads where the first one is not registered, and
    # nothing else (disjoint namespaces, so nothing is sent twice).
    assert opted_in["name"] == "lumigoinjector-opted-in.kb.io"
    # The label with any value: injection rewrites `true` to the version, and the API server
    # matches an objectSelector against the old and the new object, so an opt-out (`false`) must
    # still select it (the handler decides what each value means).
    assert opted_in["objectSelector"] == {
        "matchExpressions": [{"key": constants.LABEL_AUTO_TRACE, "operator": "Exists"}]
    }
    assert opted_in["namespaceSelector"]["matchExpressions"][-1] == {
        "key": constants.LABEL_MONITORED,
        "operator": "NotIn",
        "values": ["true"],
    }
    assert {k: v for k, v in opted_in.items() if k not in ("name", "namespaceSelector",
            "objectSelector", "matchConditions")} == {k: v for k, v in inject.items() if k not in (
            "name", "namespaceSelector", "matchConditions")}  # fmt: skip
    assert inject["name"] == constants.INJECTOR_WEBHOOK_NAME
    assert inject["clientConfig"]["service"]["path"] == constants.INJECT_PATH
    assert (inject["failurePolicy"], inject["timeoutSeconds"], inject["sideEffects"]) == (
        "Ignore",
        5,
        "None",
    )
    kinds = {
        (g, r) for rule in inject["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert kinds == {(r.group, r.plural) for r in constants.WORKLOAD_KINDS}
    assert all(rule["operations"] == ["CREATE", "UPDATE"] for rule in inject["rules"])
    # Only namespaces with an active Lumigo (the label the operator maintains), never its own.
    assert inject["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["lumigo-system", "kube-system"],
        },
        {"key": constants.LABEL_MONITORED, "operator": "In", "values": ["true"]},
    ]
    assert default["name"] == constants.DEFAULTER_WEBHOOK_NAME
    assert default["clientConfig"]["service"]["path"] == constants.MUTATE_PATH
    assert (default["failurePolicy"], default["timeoutSeconds"]) == ("Fail", 5)
    assert default["rules"][0]["resources"] == [constants.PLURAL]
    for webhook in (inject, default):
        assert "caBundle" not in webhook["clientConfig"]
        assert webhook["admissionReviewVersions"] == ["v1"]


# --- the OLM bundle -----------------------------------------------------------------------


def test_csv_runs_the_manager_with_olm_managed_certificates() -> None:
    deployment = csv_deployment(MANAGER)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--deployment-method=OLM" in container["args"]
    assert "--cert-mode=files" in container["args"]
    assert not [a for a in container["args"] if a.startswith(("--cert-secret", "--webhook-"))
                and not a.startswith(("--webhook-port", "--webhook-workers"))]  # fmt: skip
    want = manager_deployment()["spec"]["template"]["spec"]
    got = deployment["spec"]["template"]["spec"]
    assert got["securityContext"] == want["securityContext"]
    assert container["securityContext"] == want["containers"][0]["securityContext"]


def test_csv_webhookdefinitions_match_config() -> None:
    definitions = {d["generateName"]: d for d in csv()["spec"]["webhookdefinitions"]}
    # Under OLM (no namespaceSelector) the first injector entry covers the opted-in one's.
    assert "lumigoinjector-opted-in.kb.io" not in definitions
    for config in load(CONFIG / "webhook" / "manifests.yaml"):
        webhook = config["webhooks"][0]
        got = definitions[webhook["name"]]
        assert got["type"] == "MutatingAdmissionWebhook"
        assert got["webhookPath"] == webhook["clientConfig"]["service"]["path"]
        assert got["rules"] == webhook["rules"]
        assert (got["failurePolicy"], got["timeoutSeconds"], got["sideEffects"]) == (
            webhook["failurePolicy"],
            webhook["timeoutSeconds"],
            webhook["sideEffects"],
        )
        assert (got["containerPort"], got["targetPort"]) == (443, 9443)
        # OLM mounts the certificate into the Deployment that serves: the webhook's.
        assert got["deploymentName"] == webhook_deployment()["metadata"]["name"]


def test_csv_has_every_recommended_field() -> None:
    doc = csv()
    annotations = doc["metadata"]["annotations"]
    for key in ("alm-examples", "capabilities", "categories", "containerImage", "createdAt",
                "description", "repository", "support",
                "operators.operatorframework.io/suggested-namespace"):  # fmt: skip
        assert annotations.get(key), key
    spec = doc["spec"]
    for key in ("displayName", "description", "icon", "keywords", "maintainers", "provider",
                "links", "maturity", "minKubeVersion", "installModes"):  # fmt: skip
        assert spec.get(key), key
    assert {m["type"] for m in spec["installModes"]} == {
        "OwnNamespace",
        "SingleNamespace",
        "MultiNamespace",
        "AllNamespaces",
    }
    assert {i["image"] for i in spec["relatedImages"]} == {
        OPERATOR_IMAGE, INJECTOR_IMAGE, PROXY_IMAGE, "quay.io/prometheus/node-exporter:v1.8.2"
    }  # fmt: skip
    (icon,) = spec["icon"]
    assert icon["mediatype"] == "image/svg+xml"


def test_related_images_are_every_image_the_csv_runs_or_hands_the_operator() -> None:
    """Disconnected mirroring copies `relatedImages`: each container image of the CSV's
    Deployments and each image the operator deploys or injects (the manager's `*_IMAGE` env)."""
    spec = csv()["spec"]
    used = set()
    for deployment in spec["install"]["spec"]["deployments"]:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            used.add(container["image"])
            used |= {e["value"] for e in container.get("env", []) if e["name"].endswith("_IMAGE")}
    assert {i["image"] for i in spec["relatedImages"]} == used


def test_csv_descriptors_cover_every_top_level_field() -> None:
    (owned,) = csv()["spec"]["customresourcedefinitions"]["owned"]
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    spec_paths = {d["path"] for d in owned["specDescriptors"]}
    status_paths = {d["path"] for d in owned["statusDescriptors"]}
    assert set(schema["spec"]["properties"]) <= spec_paths
    assert set(schema["status"]["properties"]) <= status_paths
    assert owned["resources"], "scorecard olm-crds-have-resources"
    assert (owned["name"], owned["kind"], owned["version"]) == (
        constants.CRD_NAME,
        constants.KIND,
        constants.VERSION,
    )


def test_alm_example_is_the_seed_readme_quick_start() -> None:
    examples = json.loads(csv()["metadata"]["annotations"]["alm-examples"])
    sample = one(CONFIG / "samples" / "operator_v1alpha1_lumigo.yaml", "Lumigo")
    assert examples == [sample]


def test_bundle_ships_no_object_olm_creates_itself() -> None:
    kinds = {d["kind"] for p in (BUNDLE / "manifests").glob("*.yaml") for d in load(p)}
    assert kinds == {"ClusterServiceVersion", "CustomResourceDefinition", "Service", "Role",
                     "RoleBinding", "ClusterRole"}  # fmt: skip
    # The one ClusterRole: metrics-reader, for users to bind their scraper to (nobody is).
    roles = [d for p in (BUNDLE / "manifests").glob("*.yaml") for d in load(p)
             if d["kind"] == "ClusterRole"]  # fmt: skip
    assert roles == [one(CONFIG / "rbac" / "metrics_reader_role.yaml", "ClusterRole")]


def test_the_csv_lets_the_watchdog_scrape_the_operators_secure_metrics() -> None:
    """config/watchdog's binding to metrics-reader becomes the watchdog's clusterPermissions."""
    reader = one(CONFIG / "rbac" / "metrics_reader_role.yaml", "ClusterRole")
    assert reader["rules"][0] in csv_permissions("clusterPermissions", WATCHDOG)


def test_csv_installs_the_telemetry_proxy() -> None:
    """The proxy Deployment as in config/, its ClusterRole under its own ServiceAccount, its
    Lease rules, and its Service in manifests/ (OLM creates the ServiceAccount)."""
    want = proxy_deployment()
    got = csv_deployment(PROXY)
    assert got["spec"] == want["spec"]
    assert got["label"] == want["metadata"]["labels"]
    docs = {(d["kind"], d["metadata"]["name"]): d for d in config_rbac()}
    assert csv_permissions("clusterPermissions", PROXY) == docs[("ClusterRole", PROXY)]["rules"]
    lease_role = docs[("Role", f"{PROXY}-leader-election")]
    assert csv_permissions("permissions", PROXY) == lease_role["rules"]
    manager_rules = docs[("ClusterRole", "lumigo-lumigo-operator-manager-role")]["rules"]
    assert csv_permissions("clusterPermissions", OPERATOR_SA) == manager_rules
    service = one(BUNDLE / "manifests" / f"{PROXY}-service_v1_service.yaml", "Service")
    want_service = one(CONFIG / "telemetry-proxy" / "service.yaml", "Service")
    assert service["spec"] == want_service["spec"]
    assert "namespace" not in service["metadata"]


# --- samples (one per seed README snippet) ------------------------------------------------


def test_every_lumigo_sample_is_a_valid_spec() -> None:
    samples = sorted((CONFIG / "samples").glob("operator_v1alpha1_lumigo*.yaml"))
    assert len(samples) == 4
    for path in samples:
        lumigo = one(path, "Lumigo")
        assert lumigo["metadata"]["name"] == "lumigo"
        assert lumigo["metadata"]["labels"]["app.kubernetes.io/part-of"] == "lumigo-operator"
        load_spec(lumigo["spec"])  # raises on any invalid field


def test_opt_out_sample_is_labelled_false() -> None:
    deployment = one(CONFIG / "samples" / "apps_v1_deployment_opt_out.yaml", "Deployment")
    assert deployment["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == "false"


# --- the operator image -------------------------------------------------------------------


def _pins(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, hashes) of a pip-compile style lock."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    current = ""
    for line in path.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", line):
            current = match.group(1).lower()
            out[current] = (match.group(2), frozenset())
        elif match := re.search(r"--hash=(sha256:[0-9a-f]+)", line):
            version, hashes = out[current]
            out[current] = (version, hashes | {match.group(1)})
    return out


def test_runtime_lock_is_a_subset_of_the_dev_lock() -> None:
    runtime, full = _pins(ROOT / "requirements-runtime.lock"), _pins(ROOT / "requirements.lock")
    for name, (version, hashes) in runtime.items():
        assert name in full, name
        assert full[name][0] == version, name
        assert hashes, name
        assert hashes == full[name][1], name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name, version = requirement.split("==")
        assert runtime[name.lower()][0] == version


def test_dockerfile_is_slim_non_root_and_hash_verified() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim\b", text, re.M)
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit(), "numeric, so the kubelet can check runAsNonRoot"
    assert int(uid) != 0
    assert "--require-hashes" in text
    assert "requirements-runtime.lock" in text
    assert re.search(r'^ENTRYPOINT \["lumigo-operator", "run"\]', text, re.M)


# --- the manifests and the manager CLI agree ----------------------------------------------


def _cli_accepts(argv: list[str]) -> None:
    """Parse like `lumigo-operator` would (argparse exits with status 2 on an unknown flag)."""
    from controller.cli import _parser

    _parser().parse_args(argv)


def test_every_manager_flag_of_the_manifests_is_a_cli_flag() -> None:
    config_args = manager_deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    bundle_args = csv_deployment(MANAGER)["spec"]["template"]["spec"]["containers"][0]["args"]
    for args in (config_args, bundle_args):
        _cli_accepts(["run", *args])
    for deployment in (webhook_deployment(), csv_deployment(WEBHOOK)):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        _cli_accepts([*container["command"][1:], *container["args"]])


def test_the_dockerfile_entrypoint_and_the_hook_command_are_cli_commands() -> None:
    entrypoint = json.loads(
        re.findall(r"^ENTRYPOINT (\[.*\])", (ROOT / "Dockerfile").read_text(), re.M)[0]
    )
    assert entrypoint[0] == "lumigo-operator"
    _cli_accepts(entrypoint[1:])
    template = (CHART / "templates" / "uninstall-hook.yaml").read_text()
    assert "- lumigo-operator\n        - uninstall\n        - --timeout=" in template
    _cli_accepts(["uninstall", "--timeout=120s"])


def test_olm_users_set_endpoints_and_cluster_name_with_the_subscription_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OLM adds a Subscription's spec.config.env to every container: the CSV's manager flags
    must leave the upstream endpoints and the cluster name to those env vars."""
    from controller.cli import _parser
    from controller.options import run_options

    args = csv_deployment(MANAGER)["spec"]["template"]["spec"]["containers"][0]["args"]
    monkeypatch.setenv("LUMIGO_ENDPOINT", "https://otlp.example.com")
    monkeypatch.setenv("LUMIGO_LOGS_ENDPOINT", "https://logs.example.com")
    monkeypatch.setenv("KUBERNETES_CLUSTER_NAME", "prod-eu-1")
    opts = run_options(_parser().parse_args(["run", *args]))
    assert (opts.telemetry_upstream_endpoint, opts.telemetry_upstream_logs_endpoint) == (
        "https://otlp.example.com", "https://logs.example.com",
    )  # fmt: skip
    assert (opts.cluster_name, opts.deployment_method) == ("prod-eu-1", "OLM")
    assert (opts.telemetry_proxy_deployment, opts.telemetry_proxy_config_secret) == (
        PROXY, f"{PROXY}-config",
    )  # fmt: skip


def test_kubectl_install_sends_to_lumigo_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.cli import _parser
    from controller.options import run_options
    from controller.telemetry.config import DEFAULT_UPSTREAM

    for name in ("LUMIGO_ENDPOINT", "LUMIGO_LOGS_ENDPOINT", "KUBERNETES_CLUSTER_NAME"):
        monkeypatch.delenv(name, raising=False)
    args = manager_deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    opts = run_options(_parser().parse_args(["run", *args]))
    assert opts.telemetry_upstream_endpoint == opts.telemetry_upstream_logs_endpoint
    assert opts.telemetry_upstream_endpoint == DEFAULT_UPSTREAM
    assert (opts.cluster_name, opts.deployment_method) == ("", "Kustomize")


def test_a_stopped_operator_cannot_block_finalizer_removal() -> None:
    """The defaulter (failurePolicy Fail) must not be called for Lumigo resources being deleted,
    or `lumigo-operator uninstall` and namespace deletion hang when the operator is down."""
    condition = {
        "name": "not-being-deleted",
        "expression": "!has(object.metadata.deletionTimestamp)",
    }
    hooks = [h for c in load(ROOT / "config" / "webhook" / "manifests.yaml") for h in c["webhooks"]]
    defaulter = next(h for h in hooks if h["name"] == "lumigodefaulter.kb.io")
    assert defaulter["failurePolicy"] == "Fail"
    assert defaulter["matchConditions"] == [condition]
    chart = (ROOT / "charts" / "lumigo-operator" / "templates" / "webhooks.yaml").read_text()
    assert '"!has(object.metadata.deletionTimestamp)"' in chart


def test_the_injector_is_not_called_for_the_operators_writes_or_deployments_replicasets() -> None:
    """config/webhook and the chart (compared with it by test_packaging_helm) name the operator's
    ServiceAccount; the local test operator's registration has the same conditions for its own
    user, so the e2e tier exercises what is installed."""
    from envtest.cluster import OPERATOR_USER
    from envtest.operator import (
        INJECTOR_MATCH_CONDITIONS,
        OPTED_IN_MATCH_CONDITIONS,
        OPTED_IN_OBJECT_SELECTOR,
    )

    sa = "system:serviceaccount:lumigo-system:lumigo-kubernetes-operator"
    rbac = load(CONFIG / "rbac" / "service_account.yaml")[0]["metadata"]
    assert f"system:serviceaccount:{rbac['namespace']}:{rbac['name']}" == sa
    hooks = [h for c in load(CONFIG / "webhook" / "manifests.yaml") for h in c["webhooks"]]
    injectors = [h for h in hooks if h["clientConfig"]["service"]["path"] == "/v1alpha1/inject"]
    assert len(injectors) == 2
    inject, opted_in = injectors
    for hook, conditions in ((inject, INJECTOR_MATCH_CONDITIONS),
                             (opted_in, OPTED_IN_MATCH_CONDITIONS)):  # fmt: skip
        local = json.loads(json.dumps(conditions).replace(OPERATOR_USER, sa))
        assert hook["matchConditions"] == local, hook["name"]
    assert opted_in["objectSelector"] == OPTED_IN_OBJECT_SELECTOR
    # OLM's webhook definitions cannot carry matchConditions: the CSV has none (the handler
    # still leaves those objects unchanged when it is called).
    (path,) = (BUNDLE / "manifests").glob("*.clusterserviceversion.yaml")
    csv = yaml.safe_load(path.read_text())
    assert all("matchConditions" not in d for d in csv["spec"]["webhookdefinitions"])
