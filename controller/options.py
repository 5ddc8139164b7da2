"""The options of every `lumigo-operator` command, each declared once (`controller.flag_table`).

A field declared with `option(default, consumer, help, env=...)` is the flag `--<field-name>`
with that environment-variable fallback; `RunOptions` is what `run` and `webhook` take,
`WatchdogOptions`, `UninstallOptions`, `WaitOptions` and `QuickstartOptions` the other commands'.
The names match the manifests in config/, the Helm chart and the OLM bundle
(tests/unit/test_declared_options.py checks every flag and env var they pass against these
tables); the env vars in brackets in `--help` are the reference operator's where one existed.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from api import __version__, constants
from controller.flag_table import (
    add_flags,
    from_args,
    option,
    parse_bool,
    parse_collector_duration,
    parse_duration,
    parse_name_list,
    parse_names,
    pick,
)
from controller.telemetry.agent import AgentTarget
from controller.telemetry.agent_config import (
    DEFAULT_FREQUENCY,
    ESSENTIAL_METRICS,
    KUBE_STATE_METRICS_SELECTOR,
    AgentSettings,
    LogFileRule,
    MetricsSettings,
)
from controller.telemetry.config import ProxySettings
from controller.telemetry.proxy_reconciler import ProxyTarget
from controller.telemetry.redaction import InvalidRedactionError, Redaction, parse_patterns
from kube.objects import json_list
from webhook.pod_injection import InitContainerResources

T = TypeVar("T")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LOG_LEVELS = ("debug", "info", "warning", "error")
OLM_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # noqa: S108 - where OLM mounts it
_FREQUENCY_SECONDS = parse_duration(DEFAULT_FREQUENCY)  # the watchdog's passes
MAX_WEBHOOK_WORKERS = 64  # admission processes next to the manager, `--webhook-workers`


def _service_account_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return "lumigo-system"


def default_namespace() -> str:
    """$POD_NAMESPACE, else the pod's service-account namespace, else lumigo-system."""
    return os.environ.get("POD_NAMESPACE") or _service_account_namespace()


def parse_log_rules(text: str) -> tuple[LogFileRule, ...]:
    """A JSON list of {namespacePattern, podPattern, containerPattern} ('' = none)."""
    try:
        return tuple(LogFileRule.from_json(entry) for entry in json_list(text, "log rules"))
    except ValueError as err:  # InvalidLogRuleError is one
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_redact_annotations(text: str) -> tuple[str, ...]:
    try:
        return parse_patterns(text)
    except InvalidRedactionError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_webhook_workers(text: str) -> int:
    """'auto' -> -1 (decided at start-up from the CPU limit); otherwise a count >= 0."""
    if text.strip().lower() in ("", "auto"):
        return -1
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid webhook worker count {text!r}: expected 'auto' or a number"
        ) from None
    if not 0 <= count <= MAX_WEBHOOK_WORKERS:
        raise argparse.ArgumentTypeError(
            f"webhook workers must be 'auto' or 0-{MAX_WEBHOOK_WORKERS}, not {count}"
        )
    return count


PROCESS = "process"
PROBES = "probes and metrics"
ADMISSION = "admission"
CERTIFICATES = "certificates (--cert-mode=self)"
INJECTION = "injection"
CONTROLLER = "Lumigo controller"
PROXY = "telemetry proxy"
AGENT = "cluster agent"


def _namespace() -> str:
    return option(
        "lumigo-system",
        PROCESS,
        "the operator's namespace",
        env="POD_NAMESPACE",
        env_empty_is_unset=True,
        dynamic_default=_service_account_namespace,
    )


def _kubeconfig() -> str | None:
    return option(None, PROCESS, env="KUBECONFIG", parse=str, env_empty_is_unset=True)


def _operator_version() -> str:
    return option(__version__, PROCESS, env="LUMIGO_OPERATOR_VERSION")


def _log_rules(which: str) -> tuple[LogFileRule, ...]:
    return option(
        (),
        AGENT,
        f"containers whose log files are {which}d: a JSON list of {{namespacePattern, "
        "podPattern, containerPattern} globs",
        env=f"LUMIGO_CLUSTER_LOGS_{which.upper()}",
        parse=parse_log_rules,
    )


