"""The cluster agent's OpenTelemetry Collector configuration: one node's container log files and
kubelet metrics.

The agent is a DaemonSet (one pod per node, `controller.telemetry.agent`). Each pod reads the
kubelet's container log files of its own node, `<pods dir>/<namespace>_<pod>_<uid>/<container>/
<n>.log`, with upstream components only:

- `filelog` with the `container` parser (CRI, containerd and Docker formats; a line the runtime
  split into partial records is joined again) and a `recombine` step that joins continuation
  lines (those starting with whitespace: stack-trace frames) to the record before them; a record
  that looks like a JSON object becomes a map body (`json_parser`), any other stays a string, and
  every record carries the scope `lumigo-operator.log_file_collector` (`transform`), as the
  reference sends them;
- read offsets and the export queue kept in `file_storage` on the node, so a restarted agent
  resumes where it stopped: nothing read twice, nothing skipped, and what was read but not yet
  exported survives a crash;
- `k8s_attributes` limited to the node's own pods (each agent watches only them, so the load
  on the API server grows with pods, not with pods times nodes), and a root owner computed from the
  owner chain (the Deployment above a ReplicaSet, the CronJob above a Job);
- the node's kubelet metrics (`kubeletstats`: node, pods, containers), with the same enrichment;
  the kubelet's cAdvisor endpoint and the node's own figures (`hostmetrics` over the host's
  `/proc` and `/sys`: CPU, memory, load, disks, paging, processes), labelled with the node; and
  the kube-state-metrics pods **running on this node** (`prometheus` with Kubernetes discovery
  limited to the node), so each shard is scraped by exactly one agent and no collector scrapes the
  whole cluster; with `essential_only`, only the listed metric names (`filter`);
- OTLP/HTTP logs and metrics upstream with the cluster token, which the pod gets from a Secret
  through an environment variable: this configuration holds no secret.

Which files are read comes from include/exclude rules of glob patterns (`LogFileRule`); the
operator's own namespace is always excluded (its logs, the proxy's and the agent's own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import yaml

from controller.telemetry.config import (
    DURATION,
    ROOT_OWNER_CHAIN,
    ProxySettings,
    escape_expansion,
    k8s_extract,
    logs_url,
    operator_attributes,
    self_telemetry,
)

JSON = dict[str, Any]

DEFAULT_POD_LOGS_DIR = "/var/log/pods"
# The instrumentation scope of the records read from log files: the name by which the Lumigo
# backend tells container logs from other logs (the reference's log-file collector sends it).
LOG_FILE_SCOPE = "lumigo-operator.log_file_collector"
# Where the pod mounts the node's directories.
POD_LOGS_MOUNT = "/var/log/pods"
STATE_MOUNT = "/var/lib/lumigo-cluster-agent"
# The environment variables the DaemonSet sets: the node's name and the upstream token.
NODE_NAME_ENV = "K8S_NODE_NAME"
TOKEN_ENV = "LUMIGO_CLUSTER_TOKEN"
# The root-owner resource attributes added to every record.
ROOT_OWNER_KIND = "lumigo.k8s.root_owner.kind"
ROOT_OWNER_NAME = "lumigo.k8s.root_owner.name"
ROOT_OWNER_UID = "lumigo.k8s.root_owner.uid"
# What `essentialOnly` keeps by default: CPU, memory, filesystem and network of nodes, pods and
# containers, as the kubelet reports them (kubeletstats names).
ESSENTIAL_METRICS = (
    "k8s.node.cpu.usage",
    "k8s.node.memory.working_set",
    "k8s.node.memory.available",
    "k8s.node.filesystem.usage",
    "k8s.node.filesystem.capacity",
    "k8s.node.network.io",
    "k8s.pod.cpu.usage",
    "k8s.pod.memory.working_set",
    "k8s.pod.network.io",
    "container.cpu.usage",
    "container.memory.working_set",
    # cAdvisor (the kubelet's /metrics/cadvisor)
    "container_cpu_usage_seconds_total",
    "container_memory_working_set_bytes",
    # the node (hostmetrics)
    "system.cpu.load_average.1m",
    "system.memory.usage",
    # the cluster's objects (kube-state-metrics)
    "kube_pod_status_phase",
    "kube_pod_container_status_restarts_total",
    "kube_deployment_spec_replicas",
    "kube_deployment_status_replicas_available",
    "kube_node_status_condition",
)
NODE_IP_ENV = "K8S_NODE_IP"
# Where the DaemonSet mounts the node's /proc and /sys (hostmetrics' root_path).
HOST_ROOT_MOUNT = "/hostfs"
# The kube-state-metrics pods every agent looks for on its node, and their metrics port's name.
KUBE_STATE_METRICS_SELECTOR = "app.kubernetes.io/name=kube-state-metrics"
KUBE_STATE_METRICS_PORT = "http-metrics"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_SELECTOR = re.compile(r"^[A-Za-z0-9./_=,!-]{0,316}$")
_METRIC_NAME = re.compile(r"^[a-z][a-z0-9_.]{0,199}$")
# A glob over Kubernetes names: the characters of a name plus `*` and `?`. Nothing else may reach
# a path pattern (no `/`, no `_`, which separates the parts of a pod's log directory, no `{`).
_PATTERN = re.compile(r"^[a-z0-9.*?-]{1,253}$")


class InvalidLogRuleError(ValueError):
    """An include/exclude entry that cannot be turned into a path pattern."""


@dataclass(frozen=True)
class LogFileRule:
    """Containers selected by glob patterns (`*`, `?`) on namespace, pod and container names."""

    namespace_pattern: str = "*"
    pod_pattern: str = "*"
    container_pattern: str = "*"

    def __post_init__(self) -> None:
        for what, value in (
            ("namespacePattern", self.namespace_pattern),
            ("podPattern", self.pod_pattern),
            ("containerPattern", self.container_pattern),
        ):
            if not _PATTERN.match(value):
                raise InvalidLogRuleError(
                    f"invalid {what} {value!r}: use lowercase letters, digits, '.', '-' and the "
                    "wildcards '*' and '?'"
                )

    @classmethod
    def from_json(cls, entry: Any) -> LogFileRule:
        """An entry of `clusterCollection.logs.include`/`exclude`; a missing pattern is `*`."""
        if not isinstance(entry, dict):
            raise InvalidLogRuleError(
                f"invalid log rule {entry!r}: expected an object with namespacePattern, "
                "podPattern and containerPattern"
            )
        unknown = set(entry) - {"namespacePattern", "podPattern", "containerPattern"}
        if unknown:
            raise InvalidLogRuleError(
                f"invalid log rule {entry!r}: unknown keys {sorted(unknown)}; expected "
                "namespacePattern, podPattern and containerPattern"
            )
        values = {k: entry.get(k) or "*" for k in ("namespacePattern", "podPattern",
                                                     "containerPattern")}  # fmt: skip
        for key, value in values.items():
            if not isinstance(value, str):
                raise InvalidLogRuleError(f"invalid {key} {value!r}: expected a string")
        return cls(values["namespacePattern"], values["podPattern"], values["containerPattern"])

    def path(self, pods_dir: str) -> str:
        """The file glob of the containers' current log files under `pods_dir`."""
        pod_dir = f"{self.namespace_pattern}_{self.pod_pattern}_*"
        return f"{pods_dir.rstrip('/')}/{pod_dir}/{self.container_pattern}/*.log"


