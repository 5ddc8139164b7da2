"""The cluster agent's OpenTelemetry Collector configuration: one node's container log files and
kubelet metrics.

The agent is a DaemonSet (one pod per node, `controller.telemetry.agent`). Each pod reads the
kubelet's container log files of its own node, `<pods dir>/<namespace>_<pod>_<uid>/<container>/
<n>.log`, with upstream components only:

- `filelog` with the `container` parser (CRI, containerd and Docker formats; a line the runtime
  split into partial records is joined again) and a `recombine` step that joins continuation
  lines (those starting with whitespace: stack-trace frames) to the record before them; a record
  that looks like a JSON object becomes a map body, any other stays a string, and every record
  carries the scope `lumigo-operator.log_file_collector` (`transform`), as the reference sends
  them. The parse is `lumigo_json_body` (collector/) with an image of this operator's collector
  distribution (`k8s_enricher`): the same maps as stanza's `json_parser`, which an upstream image
  runs instead, with less CPU (docs/benchmarks.md);
- read offsets and the export queue kept in `file_storage` on the node, so a restarted agent
  resumes where it stopped: nothing read twice, nothing skipped, and what was read but not yet
  exported survives a crash;
- `k8s_attributes` limited to the node's own pods (each agent watches only them, so the load
  on the API server grows with pods, not with pods times nodes), and a root owner computed from the
  owner chain (the Deployment above a ReplicaSet, the CronJob above a Job);
- the node's kubelet metrics (`kubeletstats`: node, pods, containers), with the same enrichment;
  and, under the reference's Prometheus names and scrape jobs (`prometheus`), the kubelet's own,
  cAdvisor and resource endpoints, node-exporter in the agent's pod (`node_*`, with a `node`
  label), the kube-state-metrics pods **running on this node** (Kubernetes discovery limited to
  the node, so each shard is scraped by exactly one agent and no collector scrapes the whole
  cluster) and the collector's own `otelcol_*` series, all labelled with the node; with
  `essential_only`, only the series whose names match the essential regular expressions (a
  relabel `keep` at the scrape, as the reference does, and `filter` on the kubelet's summary);
  kube-state-metrics' `kube_pod_owner`, `kube_replicaset_owner` and `kube_job_owner` get the
  owner's `owner_uid` from `lumigo_k8s_enricher` when the proxy settings have `k8s_enricher`;
- OTLP/HTTP logs and metrics upstream with the cluster token, which the pod gets from a Secret
  through an environment variable: this configuration holds no secret.

Which files are read comes from include/exclude rules of glob patterns (`LogFileRule`); the
operator's own namespace is always excluded (its logs, the proxy's and the agent's own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from controller.telemetry.config import (
    DURATION,
    ROOT_OWNER_CHAIN,
    SELF_METRICS_JOB,
    ProxySettings,
    escape_expansion,
    k8s_enricher_config,
    k8s_extract,
    logs_url,
    metric_name_matches,
    metrics_url,
    operator_attributes,
    prometheus_bookkeeping_filter,
    self_metrics_job,
    self_telemetry,
)
from kube.objects import JSON

DEFAULT_POD_LOGS_DIR = "/var/log/pods"
# The instrumentation scope of the records read from log files: the name by which the Lumigo
# backend tells container logs from other logs (the reference's log-file collector sends it).
LOG_FILE_SCOPE = "lumigo-operator.log_file_collector"
# The processor of this operator's collector distribution that turns a JSON-object body into a map.
JSON_BODY = "lumigo_json_body"
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
# What `essentialOnly` keeps by default: the reference's list (what the Lumigo backend's Kubernetes
# pages are built on). Each entry is a regular expression (RE2) matched against the whole metric
# name, as a Prometheus relabel `regex` is: `kube_.+_labels` keeps every `kube_<kind>_labels`,
# and `http_client_*` is `http_client` followed by underscores, not a prefix.
ESSENTIAL_METRICS = (
    "container_cpu_usage_seconds_total",
    "container_memory_working_set_bytes",
    "kube_.+_labels",
    "kube_cronjob_status_active",
    "kube_daemonset_status_current_number_scheduled",
    "kube_daemonset_status_desired_number_scheduled",
    "kube_deployment_spec_replicas",
    "kube_deployment_status_replicas_available",
    "kube_job_owner",
    "kube_node_status_capacity",
    "kube_pod_container_info",
    "kube_pod_container_resource_limits",
    "kube_pod_container_status_restarts_total",
    "kube_pod_container_status_ready",
    "kube_pod_container_status_running",
    "kube_pod_container_status_terminated_reason",
    "kube_pod_container_status_waiting_reason",
    "kube_pod_status_ready",
    "kube_pod_owner",
    "kube_pod_status_phase",
    "kube_replicaset_owner",
    "kube_statefulset_replicas",
    "kube_statefulset_status_replicas_ready",
    "node_cpu_seconds_total",
    "node_memory_Active_bytes",
    "kube_deployment_created",
    "kube_statefulset_created",
    "kube_daemonset_created",
    "kube_cronjob_created",
    "kube_pod_created",
    "kube_pod_info",
    "http_client_*",
    "http_server_*",
    "otelcol_exporter_*",
    "otelcol_process_*",
    "otelcol_processor_*",
    "otelcol_receiver_*",
    "otelcol_scraper_*",
    "lumigo_operator_pod_container_resource_usage_*",
)
# The scrape jobs of the node's metrics, named as the reference names them (the backend reads the
# `job`, i.e. the resource's service.name): the kubelet's own metrics, its cAdvisor and resource
# endpoints, node-exporter and kube-state-metrics; and the collector's own metrics.
JOB_KUBELET = "k8s-infra-metrics"
JOB_CADVISOR = "k8s-infra-metrics-cadvisor"
JOB_RESOURCES = "k8s-infra-metrics-resources"
JOB_NODE_EXPORTER = "prometheus-node-exporter"
JOB_KUBE_STATE_METRICS = "kube-state-metrics"
# (The collector's own series arrive with its own resource, from its target_info: service.name
# is the collector's, not this job's, as with the reference's self-scrape.)
JOB_SELF = SELF_METRICS_JOB
# The kubelet's resource endpoint repeats these cAdvisor series: dropped there.
RESOURCES_DUPLICATES = (
    "container_cpu_usage_seconds_total",
    "container_start_time_seconds",
    "container_memory_working_set_bytes",
)
# node-exporter's process series repeat the kubelet's (`k8s-infra-metrics`): dropped there.
NODE_EXPORTER_DUPLICATES = (
    "process_virtual_memory_max_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_cpu_seconds_total",
)
# node-exporter runs in the agent's pod (`controller.telemetry.agent`), on this port.
NODE_EXPORTER_PORT = 9100
MAX_PORT = 65535
NODE_IP_ENV = "K8S_NODE_IP"
# Where node-exporter's container has the node's /proc, /sys and / (read-only).
HOST_ROOT_MOUNT = "/hostfs"
# The kube-state-metrics pods every agent looks for on its node, and their metrics port's name.
# How often the kubelets are scraped, and the watchdog's passes (--cluster-metrics-frequency,
# the watchdog's --interval, --metrics-interval, --top-interval): the one "15s".
DEFAULT_FREQUENCY = "15s"
KUBE_STATE_METRICS_SELECTOR = "app.kubernetes.io/name=kube-state-metrics"
KUBE_STATE_METRICS_PORT = "http-metrics"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_SELECTOR = re.compile(r"^[A-Za-z0-9./_=,!-]{0,316}$")
# An essential-metric pattern: the characters of metric names and of RE2's operators; no quote,
# space or `$` (nothing that could leave the OTTL string or the relabel regex it is put in).
_METRIC_PATTERN = re.compile(r"^[A-Za-z0-9_:.*+?|()\[\]{}^,\\-]{1,200}$")
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
        values = {
            k: entry.get(k) or "*" for k in ("namespacePattern", "podPattern", "containerPattern")
        }
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
    interval: str = DEFAULT_FREQUENCY  # a collector duration
    essential_only: bool = False
    essential: tuple[str, ...] = ESSENTIAL_METRICS
    kubelet_port: int = 10250
    # Where node-exporter listens, on the pod's loopback (a collector run on a host, as the tests
    # do, points it at a target of its own).
    node_exporter_port: int = NODE_EXPORTER_PORT
    upstream_endpoint: str = ""  # '' = the proxy settings' upstream endpoint
    # The label selector of the kube-state-metrics pods to scrape on each node ('' = none).
    kube_state_metrics_selector: str = KUBE_STATE_METRICS_SELECTOR

    def __post_init__(self) -> None:
        if not DURATION.match(self.interval):
            raise ValueError(
                f"invalid metrics frequency {self.interval!r}: expected a duration such as 15s"
            )
        for name in self.essential:
            _check_pattern(name)
        for what, port in (
            ("kubelet", self.kubelet_port),
            ("node-exporter", self.node_exporter_port),
        ):
            if not 0 < port <= MAX_PORT:
                raise ValueError(f"invalid {what} port {port}")
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
        json_body = [JSON_BODY] if s.proxy.k8s_enricher else []
        if json_body:
            config["processors"][JSON_BODY] = {}
        config["service"]["pipelines"]["logs/container-files"] = {
            "receivers": ["filelog"],
            "processors": [*json_body, "transform/log_files", *processors],
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
        _add_node_expansions(escaped, m)
    return escaped


def _add_node_expansions(escaped: JSON, m: MetricsSettings) -> None:
    """The node's address and name, from the pod's environment, where the scrapes need them."""
    kubelet = f"${{env:{NODE_IP_ENV}}}:{m.kubelet_port}"
    node = f"${{env:{NODE_NAME_ENV}}}"
    receivers = escaped["receivers"]
    receivers["kubeletstats"]["endpoint"] = f"https://{kubelet}"
    escaped["processors"]["resource/node"]["attributes"] = [
        {"key": "k8s.node.name", "value": node, "action": "upsert"}
    ]
    for job in receivers["prometheus/infra"]["config"]["scrape_configs"]:
        if job["job_name"] in (JOB_KUBELET, JOB_CADVISOR, JOB_RESOURCES):
            job["static_configs"] = [{"targets": [kubelet]}]
        elif job["job_name"] == JOB_NODE_EXPORTER:
            job["static_configs"][0]["labels"] = {"node": node}
        elif job["job_name"] == JOB_KUBE_STATE_METRICS:
            job["kubernetes_sd_configs"][0]["selectors"][0]["field"] = f"spec.nodeName={node}"


def _add_metrics(config: JSON, s: AgentSettings, enrich: list[str]) -> None:
    """The node's metrics, in three pipelines:

    - `metrics/infra`: what the reference's backend pages read, under its Prometheus names and
      scrape jobs: the kubelet's own, cAdvisor and resource endpoints, node-exporter (in this
      pod) and the kube-state-metrics shards on this node; with `essential_only`, a series is
      dropped at the scrape unless its name matches one of the essential patterns;
    - `metrics/self`: the collector's own `otelcol_*` series (never filtered by the list);
    - `metrics/kubelet`: the kubelet's summary (per pod and container), enriched with owners
      like the logs; with `essential_only`, filtered by the same patterns.
    """
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
    keep = _essential_keep(m)
    jobs = [
        _kubelet_job(m, name, path, in_cluster, keep)
        for name, path in (
            (JOB_KUBELET, "/metrics"),
            (JOB_CADVISOR, "/metrics/cadvisor"),
            (JOB_RESOURCES, "/metrics/resource"),
        )
    ]
    jobs.append(_static_job(m, JOB_NODE_EXPORTER, f"127.0.0.1:{m.node_exporter_port}", keep))
    for job, duplicates in ((jobs[2], RESOURCES_DUPLICATES), (jobs[3], NODE_EXPORTER_DUPLICATES)):
        job["metric_relabel_configs"].append(
            {"source_labels": ["__name__"], "action": "drop", "regex": "|".join(duplicates)}
        )
    if m.kube_state_metrics_selector:
        jobs.append(_kube_state_metrics(m, keep))
    for job in jobs:
        if not job["metric_relabel_configs"]:
            del job["metric_relabel_configs"]
    receivers["prometheus/infra"] = {"config": {"scrape_configs": jobs}}
    own = self_metrics_job(f"127.0.0.1:{s.proxy.metrics_port}", m.interval)
    receivers["prometheus/self"] = {"config": {"scrape_configs": [own]}}
    processors["resource/node"] = {"attributes": []}
    processors["filter/prometheus"] = prometheus_bookkeeping_filter()
    exporter = config["exporters"]["otlp_http/lumigo"]
    exporter["metrics_endpoint"] = metrics_url(m.upstream_endpoint or s.proxy.upstream_endpoint)
    head: list[str] = []
    if m.essential_only:
        processors["filter/essential"] = {
            "error_mode": "ignore",
            "metrics": {"metric": [f"not {metric_name_matches(m.essential)}"]},
        }
        head = ["filter/essential"]
    tail = [p for p in enrich if p in ("resource/lumigo", "batch")]
    scraped = ["filter/prometheus", "resource/node", *tail]
    # kube-state-metrics' owner series get `owner_uid` (the owner read in the series' namespace),
    # with an image that has lumigo_k8s_enricher; its other series and jobs pass unchanged.
    owners: list[str] = []
    if s.proxy.k8s_enricher and m.kube_state_metrics_selector:
        processors["lumigo_k8s_enricher"] = k8s_enricher_config(s.proxy)
        owners = ["lumigo_k8s_enricher"]
    config["service"]["pipelines"].update(
        {
            "metrics/kubelet": {
                "receivers": ["kubeletstats"],
                "processors": head + enrich,
                "exporters": ["otlp_http/lumigo"],
            },
            "metrics/infra": {
                "receivers": ["prometheus/infra"],
                "processors": [*scraped[:2], *owners, *tail],
                "exporters": ["otlp_http/lumigo"],
            },
            "metrics/self": {
                "receivers": ["prometheus/self"],
                "processors": scraped,
                "exporters": ["otlp_http/lumigo"],
            },
        }
    )


def _check_pattern(name: str) -> None:
    """An essential-metric entry: a regular expression over metric names (RE2 syntax)."""
    problem = ""
    if not _METRIC_PATTERN.match(name):
        problem = "use the characters of metric names and regular-expression operators"
    elif "(?" in name:
        problem = "no groups with flags or look-arounds (RE2 has no look-around)"
    elif name.endswith("\\") and not name.endswith("\\\\"):
        problem = "a trailing backslash escapes nothing"
    else:
        try:
            re.compile(name)
        except re.error as e:
            problem = str(e)
    if problem:
        raise ValueError(
            f"invalid essential metric pattern {name!r}: {problem} (each entry is a regular "
            "expression matched against whole metric names, e.g. kube_.+_labels)"
        )


def _essential_keep(m: MetricsSettings) -> list[JSON]:
    """The scrape-time filter of `essential_only`: Prometheus anchors the joined patterns."""
    if not m.essential_only:
        return []
    return [{"source_labels": ["__name__"], "action": "keep", "regex": "|".join(m.essential)}]


def _kubelet_job(
    m: MetricsSettings, name: str, path: str, in_cluster: bool, keep: list[JSON]
) -> JSON:
    """A scrape of this node's kubelet (its address is added after escaping)."""
    job: JSON = {
        "job_name": name,
        "scheme": "https",
        "metrics_path": path,
        "scrape_interval": m.interval,
        # Kubelets serve self-signed certificates on most clusters.
        "tls_config": {"insecure_skip_verify": True},
        "metric_relabel_configs": list(keep),
    }
    if in_cluster:
        job["authorization"] = {"credentials_file": SERVICE_ACCOUNT_TOKEN}
    return job


