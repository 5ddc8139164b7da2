"""The Helm chart: lint, render, dry-run on the real API server, install/upgrade/uninstall on the
full local cluster (kwok runs the pods, so the Deployments become Available without images).

kwok runs no containers: for the uninstall flow the manager runs as a local process (the
installed Deployment's args and env, the installed ServiceAccount's token), and the pre-delete
hook's logic, `lumigo-operator uninstall`, runs as a local process under the hook's own
ServiceAccount and RBAC, taken from the hooks Helm stored for the release.
"""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS
from tests.support.checks import clean, has_event, is_active
from tests.support.packaging import (
    CHART,
    CRD_NAME,
    OPERATOR_SA,
    ROOT,
    HelmRelease,
    denied,
    deployment_available,
    exists,
    find,
    get_json,
    helm,
    helm_release,
    installed_operator,
    is_injected,
    load_docs,
    load_file,
    render_chart,
    run,
    service_account_kubeconfig,
    telemetry_proxy_requests,
    telemetry_reconciler_requests,
)
from tests.support.workloads import workload
from webhook.injection_events import UNINSTALL_TRIGGER

TOKEN = "t_0123456789abcdef01234"  # well-formed, not a real token
SAMPLE = ROOT / "config" / "samples" / "operator_v1alpha1_lumigo.yaml"
TOKEN_IN_SAMPLE = "t_123456789012345678901"


def non_default_values(monitored_namespace: str) -> dict[str, Any]:
    """Every knob changed, the quick start on."""
    return {
        "fullnameOverride": "acme-tracing",
        "cluster": {"name": "prod-eu-1"},
        "debug": {"enabled": True},
        "crds": {"install": False},
        "controllerManager": {
            "replicas": 2,
            "manager": {
                "image": {
                    "repository": "registry.example.com/lumigo/operator",
                    "tag": "v9.9.9",
                    "pullPolicy": "Always",
                },
                "resources": {
                    "limits": {"cpu": "1", "memory": "1Gi"},
                    "requests": {"cpu": "200m", "memory": "256Mi"},
                },
            },
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "obs", "effect": "NoSchedule"}
            ],
            "nodeSelector": {"node-role.example.com/observability": "true"},
            "podAnnotations": {"example.com/team": "platform"},
            "podLabels": {"example.com/cost-center": "obs"},
            "priorityClassName": "lumigo-high",
        },
        "injectorWebhook": {
            "lumigoInjector": {
                "image": {"repository": "registry.example.com/lumigo/autotrace", "tag": "v9.9.9"}
            }
        },
        "safeRollouts": {
            "revert": False,
            "revertWindow": "30m",
            "revertRestarts": 5,
            "revertUnreadyAfter": "90s",
            "rolloutTimeout": "1h",
        },
        "endpoint": {
            "otlp": {
                "url": "https://otlp.example.com",
                "logs_url": "https://logs.example.com",
                "metrics_url": "https://metrics.example.com",
            }
        },
        "telemetryProxy": {
            "replicas": 2,
            "heartbeatInterval": "15m",
            "image": {
                "repository": "registry.example.com/otel/collector",
                "tag": "0.152.0-1",
                "pullPolicy": "Always",
            },
            "resources": {
                "limits": {"cpu": "2", "memory": "2Gi"},
                "requests": {"cpu": "1", "memory": "1Gi"},
            },
            "goMemLimit": "1600MiB",
            # A collector of the user's own, without lumigo_k8s_enricher: no such flag below.
            "enricher": False,
        },
        "global": {
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "clusterCollection": {
            "logs": {
                "enabled": True,
                "include": [{"namespacePattern": "team-*"}],
                "exclude": [{"podPattern": "debug-?", "containerPattern": "istio-proxy"}],
                "podLogsDir": "/data/pods",
            },
            "metrics": {
                "enabled": True,
                "essentialOnly": True,
                "essentialMetrics": {"names": ["k8s.pod.cpu.usage", "k8s.node.cpu.usage"]},
                "frequency": "30s",
                "kubeletPort": 10255,
            },
        },
        "kubeStateMetrics": {
            "replicas": 3,
            "image": {"repository": "registry.example.com/ksm", "tag": "v2.18.0-x"},
            "collectors": ["pods", "deployments"],
            "tolerations": [{"key": "infra", "operator": "Exists"}],
        },
        "watchdog": {
            "otelCollector": {"internalMetricsFrequency": "1m"},
            "watchers": {"top": {"frequency": "30s"}},
            "resources": {"limits": {"cpu": "200m", "memory": "96Mi"}},
        },
        "lumigoToken": {"secretName": "my-lumigo-token", "secretKey": "lumigo", "value": TOKEN},
        "monitoredNamespaces": [{"namespace": monitored_namespace, "loggingEnabled": True}],
        "uninstallHook": {"timeout": "300s"},
    }


def test_kube_state_metrics_brought_by_the_user_or_none() -> None:
    """`install: false` scrapes the user's own kube-state-metrics pods (by `selector`); without
    cluster metrics no kube-state-metrics is deployed at all."""
    values = {"kubeStateMetrics": {"install": False, "selector": "app=my-ksm"}}
    docs = load_docs(render_chart("lumigo", "observability", values))
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    args = manager_container(find(docs, "Deployment", "lumigo-lumigo-operator-controller-manager"))[
        "args"
    ]
    assert "--kube-state-metrics-selector=app=my-ksm" in args
    off = {"clusterCollection": {"metrics": {"enabled": False}}}
    docs = load_docs(render_chart("lumigo", "observability", off))
    assert not [d for d in docs if "kube-state-metrics" in d["metadata"]["name"]]


def manager_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "manager")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# --- lint and render (no cluster) ---------------------------------------------------------


def test_helm_lint_strict_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART)).stdout
    assert "0 chart(s) failed" in out
    assert "[WARNING]" not in out
    assert "[ERROR]" not in out


