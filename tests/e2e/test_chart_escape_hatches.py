"""The chart's escape hatches (issue 34, item 7): per component `affinity`, `extraEnv`,
`extraArgs`, `podAnnotations`, `podLabels`, `priorityClassName`; `commonLabels` on every object;
`extraObjects` rendered through `tpl`. The schema stays strict: a misspelt key is refused."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from envtest.cluster import LocalCluster
from tests.support.packaging import CHART, helm, load_docs, render_chart

# values key -> the pod's object name and container name
COMPONENTS = {
    "controllerManager": ("Deployment", "lumigo-lumigo-operator-controller-manager", "manager"),
    "injectorWebhook": ("Deployment", "lumigo-lumigo-operator-webhook", "webhook"),
    "telemetryProxy": ("Deployment", "lumigo-lumigo-operator-telemetry-proxy", "otelcol"),
    "watchdog": ("Deployment", "lumigo-lumigo-operator-watchdog", "watchdog"),
    "kubeStateMetrics": (
        "StatefulSet", "lumigo-lumigo-operator-kube-state-metrics", "kube-state-metrics"
    ),
}  # fmt: skip


def hatches(component: str) -> dict[str, Any]:
    return {
        "podAnnotations": {"example.com/owner": f"{component}-team"},
        "podLabels": {"example.com/cost-centre": component.lower()},
        "priorityClassName": f"{component.lower()}-priority",
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": component.lower()}},
                        },
                    }
                ]
            }
        },
        "extraEnv": [
            {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"},
            {"name": "FROM_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "extraArgs": [f"--{component.lower()}-extra=1"],
    }


def all_hatches() -> dict[str, Any]:
    values: dict[str, Any] = {name: hatches(name) for name in COMPONENTS}
    values["kubeStateMetrics"]["install"] = True
    values["commonLabels"] = {"example.com/team": "platform"}
    values["extraObjects"] = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "extra-map", "namespace": "{{ .Release.Namespace }}"},
         "data": {"release": "{{ .Release.Name }}"}},
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata:\n"
        "  name: {{ .Release.Name }}-critical\nvalue: 1000000\n",
    ]  # fmt: skip
    return values


def test_every_component_takes_its_escape_hatches() -> None:
    docs = load_docs(render_chart("lumigo", "observability", all_hatches()))
    for component, (kind, name, container_name) in COMPONENTS.items():
        want = hatches(component)
        (obj,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
        template = obj["spec"]["template"]
        spec = template["spec"]
        assert template["metadata"]["annotations"]["example.com/owner"] == f"{component}-team"
        labels = template["metadata"]["labels"]
        assert labels["example.com/cost-centre"] == component.lower(), component
        assert spec["priorityClassName"] == want["priorityClassName"], component
        assert spec["affinity"] == want["affinity"], component  # replaces the chart's
        (container,) = [c for c in spec["containers"] if c["name"] == container_name]
        assert container["args"][-1] == want["extraArgs"][0], component
        assert container["env"][-2:] == want["extraEnv"], component


def test_without_affinity_the_chart_keeps_linux_nodes_of_its_architectures() -> None:
    docs = load_docs(
        render_chart("lumigo", "observability", {"kubeStateMetrics": {"install": True}})
    )
    for kind, name, _ in COMPONENTS.values():
        (obj,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
        terms = obj["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        keys = {e["key"] for e in terms[0]["matchExpressions"]}
        assert keys == {"kubernetes.io/arch", "kubernetes.io/os"}, name


def test_common_labels_are_on_every_object_and_extra_objects_are_rendered() -> None:
    docs = load_docs(render_chart("lumigo", "observability", all_hatches()))
    chart_objects = [
        d for d in docs if d["metadata"]["name"] not in ("extra-map", "lumigo-critical")
    ]
    assert chart_objects
    for obj in chart_objects:
        if obj["kind"] == "CustomResourceDefinition":
            continue  # crds/ is not templated by Helm
        assert obj["metadata"]["labels"]["example.com/team"] == "platform", obj["metadata"]["name"]
    (extra,) = [d for d in docs if d["metadata"]["name"] == "extra-map"]
    assert extra["metadata"]["namespace"] == "observability"
    assert extra["data"] == {"release": "lumigo"}
    (priority,) = [d for d in docs if d["kind"] == "PriorityClass"]
    assert priority["metadata"]["name"] == "lumigo-critical"


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("telemetryProxy.extraEnvs[0].name=A", "extraEnvs"),  # a typo
        ("watchdog.extraEnv[0].value=no-name", "name"),
        (
            "commonLabels.app\\.kubernetes\\.io/name=mine",
            "invalid propertyName 'app.kubernetes.io/name'",
        ),
        ("controllerManager.affinity.nodeAfinity.x=y", "nodeAfinity"),
    ],
)
def test_the_schema_still_refuses_typos_and_reserved_labels(setting: str, words: str) -> None:
    out = helm("template", "x", str(CHART), "--set", setting, check=False)
    assert out.returncode != 0, setting
    assert words in out.stderr, out.stderr


def test_the_render_with_every_hatch_applies_with_server_side_dry_run(
    cluster: LocalCluster, namespace: str
) -> None:
    values = all_hatches()
    for component in COMPONENTS:
        values[component].pop("priorityClassName")  # PriorityClasses this cluster lacks
    manifest = render_chart("lumigo", namespace, values)
    try:
        out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    except subprocess.CalledProcessError as err:  # pragma: no cover - the message is the point
        raise AssertionError(err.stderr) from err
    assert "configmap/extra-map created (server dry run)" in out
