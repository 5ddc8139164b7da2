"""Command-line flags of `lumigo-operator run`, each with its environment-variable fallback.

The names match the manifests in config/, the Helm chart and the OLM bundle; the env vars in
brackets in `--help` are the reference operator's where one existed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api import __version__, constants
from controller.telemetry.agent_config import (
    ESSENTIAL_METRICS,
    KUBE_STATE_METRICS_SELECTOR,
    InvalidLogRuleError,
    LogFileRule,
)
from controller.telemetry.redaction import InvalidRedactionError, parse_patterns

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'90s' -> 90.0, '2m' -> 120.0, '365d', '1.5h', '250ms'; a bare number means seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with an optional unit ms, s, m, h or d"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def _switch(a: Callable[..., Any], flag: str, env: str, default: bool, help: str) -> None:
    """An on/off flag (`--x`/`--no-x`) whose default comes from `env` when it is set."""
    a(
        flag,
        action=argparse.BooleanOptionalAction,
        default=_env(env, str(default).lower()).lower() == "true",
        help=help,
    )


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def default_namespace() -> str:
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return "lumigo-system"


@dataclass
class RunOptions:
    namespace: str = "lumigo-system"
    kubeconfig: str | None = None
    metrics_bind_address: str = ":8080"
    metrics_secure: bool = True
    metrics_cert_dir: str | None = None
    health_probe_bind_address: str = ":8081"
    webhook_host: str = "0.0.0.0"  # noqa: S104 - the API server reaches us through a Service
    webhook_port: int = 9443
    webhook_workers: int = -1  # processes serving admissions; -1: the container's CPU limit
    # Not flags: what the workers' supervisor gives each worker (webhook.admission.memory).
    webhook_body_budget: int = 32 * 1024 * 1024
    webhook_large_body_slots: str = ""
    cert_mode: str = "self"
    cert_dir: Path = Path("/tmp/k8s-webhook-server/serving-certs")  # noqa: S108 - OLM's path
    cert_secret: str = "lumigo-lumigo-operator-lumigo-injector-webhook-certs"
    serving_cert_secret: str = ""  # "": <cert_secret>-serving
    serve_webhooks: bool = True  # False: the manager of a split install (`webhook` serves)
    injection_mode_configmap: str = ""  # where the manager publishes the `auto` decision
    webhook_service: str = "lumigo-lumigo-operator-webhooks-service"
    webhook_configurations: list[str] = field(default_factory=list)
    webhook_cert_extra_sans: list[str] = field(default_factory=list)
    ca_validity: float = 10 * 365 * 86400.0
    cert_validity: float = 365 * 86400.0
    ca_lookahead: float = 90 * 86400.0
    cert_lookahead: float = 30 * 86400.0
    cert_check_interval: float = 3600.0
    shutdown_delay: float = 5.0
    injector_image: str = constants.DEFAULT_INJECTOR_IMAGE
    injector_pull_policy: str = constants.DEFAULT_INJECTOR_PULL_POLICY
    injection_mode: str = constants.INJECTION_MODE_AUTO
    telemetry_proxy_endpoint: str = constants.DEFAULT_TELEMETRY_PROXY_SERVICE
    leader_elect: bool = True
    leader_election_id: str = constants.LEADER_ELECTION_ID
    log_level: str = "info"
    operator_version: str = __version__
    resync_period: float = 30.0
    error_requeue: float = 5.0
    inject_concurrency: int = 8
    workers: int = 4
    rollout_timeout: float = 600.0
    revert: bool = True
    revert_window: float = 600.0
    revert_restarts: int = 3
    revert_unready_after: float = 300.0
    telemetry_proxy_deployment: str = "lumigo-lumigo-operator-telemetry-proxy"
    telemetry_proxy_config_secret: str = "lumigo-lumigo-operator-telemetry-proxy-config"
    telemetry_upstream_endpoint: str = ""
    telemetry_upstream_logs_endpoint: str = ""
    telemetry_heartbeat_interval: str = "1h"
    telemetry_redact_env_values: bool = False
    # The proxy image has this repository's lumigo_k8s_enricher (hack/tools/otelcol).
    telemetry_proxy_enricher: bool = False
    telemetry_redact_annotations: tuple[str, ...] = ()
    cluster_name: str = ""
    deployment_method: str = "Helm"
    cluster_logs: bool = False
    cluster_logs_include: tuple[LogFileRule, ...] = ()
    cluster_logs_exclude: tuple[LogFileRule, ...] = ()
    cluster_agent_daemonset: str = "lumigo-lumigo-operator-cluster-agent"
    cluster_token_secret: str = "lumigo-credentials"
    cluster_token_key: str = "token"
    pod_logs_dir: str = "/var/log/pods"
    cluster_agent_state_dir: str = "/var/lib/lumigo-operator/cluster-agent"
    cluster_metrics: bool = False
    cluster_metrics_frequency: str = "15s"
    cluster_metrics_essential_only: bool = False
    cluster_metrics_essential_names: tuple[str, ...] = ESSENTIAL_METRICS
    kubelet_port: int = 10250
    node_exporter_image: str = ""
    kube_state_metrics_selector: str = KUBE_STATE_METRICS_SELECTOR
    node_provider_ids: bool = True
    telemetry_upstream_metrics_endpoint: str = ""


def serving_secret(opts: RunOptions) -> str:
    """The Secret admission is served from: the serving pair and the CA certificates, never
    the CA key (which stays in --cert-secret, read by the manager only)."""
    return opts.serving_cert_secret or f"{opts.cert_secret}-serving"


def parse_log_rules(text: str) -> tuple[LogFileRule, ...]:
    """A JSON list of {namespacePattern, podPattern, containerPattern} ('' = none)."""
    if not text.strip():
        return ()
    try:
        entries = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid log rules {text!r}: not JSON ({err})") from None
    if not isinstance(entries, list):
        raise argparse.ArgumentTypeError(f"invalid log rules {text!r}: expected a JSON list")
    try:
        return tuple(LogFileRule.from_json(entry) for entry in entries)
    except InvalidLogRuleError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_bool(text: str) -> bool:
    """'true'/'false' (and 1/0, yes/no, on/off), as Go's flag package reads a bool."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on", "t"):
        return True
    if value in ("false", "0", "no", "off", "f"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}: expected true or false")


