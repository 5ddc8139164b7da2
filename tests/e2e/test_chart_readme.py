"""The chart's README is generated from values.yaml (hack/gen-chart-readme) and kept in sync;
Chart.yaml's Artifact Hub annotations name the images a default install runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.packaging import CHART, helm

ROOT = Path(__file__).resolve().parents[2]


def test_the_chart_readme_is_what_values_yaml_generates() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "hack/gen-chart-readme"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_every_described_key_is_a_row_with_its_description() -> None:
    readme = (CHART / "README.md").read_text()
    assert "helm repo add lumigo https://lumigo-io.github.io/lumigo-kubernetes-operator" in readme
    for key, words in (
        ("injectorWebhook.lumigoInjector.mode", "image-volume"),
        ("telemetryProxy.extraEnv", "More environment variables"),
        ("extraObjects", "tpl"),
    ):
        (row,) = [line for line in readme.splitlines() if line.startswith(f"| `{key}` |")]
        assert words in row, row


def test_artifact_hub_images_are_the_default_render() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    annotated = {i["image"] for i in yaml.safe_load(chart["annotations"]["artifacthub.io/images"])}
    rendered = helm("template", "x", str(CHART), "--set", "kubeStateMetrics.install=true").stdout
    images = set(
        re.findall(r"(?:image: |value: )\"?((?:quay\.io|registry\.k8s\.io)/[^\s\"]+)", rendered)
    )
    assert annotated == images
