"""Every flag and env var the install artifacts pass to `lumigo-operator` is a declared option.

The options of each command are declared once (controller/options.py, controller/flag_table.py).
The Helm chart (rendered by bin/helm with its default values and a few value sets), the kustomize
manifests in config/ and the committed OLM bundle's CSV must pass only flags and environment
variables that exist in those tables, with values that parse as the declared type; where they
pass a duration without the user asking for one, it is the table's default, so that a default
such as 15s is written in the table and only checked elsewhere.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.flag_table import Option, declared, parse_collector_duration
from controller.options import (
    ENVIRONMENT_ONLY,
    CheckOptions,
    QuickstartOptions,
    RunOptions,
    UninstallOptions,
    WaitOptions,
    WatchdogOptions,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "lumigo-operator"
HELM = ROOT / "bin" / "helm"
CSV = ROOT / "bundle" / "manifests" / "lumigo-operator.clusterserviceversion.yaml"
OPERATOR_IMAGE = "quay.io/lumigo/lumigo-operator:"
COMMANDS: dict[str, type[Any]] = {
    "run": RunOptions,
    "webhook": RunOptions,
    "watchdog": WatchdogOptions,
    "uninstall": UninstallOptions,
    "wait-for-webhook": WaitOptions,
    "quickstart": QuickstartOptions,
    "check": CheckOptions,
}
# Chart values beyond the defaults: every optional flag of the templates is rendered by one.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything-on": {
        "debug": {"enabled": True},
        "cluster": {"name": "prod-eu-1"},
        "clusterCollection": {
            "logs": {
                "enabled": True,
                "include": [{"namespacePattern": "app-*"}],
                "exclude": [{"podPattern": "noisy-*"}],
            },
            "metrics": {"enabled": True, "essentialOnly": False, "frequency": "30s"},
        },
        "telemetryProxy": {"redaction": {"envValues": True, "annotations": ["secret\\..*"]}},
        "monitoredNamespaces": [{"namespace": "my-app", "tracingEnabled": True}],
        "lumigoToken": {"value": "t_0123456789abcdef0123"},
        "safeRollouts": {"revert": False, "revertWindow": "20m", "rolloutTimeout": "1h"},
        "injectorWebhook": {"workers": 2, "lumigoInjector": {"mode": "init-container"}},
        "metrics": {"secure": False},
    },
    "all-off": {
        "watchdog": {"enabled": False},
        "clusterCollection": {"metrics": {"enabled": False}},
        "kubeStateMetrics": {"install": False, "selector": "app=ksm"},
        "telemetryProxy": {"enricher": False},
        "uninstallHook": {"enabled": False},
    },
}


@dataclass(frozen=True)
class Invocation:
    """One container that runs `lumigo-operator`: where it comes from and what it passes."""

    source: str
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str | None], ...]  # (name, literal value or None for valueFrom)


def _pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = doc.get("spec") or {}
    if doc.get("kind") == "ClusterServiceVersion":
        for deployment in (spec.get("install") or {}).get("spec", {}).get("deployments", []):
            yield deployment["spec"]["template"]["spec"]
    elif doc.get("kind") == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]
    elif "template" in spec:
        yield spec["template"]["spec"]


def invocations(source: str, docs: list[dict[str, Any]]) -> list[Invocation]:
    found = []
    for doc in docs:
        for pod in _pod_specs(doc):
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                if not container["image"].startswith(OPERATOR_IMAGE):
                    continue
                command = container.get("command") or ["lumigo-operator", "run"]  # ENTRYPOINT
                assert command[0] == "lumigo-operator", (source, command)
                env = tuple((e["name"], e.get("value")) for e in container.get("env", []))
                where = f"{source}: {doc['kind']} {doc['metadata']['name']}/{container['name']}"
                found.append(
                    Invocation(where, command[1], (*command[2:], *container.get("args", [])), env)
                )
    return found


def render(values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    out = subprocess.run(
        [
            str(HELM),
            "template",
            "lumigo",
            str(CHART),
            "--namespace",
            "lumigo-system",
            "--values",
            str(values_file),
        ],
        check=True,
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path)},
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kustomize_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((ROOT / "config").rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return docs


def problems(call: Invocation, *, defaults: bool) -> list[str]:
    """What `call` passes that is not a declared option of its command, or not of its type;
    with `defaults`, also each duration that is not the table's default."""
    options = {opt.flag: opt for opt in declared(COMMANDS[call.command])}
    found = []
    for arg in call.args:
        name, has_value, text = arg.partition("=")
        negated = "--no-" + name.removeprefix("--no-") == name and name not in options
        opt = options.get("--" + name.removeprefix("--no-") if negated else name)
        if opt is None or not name.startswith("--"):
            found.append(f"{call.source}: {arg!r} is no option of `{call.command}`")
            continue
        if opt.is_switch or (opt.optional_value and not has_value):
            if has_value:
                found.append(f"{call.source}: {arg!r}: {opt.flag} is a switch, it takes no value")
            continue
        if negated or not has_value:
            found.append(f"{call.source}: {arg!r}: {opt.flag} takes a value (--flag=value)")
            continue
        found += _value_problems(call, opt, text, defaults=defaults)
    envs = {opt.env: opt for opt in declared(COMMANDS[call.command]) if opt.env}
    for name, value in call.env:
        if name in ENVIRONMENT_ONLY:
            continue
        if name not in envs:
            found.append(f"{call.source}: env {name} is read by no option of `{call.command}`")
        elif value is not None and not envs[name].is_switch:
            found += _value_problems(call, envs[name], value, defaults=False)
    return found