def parse_redact_annotations(text: str) -> tuple[str, ...]:
    try:
        return parse_patterns(text)
    except InvalidRedactionError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _webhook_workers(text: str) -> int:
    """'auto' -> -1 (decided at start-up from the CPU limit); otherwise a count >= 0."""
    if text.strip().lower() in ("", "auto"):
        return -1
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid webhook worker count {text!r}: expected 'auto' or a number"
        ) from None
    if not 0 <= count <= 64:
        raise argparse.ArgumentTypeError(f"webhook workers must be 'auto' or 0-64, not {count}")
    return count


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    d = RunOptions()
    a = parser.add_argument
    a("--namespace", default=default_namespace(), help="the operator's namespace [POD_NAMESPACE]")
    a("--kubeconfig", default=os.environ.get("KUBECONFIG") or None, help="[KUBECONFIG]")
    a("--metrics-bind-address", default=d.metrics_bind_address, help="/metrics; '0' disables")
    a(
        "--metrics-secure",
        type=parse_bool,
        nargs="?",
        const=True,
        default=parse_bool(_env("LUMIGO_METRICS_SECURE", str(d.metrics_secure))),
        help="serve /metrics over HTTPS, only to bearer tokens the API server accepts whose user "
        "may get the non-resource URL /metrics (e.g. bound to the metrics-reader ClusterRole); "
        "false: plain HTTP without authentication, for a trusted network "
        "[LUMIGO_METRICS_SECURE]",
    )
    a(
        "--metrics-cert-dir",
        default=_env("LUMIGO_METRICS_CERT_DIR", "") or None,
        help="tls.crt and tls.key for secure /metrics (followed while serving); unset: a "
        "self-signed certificate generated in memory at start-up [LUMIGO_METRICS_CERT_DIR]",
    )
    a("--health-probe-bind-address", default=d.health_probe_bind_address)
    a("--webhook-host", default=d.webhook_host)
    a("--webhook-port", type=int, default=int(_env("WEBHOOK_PORT", str(d.webhook_port))))
    a(
        "--webhook-workers",
        type=_webhook_workers,
        default=_env("LUMIGO_WEBHOOK_WORKERS", "auto"),  # a string default goes through `type`
        help="processes serving admissions, each with its own Lumigo cache: 'auto' (the "
        "container's CPU limit, rounded up), a number, or 0 to serve in the manager process "
        "[LUMIGO_WEBHOOK_WORKERS]",
    )
    a(
        "--cert-mode",
        choices=["self", "files"],
        default=_env("LUMIGO_CERT_MODE", d.cert_mode),
        help="self: keep CA + serving cert in a Secret and own the caBundle (Helm, kubectl); "
        "files: serve --cert-dir, written by someone else (OLM) [LUMIGO_CERT_MODE]",
    )
    a("--cert-dir", type=Path, default=d.cert_dir)
    a(
        "--cert-secret",
        default=d.cert_secret,
        help="self mode: the Secret with the CA (its key included), written and read by the "
        "manager only",
    )
    a(
        "--serving-cert-secret",
        default=d.serving_cert_secret,
        help="self mode: the Secret admissions are served from (serving pair and CA "
        "certificates, no CA key), written by the manager (default: <cert-secret>-serving)",
    )
    _switch(
        a,
        "--serve-webhooks",
        "LUMIGO_SERVE_WEBHOOKS",
        True,
        "`run` also serves admissions; --no-serve-webhooks when a `lumigo-operator "
        "webhook` Deployment serves them under its own identity [LUMIGO_SERVE_WEBHOOKS]",
    )
    a(
        "--injection-mode-configmap",
        default=_env("LUMIGO_INJECTION_MODE_CONFIGMAP", d.injection_mode_configmap),
        help="with --injection-mode=auto and a separate webhook: the ConfigMap (operator "
        "namespace) where the manager publishes the mode it decided and the webhook reads it "
        "[LUMIGO_INJECTION_MODE_CONFIGMAP]",
    )
    a("--webhook-service", default=d.webhook_service)
    a(
        "--webhook-configurations",
        type=lambda s: [x for x in s.split(",") if x],
        default=[],
        help="comma-separated MutatingWebhookConfiguration names whose caBundle we own",
    )
    a(
        "--webhook-cert-extra-sans",
        type=lambda s: [x for x in s.split(",") if x],
        default=[],
        help="extra DNS names / IP addresses in the serving certificate (e.g. 127.0.0.1 for a "
        "url: client config in a local cluster)",
    )
    a("--ca-validity", type=parse_duration, default=d.ca_validity)
    a("--cert-validity", type=parse_duration, default=d.cert_validity)
    a("--ca-lookahead", type=parse_duration, default=d.ca_lookahead)
    a("--cert-lookahead", type=parse_duration, default=d.cert_lookahead)
    a("--cert-check-interval", type=parse_duration, default=d.cert_check_interval)
    a(
        "--shutdown-delay",
        type=parse_duration,
        default=_env("LUMIGO_SHUTDOWN_DELAY", f"{d.shutdown_delay}s"),  # through `type`
        help="after SIGTERM, report not ready and keep serving this long before stopping, so "
        "that admissions still routed to this pod succeed; 0 when not behind a Service "
        "[LUMIGO_SHUTDOWN_DELAY]",
    )
    a("--injector-image", default=_env("LUMIGO_INJECTOR_IMAGE", d.injector_image))
    a(
        "--injector-pull-policy",
        choices=constants.PULL_POLICIES,
        default=_env("LUMIGO_INJECTOR_PULL_POLICY", d.injector_pull_policy),
        help="the init container's imagePullPolicy [LUMIGO_INJECTOR_PULL_POLICY]",
    )
    a(
        "--injection-mode",
        choices=(constants.INJECTION_MODE_AUTO, *constants.INJECTION_MODES),
        default=_env("LUMIGO_INJECTION_MODE", d.injection_mode),
        help="init-container: copy the payload into an emptyDir; image-volume: mount the "
        "injector image read-only (Kubernetes >= 1.35 with containerd >= 2.2 or CRI-O >= 1.33 "
        "on every node); auto: image-volume when the API server and every node support it "
        "[LUMIGO_INJECTION_MODE]",
    )
    a(
        "--telemetry-proxy-endpoint",
        default=_env("TELEMETRY_PROXY_OTLP_SERVICE", d.telemetry_proxy_endpoint),
        help="base URL of the telemetry proxy Service [TELEMETRY_PROXY_OTLP_SERVICE]",
    )
    _switch(a, "--leader-elect", "LUMIGO_LEADER_ELECT", True, "one active controller per cluster")
    a("--leader-election-id", default=d.leader_election_id)
    a("--log-level", default=_env("LUMIGO_LOG_LEVEL", d.log_level), choices=["debug", "info",
      "warning", "error"])  # fmt: skip
    a("--operator-version", default=_env("LUMIGO_OPERATOR_VERSION", d.operator_version))
    a("--resync-period", type=parse_duration, default=d.resync_period)
    a("--inject-concurrency", type=int, default=d.inject_concurrency)
    a("--workers", type=int, default=d.workers, help="Lumigo reconcile workers")
    a(
        "--rollout-timeout",
        type=parse_duration,
        default=d.rollout_timeout,
        help="a rollout the operator started holds a slot of maxConcurrentRollouts at most this"
        " long",
    )
    a(
        "--revert",
        action=argparse.BooleanOptionalAction,
        default=d.revert,
        help="revert the instrumentation of a workload whose new pods fail while the previous"
        " ones were healthy",
    )
    a(
        "--revert-window",
        type=parse_duration,
        default=d.revert_window,
        help="how long after instrumenting a workload its new pods are watched",
    )
    a(
        "--revert-restarts",
        type=int,
        default=d.revert_restarts,
        help="container restarts of a new pod that mean it is crash-looping",
    )
    a(
        "--revert-unready-after",
        type=parse_duration,
        default=d.revert_unready_after,
        help="how long a started new pod may stay not ready",
    )
    a(
        "--telemetry-proxy-deployment",
        default=d.telemetry_proxy_deployment,
        help="the telemetry proxy Deployment the operator configures ('' to disable)",
    )
    a("--telemetry-proxy-config-secret", default=d.telemetry_proxy_config_secret)
    a(
        "--telemetry-upstream-endpoint",
        default=_env("LUMIGO_ENDPOINT", d.telemetry_upstream_endpoint),
        help="where the proxy sends traces ('' = Lumigo's) [LUMIGO_ENDPOINT]",
    )
    a(
        "--telemetry-upstream-logs-endpoint",
        default=_env("LUMIGO_LOGS_ENDPOINT", d.telemetry_upstream_logs_endpoint),
        help="where the proxy sends logs and Kubernetes events [LUMIGO_LOGS_ENDPOINT]",
    )
    a(
        "--telemetry-heartbeat-interval",
        default=d.telemetry_heartbeat_interval,
        help="how often the proxy sends each monitored namespace's Lumigo spec and status"
        " (a collector duration: 1h, 10m, 30s)",
    )
    a("--cluster-name", default=_env("KUBERNETES_CLUSTER_NAME", d.cluster_name))
    a("--deployment-method", default=_env("LUMIGO_DEPLOYMENT_METHOD", d.deployment_method))
    _add_redaction_flags(parser, d)