def _token_secret(consumer: str, where: str) -> str:
    return option(
        constants.DEFAULT_TOKEN_SECRET,
        consumer,
        f"the Secret, in {where}, with the token of cluster collection",
        env="LUMIGO_CLUSTER_TOKEN_SECRET",
    )


@dataclass
class RunOptions:
    """`lumigo-operator run` and `lumigo-operator webhook`."""

    namespace: str = _namespace()
    kubeconfig: str | None = _kubeconfig()
    log_level: str = option("info", PROCESS, env="LUMIGO_LOG_LEVEL", choices=LOG_LEVELS)
    operator_version: str = _operator_version()

    metrics_bind_address: str = option(":8080", PROBES, "/metrics; '0' disables")
    metrics_secure: bool = option(
        True,
        PROBES,
        "serve /metrics over HTTPS, only to bearer tokens the API server accepts whose user may "
        "get the non-resource URL /metrics (e.g. bound to the metrics-reader ClusterRole); "
        "false: plain HTTP without authentication, for a trusted network",
        env="LUMIGO_METRICS_SECURE",
        parse=parse_bool,
        optional_value=True,
    )
    metrics_cert_dir: str | None = option(
        None,
        PROBES,
        "tls.crt and tls.key for secure /metrics (followed while serving); unset: a "
        "self-signed certificate generated in memory at start-up",
        env="LUMIGO_METRICS_CERT_DIR",
        parse=str,
        env_empty_is_unset=True,
    )
    health_probe_bind_address: str = option(":8081", PROBES)
    shutdown_delay: float = option(
        5.0,
        PROBES,
        "after SIGTERM, report not ready and keep serving this long before stopping, so that "
        "admissions still routed to this pod succeed; 0 when not behind a Service",
        env="LUMIGO_SHUTDOWN_DELAY",
    )
    leader_elect: bool = option(
        True, PROBES, "one active controller per cluster", env="LUMIGO_LEADER_ELECT"
    )
    leader_election_id: str = option(constants.LEADER_ELECTION_ID, PROBES)

    webhook_host: str = option("0.0.0.0", ADMISSION)  # noqa: S104 - reached through a Service
    webhook_port: int = option(9443, ADMISSION, env="WEBHOOK_PORT")
    webhook_workers: int = option(
        -1,
        ADMISSION,
        "processes serving admissions, each with its own Lumigo cache: 'auto' (the container's "
        "CPU limit, rounded up), a number, or 0 to serve in the manager process",
        env="LUMIGO_WEBHOOK_WORKERS",
        parse=parse_webhook_workers,
    )
    # Not flags: what the workers' supervisor gives each worker (kube.http.memory).
    webhook_body_budget: int = 32 * 1024 * 1024
    webhook_large_body_slots: str = ""
    serve_webhooks: bool = option(
        True,
        ADMISSION,
        "`run` also serves admissions; --no-serve-webhooks when a `lumigo-operator webhook` "
        "Deployment serves them under its own identity",
        env="LUMIGO_SERVE_WEBHOOKS",
    )
    webhook_service: str = option("lumigo-lumigo-operator-webhooks-service", ADMISSION)
    webhook_configurations: list[str] = option(
        [],
        ADMISSION,
        "comma-separated MutatingWebhookConfiguration names whose caBundle we own",
        parse=parse_name_list,
    )

    cert_mode: str = option(
        "self",
        CERTIFICATES,
        "self: keep CA + serving cert in a Secret and own the caBundle (Helm, kubectl); files: "
        "serve --cert-dir, written by someone else (OLM)",
        env="LUMIGO_CERT_MODE",
        choices=("self", "files"),
    )
    cert_dir: Path = option(OLM_CERT_DIR, CERTIFICATES)
    cert_secret: str = option(
        "lumigo-lumigo-operator-lumigo-injector-webhook-certs",
        CERTIFICATES,
        "self mode: the Secret with the CA (its key included), written and read by the manager "
        "only",
    )
    serving_cert_secret: str = option(
        "",
        CERTIFICATES,
        "self mode: the Secret admissions are served from (serving pair and CA certificates, "
        "no CA key), written by the manager (default: <cert-secret>-serving)",
    )
    webhook_cert_extra_sans: list[str] = option(
        [],
        CERTIFICATES,
        "extra DNS names / IP addresses in the serving certificate (e.g. 127.0.0.1 for a url: "
        "client config in a local cluster)",
        parse=parse_name_list,
    )
    ca_validity: float = option(10 * 365 * 86400.0, CERTIFICATES)
    cert_validity: float = option(365 * 86400.0, CERTIFICATES)
    ca_lookahead: float = option(90 * 86400.0, CERTIFICATES)
    cert_lookahead: float = option(30 * 86400.0, CERTIFICATES)
    cert_check_interval: float = option(3600.0, CERTIFICATES)

    injector_image: str = option(
        constants.DEFAULT_INJECTOR_IMAGE, INJECTION, env="LUMIGO_INJECTOR_IMAGE"
    )
    injector_pull_policy: str = option(
        constants.DEFAULT_INJECTOR_PULL_POLICY,
        INJECTION,
        "the init container's imagePullPolicy",
        env="LUMIGO_INJECTOR_PULL_POLICY",
        choices=constants.PULL_POLICIES,
    )
    injection_mode: str = option(
        constants.INJECTION_MODE_AUTO,
        INJECTION,
        "init-container: copy the payload into an emptyDir; image-volume: mount the injector "
        "image read-only (Kubernetes >= 1.35 with containerd >= 2.2 or CRI-O >= 1.33 on every "
        "node); auto: image-volume when the API server and every node support it",
        env="LUMIGO_INJECTION_MODE",
        choices=(constants.INJECTION_MODE_AUTO, *constants.INJECTION_MODES),
    )
    init_resources: InitContainerResources = option(
        InitContainerResources(),
        INJECTION,
        "the lumigo-injector init container's resources, e.g. "
        "requests.cpu=50m,requests.memory=64Mi,limits.cpu=500m,limits.memory=128Mi (any of the "
        "four; the others keep their defaults)",
        env="LUMIGO_INIT_RESOURCES",
        parse=InitContainerResources.parse,
    )
    init_container_user: str = option(
        constants.INIT_USER_AUTO,
        INJECTION,
        "who the lumigo-injector init container runs as. fsgroup: the pod's fsGroup, else 1234 "
        "(the reference); unset: no user of its own, so the pod's or the one the platform "
        "assigns (OpenShift's SCCs refuse any UID outside the namespace's range); auto: unset "
        "where the API server serves security.openshift.io, else fsgroup",
        env="LUMIGO_INIT_CONTAINER_USER",
        choices=(constants.INIT_USER_AUTO, *constants.INIT_USERS),
    )
    injection_mode_configmap: str = option(
        "",
        INJECTION,
        "with --injection-mode=auto and a separate webhook: the ConfigMap (operator namespace) "
        "where the manager publishes the mode it decided and the webhook reads it",
        env="LUMIGO_INJECTION_MODE_CONFIGMAP",
    )
    telemetry_proxy_endpoint: str = option(
        constants.DEFAULT_TELEMETRY_PROXY_SERVICE,
        INJECTION,
        "base URL of the telemetry proxy Service",
        env="TELEMETRY_PROXY_OTLP_SERVICE",
    )

    resync_period: float = option(30.0, CONTROLLER)
    error_requeue: float = 5.0  # not a flag
    inject_concurrency: int = option(8, CONTROLLER)
    workers: int = option(4, CONTROLLER, "Lumigo reconcile workers")
    rollout_timeout: float = option(
        600.0,
        CONTROLLER,
        "a rollout the operator started holds a slot of maxConcurrentRollouts at most this long",
    )
    revert: bool = option(
        True,
        CONTROLLER,
        "revert the instrumentation of a workload whose new pods fail while the previous ones "
        "were healthy",
    )
    revert_window: float = option(
        600.0, CONTROLLER, "how long after instrumenting a workload its new pods are watched"
    )
    revert_restarts: int = option(
        3, CONTROLLER, "container restarts of a new pod that mean it is crash-looping"
    )
    revert_unready_after: float = option(
        300.0, CONTROLLER, "how long a started new pod may stay not ready"
    )

    telemetry_proxy_deployment: str = option(
        "lumigo-lumigo-operator-telemetry-proxy",
        PROXY,
        "the telemetry proxy Deployment the operator configures ('' to disable)",
    )
    telemetry_proxy_config_secret: str = option(
        "lumigo-lumigo-operator-telemetry-proxy-config", PROXY
    )
    telemetry_upstream_endpoint: str = option(
        "", PROXY, "where the proxy sends traces ('' = Lumigo's)", env="LUMIGO_ENDPOINT"
    )
    telemetry_upstream_logs_endpoint: str = option(
        "", PROXY, "where the proxy sends logs and Kubernetes events", env="LUMIGO_LOGS_ENDPOINT"
    )
    telemetry_heartbeat_interval: str = option(
        "1h",
        PROXY,
        "how often the proxy sends each monitored namespace's Lumigo spec and status (a "
        "collector duration: 1h, 10m, 30s)",
        parse=parse_collector_duration,
    )
    cluster_name: str = option("", PROXY, env="KUBERNETES_CLUSTER_NAME")
    deployment_method: str = option("Helm", PROXY, env="LUMIGO_DEPLOYMENT_METHOD")
    # The proxy image has this repository's lumigo_k8s_enricher (hack/tools/otelcol).
    telemetry_proxy_enricher: bool = option(
        False,
        PROXY,
        "the telemetry proxy's image is this operator's collector distribution (with the "
        "lumigo_k8s_enricher processor): every Kubernetes Event gets its root owner read from "
        "the API and the object version it names is sent",
        env="LUMIGO_TELEMETRY_PROXY_ENRICHER",
    )
    telemetry_redact_env_values: bool = option(
        False,
        PROXY,
        "replace the literal env values of the pods and pod templates the object collection "
        "sends upstream (and in their last-applied-configuration) by [REDACTED]",
        env="LUMIGO_TELEMETRY_REDACT_ENV_VALUES",
    )
    telemetry_redact_annotations: tuple[str, ...] = option(
        (),
        PROXY,
        "annotations whose value the object collection sends as [REDACTED]: a JSON list of RE2 "
        "regular expressions, each matched against the whole key",
        env="LUMIGO_TELEMETRY_REDACT_ANNOTATIONS",
        parse=parse_redact_annotations,
    )

    cluster_logs: bool = option(
        False,
        AGENT,
        "run the cluster agent, a DaemonSet that sends the container log files of every node",
        env="LUMIGO_CLUSTER_LOGS",
    )
    cluster_logs_include: tuple[LogFileRule, ...] = _log_rules("include")
    cluster_logs_exclude: tuple[LogFileRule, ...] = _log_rules("exclude")
    cluster_agent_daemonset: str = option("lumigo-lumigo-operator-cluster-agent", AGENT)
    cluster_token_secret: str = _token_secret(AGENT, "the operator's namespace")
    cluster_token_key: str = option(constants.DEFAULT_TOKEN_KEY, AGENT)
    pod_logs_dir: str = option("/var/log/pods", AGENT, "the kubelet's podLogsDir on the nodes")
    cluster_agent_state_dir: str = option(
        "/var/lib/lumigo-operator/cluster-agent",
        AGENT,
        "where each node keeps the agent's read offsets and export queue",
    )
    cluster_metrics: bool = option(
        False,
        AGENT,
        "the cluster agent also sends each node's kubelet metrics (node, pods, containers)",
        env="LUMIGO_CLUSTER_METRICS",
    )
    cluster_metrics_frequency: str = option(
        DEFAULT_FREQUENCY,
        AGENT,
        "how often the kubelets are scraped (a collector duration)",
        parse=parse_collector_duration,
    )
    cluster_metrics_essential_only: bool = option(
        False,
        AGENT,
        "send only --cluster-metrics-essential-names",
        env="LUMIGO_CLUSTER_METRICS_ESSENTIAL_ONLY",
    )
    cluster_metrics_essential_names: tuple[str, ...] = option(
        ESSENTIAL_METRICS,
        AGENT,
        "comma-separated metric names kept by --cluster-metrics-essential-only",
        parse=parse_names,
    )
    kubelet_port: int = option(10250, AGENT, "the kubelets' API port")
    node_exporter_image: str = option(
        "",
        AGENT,
        "node-exporter, run in each agent pod for the node's metrics ('' = none)",
        env="LUMIGO_NODE_EXPORTER_IMAGE",
    )
    node_provider_ids: bool = option(
        True,
        AGENT,
        "annotate each Node with its spec.providerID so that telemetry carries k8s.provider.id",
        env="LUMIGO_NODE_PROVIDER_IDS",
    )
    kube_state_metrics_selector: str = option(
        KUBE_STATE_METRICS_SELECTOR,
        AGENT,
        "label selector of the kube-state-metrics pods each node's agent scrapes on its node "
        "('' = none)",
        env="LUMIGO_KUBE_STATE_METRICS_SELECTOR",
    )
    telemetry_upstream_metrics_endpoint: str = option(
        "",
        AGENT,
        "where cluster metrics go ('' = the traces endpoint)",
        env="LUMIGO_METRICS_ENDPOINT",
    )