@dataclass(frozen=True)
class MetricsSettings:
    """The kubelet metrics of the node (`clusterCollection.metrics`)."""

    enabled: bool = False
    interval: str = "15s"  # a collector duration
    essential_only: bool = False
    essential: tuple[str, ...] = ESSENTIAL_METRICS
    kubelet_port: int = 10250
    upstream_endpoint: str = ""  # '' = the proxy settings' upstream endpoint
    # The label selector of the kube-state-metrics pods to scrape on each node ('' = none).
    kube_state_metrics_selector: str = KUBE_STATE_METRICS_SELECTOR

    def __post_init__(self) -> None:
        if not DURATION.match(self.interval):
            raise ValueError(
                f"invalid metrics frequency {self.interval!r}: expected a duration such as 15s"
            )
        for name in self.essential:
            if not _METRIC_NAME.match(name):
                raise ValueError(f"invalid essential metric name {name!r}: expected e.g. "
                                 "k8s.pod.cpu.usage")  # fmt: skip
        if not 0 < self.kubelet_port < 65536:
            raise ValueError(f"invalid kubelet port {self.kubelet_port}")
        if not _SELECTOR.match(self.kube_state_metrics_selector):
            raise ValueError(
                f"invalid kube-state-metrics selector {self.kube_state_metrics_selector!r}: "
                "expected a label selector such as app.kubernetes.io/name=kube-state-metrics"
            )