def test_helm_lint_strict_is_clean_with_non_default_values(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(non_default_values("my-app")))
    out = helm("lint", "--strict", str(CHART), "--values", str(values)).stdout
    assert "[WARNING]" not in out
    assert "[ERROR]" not in out


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("controllerManager.replicas=0", "replicas"),
        ("controllerManager.manager.image.pullPolicy=Sometimes", "pullPolicy"),
        ("monitoredNamespaces[0].namespace=Not_A_Namespace", "namespace"),
        ("unknownKnob=1", "unknownKnob"),
        ("telemetryProxy.goMemLimit=lots", "goMemLimit"),
        ("telemetryProxy.image.pullPolicy=Sometimes", "pullPolicy"),
        ("telemetryProxy.replica=2", "replica"),
        ("endpoint.otlp.url=otlp.example.com", "url"),
        ("endpoint.otlp.logsUrl=https://x.example.com", "logsUrl"),
    ],
)
def test_values_schema_rejects_bad_values(setting: str, words: str) -> None:
    proc = helm("template", "lumigo", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr
    assert words in proc.stderr


def _proxy_image_and_manager_args(*sets: str) -> tuple[str, list[str]]:
    docs = load_docs(helm("template", "lumigo", str(CHART), *sets).stdout)
    (collector,) = find(docs, "Deployment", "lumigo-lumigo-operator-telemetry-proxy")["spec"][
        "template"
    ]["spec"]["containers"]
    manager = find(docs, "Deployment", "lumigo-lumigo-operator-controller-manager")
    (container,) = [c for c in manager["spec"]["template"]["spec"]["containers"]]
    return collector["image"], container["args"]


def test_default_proxy_is_our_collector_with_the_enricher_on() -> None:
    """The default proxy image is this repository's collector build (hack/tools/otelcol), tagged
    v<appVersion> as the operator's image, and the operator renders lumigo_k8s_enricher for it:
    production runs the collector the tests run (issue 31 item 1, issue 29)."""
    app_version = load_file(CHART / "Chart.yaml")[0]["appVersion"]
    image, args = _proxy_image_and_manager_args()
    assert image == f"quay.io/lumigo/lumigo-operator-telemetry-proxy:v{app_version}"
    assert "--telemetry-proxy-enricher" in args
    # An explicit tag of our image is kept as given.
    image, _ = _proxy_image_and_manager_args("--set", "telemetryProxy.image.tag=v9.9.9")
    assert image == "quay.io/lumigo/lumigo-operator-telemetry-proxy:v9.9.9"


def test_the_upstream_contrib_image_with_the_enricher_off_still_renders() -> None:
    image, args = _proxy_image_and_manager_args(
        "--set", "telemetryProxy.image.repository=otel/opentelemetry-collector-contrib",
        "--set", "telemetryProxy.image.tag=0.152.0",
        "--set", "telemetryProxy.enricher=false",
    )  # fmt: skip
    assert image == "otel/opentelemetry-collector-contrib:0.152.0"
    assert "--telemetry-proxy-enricher" not in args


@pytest.mark.parametrize(
    "repository",
    [
        "otel/opentelemetry-collector-contrib",
        "docker.io/otel/opentelemetry-collector-contrib",
        "mirror.example.com:5000/otel/opentelemetry-collector-k8s",
        "ghcr.io/open-telemetry/opentelemetry-collector-releases/opentelemetry-collector-contrib",
    ],
)
def test_an_upstream_collector_image_with_the_enricher_on_is_refused(repository: str) -> None:
    """An upstream distribution has no lumigo_k8s_enricher: it would refuse the configuration
    the operator renders and no tenant's telemetry would be forwarded. Refused at render time."""
    proc = helm(
        "template", "lumigo", str(CHART),
        "--set", f"telemetryProxy.image.repository={repository}",
        "--set", "telemetryProxy.image.tag=0.152.0",
        check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "lumigo_k8s_enricher" in proc.stderr
    assert "telemetryProxy.enricher=false" in proc.stderr


def test_default_render_has_no_key_material_and_labels_operator_workloads() -> None:
    docs = load_docs(render_chart("lumigo", "lumigo-system"))
    kinds = sorted({d["kind"] for d in docs})
    assert "Secret" not in kinds, "no certificate or token Secret is rendered by default"
    for hook in docs:
        if hook["kind"] == "MutatingWebhookConfiguration":
            for webhook in hook["webhooks"]:
                assert "caBundle" not in webhook["clientConfig"]
    deployment = find(docs, "Deployment", "lumigo-lumigo-operator-controller-manager")
    webhook = find(docs, "Deployment", "lumigo-lumigo-operator-webhook")
    proxy = find(docs, "Deployment", "lumigo-lumigo-operator-telemetry-proxy")
    job = find(docs, "Job", "lumigo-lumigo-operator-uninstall-hook")
    for operator_workload in (deployment, webhook, proxy, job):
        labels = operator_workload["metadata"]["labels"]
        assert labels["lumigo.auto-trace"] == "false"
        pod_labels = operator_workload["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["lumigo.auto-trace"] == "false"
    crd = find(docs, "CustomResourceDefinition", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def webhook_args(docs: list[dict[str, Any]], fullname: str) -> list[str]:
    webhook = find(docs, "Deployment", f"{fullname}-webhook")
    (container,) = webhook["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args


def test_admission_is_served_by_a_webhook_deployment_that_scales_apart() -> None:
    """Issue 28 item 7: the webhook Deployment, its own ServiceAccount, the Service selecting
    its pods only; replicas and workers from the old values unless `injectorWebhook.*` says
    otherwise; a PodDisruptionBudget only with more than one replica."""
    docs = load_docs(render_chart("lumigo", "lumigo-system"))
    fullname = "lumigo-lumigo-operator"
    webhook = find(docs, "Deployment", f"{fullname}-webhook")
    manager = find(docs, "Deployment", f"{fullname}-controller-manager")
    pod = webhook["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == f"{fullname}-webhook"
    assert pod["metadata"]["labels"]["lumigo.auto-trace"] == "false"
    assert webhook["spec"]["replicas"] == 1
    assert "--no-serve-webhooks" in manager_container(manager)["args"]
    service = find(docs, "Service", f"{fullname}-webhooks-service")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    manager_labels = manager["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= manager_labels.items()
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]

    # Existing values keep their meaning: the manager's replicas and worker count.
    docs = load_docs(render_chart("lumigo", "lumigo-system", {
        "controllerManager": {"replicas": 2, "webhookWorkers": 3},
    }))  # fmt: skip
    assert find(docs, "Deployment", f"{fullname}-webhook")["spec"]["replicas"] == 2
    assert "--webhook-workers=3" in webhook_args(docs, fullname)
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == webhook["spec"]["selector"]["matchLabels"]

    # The webhook's own values win, and scale it apart from the manager.
    docs = load_docs(render_chart("lumigo", "lumigo-system", {
        "controllerManager": {"replicas": 2, "webhookWorkers": 3},
        "injectorWebhook": {"replicas": 4, "workers": 0,
                            "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
    }))  # fmt: skip
    webhook = find(docs, "Deployment", f"{fullname}-webhook")
    assert webhook["spec"]["replicas"] == 4
    assert find(docs, "Deployment", f"{fullname}-controller-manager")["spec"]["replicas"] == 2
    assert "--webhook-workers=0" in webhook_args(docs, fullname)
    (container,) = webhook["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"limits": {"cpu": "2", "memory": "1Gi"}}


def test_helm_test_runs_the_check_as_an_identity_that_may_only_dry_run_a_lumigo_here() -> None:
    docs = load_docs(render_chart("lumigo", "lumigo-system"))
    tests = {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    }
    name = "lumigo-lumigo-operator-check"
    assert set(tests) == {(kind, name) for kind in ("ServiceAccount", "Role", "RoleBinding", "Pod")}
    for key, doc in tests.items():
        annotations = doc["metadata"]["annotations"]
        # Deleted when it passed, kept when it failed (its log says why).
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert doc["metadata"]["namespace"] == "lumigo-system"
        if key[0] != "Pod":
            assert int(annotations["helm.sh/hook-weight"]) < 0, key  # before the Pod
    assert tests[("Role", name)]["rules"] == [
        {"apiGroups": ["operator.lumigo.io"], "resources": ["lumigoes"], "verbs": ["create"]}
    ]
    pod = tests[("Pod", name)]["spec"]
    assert pod["serviceAccountName"] == name
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"][:2] == ["lumigo-operator", "check"]
    assert "--namespace=lumigo-system" in container["command"]
    assert (
        "--proxy-url=http://lumigo-lumigo-operator-telemetry-proxy-service.lumigo-system"
        ".svc.cluster.local" in container["command"]
    )
    assert container["securityContext"]["runAsNonRoot"] is True


def test_uninstall_hook_and_its_rbac_are_pre_delete_hooks() -> None:
    docs = load_docs(render_chart("lumigo", "lumigo-system"))
    hooks = {
        (d["kind"], d["metadata"]["name"]): d["metadata"].get("annotations", {})
        for d in docs
        if d["metadata"].get("annotations", {}).get("helm.sh/hook", "test") != "test"
    }
    name = "lumigo-lumigo-operator-uninstall-hook"
    assert set(hooks) == {
        ("ServiceAccount", name),
        ("ClusterRole", name),
        ("ClusterRoleBinding", name),
        ("Job", name),
    }
    for hook in hooks.values():
        assert hook["helm.sh/hook"] == "pre-delete"
        assert hook["argocd.argoproj.io/hook"] == "PreDelete"  # Argo CD runs it too
        assert hook["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    job_weight = int(hooks[("Job", name)]["helm.sh/hook-weight"])
    for key, hook in hooks.items():
        if key[0] != "Job":
            assert int(hook["helm.sh/hook-weight"]) < job_weight, key
    job = find(docs, "Job", name)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["lumigo-operator", "uninstall"]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == name


def test_non_default_values_are_rendered() -> None:
    docs = load_docs(render_chart("lumigo", "observability", non_default_values("my-app")))
    assert not [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    deployment = find(docs, "Deployment", "acme-tracing-controller-manager")
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert pod["spec"]["nodeSelector"] == {"node-role.example.com/observability": "true"}
    assert pod["spec"]["priorityClassName"] == "lumigo-high"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["metadata"]["annotations"]["example.com/team"] == "platform"
    assert pod["metadata"]["labels"]["example.com/cost-center"] == "obs"
    container = manager_container(deployment)
    assert container["image"] == "registry.example.com/lumigo/operator:v9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    env = env_of(container)
    assert env["LUMIGO_INJECTOR_IMAGE"] == "registry.example.com/lumigo/autotrace:v9.9.9"
    assert env["LUMIGO_LOG_LEVEL"] == "debug"
    assert env["TELEMETRY_PROXY_OTLP_SERVICE"] == (
        "http://acme-tracing-telemetry-proxy-service.$(POD_NAMESPACE).svc.cluster.local"
    )
    injector_name = "acme-tracing-injector-webhook-configuration"
    defaulter_name = "acme-tracing-defaulter-webhook-configuration"
    assert f"--webhook-configurations={injector_name},{defaulter_name}" in container["args"]
    # Safe rollouts: the revert switch and thresholds.
    for arg in ("--no-revert", "--revert-window=30m", "--revert-restarts=5",
                "--revert-unready-after=90s", "--rollout-timeout=1h"):  # fmt: skip
        assert arg in container["args"]
    assert "--revert" not in container["args"]
    # The telemetry proxy: where the operator finds it, where it sends, what it is called.
    assert env["LUMIGO_NODE_EXPORTER_IMAGE"] == "quay.io/prometheus/node-exporter:v1.8.2"
    assert container["args"][-21:] == [
        "--telemetry-proxy-deployment=acme-tracing-telemetry-proxy",
        "--telemetry-proxy-config-secret=acme-tracing-telemetry-proxy-config",
        "--telemetry-upstream-endpoint=https://otlp.example.com",
        "--telemetry-upstream-logs-endpoint=https://logs.example.com",
        "--telemetry-heartbeat-interval=15m",
        "--cluster-name=prod-eu-1",
        "--deployment-method=Helm",
        # Cluster collection: the agent's rules as JSON, parsed back by the operator's flags.
        "--cluster-logs",
        '--cluster-logs-include=[{"namespacePattern":"team-*"}]',
        '--cluster-logs-exclude=[{"containerPattern":"istio-proxy","podPattern":"debug-?"}]',
        "--pod-logs-dir=/data/pods",
        "--cluster-metrics",
        "--cluster-metrics-frequency=30s",
        "--cluster-metrics-essential-only",
        "--cluster-metrics-essential-names=k8s.pod.cpu.usage,k8s.node.cpu.usage",
        "--kubelet-port=10255",
        # The chart's own kube-state-metrics (install: true), not any other in the cluster.
        "--kube-state-metrics-selector=app.kubernetes.io/name=kube-state-metrics,"
        "app.kubernetes.io/instance=lumigo",
        "--telemetry-upstream-metrics-endpoint=https://metrics.example.com",
        "--cluster-agent-daemonset=acme-tracing-cluster-agent",
        "--cluster-token-secret=my-lumigo-token",
        "--cluster-token-key=lumigo",
    ]
    # kube-state-metrics: its shards, image, kinds and scheduling; pods the selector above finds.
    ksm = find(docs, "StatefulSet", "acme-tracing-kube-state-metrics")
    assert ksm["spec"]["replicas"] == 3
    ksm_pod = ksm["spec"]["template"]
    assert ksm_pod["metadata"]["labels"]["app.kubernetes.io/name"] == "kube-state-metrics"
    assert ksm_pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "lumigo"
    assert ksm_pod["spec"]["tolerations"] == [{"key": "infra", "operator": "Exists"}]
    (ksm_container,) = ksm_pod["spec"]["containers"]
    assert ksm_container["image"] == "registry.example.com/ksm:v2.18.0-x"
    assert "--resources=pods,deployments" in ksm_container["args"]
    assert {p["name"] for p in ksm_container["ports"]} >= {"http-metrics"}
    (ksm_rules,) = [d["rules"] for d in docs if d["kind"] == "ClusterRole"
                    and d["metadata"]["name"] == "acme-tracing-kube-state-metrics"]  # fmt: skip
    assert {verb for rule in ksm_rules for verb in rule["verbs"]} == {"list", "watch"}
    # The watchdog: its frequencies, endpoint, token Secret and resources.
    watchdog = find(docs, "Deployment", "acme-tracing-watchdog")
    (dog,) = watchdog["spec"]["template"]["spec"]["containers"]
    assert dog["args"] == [
        "--interval=30s", "--metrics-interval=1m", "--logs-endpoint=https://logs.example.com",
        "--metrics-endpoint=https://metrics.example.com",
        "--token-secret=my-lumigo-token", "--token-key=lumigo", "--cluster-name=prod-eu-1",
    ]  # fmt: skip
    assert dog["image"] == "registry.example.com/lumigo/operator:v9.9.9"
    assert dog["resources"]["limits"] == {"cpu": "200m", "memory": "96Mi"}
    assert watchdog["spec"]["template"]["spec"]["tolerations"][0]["key"] == "spot"
    token_role = find(docs, "Role", "acme-tracing-watchdog-token")
    assert token_role["rules"][0]["resourceNames"] == ["my-lumigo-token"]
    # The token Secret of cluster collection, in the release namespace.
    (token,) = [
        d for d in docs
        if d["kind"] == "Secret" and d["metadata"]["namespace"] == "observability"
        and d["metadata"]["name"] == "my-lumigo-token"
    ]  # fmt: skip
    assert token["stringData"] == {"lumigo": TOKEN}
    proxy = find(docs, "Deployment", "acme-tracing-telemetry-proxy")
    assert proxy["spec"]["replicas"] == 2
    proxy_pod = proxy["spec"]["template"]["spec"]
    (collector,) = proxy_pod["containers"]
    assert collector["image"] == "registry.example.com/otel/collector:0.152.0-1"
    assert collector["imagePullPolicy"] == "Always"
    assert collector["resources"] == {
        "limits": {"cpu": "2", "memory": "2Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}
    }  # fmt: skip
    assert {"name": "GOMEMLIMIT", "value": "1600MiB"} in collector["env"]
    # No proxy-specific scheduling: the global fallbacks; the manager keeps its own.
    assert proxy_pod["tolerations"] == [
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert proxy_pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert proxy_pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert proxy_pod["volumes"][0]["secret"]["secretName"] == "acme-tracing-telemetry-proxy-config"
    config_binding = find(docs, "RoleBinding", "acme-tracing-telemetry-proxy-config")
    assert config_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "lumigo-kubernetes-operator",
         "namespace": "observability"}
    ]  # fmt: skip
    injector = find(docs, "MutatingWebhookConfiguration", injector_name)
    expression, monitored = injector["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert expression["values"] == ["observability", "kube-system"]
    assert monitored == {
        "key": "operator.lumigo.io/monitored",
        "operator": "In",
        "values": ["true"],
    }
    job = find(docs, "Job", "acme-tracing-uninstall-hook")
    assert "--timeout=300s" in job["spec"]["template"]["spec"]["containers"][0]["command"]
    # Debug keeps the hook Job (and its RBAC) for inspection.
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
    # Quick start: the Secret is a release object; the Lumigo is made by a post-install hook
    # Job (created, or updated on upgrade, by `lumigo-operator quickstart`), not by Helm.
    secrets = [
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "my-lumigo-token"
    ]
    # One in the monitored namespace, one in the release's (cluster collection, checked above).
    assert sorted(d["metadata"]["namespace"] for d in secrets) == ["my-app", "observability"]
    assert all(d["stringData"] == {"lumigo": TOKEN} for d in secrets)
    assert not [d for d in docs if d["kind"] == "Lumigo"]
    job = find(docs, "Job", "acme-tracing-quickstart-hook")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == [
        "lumigo-operator", "quickstart",
        '--settings=[{"loggingEnabled":true,"namespace":"my-app"}]',
        "--release=lumigo", "--secret-name=my-lumigo-token", "--secret-key=lumigo",
        "--timeout=240s",
    ]  # fmt: skip
    role = find(docs, "ClusterRole", "acme-tracing-quickstart-hook")
    assert role["rules"] == [
        {"apiGroups": ["operator.lumigo.io"], "resources": ["lumigoes"],
         "verbs": ["create", "get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
    ]  # fmt: skip


def test_token_appears_only_in_its_secret(cluster: LocalCluster, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(non_default_values("my-app")))
    rendered = render_chart("lumigo", "observability", non_default_values("my-app"))
    docs = load_docs(rendered)
    holders = [d for d in docs if TOKEN in json.dumps(d)]
    # The monitored namespace's, and the release namespace's for cluster collection.
    assert [(d["kind"], d["metadata"]["name"]) for d in holders] == [
        ("Secret", "my-lumigo-token"), ("Secret", "my-lumigo-token")
    ]  # fmt: skip
    # NOTES.txt is printed by `helm install`: it must not echo the token either.
    out = helm(
        "install", "lumigo", str(CHART), "--namespace", "observability",
        "--dry-run=client", "--values", str(values), cluster=cluster,
    ).stdout  # fmt: skip
    notes = out.split("NOTES:", 1)[1]
    assert "my-app" in notes
    assert TOKEN not in notes


def _method_aside(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod with the manager's flags that differ by install method checked and removed:
    --deployment-method (Helm in the chart, Kustomize in config/) and
    --kube-state-metrics-selector (the chart's own kube-state-metrics; any in config/, which
    deploys none)."""
    selectors = {
        "--kube-state-metrics-selector=app.kubernetes.io/name=kube-state-metrics,"
        "app.kubernetes.io/instance=lumigo",
        "--kube-state-metrics-selector=app.kubernetes.io/name=kube-state-metrics",
    }
    out = copy.deepcopy(pod)
    for container in out["containers"]:
        methods = [a for a in container.get("args", []) if a.startswith("--deployment-method=")]
        ksm = [a for a in container.get("args", []) if a.startswith("--kube-state-metrics-")]
        if container["name"] == "manager":
            assert methods in (["--deployment-method=Helm"], ["--deployment-method=Kustomize"])
            assert len(ksm) == 1, ksm
            assert ksm[0] in selectors, ksm
        container["args"] = [a for a in container.get("args", []) if a not in methods + ksm]
    return out


def _without_helm_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].pop("labels", None)
    out["metadata"].pop("annotations", None)
    return out


def test_chart_renders_the_same_objects_as_config_default() -> None:
    """Release `lumigo` in lumigo-system gives the names of config/: same RBAC, webhooks, pod."""
    chart = load_docs(render_chart("lumigo", "lumigo-system"))
    config: list[dict[str, Any]] = []
    for part in ("rbac", "manager", "webhook", "telemetry-proxy", "kube-state-metrics"):
        for path in sorted((ROOT / "config" / part).glob("*.yaml")):
            if path.name != "kustomization.yaml":
                config += load_file(path)
    assert config
    for want in config:
        kind, name = want["kind"], want["metadata"]["name"]
        got = find(chart, kind, name)
        if kind in ("ClusterRole", "Role"):
            assert got["rules"] == want["rules"], name
        elif kind in ("ClusterRoleBinding", "RoleBinding"):
            assert (got["roleRef"], got["subjects"]) == (want["roleRef"], want["subjects"]), name
        elif kind == "MutatingWebhookConfiguration":
            assert got["webhooks"] == want["webhooks"], name
        elif kind == "Service":
            assert got["spec"]["ports"] == want["spec"]["ports"], name
            assert want["spec"]["selector"].items() <= got["spec"]["selector"].items(), name
        elif kind == "Deployment":
            got_pod, want_pod = (_method_aside(d["spec"]["template"]["spec"]) for d in (got, want))
            assert got_pod == want_pod, name
            assert got["spec"]["replicas"] == want["spec"]["replicas"]
            assert want["metadata"]["labels"].items() <= got["metadata"]["labels"].items()
        elif kind == "StatefulSet":
            assert got["spec"] == want["spec"], name
        else:
            assert _without_helm_metadata(got) == _without_helm_metadata(want), name


# --- on the real API server ---------------------------------------------------------------


def test_default_render_applies_with_server_side_dry_run(
    cluster: LocalCluster, namespace: str
) -> None:
    manifest = render_chart("lumigo", namespace)
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert "deployment.apps/lumigo-lumigo-operator-controller-manager created" in out
    assert "mutatingwebhookconfiguration.admissionregistration.k8s.io/" in out
    # Nothing was persisted.
    deployment = "lumigo-lumigo-operator-controller-manager"
    assert not exists(cluster, "deployment", deployment, "-n", namespace)


def test_long_release_name_gives_valid_object_names(cluster: LocalCluster, namespace: str) -> None:
    manifest = render_chart("lumigo-production-eu-west-1-tracing", namespace)
    services = [d for d in load_docs(manifest) if d["kind"] == "Service"]
    assert services
    assert all(len(s["metadata"]["name"]) <= 63 for s in services)
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)


def test_non_default_render_applies_with_server_side_dry_run(
    cluster: LocalCluster, crd: Path, namespace: str
) -> None:
    manifest = render_chart("lumigo", namespace, non_default_values(namespace))
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert "deployment.apps/acme-tracing-controller-manager" in out
    assert "job.batch/acme-tracing-quickstart-hook" in out
    assert "secret/my-lumigo-token" in out
    assert TOKEN not in out


# --- install on the full local cluster ----------------------------------------------------


@pytest.fixture
def release(full_cluster: LocalCluster) -> Iterator[HelmRelease]:
    with helm_release(full_cluster) as rel:
        yield rel


def test_helm_install_upgrade_uninstall(full_cluster: LocalCluster, release: HelmRelease) -> None:
    cluster, ns, fullname = full_cluster, release.namespace, release.fullname
    out = release.install()
    assert "STATUS: deployed" in out
    assert "kubectl get pods -n " + ns in out
    assert f"deployment/{fullname}-telemetry-proxy" in out, "NOTES tell where the proxy logs are"

    crd = get_json(cluster, "crd", CRD_NAME)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert deployment_available(cluster, ns, f"{fullname}-controller-manager")
    deployment = get_json(cluster, "deployment", f"{fullname}-controller-manager", "-n", ns)
    assert deployment["metadata"]["labels"]["lumigo.auto-trace"] == "false"
    pods = get_json(cluster, "pods", "-n", ns, "-l", "control-plane=controller-manager")["items"]
    assert pods, "the restricted namespace admitted the manager pod"
    assert all(p["metadata"]["labels"]["lumigo.auto-trace"] == "false" for p in pods)

    injector_name = f"{fullname}-injector-webhook-configuration"
    injector = get_json(cluster, "mutatingwebhookconfiguration", injector_name)
    defaulter = get_json(
        cluster, "mutatingwebhookconfiguration", f"{fullname}-defaulter-webhook-configuration"
    )
    inject, opted_in = injector["webhooks"]
    (default,) = defaulter["webhooks"]
    assert (inject["name"], inject["clientConfig"]["service"]["path"]) == (
        "lumigoinjector.kb.io", "/v1alpha1/inject"
    )  # fmt: skip
    assert (opted_in["name"], opted_in["clientConfig"]["service"]["path"]) == (
        "lumigoinjector-opted-in.kb.io", "/v1alpha1/inject"
    )  # fmt: skip
    assert (inject["failurePolicy"], inject["timeoutSeconds"], inject["sideEffects"]) == (
        "Ignore", 5, "None"
    )  # fmt: skip
    assert (default["name"], default["clientConfig"]["service"]["path"]) == (
        "lumigodefaulter.kb.io", "/v1alpha1/mutate"
    )  # fmt: skip
    assert (default["failurePolicy"], default["timeoutSeconds"]) == ("Fail", 5)
    assert inject["clientConfig"]["service"]["name"] == f"{fullname}-webhooks-service"
    assert not exists(cluster, "secret", f"{fullname}-lumigo-injector-webhook-certs", "-n", ns), (
        "the serving certificate is the operator's to create, not Helm's"
    )

    # The telemetry proxy is part of the release, and the operator's and the proxy's
    # ServiceAccounts may do what the reconciler and the collector do.
    proxy = f"{fullname}-telemetry-proxy"
    assert deployment_available(cluster, ns, proxy)
    assert exists(cluster, "service", f"{proxy}-service", "-n", ns)
    assert exists(cluster, "serviceaccount", proxy, "-n", ns)
    assert not exists(cluster, "secret", f"{proxy}-config", "-n", ns), "the operator writes it"
    assert denied(cluster, ns, OPERATOR_SA, telemetry_reconciler_requests(ns, fullname)) == []
    assert denied(cluster, ns, proxy, telemetry_proxy_requests(ns, fullname)) == []

    # A caBundle written by the operator survives `helm upgrade` (Helm never sets that field).
    bundle = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="
    cluster.kubectl(
        "patch", "mutatingwebhookconfiguration", injector_name,
        "--type=json", "-p",
        json.dumps([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]),
    )  # fmt: skip
    out = release.helm(
        "upgrade", release.name, str(CHART), "--wait", "--timeout", "180s",
        "--set", "controllerManager.replicas=2",
    ).stdout  # fmt: skip
    assert "STATUS: deployed" in out
    wait_until(
        lambda: get_json(cluster, "deployment", f"{fullname}-controller-manager", "-n", ns)
        .get("status", {}).get("availableReplicas") == 2,
        120, "2 available replicas after the upgrade",
    )  # fmt: skip
    injector = get_json(cluster, "mutatingwebhookconfiguration", injector_name)
    assert injector["webhooks"][0]["clientConfig"].get("caBundle") == bundle
    assert exists(cluster, "crd", CRD_NAME)

    out = release.uninstall()
    assert "uninstalled" in out
    # The pre-delete hook Job ran to completion (kwok completes its pod; the uninstall logic
    # itself is tested as a local process) and, having succeeded, was removed with its RBAC;
    # then Helm removed everything else but the CRD.
    selector = f"involvedObject.kind=Job,involvedObject.name={fullname}-uninstall-hook"
    hook_events = get_json(cluster, "events", "-n", ns, "--field-selector", selector)["items"]
    assert "Completed" in {e["reason"] for e in hook_events}
    assert not exists(cluster, "job", f"{fullname}-uninstall-hook", "-n", ns)
    assert not exists(cluster, "serviceaccount", f"{fullname}-uninstall-hook", "-n", ns)
    assert release.cluster_scoped_leftovers() == []
    assert not exists(cluster, "deployment", f"{fullname}-controller-manager", "-n", ns)
    assert not exists(cluster, "serviceaccount", "lumigo-kubernetes-operator", "-n", ns)
    assert not exists(cluster, "deployment", proxy, "-n", ns)
    assert not exists(cluster, "serviceaccount", proxy, "-n", ns)
    assert exists(cluster, "crd", CRD_NAME), "the CRD (and users' Lumigo resources) is kept"


def test_helm_uninstall_removes_every_lumigo_and_all_instrumentation(
    full_cluster: LocalCluster, kube: KubeClient, release: HelmRelease, tmp_path: Path
) -> None:
    cluster, ns, fullname = full_cluster, release.namespace, release.fullname
    release.install()
    hook = f"{fullname}-uninstall-hook"

    # The hooks as Helm stored them for the release: the Job, and before it (lower weight) its
    # own ServiceAccount and RBAC, all pre-delete, deleted when they succeed.
    stored = load_docs(release.helm("get", "hooks", release.name).stdout)
    hooks = {d["kind"]: d for d in stored if d["metadata"]["name"] == hook}
    assert set(hooks) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
    weights = {}
    for kind, doc in hooks.items():
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete", kind
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        weights[kind] = int(annotations["helm.sh/hook-weight"])
    assert max(w for k, w in weights.items() if k != "Job") < weights["Job"]
    job_pod = hooks["Job"]["spec"]["template"]["spec"]
    assert job_pod["serviceAccountName"] == hook
    hook_command = job_pod["containers"][0]["command"]
    assert hook_command[:2] == ["lumigo-operator", "uninstall"]

    with installed_operator(cluster, kube, ns, f"{fullname}-controller-manager", tmp_path) as op:
        # A namespace traced the README way (an existing and a new Deployment), and a Deployment
        # opted in by its label in a namespace without Lumigo.
        traced = op.new_namespace()
        kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, "existing"), traced)
        cluster.kubectl("apply", "-n", traced, "-f", str(SAMPLE))
        wait_until(lambda: is_active(kube, traced), 60, "the Lumigo Active")
        wait_until(
            lambda: is_injected(kube.get(DEPLOYMENTS, "existing", traced)), 60,
            "the existing Deployment instrumented by the controller",
        )  # fmt: skip
        assert is_injected(kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, "new"), traced))
        opted = op.new_namespace()
        opt_in = workload(DEPLOYMENTS, "opted-in", {constants.LABEL_AUTO_TRACE: "true"})
        assert is_injected(kube.create(DEPLOYMENTS, opt_in, opted))
        workloads = [(traced, "existing"), (traced, "new"), (opted, "opted-in")]
        # The chart's opted-in entry still sees a label-opted-in workload relabelled `false`
        # (injection rewrote its `true`): the instrumentation goes on that update.
        later = workload(DEPLOYMENTS, "opted-out-later", {constants.LABEL_AUTO_TRACE: "true"})
        injected = kube.create(DEPLOYMENTS, later, opted)
        assert is_injected(injected)
        opt_out = {"metadata": {"labels": {constants.LABEL_AUTO_TRACE: "false"}}}
        assert clean(kube.merge_patch(DEPLOYMENTS, "opted-out-later", opt_out, opted))
        # Labelled `false` but carrying the instrumentation (an export applied again): the
        # uninstall hook cleans it and leaves the user's label.
        copy = workload(DEPLOYMENTS, "copy", {constants.LABEL_AUTO_TRACE: "false"})
        copy["spec"]["template"]["spec"] = injected["spec"]["template"]["spec"]
        assert not clean(kube.create(DEPLOYMENTS, copy, opted))
        proxy_secret = f"{fullname}-telemetry-proxy-config"
        wait_until(lambda: exists(cluster, "secret", proxy_secret, "-n", ns), 60,
                   "the operator to configure the release's telemetry proxy")  # fmt: skip

        # The hook's logic where Helm runs it: before anything of the release is deleted, while
        # the operator runs, under the hook's own ServiceAccount and RBAC.
        hook_rbac = "\n---\n".join(json.dumps(d) for k, d in hooks.items() if k != "Job")
        cluster.kubectl("apply", "-f", "-", input=hook_rbac)
        try:
            kubeconfig = service_account_kubeconfig(cluster, ns, hook, tmp_path / "hook.kc")
            result = run(
                [str(ROOT / ".venv" / "bin" / "lumigo-operator"), *hook_command[1:],
                 f"--kubeconfig={kubeconfig}"],
                check=False,
            )  # fmt: skip
        finally:
            cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=hook_rbac)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "finalized 0 here" in result.stdout, "the running operator processed the finalizer"
        assert kube.list(LUMIGOES)[0] == [], "no Lumigo left anywhere"
        copied = kube.get(DEPLOYMENTS, "copy", opted)
        assert clean(copied)
        assert copied["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == "false"
        for namespace, name in workloads:
            stored_workload = kube.get(DEPLOYMENTS, name, namespace)
            assert clean(stored_workload), name
            assert constants.LABEL_AUTO_TRACE not in (
                stored_workload["metadata"].get("labels") or {}
            )
        # Removed by the operator for the Lumigo, by the uninstall for the opted-in workload.
        by_operator = f"trigger: controller, acting on behalf of the '{traced}/lumigo'"
        removals = [
            (traced, "existing", by_operator),
            (traced, "new", by_operator),
            (opted, "opted-in", UNINSTALL_TRIGGER),
        ]
        for namespace, name, text in removals:
            wait_until(
                lambda n=namespace, w=name, m=text: has_event(
                    kube, n, w, "LumigoRemovedInstrumentation", m
                ),
                30, f"the removal event of {name}",
            )  # fmt: skip

        out = release.uninstall()
        assert "uninstalled" in out
        status = release.helm("status", release.name, check=False)
        assert status.returncode != 0
        assert "not found" in status.stderr
        assert not exists(cluster, "job", hook, "-n", ns)
        assert not exists(cluster, "serviceaccount", hook, "-n", ns)
        assert release.cluster_scoped_leftovers() == []
        assert not exists(cluster, "deployment", f"{fullname}-telemetry-proxy", "-n", ns)
        # The proxy's configuration (the tokens) goes with the proxy Deployment that owns it.
        # The garbage collector works through the whole session's deletions first: on a loaded
        # CI machine that took over 60 s once.
        wait_until(lambda: not exists(cluster, "secret", proxy_secret, "-n", ns), 180,
                   "the garbage collector to delete the proxy configuration")  # fmt: skip
        for namespace, name in workloads:
            assert clean(kube.get(DEPLOYMENTS, name, namespace)), name
        assert TOKEN_IN_SAMPLE not in op.log_text() + result.stdout + result.stderr


# --- quick start: monitoredNamespaces (issue 29 item 5) -----------------------------------


def run_quickstart_hook(release: HelmRelease, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The post-install/post-upgrade quick-start Job's logic where Helm ran it (kwok completes
    its pod without running a container): its command as Helm stored it for the release's
    current revision, run as a local process under the hook's own ServiceAccount and RBAC."""
    cluster = release.cluster
    hook = f"{release.fullname}-quickstart-hook"
    stored = load_docs(release.helm("get", "hooks", release.name).stdout)
    hooks = {d["kind"]: d for d in stored if d["metadata"]["name"] == hook}
    assert set(hooks) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
    assert not [d for d in stored if d["kind"] == "Lumigo"], "the Job makes them, not Helm"
    pod = hooks["Job"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == hook
    command = pod["containers"][0]["command"]
    assert command[:2] == ["lumigo-operator", "quickstart"]
    rbac = "\n---\n".join(json.dumps(d) for k, d in hooks.items() if k != "Job")
    cluster.kubectl("apply", "-f", "-", input=rbac)
    try:
        kubeconfig = service_account_kubeconfig(cluster, release.namespace, hook,
                                                tmp_path / "quickstart.kc")  # fmt: skip
        return run(
            [str(ROOT / ".venv" / "bin" / "lumigo-operator"), *command[1:],
             f"--kubeconfig={kubeconfig}"],
            check=False,
        )  # fmt: skip
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=rbac)


def _flags(kube: KubeClient, namespace: str) -> tuple[bool, bool]:
    spec = kube.get(LUMIGOES, "lumigo", namespace)["spec"]
    return spec["tracing"]["enabled"], spec["logging"]["enabled"]


def test_helm_quickstart_defaults_upgrades_and_leaves_users_lumigo_alone(
    full_cluster: LocalCluster, kube: KubeClient, release: HelmRelease, tmp_path: Path
) -> None:
    """`monitoredNamespaces` as the reference does it: a `lumigo` Lumigo per namespace with
    tracing and logging on unless the entry says otherwise; each `helm upgrade` sets on it the
    flags its entry gives (the others, a user's edits included, are kept); a namespace dropped
    from the list keeps its Lumigo. Ours on top: a Lumigo the chart did not create (the seed
    README's sample, labelled `app.kubernetes.io/instance: lumigo` like the release) is never
    touched, and a namespace that does not exist fails the upgrade before anything changes."""
    cluster, fullname = full_cluster, release.fullname
    suffix = uuid.uuid4().hex[:5]
    plain, tuned, own, dropped = (f"t-qs-{n}-{suffix}" for n in ("plain", "tuned", "own", "gone"))
    namespaces = [plain, tuned, own, dropped]
    for name in namespaces:
        cluster.kubectl("create", "namespace", name)
    values = tmp_path / "values.yaml"

    def monitor(*entries: dict[str, Any]) -> str:
        values.write_text(json.dumps({"lumigoToken": {"value": TOKEN},
                                      "monitoredNamespaces": list(entries)}))  # fmt: skip
        return str(values)

    def upgrade(check: bool = True) -> subprocess.CompletedProcess[str]:
        return release.helm("upgrade", release.name, str(CHART), "--wait", "--timeout", "180s",
                            "--values", str(values), check=check)  # fmt: skip

    users_lumigo = next(d for d in load_file(SAMPLE) if d["kind"] == "Lumigo")
    deployment = f"{fullname}-controller-manager"
    try:
        release.install("--values", monitor(
            {"namespace": plain}, {"namespace": tuned, "tracingEnabled": False},
            {"namespace": own, "loggingEnabled": True}, {"namespace": dropped},
        ))  # fmt: skip
        with installed_operator(cluster, kube, release.namespace, deployment, tmp_path):
            users = kube.create(LUMIGOES, users_lumigo, own)
            result = run_quickstart_hook(release, tmp_path)
            assert result.returncode == 0, result.stdout + result.stderr
            assert _flags(kube, plain) == (True, True), "the reference's defaults: both on"
            assert _flags(kube, tuned) == (False, True)
            assert _flags(kube, dropped) == (True, True)
            mine = kube.get(LUMIGOES, "lumigo", own)
            assert mine["spec"] == users["spec"]
            assert mine["metadata"]["generation"] == users["metadata"]["generation"]
            assert f"{own}/lumigo" in result.stdout, "says which Lumigo it left alone"
            # A user's edit of a quick-start Lumigo, on a flag the next values do not give.
            kube.merge_patch(LUMIGOES, "lumigo", {"spec": {"logging": {"enabled": False}}}, plain)
            assert TOKEN not in result.stdout + result.stderr

        monitor(
            {"namespace": plain, "tracingEnabled": False},
            {"namespace": tuned, "tracingEnabled": True, "loggingEnabled": False},
            {"namespace": own, "loggingEnabled": True},
        )  # fmt: skip
        assert "STATUS: deployed" in upgrade().stdout
        with installed_operator(cluster, kube, release.namespace, deployment, tmp_path):
            result = run_quickstart_hook(release, tmp_path)
            assert result.returncode == 0, result.stdout + result.stderr
            assert _flags(kube, plain) == (False, False), "tracing from the values, logging kept"
            assert _flags(kube, tuned) == (True, False)
            assert _flags(kube, dropped) == (True, True), "dropped from the list: left as it is"
            assert kube.get(LUMIGOES, "lumigo", own)["spec"] == users["spec"]

        # Bad input: a namespace that does not exist. A clear error before anything changes.
        missing = f"t-qs-missing-{suffix}"
        monitor({"namespace": plain, "loggingEnabled": True}, {"namespace": missing})
        failed = upgrade(check=False)
        assert failed.returncode != 0
        assert f'monitoredNamespaces: namespace "{missing}" does not exist' in failed.stderr
        history = json.loads(release.helm("history", release.name, "-o", "json").stdout)
        assert [h["status"] for h in history] == ["superseded", "deployed"]
        assert _flags(kube, plain) == (False, False)
    finally:
        for name in namespaces:
            for lumigo in kube.list(LUMIGOES, name)[0]:
                patch = {"metadata": {"finalizers": None}}
                kube.merge_patch(LUMIGOES, lumigo["metadata"]["name"], patch, name)
            cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")