# The components' settings are filled by `component_settings` from the same-named options,
# except these fields, whose option has another name (None: no option fills it). The one place
# a setting's name differs from its option's.
RENAMED: dict[type, dict[str, str | None]] = {
    ProxyTarget: {
        "secret_name": "telemetry_proxy_config_secret",
        "deployment_name": "telemetry_proxy_deployment",
    },
    ProxySettings: {
        "upstream_logs_endpoint": "telemetry_upstream_logs_endpoint",
        "upstream_metrics_endpoint": "telemetry_upstream_metrics_endpoint",
        "lease_namespace": "namespace",
        "heartbeat_interval": "telemetry_heartbeat_interval",
        "k8s_enricher": "telemetry_proxy_enricher",
        "log_level": None,  # the proxy's, not the operator's --log-level
    },
    Redaction: {
        "env_values": "telemetry_redact_env_values",
        "annotations": "telemetry_redact_annotations",
    },
    AgentTarget: {
        "daemonset_name": "cluster_agent_daemonset",
        "proxy_deployment": "telemetry_proxy_deployment",
        "token_secret": "cluster_token_secret",
        "token_key": "cluster_token_key",
        "state_dir": "cluster_agent_state_dir",
    },
    AgentSettings: {
        "operator_namespace": "namespace",
        "logs": "cluster_logs",
        "include": "cluster_logs_include",
        "exclude": "cluster_logs_exclude",
    },
    MetricsSettings: {
        "enabled": "cluster_metrics",
        "interval": "cluster_metrics_frequency",
        "essential_only": "cluster_metrics_essential_only",
        "essential": "cluster_metrics_essential_names",
        "upstream_endpoint": "telemetry_upstream_metrics_endpoint",
    },
}