def _add_redaction_flags(parser: argparse.ArgumentParser, d: RunOptions) -> None:
    a = parser.add_argument
    a(
        "--telemetry-proxy-enricher",
        action=argparse.BooleanOptionalAction,
        default=_env("LUMIGO_TELEMETRY_PROXY_ENRICHER", str(d.telemetry_proxy_enricher)).lower()
        == "true",
        help="the telemetry proxy's image is this operator's collector distribution (with the"
        " lumigo_k8s_enricher processor): every Kubernetes Event gets its root owner read from"
        " the API and the object version it names is sent [LUMIGO_TELEMETRY_PROXY_ENRICHER]",
    )
    a(
        "--telemetry-redact-env-values",
        action=argparse.BooleanOptionalAction,
        default=_env(
            "LUMIGO_TELEMETRY_REDACT_ENV_VALUES", str(d.telemetry_redact_env_values)
        ).lower()
        == "true",
        help="replace the literal env values of the pods and pod templates the object collection"
        " sends upstream (and in their last-applied-configuration) by [REDACTED]"
        " [LUMIGO_TELEMETRY_REDACT_ENV_VALUES]",
    )
    a(
        "--telemetry-redact-annotations",
        type=parse_redact_annotations,
        default=parse_redact_annotations(_env("LUMIGO_TELEMETRY_REDACT_ANNOTATIONS", "")),
        help="annotations whose value the object collection sends as [REDACTED]: a JSON list of"
        " RE2 regular expressions, each matched against the whole key"
        " [LUMIGO_TELEMETRY_REDACT_ANNOTATIONS]",
    )
    _add_cluster_logs_flags(parser, d)