@dataclass(frozen=True)
class AgentSettings:
    """What the agent's configuration depends on (from the operator's flags)."""

    operator_namespace: str
    logs: bool = True
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    include: tuple[LogFileRule, ...] = ()
    exclude: tuple[LogFileRule, ...] = ()
    proxy: ProxySettings = field(default_factory=ProxySettings)
    # Record batches: a batch leaves at this many records or after this time.
    batch_size: int = 1000
    batch_timeout: str = "1s"
    # Exported records held on the node's disk while upstream is unreachable.
    queue_items: int = 100_000
    # Where the collector finds the pods' log files and keeps its state (the pod's mounts; a
    # collector run on a host, as the bench does, reads the host's directories).
    pods_dir: str = POD_LOGS_MOUNT
    state_dir: str = STATE_MOUNT
    host_root: str = HOST_ROOT_MOUNT  # '' = this machine's own /proc and /sys


def render_agent(settings: AgentSettings) -> str:
    """The agent's collector configuration as YAML text (deterministic; no secret in it)."""
    return yaml.safe_dump(build_agent(settings), sort_keys=True, width=1000)


def build_agent(s: AgentSettings) -> JSON:
    """The configuration as a dict; every user-given string is escaped for the collector."""
    processors = ["k8s_attributes", "transform/root_owner", "resource/lumigo", "batch"]
    attributes = operator_attributes(s.proxy)
    if not attributes:
        processors.remove("resource/lumigo")
    config: JSON = {
        "extensions": {
            "file_storage": {
                "directory": s.state_dir,
                "create_directory": True,
                "compaction": {"on_start": True, "directory": s.state_dir},
            },
            "health_check": {"endpoint": f"{s.proxy.listen_host}:{s.proxy.health_port}"},
        },
        "receivers": {},
        "processors": {
            "k8s_attributes": {
                "auth_type": s.proxy.kube_auth,
                "filter": {"node_from_env_var": NODE_NAME_ENV},
                "wait_for_metadata": True,
                "wait_for_metadata_timeout": "60s",
                "extract": k8s_extract(),
                "pod_association": [
                    {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]}
                ],
            },
            "transform/root_owner": {
                "error_mode": "ignore",
                "log_statements": [{"context": "resource", "statements": _root_owner()}],
                "metric_statements": [{"context": "resource", "statements": _root_owner()}],
            },
            "resource/lumigo": {"attributes": attributes},
            "batch": {"send_batch_size": s.batch_size, "timeout": s.batch_timeout},
        },
        "exporters": {
            "otlp_http/lumigo": {
                "sending_queue": {
                    "sizer": "items",
                    "queue_size": s.queue_items,
                    "storage": "file_storage",
                },
            }
        },
        "service": {
            "extensions": ["file_storage", "health_check"],
            "pipelines": {},
            "telemetry": self_telemetry(s.proxy),
        },
    }
    if not attributes:
        del config["processors"]["resource/lumigo"]
    exporter = config["exporters"]["otlp_http/lumigo"]
    if s.logs:
        config["receivers"]["filelog"] = _filelog(s)
        exporter["logs_endpoint"] = logs_url(
            s.proxy.upstream_logs_endpoint or s.proxy.upstream_endpoint
        )
        config["processors"]["transform/log_files"] = {
            "error_mode": "ignore",
            "log_statements": [
                {"context": "scope", "statements": [f'set(name, "{LOG_FILE_SCOPE}")']}
            ],
        }
        config["service"]["pipelines"]["logs/container-files"] = {
            "receivers": ["filelog"],
            "processors": ["transform/log_files", *processors],
            "exporters": ["otlp_http/lumigo"],
        }
    m = s.metrics
    if m.enabled:
        _add_metrics(config, s, processors)
    escaped: JSON = escape_expansion(config)
    # The expansions the agent uses, added after escaping: its node and token from its env.
    escaped["exporters"]["otlp_http/lumigo"]["headers"] = {
        "Authorization": f"LumigoToken ${{env:{TOKEN_ENV}}}"
    }
    if m.enabled:
        kubelet = f"${{env:{NODE_IP_ENV}}}:{m.kubelet_port}"
        receivers = escaped["receivers"]
        receivers["kubeletstats"]["endpoint"] = f"https://{kubelet}"
        cadvisor = receivers["prometheus/kubelet"]["config"]["scrape_configs"][0]
        cadvisor["static_configs"] = [{"targets": [kubelet]}]
        escaped["processors"]["resource/node"]["attributes"] = [
            {"key": "k8s.node.name", "value": f"${{env:{NODE_NAME_ENV}}}", "action": "upsert"}
        ]
        if m.kube_state_metrics_selector:
            ksm = receivers["prometheus/kube-state-metrics"]["config"]["scrape_configs"][0]
            ksm["kubernetes_sd_configs"][0]["selectors"][0]["field"] = (
                f"spec.nodeName=${{env:{NODE_NAME_ENV}}}"
            )
    return escaped


