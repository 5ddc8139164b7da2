"""Pure parts of the proxy configuration reconciler."""

from __future__ import annotations

import pytest

from controller.telemetry.config import MonitoredNamespace, ProxySettings, render
from controller.telemetry.proxy_reconciler import (
    MAX_CONFIG_BYTES,
    ConfigTooLargeError,
    ProxyTarget,
    _relevance,
    check_size,
)


def test_names_follow_the_release_fullname() -> None:
    target = ProxyTarget.for_release("lumigo-system", "lumigo-lumigo-operator")
    assert target.deployment_name == "lumigo-lumigo-operator-telemetry-proxy"
    assert target.secret_name == "lumigo-lumigo-operator-telemetry-proxy-config"


def test_a_config_too_large_for_a_secret_is_refused_with_what_to_do() -> None:
    def config(count: int) -> str:
        namespaces = [MonitoredNamespace(f"ns-{i:04d}", "u", f"t_{i:021x}") for i in range(count)]
        return render(namespaces, ProxySettings())

    check_size(config(100), 100)
    per_namespace = (len(config(100)) - len(config(0))) / 100
    too_many = int(MAX_CONFIG_BYTES / per_namespace) + 10
    with pytest.raises(ConfigTooLargeError, match="kubeEvents"):
        check_size(config(too_many), too_many)


def lumigo(active: bool, kube_events: bool = True, labels: dict[str, str] | None = None) -> dict:
    return {
        "metadata": {"name": "lumigo", "namespace": "a", "labels": labels or {}},
        "spec": {"infrastructure": {"kubeEvents": {"enabled": kube_events}}},
        "status": {
            "conditions": [
                {"type": "Active", "status": "True" if active else "False", "lastUpdateTime": "x"}
            ]
        },
    }


def test_only_changes_the_configuration_depends_on_trigger_a_pass() -> None:
    base = _relevance(lumigo(True))
    assert _relevance(lumigo(True, labels={"team": "x"})) == base
    assert _relevance(lumigo(False)) != base
    assert _relevance(lumigo(True, kube_events=False)) != base