def _static_job(m: MetricsSettings, name: str, target: str, keep: list[JSON]) -> JSON:
    return {
        "job_name": name,
        "scrape_interval": m.interval,
        "static_configs": [{"targets": [target]}],
        "metric_relabel_configs": list(keep),
    }


def _kube_state_metrics(m: MetricsSettings, keep: list[JSON]) -> JSON:
    """The scrape of the kube-state-metrics pods on this agent's node (the field selector, which
    names the node, is added after escaping)."""
    return {
        "job_name": JOB_KUBE_STATE_METRICS,
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
        "metric_relabel_configs": list(keep),
    }


def _filelog(s: AgentSettings) -> JSON:
    include = s.include or (LogFileRule(),)
    exclude = (LogFileRule(s.operator_namespace), *s.exclude)
    filelog: JSON = {
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
        ],
    }
    if not s.proxy.k8s_enricher:
        # A record that looks like a JSON object becomes a map body, as the reference sends it;
        # anything else (plain text, an array, broken or too deeply nested JSON) stays the string
        # it was, without a log line of the agent's own per failure. (Our distribution's
        # `lumigo_json_body` processor does the same, cheaper.)
        filelog["operators"].append(
            {
                "type": "json_parser",
                "id": "json-body",
                "if": 'body matches "^\\\\s*\\\\{"',
                "parse_to": "body",
                "on_error": "send_quiet",
            }
        )
    return filelog


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