def _value_problems(call: Invocation, opt: Option, text: str, *, defaults: bool) -> list[str]:
    try:
        value = opt.value_of(text)
    except (ValueError, TypeError) as err:
        return [f"{call.source}: {opt.flag}={text!r} does not parse: {err}"]
    duration = isinstance(opt.default, float) or opt.parse is parse_collector_duration
    if defaults and duration and value != opt.default:
        return [
            f"{call.source}: {opt.flag}={text} repeats a default other than the table's "
            f"{opt.default}"
        ]
    return []


# What an artifact passes on purpose instead of the table's default: (command, flag) -> why.
CHOSEN = {
    ("quickstart", "--timeout"): "the quick-start hook waits longer for a fresh install's webhook",
}


def _checked(calls: list[Invocation], *, defaults: bool) -> list[str]:
    found = []
    for call in calls:
        found += [
            p
            for p in problems(call, defaults=defaults)
            if not any(f"{flag}=" in p and call.command == cmd for cmd, flag in CHOSEN)
            or "does not parse" in p
        ]
    return found


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_chart_passes_only_declared_options(name: str, tmp_path: Path) -> None:
    calls = invocations(f"chart[{name}]", render(VALUE_SETS[name], tmp_path))
    assert {c.command for c in calls} >= {"run", "webhook"}
    assert _checked(calls, defaults=name == "defaults") == []


def test_the_chart_renders_every_command_it_runs(tmp_path: Path) -> None:
    calls = invocations("chart", render(VALUE_SETS["everything-on"], tmp_path))
    commands = {c.command for c in calls}
    assert commands == {"run", "webhook", "watchdog", "uninstall", "quickstart"}


def test_kustomize_manifests_pass_only_declared_options() -> None:
    calls = invocations("config", kustomize_docs())
    assert {c.command for c in calls} == {"run", "webhook", "watchdog"}
    assert _checked(calls, defaults=True) == []


def test_the_bundle_csv_passes_only_declared_options() -> None:
    docs = [d for d in yaml.safe_load_all(CSV.read_text()) if d]
    calls = invocations("bundle", docs)
    assert {c.command for c in calls} == {"run", "webhook", "watchdog"}
    assert _checked(calls, defaults=True) == []


