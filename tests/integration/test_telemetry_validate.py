"""The rendered configuration is valid for the real collector (its own `validate` command)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from controller.telemetry.agent_config import (
    AgentSettings,
    LogFileRule,
    MetricsSettings,
    render_agent,
)
from controller.telemetry.config import MonitoredNamespace, Origin, ProxySettings, render
from tests.support.otel import COLLECTOR


@pytest.mark.parametrize("count", [0, 1, 3])
@pytest.mark.parametrize("cluster_name", ["", "prod-eu"])
def test_rendered_config_passes_collector_validate(
    count: int, cluster_name: str, tmp_path: Path
) -> None:
    namespaces = [MonitoredNamespace(f"team-{i}", f"uid-{i}", f"t_{i:021x}") for i in range(count)]
    config = tmp_path / "config.yaml"
    settings = ProxySettings(
        origin=Origin(cluster_name=cluster_name),
        upstream_logs_endpoint="https://logs.example.com/v1/logs" if cluster_name else "",
        # With and without the proxy's own metrics (the cluster token).
        self_metrics_token="t_0123456789abcdef01234" if count % 2 else "",
    )
    config.write_text(render(namespaces, settings))
    result = subprocess.run(
        [str(COLLECTOR), "validate", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_validate_rejects_a_broken_config(tmp_path: Path) -> None:
    """Guards the test above: `validate` really checks component settings."""
    config = tmp_path / "config.yaml"
    text = render([MonitoredNamespace("a", "u", "t_0123456789abcdef01234")], ProxySettings())
    config.write_text(text.replace("mode: watch", "mode: sometimes"))
    result = subprocess.run(
        [str(COLLECTOR), "validate", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "invalid mode" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "settings",
    [
        AgentSettings("lumigo-system"),
        AgentSettings(
            "ops",
            include=(LogFileRule("team-*"),),
            exclude=(LogFileRule(container_pattern="istio-proxy"),),
            proxy=ProxySettings(origin=Origin(cluster_name="prod", cluster_uid="u")),
        ),
        AgentSettings(
            "ops",
            logs=False,
            metrics=MetricsSettings(enabled=True, essential_only=True),
            proxy=ProxySettings(kube_auth="kubeConfig"),
        ),
        AgentSettings(
            "ops",
            metrics=MetricsSettings(enabled=True, upstream_endpoint="https://m.example.com"),
            proxy=ProxySettings(kube_auth="kubeConfig"),
        ),
        # This repository's processors (lumigo_json_body on the logs, the enricher's owner_uid).
        AgentSettings(
            "ops",
            metrics=MetricsSettings(enabled=True),
            proxy=ProxySettings(kube_auth="kubeConfig", k8s_enricher=True),
        ),
    ],
)
def test_the_cluster_agent_config_passes_collector_validate(
    settings: AgentSettings, tmp_path: Path
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(render_agent(replace(settings, state_dir=str(tmp_path / "state"))))
    env = {"PATH": "/usr/bin:/bin", "K8S_NODE_NAME": "n", "K8S_NODE_IP": "10.0.0.1",
           "LUMIGO_CLUSTER_TOKEN": "t", "KUBECONFIG": str(tmp_path / "kubeconfig")}  # fmt: skip
    result = subprocess.run(
        [str(COLLECTOR), "validate", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