def component_settings(cls: type[T], opts: object, **given: object) -> T:
    """A component's settings `cls` from the options `opts` (see RENAMED), `given` aside."""
    return pick(cls, opts, RENAMED.get(cls), **given)


def serving_secret(opts: RunOptions) -> str:
    """The Secret admission is served from: the serving pair and the CA certificates, never
    the CA key (which stays in --cert-secret, read by the manager only)."""
    return opts.serving_cert_secret or f"{opts.cert_secret}-serving"


WATCHDOG = "watchdog"


@dataclass
class WatchdogOptions:
    """`lumigo-operator watchdog` (controller.telemetry.watchdog_cli)."""

    namespace: str = _namespace()
    kubeconfig: str | None = _kubeconfig()
    interval: float = option(_FREQUENCY_SECONDS, WATCHDOG, "how often pods and events are read")
    metrics_interval: float = option(
        _FREQUENCY_SECONDS, WATCHDOG, "how often the pods' own metrics are scraped"
    )
    logs_endpoint: str = option(
        "", WATCHDOG, "where the records go ('' = Lumigo's)", env="LUMIGO_LOGS_ENDPOINT"
    )
    metrics_endpoint: str = option(
        "",
        WATCHDOG,
        "where the containers' resource-usage gauges go ('' = Lumigo's; 'none' = not sent)",
        env="LUMIGO_METRICS_ENDPOINT",
    )
    top_interval: float = option(
        _FREQUENCY_SECONDS,
        WATCHDOG,
        "how often the containers' resource usage (metrics.k8s.io) is read and sent",
    )
    cluster_name: str = option("", WATCHDOG, env="KUBERNETES_CLUSTER_NAME")
    token_secret: str = _token_secret(WATCHDOG, "--namespace")
    token_key: str = option(constants.DEFAULT_TOKEN_KEY, WATCHDOG)
    operator_version: str = _operator_version()
    log_level: str = option("info", PROCESS, env="LUMIGO_LOG_LEVEL")