def test_the_check_finds_a_misspelt_flag_a_bad_value_and_an_unread_env_var() -> None:
    """The check bites: one broken flag name, value, repeated default and env var each."""
    call = Invocation(
        "sample",
        "run",
        (
            "--leader-elect",
            "--metrics-secure",
            "--no-revert",
            "--revert-window=10m",
            "--cluster-metric-frequency=15s",
            "--revert-restarts=three",
            "--cluster-logs=true",
            "--rollout-timeout=20m",
        ),
        (("POD_NAMESPACE", None), ("LUMIGO_INJECTION_MODE", "sideways"), ("LUMIGO_LOGLEVEL", "x")),
    )
    found = problems(call, defaults=True)
    assert len(found) == 6, found
    assert "'--cluster-metric-frequency=15s' is no option of `run`" in found[0]
    assert "--revert-restarts='three' does not parse" in found[1]
    assert "--cluster-logs is a switch" in found[2]
    assert "--rollout-timeout=20m repeats a default other than the table's 600.0" in found[3]
    assert "--injection-mode='sideways' does not parse" in found[4]
    assert "env LUMIGO_LOGLEVEL is read by no option" in found[5]
    bad_mode = Invocation("sample", "run", (), (("LUMIGO_INJECTION_MODE", "sideways"),))
    assert "does not parse" in problems(bad_mode, defaults=False)[0]


def test_every_option_is_declared_once_per_command() -> None:
    for cls in set(COMMANDS.values()):
        flags = [opt.flag for opt in declared(cls)]
        assert len(flags) == len(set(flags)), cls
        envs = [opt.env for opt in declared(cls) if opt.env]
        assert len(envs) == len(set(envs)), cls
        for opt in declared(cls):
            if not opt.is_switch and opt.default is not None and not opt.required:
                # A declared default is what its own flag would give.
                assert opt.value_of(_text(opt.default)) == opt.default, opt.flag


def _text(value: object) -> str:
    if value == -1:  # --webhook-workers' auto
        return "auto"
    if isinstance(value, float):
        return f"{value}s"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) if all(isinstance(v, str) for v in value) else "[]"
    return str(value)


def test_component_settings_take_the_same_named_options() -> None:
    """`pick` fills the manager's and the injection's settings from the options of the same
    name: a field renamed on either side would silently keep its default, so check each."""
    from controller.flag_table import pick
    from controller.runtime.manager import ManagerOptions
    from controller.webhook_serving import injection_settings

    opts = RunOptions(
        namespace="ns",
        leader_election_id="lease",
        health_probe_bind_address=":7",
        metrics_bind_address=":9",
        metrics_secure=False,
        metrics_cert_dir="/certs",
        shutdown_delay=3.0,
        operator_version="1.2.3",
        injector_image="injector:1",
        injector_pull_policy="Always",
        injection_mode="image-volume",
        telemetry_proxy_endpoint="http://proxy",
    )
    manager = pick(ManagerOptions, opts, leader_election=False)
    assert manager == ManagerOptions(
        namespace="ns",
        leader_election=False,
        leader_election_id="lease",
        health_probe_bind_address=":7",
        metrics_bind_address=":9",
        metrics_secure=False,
        metrics_cert_dir="/certs",
        shutdown_delay=3.0,
    )
    settings = injection_settings(opts)
    assert (
        settings.operator_version,
        settings.injector_image,
        settings.injector_pull_policy,
        settings.injection_mode,
        settings.telemetry_proxy_endpoint,
    ) == (
        "1.2.3",
        "injector:1",
        "Always",
        "image-volume",
        "http://proxy",
    )


