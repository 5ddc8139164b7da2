"""The lumigo-injector init container's resources are configurable (--init-resources,
LUMIGO_INIT_RESOURCES, the chart's injectorWebhook.lumigoInjector.resources), so an instrumented
pod passes a namespace's LimitRange: the real API server's LimitRanger admits the defaults under
common ratios (4 for CPU, 2 for memory), refuses them under a CPU ratio of 2 and admits the
configured resources there (issue 34, item 4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.cli import _parser
from controller.options import RunOptions, run_options
from controller.webhook_serving import injection_settings
from envtest.cluster import KubectlError, LocalCluster
from tests.support.packaging import CHART, helm, load_docs
from webhook.pod_injection import InitContainerResources, InjectionSettings, inject


def limit_range(cpu: str, memory: str) -> str:
    ratio = {"type": "Container", "maxLimitRequestRatio": {"cpu": cpu, "memory": memory}}
    return json.dumps({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "ratio"},
                       "spec": {"limits": [ratio]}})  # fmt: skip


def options(*args: str) -> RunOptions:
    return run_options(_parser().parse_args(["run", *args]))


def pod(settings: InjectionSettings, name: str) -> dict[str, Any]:
    """The pod an instrumented Deployment's ReplicaSet would create."""
    app = {"name": "app", "image": "python:3.12",
           "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                         "limits": {"cpu": "200m", "memory": "128Mi"}}}  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [app]}},
        },
    }
    template = inject(deployment, settings, "Deployment")["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": name},
            "spec": template["spec"]}  # fmt: skip


def test_parse_takes_any_of_the_four_and_refuses_the_rest() -> None:
    parsed = InitContainerResources.parse("requests.cpu=125m, limits.memory=256Mi")
    assert parsed == InitContainerResources(requests_cpu="125m", limits_memory="256Mi")
    assert InitContainerResources.parse(str(parsed)) == parsed
    for bad, words in (
        ("requests.gpu=1", "is not one of"),
        ("limits.cpu", "is not one of"),
        ("requests.cpu=1,limits.cpu=500m", "exceeds its limit"),
        ("requests.memory=lots", "init container requests memory"),
    ):
        with pytest.raises(ValueError, match=words):
            InitContainerResources.parse(bad)


def test_the_flag_and_the_env_reach_the_injected_init_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LUMIGO_INIT_RESOURCES", "requests.cpu=150m,limits.memory=256Mi")
    opts = options()
    init = pod(injection_settings(opts), "p")["spec"]["initContainers"][0]
    assert init["resources"] == {
        "requests": {"cpu": "150m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }
    flagged = options("--init-resources=limits.cpu=250m")
    assert flagged.init_resources.limits_cpu == "250m"


def test_common_limit_ranges_admit_the_defaults_and_a_stricter_one_the_configured_resources(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=limit_range("10", "2"))
    common = pod(InjectionSettings(), "defaults")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(common))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=limit_range("4", "2"))
    refused = pod(InjectionSettings(), "refused")
    with pytest.raises(KubectlError, match="cpu max limit to request ratio per Container is 4"):
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(refused))
    configured = InitContainerResources.parse("requests.cpu=125m")
    admitted = pod(InjectionSettings(init_resources=configured), "configured")
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(admitted))


def test_the_chart_passes_its_values_to_the_manager_and_the_webhook() -> None:
    rendered = helm(
        "template", "x", str(CHART),
        "--set", "injectorWebhook.lumigoInjector.resources.requests.cpu=150m",
    ).stdout  # fmt: skip
    containers = [
        c
        for d in load_docs(rendered)
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] in ("manager", "webhook")
    ]
    assert len(containers) == 2
    for container in containers:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert InitContainerResources.parse(env["LUMIGO_INIT_RESOURCES"]).requests_cpu == "150m"
