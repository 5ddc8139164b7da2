"""The Go tests of this repository's own collector components (collector/: lumigo_k8s_enricher,
lumigo_json_body), which ocb builds into the telemetry proxy and the cluster agent. `make test`
runs them, so a change there is proven the way a change to the Python is; with install-tools'
Go environment, whose module and build caches the collector build has already filled."""

from __future__ import annotations

import subprocess

from tests.support.scripts import ROOT, hack_script

COLLECTOR = ROOT / "collector"


def test_the_collector_components_go_tests_pass() -> None:
    env = hack_script("install-tools").go_env()
    packages = sorted({p.parent.name for p in COLLECTOR.glob("*/*_test.go")})
    assert packages == ["lumigojsonbody", "lumigok8senricher"], "a component without Go tests"
    done = subprocess.run(
        ["go", "test", "-count=1", "./..."], cwd=COLLECTOR, env=env,
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for package in packages:
        assert f"ok  \tlumigo-operator/collector/{package}" in done.stdout, done.stdout


def test_every_collector_component_is_in_the_distribution() -> None:
    manifest = (ROOT / "hack" / "tools" / "otelcol" / "manifest.yaml").read_text()
    for component in (p for p in COLLECTOR.iterdir() if p.is_dir()):
        assert f"lumigo-operator/collector/{component.name}" in manifest, component.name