def _add_cluster_logs_flags(parser: argparse.ArgumentParser, d: RunOptions) -> None:
    a = parser.add_argument
    _switch(
        a,
        "--cluster-logs",
        "LUMIGO_CLUSTER_LOGS",
        False,
        "run the cluster agent, a DaemonSet that sends the container log files of every"
        " node [LUMIGO_CLUSTER_LOGS]",
    )
    for which in ("include", "exclude"):
        a(
            f"--cluster-logs-{which}",
            type=parse_log_rules,
            default=parse_log_rules(_env(f"LUMIGO_CLUSTER_LOGS_{which.upper()}", "")),
            help=f"containers whose log files are {which}d: a JSON list of {{namespacePattern,"
            f" podPattern, containerPattern}} globs [LUMIGO_CLUSTER_LOGS_{which.upper()}]",
        )
    a("--cluster-agent-daemonset", default=d.cluster_agent_daemonset)
    a(
        "--cluster-token-secret",
        default=_env("LUMIGO_CLUSTER_TOKEN_SECRET", d.cluster_token_secret),
        help="the Secret, in the operator's namespace, with the token of cluster collection"
        " [LUMIGO_CLUSTER_TOKEN_SECRET]",
    )
    a("--cluster-token-key", default=d.cluster_token_key)
    a("--pod-logs-dir", default=d.pod_logs_dir, help="the kubelet's podLogsDir on the nodes")
    a(
        "--cluster-agent-state-dir",
        default=d.cluster_agent_state_dir,
        help="where each node keeps the agent's read offsets and export queue",
    )
    _switch(
        a,
        "--cluster-metrics",
        "LUMIGO_CLUSTER_METRICS",
        False,
        "the cluster agent also sends each node's kubelet metrics (node, pods, containers)"
        " [LUMIGO_CLUSTER_METRICS]",
    )
    a("--cluster-metrics-frequency", default=d.cluster_metrics_frequency)
    _switch(
        a,
        "--cluster-metrics-essential-only",
        "LUMIGO_CLUSTER_METRICS_ESSENTIAL_ONLY",
        False,
        "send only --cluster-metrics-essential-names [LUMIGO_CLUSTER_METRICS_ESSENTIAL_ONLY]",
    )
    a(
        "--cluster-metrics-essential-names",
        type=lambda text: tuple(n.strip() for n in text.split(",") if n.strip()),
        default=d.cluster_metrics_essential_names,
        help="comma-separated metric names kept by --cluster-metrics-essential-only",
    )
    a("--kubelet-port", type=int, default=d.kubelet_port, help="the kubelets' API port")
    a(
        "--node-exporter-image",
        default=_env("LUMIGO_NODE_EXPORTER_IMAGE", d.node_exporter_image),
        help="node-exporter, run in each agent pod for the node's metrics ('' = none)"
        " [LUMIGO_NODE_EXPORTER_IMAGE]",
    )
    _switch(
        a,
        "--node-provider-ids",
        "LUMIGO_NODE_PROVIDER_IDS",
        True,
        "annotate each Node with its spec.providerID so that telemetry carries"
        " k8s.provider.id [LUMIGO_NODE_PROVIDER_IDS]",
    )
    a(
        "--kube-state-metrics-selector",
        default=_env("LUMIGO_KUBE_STATE_METRICS_SELECTOR", d.kube_state_metrics_selector),
        help="label selector of the kube-state-metrics pods each node's agent scrapes on its node"
        " ('' = none) [LUMIGO_KUBE_STATE_METRICS_SELECTOR]",
    )
    a(
        "--telemetry-upstream-metrics-endpoint",
        default=_env("LUMIGO_METRICS_ENDPOINT", d.telemetry_upstream_metrics_endpoint),
        help="where cluster metrics go ('' = the traces endpoint) [LUMIGO_METRICS_ENDPOINT]",
    )