def _add_metrics(config: JSON, s: AgentSettings, enrich: list[str]) -> None:
    """Four metric sources, in three pipelines: the kubelet's summary (per pod and container,
    enriched with owners like the logs), the node (hostmetrics and the kubelet's cAdvisor
    endpoint, labelled with the node) and the cluster's objects (the kube-state-metrics shards
    on this node; their series name the objects themselves, so no pod enrichment)."""
    m = s.metrics
    in_cluster = s.proxy.kube_auth == "serviceAccount"
    receivers, processors = config["receivers"], config["processors"]
    receivers["kubeletstats"] = {
        # A collector run outside a cluster (tests, the bench) reaches a kubelet without a
        # ServiceAccount token.
        "auth_type": "serviceAccount" if in_cluster else "none",
        "collection_interval": m.interval,
        # Kubelets serve self-signed certificates on most clusters.
        "insecure_skip_verify": True,
        "metric_groups": ["node", "pod", "container"],
    }
    host: JSON = {
        "collection_interval": m.interval,
        "scrapers": {name: {} for name in ("cpu", "memory", "load", "disk", "paging", "processes")},
    }
    if s.host_root:
        host["root_path"] = s.host_root
    receivers["hostmetrics"] = host
    cadvisor: JSON = {
        "job_name": "kubelet-cadvisor",
        "scheme": "https",
        "metrics_path": "/metrics/cadvisor",
        "scrape_interval": m.interval,
        "tls_config": {"insecure_skip_verify": True},
    }
    if in_cluster:
        cadvisor["authorization"] = {"credentials_file": SERVICE_ACCOUNT_TOKEN}
    receivers["prometheus/kubelet"] = {"config": {"scrape_configs": [cadvisor]}}
    processors["resource/node"] = {"attributes": []}
    exporter = config["exporters"]["otlp_http/lumigo"]
    exporter["metrics_endpoint"] = metrics_url(m.upstream_endpoint or s.proxy.upstream_endpoint)
    head: list[str] = []
    if m.essential_only:
        names = " or ".join(f'name == "{n}"' for n in m.essential)
        processors["filter/essential"] = {
            "error_mode": "ignore",
            "metrics": {"metric": [f"not ({names})"]},
        }
        head = ["filter/essential"]
    tail = [p for p in enrich if p in ("resource/lumigo", "batch")]
    pipelines = config["service"]["pipelines"]
    pipelines["metrics/kubelet"] = {
        "receivers": ["kubeletstats"],
        "processors": head + enrich,
        "exporters": ["otlp_http/lumigo"],
    }
    pipelines["metrics/node"] = {
        "receivers": ["hostmetrics", "prometheus/kubelet"],
        "processors": [*head, "resource/node", *tail],
        "exporters": ["otlp_http/lumigo"],
    }
    if m.kube_state_metrics_selector:
        receivers["prometheus/kube-state-metrics"] = {
            "config": {"scrape_configs": [_kube_state_metrics(m)]}
        }
        pipelines["metrics/cluster"] = {
            "receivers": ["prometheus/kube-state-metrics"],
            "processors": head + tail,
            "exporters": ["otlp_http/lumigo"],
        }