# Environment variables our processes read that are no flag's fallback: name -> who reads it.
ENVIRONMENT_ONLY = {
    "POD_NAME": "watchdog: its own pod (controller.telemetry.watchdog_cli)",
    "LUMIGO_MEMORY_LIMIT": "admission workers: the container's memory limit in bytes "
    "(kube.http.memory)",
}


UNINSTALL = "uninstall"
HOOKS = "Helm hooks"


@dataclass
class UninstallOptions:
    """`lumigo-operator uninstall` (the Helm pre-delete hook)."""

    kubeconfig: str | None = option(None, PROCESS, parse=str)  # KubeClient reads $KUBECONFIG
    timeout: float = option(120.0, UNINSTALL, "how long to wait for finalizers (default 120s)")
    log_level: str = option("info", PROCESS, env="LUMIGO_LOG_LEVEL")
    operator_version: str = option(__version__, PROCESS)


@dataclass
class WaitOptions:
    """`lumigo-operator wait-for-webhook` (the Helm quick-start hook's wait)."""

    namespace: str = option(
        "", HOOKS, "a namespace the webhook serves (a Lumigo goes there)", required=True
    )
    kubeconfig: str | None = option(None, PROCESS, parse=str)
    timeout: float = option(180.0, HOOKS)
    log_level: str = option("info", PROCESS)