def add_watchdog_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of `lumigo-operator watchdog`."""
    a = parser.add_argument
    a("--namespace", default=default_namespace(), help="the operator's namespace [POD_NAMESPACE]")
    a("--kubeconfig", default=os.environ.get("KUBECONFIG") or None, help="[KUBECONFIG]")
    a("--interval", type=parse_duration, default=15.0, help="how often pods and events are read")
    a(
        "--metrics-interval",
        type=parse_duration,
        default=15.0,
        help="how often the pods' own metrics are scraped",
    )
    a(
        "--logs-endpoint",
        default=_env("LUMIGO_LOGS_ENDPOINT", ""),
        help="where the records go ('' = Lumigo's) [LUMIGO_LOGS_ENDPOINT]",
    )
    a(
        "--metrics-endpoint",
        default=_env("LUMIGO_METRICS_ENDPOINT", ""),
        help="where the containers' resource-usage gauges go ('' = Lumigo's; 'none' = not "
        "sent) [LUMIGO_METRICS_ENDPOINT]",
    )
    a(
        "--top-interval",
        type=parse_duration,
        default=15.0,
        help="how often the containers' resource usage (metrics.k8s.io) is read and sent",
    )
    a("--cluster-name", default=_env("KUBERNETES_CLUSTER_NAME", ""))
    a(
        "--token-secret",
        default=_env("LUMIGO_CLUSTER_TOKEN_SECRET", "lumigo-credentials"),
        help="the Secret, in --namespace, with the token [LUMIGO_CLUSTER_TOKEN_SECRET]",
    )
    a("--token-key", default="token")
    a("--operator-version", default=_env("LUMIGO_OPERATOR_VERSION", __version__))
    a("--log-level", default=_env("LUMIGO_LOG_LEVEL", "info"))


def run_options(args: argparse.Namespace) -> RunOptions:
    fields = RunOptions.__dataclass_fields__
    return RunOptions(**{k: v for k, v in vars(args).items() if k in fields})