def _kube_state_metrics(m: MetricsSettings) -> JSON:
    """The scrape of the kube-state-metrics pods on this agent's node (the field selector, which
    names the node, is added after escaping)."""
    return {
        "job_name": "kube-state-metrics",
        "scrape_interval": m.interval,
        # Its series carry `namespace`, `pod`, ... labels of their own: keep them as they are.
        "honor_labels": True,
        "kubernetes_sd_configs": [
            {
                "role": "pod",
                "selectors": [{"role": "pod", "label": m.kube_state_metrics_selector}],
            }
        ],
        "relabel_configs": [
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": KUBE_STATE_METRICS_PORT,
                "action": "keep",
            }
        ],
    }


def metrics_url(endpoint: str) -> str:
    """The exporter's full metrics URL (a bare host gets /v1/metrics)."""
    if urlparse(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/metrics"
    return endpoint


def _filelog(s: AgentSettings) -> JSON:
    include = s.include or (LogFileRule(),)
    exclude = (LogFileRule(s.operator_namespace), *s.exclude)
    return {
        "include": sorted({r.path(s.pods_dir) for r in include}),
        "exclude": sorted({r.path(s.pods_dir) for r in exclude}),
        # With the offsets kept on the node, "beginning" only matters for files the agent has
        # never seen: a pod started while the agent was down loses nothing.
        "start_at": "beginning",
        "include_file_path": True,
        "include_file_name": False,
        "storage": "file_storage",
        # A full export queue slows reading down instead of dropping records.
        "retry_on_failure": {"enabled": True},
        "max_log_size": "1MiB",
        "operators": [
            {"type": "container", "id": "container-parser", "max_log_size": "1MiB"},
            {
                "type": "recombine",
                "id": "multiline",
                "combine_field": "body",
                "source_identifier": 'attributes["log.file.path"]',
                "is_first_entry": 'body matches "^[^[:space:]]"',
                "combine_with": "\n",
                "force_flush_period": "1s",
                "max_log_size": "1MiB",
            },
            # A record that looks like a JSON object becomes a map body, as the reference sends
            # it; anything else (plain text, an array, broken or too deeply nested JSON) stays
            # the string it was, without a log line of the agent's own per failure.
            {
                "type": "json_parser",
                "id": "json-body",
                "if": 'body matches "^\\\\s*\\\\{"',
                "parse_to": "body",
                "on_error": "send_quiet",
            },
        ],
    }


def _root_owner() -> list[str]:
    """OTTL statements setting the root owner from the owner chain's attributes."""
    statements: list[str] = []
    for kind, _api_version, attribute in ROOT_OWNER_CHAIN:
        name, uid = f'attributes["k8s.{attribute}.name"]', f'attributes["k8s.{attribute}.uid"]'
        statements += [
            f'delete_key(attributes, "{ROOT_OWNER_UID}") where {name} != nil',
            f'set(attributes["{ROOT_OWNER_KIND}"], "{kind}") where {name} != nil',
            f'set(attributes["{ROOT_OWNER_NAME}"], {name}) where {name} != nil',
            f'set(attributes["{ROOT_OWNER_UID}"], {uid}) where {name} != nil and {uid} != nil',
        ]
    return statements