@dataclass
class CheckOptions:
    """`lumigo-operator check` (the chart's `helm test`)."""

    namespace: str = option(
        "", HOOKS, "the operator's namespace (a dry-run Lumigo goes there)", required=True
    )
    proxy_url: str = option(
        "", HOOKS, "the telemetry proxy's Service URL, as instrumented pods use it", required=True
    )
    kubeconfig: str | None = option(None, PROCESS, parse=str)
    timeout: float = option(60.0, HOOKS, "how long each check may wait for an answer")
    log_level: str = option("info", PROCESS)


@dataclass
class QuickstartOptions:
    """`lumigo-operator quickstart` (the Helm post-install/post-upgrade hook)."""

    settings: str = option(
        "",
        HOOKS,
        'JSON list: [{"namespace": "my-app", "tracingEnabled": true, "loggingEnabled": true}]',
        required=True,
    )
    release: str = option("", HOOKS, "the Helm release creating them", required=True)
    secret_name: str = option(constants.DEFAULT_TOKEN_SECRET, HOOKS)
    secret_key: str = option(constants.DEFAULT_TOKEN_KEY, HOOKS)
    kubeconfig: str | None = option(None, PROCESS, parse=str)
    timeout: float = option(180.0, HOOKS, "how long to wait for the Lumigo webhook")
    log_level: str = option("info", PROCESS)


def run_options(args: argparse.Namespace) -> RunOptions:
    return from_args(RunOptions, args)


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `run` and `webhook`."""
    add_flags(parser, RunOptions)