def test_telemetry_settings_take_their_declared_options() -> None:
    """The proxy's, the agent's and the watchdog's settings and targets come from the options
    of the same name or of the name controller.options.RENAMED declares: each field checked."""
    import argparse

    from controller.flag_table import add_flags, pick
    from controller.options import WatchdogOptions, component_settings
    from controller.telemetry.agent import AgentTarget
    from controller.telemetry.agent_config import AgentSettings, LogFileRule, MetricsSettings
    from controller.telemetry.config import Origin, ProxySettings
    from controller.telemetry.proxy_reconciler import ProxyTarget
    from controller.telemetry.redaction import Redaction
    from controller.telemetry.watchdog import WatchdogSettings

    rule = LogFileRule("ns*", "p*", "c*")
    opts = RunOptions(
        namespace="ns1",
        log_level="debug",
        operator_version="9.9",
        cluster_name="c1",
        deployment_method="kustomize",
        telemetry_upstream_logs_endpoint="https://l.example",
        telemetry_upstream_metrics_endpoint="https://m.example",
        telemetry_heartbeat_interval="2h",
        telemetry_redact_env_values=True,
        telemetry_redact_annotations=("a/*",),
        telemetry_proxy_enricher=True,
        telemetry_proxy_deployment="pd",
        telemetry_proxy_config_secret="cfg",
        cluster_agent_daemonset="ds",
        cluster_token_secret="ts",
        cluster_token_key="tk",
        pod_logs_dir="/x",
        cluster_agent_state_dir="/y",
        node_exporter_image="ne:1",
        cluster_logs=False,
        cluster_logs_include=(rule,),
        cluster_logs_exclude=(rule, rule),
        cluster_metrics=True,
        cluster_metrics_frequency="20s",
        cluster_metrics_essential_only=True,
        cluster_metrics_essential_names=("up",),
        kubelet_port=1234,
        kube_state_metrics_selector="a=b",
    )
    proxy = component_settings(
        ProxySettings,
        opts,
        upstream_endpoint="https://u.example",
        origin=pick(Origin, opts),
        redaction=component_settings(Redaction, opts),
    )
    assert proxy == ProxySettings(
        upstream_endpoint="https://u.example",
        upstream_logs_endpoint="https://l.example",
        upstream_metrics_endpoint="https://m.example",
        origin=Origin(cluster_name="c1", operator_version="9.9", deployment_method="kustomize"),
        lease_namespace="ns1",
        heartbeat_interval="2h",
        redaction=Redaction(env_values=True, annotations=("a/*",)),
        k8s_enricher=True,
    )
    assert proxy.log_level == "info"  # the proxy's own, not the operator's --log-level
    assert component_settings(ProxyTarget, opts) == ProxyTarget(
        namespace="ns1", secret_name="cfg", deployment_name="pd"
    )
    assert component_settings(AgentTarget, opts) == AgentTarget(
        namespace="ns1",
        daemonset_name="ds",
        proxy_deployment="pd",
        token_secret="ts",
        token_key="tk",
        pod_logs_dir="/x",
        state_dir="/y",
        node_exporter_image="ne:1",
    )
    metrics = component_settings(MetricsSettings, opts)
    assert metrics == MetricsSettings(
        enabled=True,
        interval="20s",
        essential_only=True,
        essential=("up",),
        kubelet_port=1234,
        upstream_endpoint="https://m.example",
        kube_state_metrics_selector="a=b",
    )
    assert component_settings(AgentSettings, opts, metrics=metrics, proxy=proxy) == AgentSettings(
        operator_namespace="ns1",
        logs=False,
        metrics=metrics,
        include=(rule,),
        exclude=(rule, rule),
        proxy=proxy,
    )
    parser = argparse.ArgumentParser()
    add_flags(parser, WatchdogOptions)
    args = parser.parse_args(
        [
            "--namespace=w",
            "--token-secret=s",
            "--token-key=k",
            "--interval=3s",
            "--metrics-interval=4s",
            "--top-interval=5s",
            "--cluster-name=cc",
        ]
    )
    assert pick(WatchdogSettings, args, logs_endpoint="L", own_pod="me") == WatchdogSettings(
        namespace="w",
        logs_endpoint="L",
        token_secret="s",
        token_key="k",
        interval=3.0,
        metrics_interval=4.0,
        top_interval=5.0,
        cluster_name="cc",
        own_pod="me",
        metrics_endpoint=args.metrics_endpoint,
    )


def test_pick_refuses_a_declared_name_that_is_no_field_or_no_option() -> None:
    from controller.flag_table import pick
    from controller.telemetry.config import Origin

    with pytest.raises(TypeError, match="no field"):
        pick(Origin, RunOptions(), {"cluster": "cluster_name"})
    with pytest.raises(TypeError, match="no option"):
        pick(Origin, RunOptions(), {"cluster_name": "kubernetes_cluster_name"})
