"""A Lumigo user's values file of the reference chart (v69) works with this chart: every key is
accepted by the schema, and each is either used with the reference's meaning or named in
NOTES.txt as ignored, with why (issue 32, drop-in upgrades). The file is
tests/e2e/reference_values_v69.yaml: every key of the reference's values.yaml plus what users
commonly change there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from envtest.cluster import LocalCluster
from tests.support.packaging import CHART, find, helm, load_docs, render_chart

REFERENCE_VALUES = Path(__file__).with_name("reference_values_v69.yaml")
OURS = yaml.safe_load((CHART / "values.yaml").read_text())
GLOBAL_TOLERATIONS = [
    {"key": "dedicated", "operator": "Equal", "value": "observability", "effect": "NoSchedule"}
]
GLOBAL_SELECTOR = {"kubernetes.io/os": "linux", "pool": "system"}


def reference_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(REFERENCE_VALUES.read_text())
    return values


def leaf_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            paths += leaf_paths(value, f"{prefix}{key}.")
        else:
            paths.append(f"{prefix}{key}")
    return paths


def in_our_values(path: str) -> bool:
    node: Any = OURS
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def notes_of(cluster: LocalCluster, values: Path, namespace: str) -> str:
    # Even a client dry run checks cluster-scoped objects: a release name of its own (other
    # tests' releases may still hold theirs) and no CRD (another test may have created it).
    out = helm(
        "install", "reference-values", str(CHART), "--namespace", namespace, "--dry-run=client",
        "--values", str(values), "--set", "crds.install=false", cluster=cluster,
    ).stdout  # fmt: skip
    return " ".join(out.split("NOTES:", 1)[1].split())


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = ("Deployment", "StatefulSet", "Job", "DaemonSet")
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in kinds
    }


def test_the_file_holds_the_keys_users_upgrade_with() -> None:
    """The fixture is not vacuous: the reference's per-component shapes are in it."""
    paths = leaf_paths(reference_values())
    assert len(paths) >= 100
    for path in (
        "tolerations.watchdog",
        "nodeSelector.uninstallHook",
        "controllerManager.kubeRbacProxy.image.tag",
        "telemetryProxy.logs.batchProcessor.timeout",
        "kube-state-metrics.autosharding.enabled",
        "kubernetesClusterDomain",
        "output.showOperatorStatus",
    ):
        assert path in paths, path


def test_every_reference_key_is_accepted_and_used_or_named_as_ignored(
    cluster: LocalCluster, namespace: str
) -> None:
    helm("lint", "--strict", str(CHART), "--values", str(REFERENCE_VALUES))
    notes = notes_of(cluster, REFERENCE_VALUES, namespace)
    assert "Values of the Lumigo reference chart that this chart accepts and ignores:" in notes
    unaccounted = [
        path
        for path in leaf_paths(reference_values())
        if not in_our_values(path)
        and not path.startswith(("tolerations.", "nodeSelector."))  # used: the next test
        and not any(f"- {prefix}:" in notes for prefix in _prefixes(path))
    ]
    assert unaccounted == []
    # Only what the file sets is named; the placement keys it uses are not.
    assert "- tolerations.global:" not in notes
    assert "- tolerations.targetAllocator:" not in notes  # null in the file


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


def test_the_reference_placement_reaches_every_pod_and_the_cluster_agent() -> None:
    docs = load_docs(render_chart("lumigo", "observability", reference_values()))
    specs = pod_specs(docs)
    assert set(specs) >= {
        "lumigo-lumigo-operator-controller-manager", "lumigo-lumigo-operator-webhook",
        "lumigo-lumigo-operator-telemetry-proxy", "lumigo-lumigo-operator-watchdog",
        "lumigo-lumigo-operator-kube-state-metrics", "lumigo-lumigo-operator-uninstall-hook",
    }  # fmt: skip
    for name, spec in specs.items():
        assert spec["tolerations"] == GLOBAL_TOLERATIONS, name
        assert spec["nodeSelector"] == GLOBAL_SELECTOR, name
    proxy = find(docs, "Deployment", "lumigo-lumigo-operator-telemetry-proxy")
    agent = json.loads(
        proxy["metadata"]["annotations"]["operator.lumigo.io/cluster-agent-scheduling"]
    )
    assert agent == {
        "tolerations": [{"operator": "Exists"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
    }


@pytest.mark.parametrize(
    ("sets", "tolerations"),
    [
        # This chart's own key of the component, then the reference's, then global, then the
        # reference's global.
        (["controllerManager.tolerations[0].key=own", "tolerations.controllerManager[0].key=ref",
          "global.tolerations[0].key=global", "tolerations.global[0].key=refglobal"], "own"),
        (["tolerations.controllerManager[0].key=ref", "global.tolerations[0].key=global",
          "tolerations.global[0].key=refglobal"], "ref"),
        (["global.tolerations[0].key=global", "tolerations.global[0].key=refglobal"], "global"),
        (["tolerations.global[0].key=refglobal", "tolerations.watchdog[0].key=other"], "refglobal"),
    ],
)  # fmt: skip
def test_the_first_placement_set_wins(sets: list[str], tolerations: str) -> None:
    args = ["template", "lumigo", str(CHART)]
    for item in sets:
        args += ["--set", item]
    specs = pod_specs(load_docs(helm(*args).stdout))
    manager = specs["lumigo-lumigo-operator-controller-manager"]
    assert [t["key"] for t in manager["tolerations"]] == [tolerations]


def test_the_reference_images_are_replaced_by_this_charts_own(
    cluster: LocalCluster, namespace: str
) -> None:
    manifest = render_chart("lumigo", namespace, reference_values())
    assert "public.ecr.aws/lumigo" not in manifest
    specs = pod_specs(load_docs(manifest))
    manager = specs["lumigo-lumigo-operator-controller-manager"]["containers"][0]
    assert manager["image"].startswith("quay.io/lumigo/lumigo-operator:v")
    assert manager["resources"]["limits"]["memory"] == "256Mi"  # the file's, used
    env = {e["name"]: e.get("value") for e in manager["env"]}
    assert env["LUMIGO_INJECTOR_IMAGE"].startswith("quay.io/lumigo/lumigo-autotrace:v")
    proxy = specs["lumigo-lumigo-operator-telemetry-proxy"]["containers"][0]
    assert proxy["image"].startswith("quay.io/lumigo/lumigo-operator-telemetry-proxy:v")
    notes = notes_of(cluster, REFERENCE_VALUES, namespace)
    for key in ("controllerManager.manager.image", "telemetryProxy.image",
                "injectorWebhook.lumigoInjector.image", "watchdog.image"):  # fmt: skip
        assert f"- {key}:" in notes, key
    # A registry of the user's own under the same keys is used as given.
    mine = reference_values()
    mine["controllerManager"]["manager"]["image"] = {
        "repository": "registry.example.com/lumigo-operator",
        "tag": 7,
    }
    specs = pod_specs(load_docs(render_chart("lumigo", namespace, mine)))
    manager = specs["lumigo-lumigo-operator-controller-manager"]["containers"][0]
    assert manager["image"] == "registry.example.com/lumigo-operator:7"


def test_the_render_applies_with_server_side_dry_run(cluster: LocalCluster, namespace: str) -> None:
    manifest = render_chart("lumigo", namespace, reference_values())
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert "deployment.apps/lumigo-lumigo-operator-controller-manager created" in out
