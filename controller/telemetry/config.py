"""The telemetry proxy's OpenTelemetry Collector configuration, rendered from the active Lumigoes.

A pure function: the same inputs give the same bytes (sorted keys, sorted namespaces), so the
reconciler can compare rendered texts to decide whether the proxy must restart.

Two kinds of pipelines share one upstream collector:

- the proxy: OTLP/HTTP on 4318 from the injected tracers. Every tenant is hostile, so the
  receiver accepts only the tokens of the active Lumigoes (`bearertokenauth`: any other
  Authorization gets 401 before its body is read, and costs no batcher, queue or memory); the
  client's own k8s identity attributes are deleted, the pod is found by the connection's source
  address only (k8s attributes: pod, namespace, owner chain) and operator attributes are added;
  then the `routing` connector sends each request to its token's tenant pipeline, which removes
  any enrichment naming a namespace the token does not belong to and exports through the
  tenant's own exporter (its token, its own bounded queue and batches). A tenant is a token: the
  namespaces whose Lumigoes share one share its pipeline.
- one events pipeline per namespace whose active Lumigo wants Kubernetes events: a
  `k8s_objects` receiver watching Events and the 7 object kinds of that namespace only, and
  listing them at start and every `objects_pull_interval` (10 minutes, as the reference), exported
  with that namespace's token. One receiver and exporter per namespace (rather than a routing
  table) keeps tenants apart by construction: a namespace's records can only reach the exporter
  that carries its own token. The receivers run only on the Lease holder
  (`k8s_leader_elector`), so scaling the proxy never duplicates collection.
- every record of an events pipeline has the object itself as its body (a watch event's
  `{type, object}` is unwrapped) and the reference's scope: `lumigo-operator.k8s-events` for
  Events, `lumigo-operator.k8s-objects` for the other objects. With `k8s_enricher` (a proxy image
  built from hack/tools/otelcol, which has the `lumigo_k8s_enricher` processor of collector/),
  each Event gets its `rootOwnerReference` from the API, read in the Event's own namespace
  (Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob), and the involved object's version is
  sent as an object record when the pipeline has not carried it; without it (the upstream
  image), OTTL sets it from the pod's owner chain k8s_attributes knows, or the workload itself.
- with the cluster token (the `lumigoToken` Secret of the operator's namespace, as the
  reference's infrastructure token), the proxy's own `otelcol_*` metrics, scraped from itself
  under the job `lumigo-operator-self-metrics` and sent with that token; never a tenant's.
- in each events pipeline, the namespace heartbeat: a second receiver pulls the namespace's
  Lumigo resources every `heartbeat_interval` (hourly by default), so the backend sees each one's
  spec and status as a log record of scope `lumigo-operator.namespace_heartbeat` (set by a
  `transform` processor), exported with the same token.

The result embeds tokens: it must only ever be stored in a Secret, never logged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import yaml

from api.constants import ANNOTATION_PROVIDER_ID, WORKLOAD_KINDS
from controller.telemetry.redaction import Redaction
from controller.telemetry.redaction import processor as redaction_processor
from kube.kinds import CRONJOBS, DAEMONSETS, DEPLOYMENTS, JOBS, PODS, REPLICASETS, STATEFULSETS
from kube.objects import JSON

DEFAULT_UPSTREAM = "https://ga-otlp.lumigo-tracer-edge.golumigo.com"
OTLP_HTTP_PORT = 4318
HEALTH_PORT = 13133
METRICS_PORT = 8888

# The Kubernetes objects collected per namespace, as k8s_objects (name, group) pairs: Events and
# the kinds of the owner chain, so that an event on a pod can be walked up to its workload.
COLLECTED_OBJECTS: tuple[tuple[str, str], ...] = (
    ("events", ""),
    ("pods", ""),
    ("deployments", "apps"),
    ("daemonsets", "apps"),
    ("replicasets", "apps"),
    ("statefulsets", "apps"),
    ("cronjobs", "batch"),
    ("jobs", "batch"),
)

# The namespace heartbeat: the instrumentation scope of its records, and what it pulls.
HEARTBEAT_SCOPE = "lumigo-operator.namespace_heartbeat"
HEARTBEAT_OBJECTS = ("lumigoes", "operator.lumigo.io")
HEARTBEAT_KIND = "Lumigo"
# The scopes of Kubernetes Event records and of the other objects' records, as the reference.
EVENTS_SCOPE = "lumigo-operator.k8s-events"
OBJECTS_SCOPE = "lumigo-operator.k8s-objects"
# The scrape job of the collectors' own metrics, and their service.name, as the reference's.
SELF_METRICS_JOB = "lumigo-operator-self-metrics"
COLLECTOR_SERVICE_NAME = "lumigo-collector"

# Series never sent (scrape bookkeeping, Go runtime, API-server client internals).
PROMETHEUS_EXCLUDED = (
    "scrape_.+",
    "up",
    "go_.+",
    "apiserver_.+",
    "authentication_token_.+",
    "aggregator_discovery_aggregation_count",
)
# A collector duration: what `heartbeat_interval` may be (it comes from a flag).
DURATION = re.compile(r"^[1-9][0-9]{0,5}(ms|s|m|h)$")

# Events, and those about a pod (OTTL conditions on an Event's record, once unwrapped).
INVOLVED = 'log.body["involvedObject"]'
EVENT = 'log.body["kind"] == "Event"'
# The Events sent, as the reference: about an object of these (apiVersion, kind), with a uid
# (the Events of the operator's webhook name none).
EVENT_OBJECTS = tuple((r.api_version, r.kind) for r in (PODS, *WORKLOAD_KINDS))
POD_EVENT = f'{EVENT} and {INVOLVED}["kind"] == "Pod"'
# A pod's owners from the nearest to the farthest: (kind, apiVersion, k8s_attributes name).
ROOT_OWNER_CHAIN = tuple(
    (r.kind, r.api_version, r.kind.lower())
    for r in (PODS, REPLICASETS, DEPLOYMENTS, STATEFULSETS, DAEMONSETS, JOBS, CRONJOBS)
)
TOP_LEVEL_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "CronJob")

# Pod, namespace and owner-chain attributes added to every span and log of the proxy.
K8S_METADATA = (
    "k8s.namespace.name",
    "k8s.pod.name",
    "k8s.pod.uid",
    "k8s.node.name",
    "k8s.replicaset.name",
    "k8s.replicaset.uid",
    "k8s.deployment.name",
    "k8s.deployment.uid",
    "k8s.statefulset.name",
    "k8s.statefulset.uid",
    "k8s.daemonset.name",
    "k8s.daemonset.uid",
    "k8s.job.name",
    "k8s.job.uid",
    "k8s.cronjob.name",
    "k8s.cronjob.uid",
)


def k8s_extract() -> JSON:
    """What `k8s_attributes` adds: K8S_METADATA and `k8s.provider.id`, the Node's provider ID
    from the annotation the operator keeps on it (controller.telemetry.provider_id)."""
    return {
        "metadata": list(K8S_METADATA),
        "annotations": [
            {"tag_name": "k8s.provider.id", "key": ANNOTATION_PROVIDER_ID, "from": "node"}
        ],
    }


# Resource attributes that say which pod, namespace, node or cluster data comes from: a client
# may not say it of itself (deleted before enrichment). k8s.container.name stays: the tracer
# knows its own container, and it names no pod.
CLIENT_IDENTITY = (
    r"^k8s\.(cluster|cronjob|daemonset|deployment|job|namespace|node|pod|provider|replicaset"
    r"|statefulset)\."
)
# What enrichment added about a pod (everything above but the cluster): removed when the pod is
# in a namespace its token does not belong to.
POD_ENRICHMENT = (
    r"^k8s\.(cronjob|daemonset|deployment|job|namespace|node|pod|provider|replicaset"
    r"|statefulset)\."
)
# The receiver's only token when no Lumigo is active: no HTTP header value can hold a newline,
# so every request is refused (bearertokenauth needs at least one token).
NO_TENANT_TOKEN = "no active Lumigo\n"
SCHEME = "LumigoToken"


@dataclass(frozen=True)
class MonitoredNamespace:
    """A namespace with an active Lumigo and its token: a proxy tenant, and, with
    `kube_events`, a namespace whose Kubernetes events and objects are collected."""

    name: str
    uid: str
    token: str = field(repr=False)  # never in a repr, hence never in a log line by accident
    kube_events: bool = True


@dataclass(frozen=True)
class Origin:
    """Who sends the telemetry: stamped by the proxy on everything it forwards (when set)."""

    cluster_name: str = ""
    cluster_uid: str = ""
    operator_version: str = "dev"
    deployment_method: str = "Helm"


@dataclass(frozen=True)
class ProxySettings:
    """Everything in the configuration that does not come from the Lumigo resources."""

    upstream_endpoint: str = DEFAULT_UPSTREAM
    # Where logs go when elsewhere than traces: a full URL (https://host/v1/logs), or a bare host
    # like the chart's default `endpoint.otlp.logs_url`, which gets the OTLP path /v1/logs.
    upstream_logs_endpoint: str = ""
    # Where the proxy's own metrics go when elsewhere than traces (a bare host gets /v1/metrics).
    upstream_metrics_endpoint: str = ""
    origin: Origin = Origin()
    # Where the proxy's Lease lives (the proxy's own namespace) and its name.
    lease_namespace: str = "lumigo-system"
    lease_name: str = "lumigo-telemetry-proxy-k8s-objects"
    # serviceAccount in a cluster; kubeConfig for a collector run outside one (tests, dev).
    kube_auth: str = "serviceAccount"
    listen_host: str = "0.0.0.0"  # noqa: S104 - a Service in front of a pod
    otlp_port: int = OTLP_HTTP_PORT
    health_port: int = HEALTH_PORT
    metrics_port: int = METRICS_PORT
    # Proxy batching: a batch leaves at this many spans/records or after this time, per tenant.
    batch_size: int = 1024
    batch_max_size: int = 2048
    batch_timeout: str = "1s"
    # Each tenant's export queue (spans/records held for batching and for retry while upstream
    # is unreachable), in bytes of OTLP: beyond it that tenant's requests are refused (its
    # tracers drop them), and no other tenant's.
    tenant_queue_bytes: int = 32 << 20
    # Beyond this share of the proxy's memory limit (its cgroup's, else the machine's) every
    # request is refused until memory is back under it, rather than the proxy OOM-killed.
    memory_limit_percentage: int = 80
    memory_spike_percentage: int = 20
    # Kubernetes events/objects: small batches, the volume is low and freshness matters.
    events_batch_size: int = 100
    events_batch_timeout: str = "1s"
    events_queue_items: int = 20_000
    # How often each monitored namespace's Lumigo resources are sent (the heartbeat).
    heartbeat_interval: str = "1h"
    # How often each monitored namespace's Events and objects are listed again besides the watch
    # (as the reference): what a watch gap lost, or an Event the backend missed, arrives again.
    objects_pull_interval: str = "10m"
    # What the object collection redacts before it leaves (controller.telemetry.redaction).
    redaction: Redaction = field(default_factory=Redaction)
    # The proxy image has this repository's `lumigo_k8s_enricher` processor (collector/): only
    # then is it rendered (the upstream contrib image would refuse the whole configuration).
    k8s_enricher: bool = False
    # Its budget of API reads per Event, and what it remembers (objects, for how long).
    k8s_enricher_timeout: str = "2s"
    k8s_enricher_cache_size: int = 4096
    k8s_enricher_cache_ttl: str = "1m"
    log_level: str = "info"
    # The cluster token (read by the reconciler at each pass): with it, the proxy sends its own
    # metrics every `self_metrics_interval`, as the reference does with its infrastructure token.
    self_metrics_token: str = field(default="", repr=False)
    self_metrics_interval: str = "30s"

    def __post_init__(self) -> None:
        for endpoint in filter(None, (self.upstream_endpoint, self.upstream_logs_endpoint)):
            url = urlparse(endpoint)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(
                    f"invalid telemetry upstream endpoint {endpoint!r}: expected an http:// "
                    f"or https:// URL such as {DEFAULT_UPSTREAM}"
                )
        if not self.upstream_endpoint:
            raise ValueError("invalid telemetry upstream endpoint '': it is required")
        if self.kube_auth not in ("serviceAccount", "kubeConfig"):
            raise ValueError(f"invalid kube_auth {self.kube_auth!r}")
        intervals = {
            "heartbeat interval": self.heartbeat_interval,
            "objects pull interval": self.objects_pull_interval,
            "self-metrics interval": self.self_metrics_interval,
        }
        bad = [
            f"invalid {what} {value!r}"
            for what, value in intervals.items()
            if not DURATION.match(value)
        ]
        if bad:
            raise ValueError(f"{bad[0]}: expected a duration such as 1h, 10m or 30s")


def render(namespaces: Iterable[MonitoredNamespace], settings: ProxySettings) -> str:
    """The collector configuration as YAML text (deterministic; contains tokens)."""
    return yaml.safe_dump(
        escape_expansion(build(namespaces, settings)),
        sort_keys=True,
        default_flow_style=False,
        width=1000,
    )


def escape_expansion(value: Any) -> Any:
    """`value` with every `$` in its string values written `$$`, the collector's literal dollar.

    The collector expands `${env:…}`, `${file:…}` (and, in upstream builds, `${http:…}`) anywhere
    in its configuration, and fails to load it at all on an unknown scheme. This configuration is
    shared by every namespace and carries values that come from users (tokens, names), and the
    operator itself never uses expansion: so no string in it is ever expanded.
    """
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {k: escape_expansion(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_expansion(v) for v in value]
    return value


def build(namespaces: Iterable[MonitoredNamespace], settings: ProxySettings) -> JSON:
    """The collector configuration as a dict (see `render`)."""
    given = list(namespaces)
    by_name: dict[str, MonitoredNamespace] = {}
    for ns in given:
        by_name.setdefault(ns.name, ns)  # one Lumigo per namespace; first one wins
    monitored = [by_name[name] for name in sorted(by_name) if by_name[name].kube_events]
    # Tenants: every (namespace, token) given. A namespace without a Lumigo may have workloads
    # opted in by label with different tokens; a namespace with one has only its Lumigo's.
    active = sorted({(ns.name, ns.token): ns for ns in given}.values(), key=lambda n: n.name)

    s = settings
    config: JSON = {
        "extensions": {
            "bearertokenauth/tenants": {
                "scheme": SCHEME,
                "tokens": sorted({ns.token for ns in active}) or [NO_TENANT_TOKEN],
            },
            "health_check": {"endpoint": f"{s.listen_host}:{s.health_port}"},
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "http": {
                        "endpoint": f"{s.listen_host}:{s.otlp_port}",
                        "include_metadata": True,
                        "auth": {"authenticator": "bearertokenauth/tenants"},
                    }
                }
            }
        },
        "processors": {
            "memory_limiter": {
                "check_interval": "1s",
                "limit_percentage": s.memory_limit_percentage,
                "spike_limit_percentage": s.memory_spike_percentage,
            },
            "transform/untrusted": {
                "error_mode": "ignore",
                "trace_statements": untrusted_statements(),
                "log_statements": untrusted_statements(),
            },
            "k8s_attributes/proxy": {
                **_k8s_attributes(s),
                # The connection's source address only: what a client says about itself
                # (k8s.pod.uid, k8s.pod.ip) never picks the pod.
                "pod_association": [{"sources": [{"from": "connection"}]}],
            },
            "resource/lumigo": {"attributes": operator_attributes(s)},
        },
        "exporters": {},
        "service": {
            "extensions": ["bearertokenauth/tenants", "health_check"],
            "pipelines": {},
            "telemetry": self_telemetry(s),
        },
    }
    _add_tenant_pipelines(config, active, s)
    if monitored:
        _add_events_pipelines(config, monitored, s)
    if s.self_metrics_token:
        _add_self_metrics_pipeline(config, s)
    return config


def _add_self_metrics_pipeline(config: JSON, s: ProxySettings) -> None:
    """The proxy's own `otelcol_*` series, scraped from its metrics port like the reference's
    `prometheus/collector-self-metrics`, exported with the cluster token only."""
    host = "127.0.0.1" if s.listen_host in ("0.0.0.0", "") else s.listen_host  # noqa: S104
    config["receivers"]["prometheus/self"] = {
        "config": {
            "scrape_configs": [
                self_metrics_job(f"{host}:{s.metrics_port}", s.self_metrics_interval)
            ]
        }
    }
    config["processors"]["filter/self"] = prometheus_bookkeeping_filter()
    config["processors"]["batch/self"] = {}
    config["exporters"]["otlp_http/self"] = {
        "metrics_endpoint": metrics_url(s.upstream_metrics_endpoint or s.upstream_endpoint),
        "headers": {"Authorization": f"LumigoToken {s.self_metrics_token}"},
    }
    config["service"]["pipelines"]["metrics/self"] = {
        "receivers": ["prometheus/self"],
        "processors": ["filter/self", "resource/lumigo", "batch/self"],
        "exporters": ["otlp_http/self"],
    }


def prometheus_bookkeeping_filter() -> JSON:
    """A `filter` processor dropping what a Prometheus scrape adds besides the target's own
    series (`PROMETHEUS_EXCLUDED`), as the reference's `filter/filter-prom-metrics`."""
    return {
        "error_mode": "ignore",
        "metrics": {"metric": [metric_name_matches(PROMETHEUS_EXCLUDED)]},
    }


def metric_name_matches(patterns: tuple[str, ...]) -> str:
    """An OTTL condition: the metric's whole name matches one of `patterns` (checked ones)."""
    joined = "|".join(patterns).replace("\\", "\\\\")
    return f'IsMatch(name, "^(?:{joined})$")'


def self_metrics_job(target: str, interval: str) -> JSON:
    """The scrape of a collector's own metrics (the proxy's and the cluster agent's), under the
    reference's job name: the backend tells the operator's collectors' series by it."""
    return {
        "job_name": SELF_METRICS_JOB,
        "scrape_interval": interval,
        "static_configs": [{"targets": [target]}],
    }


def _k8s_attributes(s: ProxySettings) -> JSON:
    return {
        "auth_type": s.kube_auth,
        # Data is only forwarded once the pod cache is synced, so that none leaves unenriched
        # after a restart; a proxy that cannot sync never becomes ready and the rollout keeps
        # the old pods serving.
        "wait_for_metadata": True,
        "wait_for_metadata_timeout": "60s",
        "extract": k8s_extract(),
    }


def untrusted_statements() -> list[str]:
    """OTTL (resource context) deleting the identity attributes a client set on its own data."""
    return [f'delete_matching_keys(resource.attributes, "{_ottl(CLIENT_IDENTITY)}")']


def namespace_guard(namespaces: Iterable[str]) -> list[str]:
    """OTTL (resource context) removing a pod's enrichment when the pod is in none of
    `namespaces` (namespace names: DNS labels, nothing a regular expression interprets). Without
    a namespace there is no enrichment: IsMatch of nothing is false, and nothing is deleted."""
    allowed = "^(?:" + "|".join(sorted(namespaces)) + ")$"
    namespace = 'resource.attributes["k8s.namespace.name"]'
    return [
        f'delete_matching_keys(resource.attributes, "{_ottl(POD_ENRICHMENT)}") '
        f'where not IsMatch({namespace}, "{allowed}")'
    ]


def namespace_uid_statements(namespaces: Iterable[str], uids: dict[str, str]) -> list[str]:
    """OTTL (resource context) setting `k8s.namespace.uid` from the pod's namespace, as the
    reference's enricher does; after `namespace_guard`, so only a namespace of the token's own.
    Names are DNS labels and UIDs come from the API: nothing to escape."""
    namespace = 'resource.attributes["k8s.namespace.name"]'
    return [
        f'set(resource.attributes["k8s.namespace.uid"], "{uids[name]}") '
        f'where {namespace} == "{name}"'
        for name in sorted(namespaces)
        if uids.get(name)
    ]


def _ottl(pattern: str) -> str:
    """A regular expression as an OTTL string literal's content."""
    return pattern.replace("\\", "\\\\")


def _add_tenant_pipelines(config: JSON, active: list[MonitoredNamespace], s: ProxySettings) -> None:
    """The proxy: OTLP in, one routed pipeline and exporter per token out (see the module doc).

    Without any tenant the receiver refuses everything and its pipelines end in `nop`."""
    pipelines = config["service"]["pipelines"]
    tenants = _tenants(active)
    if not tenants:
        config["exporters"]["nop"] = {}
        for signal in ("traces", "logs"):
            pipelines[signal] = {"receivers": ["otlp"], "processors": [], "exporters": ["nop"]}
        return
    shared = ["memory_limiter", "transform/untrusted", "k8s_attributes/proxy", "resource/lumigo"]
    for signal in ("traces", "logs"):
        router = f"routing/{signal}"
        pipelines[signal] = {
            "receivers": ["otlp"],
            "processors": list(shared),
            "exporters": [router],
        }
        table = []
        for key, (token, _) in tenants.items():
            condition = f'request["authorization"] == "{SCHEME} {token}"'
            pipeline = f"{signal}/tenant-{key}"
            table.append({"context": "request", "condition": condition, "pipelines": [pipeline]})
            pipelines[pipeline] = {
                "receivers": [router],
                "processors": [f"transform/tenant-{key}"],
                "exporters": [f"otlp_http/tenant-{key}"],
            }
        # No default route: a request reaching the router has a known token (the receiver
        # refused the others).
        config.setdefault("connectors", {})[router] = {"error_mode": "ignore", "table": table}
    uids = {ns.name: ns.uid for ns in active}
    for key, (token, names) in tenants.items():
        guard = namespace_guard(names) + namespace_uid_statements(names, uids)
        config["processors"][f"transform/tenant-{key}"] = {
            "error_mode": "ignore",
            "trace_statements": guard,
            "log_statements": guard,
        }
        config["exporters"][f"otlp_http/tenant-{key}"] = {
            **_endpoints(s),
            "headers": {"Authorization": f"{SCHEME} {token}"},
            "sending_queue": {
                "sizer": "bytes",
                "queue_size": s.tenant_queue_bytes,
                "batch": {
                    "sizer": "items",
                    "flush_timeout": s.batch_timeout,
                    "min_size": s.batch_size,
                    "max_size": s.batch_max_size,
                },
            },
        }


def _tenants(active: list[MonitoredNamespace]) -> dict[str, tuple[str, list[str]]]:
    """Tenant key -> (token, its namespaces sorted), in key order. The key names the tenant's
    components: its first namespace, with a suffix when that namespace has several tokens
    (workloads opted in by label with different Secrets)."""
    names_by_token: dict[str, list[str]] = {}
    for ns in active:
        names_by_token.setdefault(ns.token, []).append(ns.name)
    out: dict[str, tuple[str, list[str]]] = {}
    by_names = sorted((sorted(names), token) for token, names in names_by_token.items())
    for names, token in by_names:
        key, n = names[0], 1
        while key in out:
            n += 1
            key = f"{names[0]}-{n}"
        out[key] = (token, names)
    return dict(sorted(out.items()))


def self_telemetry(s: ProxySettings) -> JSON:
    """The collector's own logs (JSON) and metrics (Prometheus, on `metrics_port`)."""
    prometheus = {
        "host": s.listen_host,
        "port": s.metrics_port,
        "without_scope_info": True,
        "without_type_suffix": True,
        "without_units": True,
    }
    return {
        "logs": {"level": s.log_level, "encoding": "json"},
        # The service.name of the collector's own series: the one the reference's collector
        # distribution has, by which the Lumigo backend recognises them.
        "resource": {"service.name": COLLECTOR_SERVICE_NAME},
        "metrics": {
            "level": "normal",
            "readers": [{"pull": {"exporter": {"prometheus": prometheus}}}],
        },
    }


def _endpoints(s: ProxySettings) -> JSON:
    out: JSON = {"endpoint": s.upstream_endpoint.rstrip("/")}
    if s.upstream_logs_endpoint:
        out["logs_endpoint"] = logs_url(s.upstream_logs_endpoint)
    return out


def logs_url(endpoint: str) -> str:
    """The exporter's full logs URL: a bare host (no path) gets /v1/logs, as the reference does
    with `endpoint.otlp.logs_url`; posting to `/` would have every record refused with 404."""
    if urlparse(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/logs"
    return endpoint


def metrics_url(endpoint: str) -> str:
    """The exporter's full metrics URL (a bare host gets /v1/metrics)."""
    if urlparse(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/metrics"
    return endpoint


def operator_attributes(s: ProxySettings) -> list[JSON]:
    origin = s.origin
    values = {
        "k8s.cluster.name": origin.cluster_name,
        "k8s.cluster.uid": origin.cluster_uid,
        "lumigo.k8s_operator.version": origin.operator_version,
        "lumigo.k8s_operator.deployment_method": origin.deployment_method,
    }
    return [
        {"key": key, "value": value, "action": "upsert"}
        for key, value in sorted(values.items())
        if value
    ]


def _add_events_pipelines(
    config: JSON, monitored: list[MonitoredNamespace], s: ProxySettings
) -> None:
    config["extensions"]["k8s_leader_elector"] = {
        "auth_type": s.kube_auth,
        "lease_name": s.lease_name,
        "lease_namespace": s.lease_namespace,
    }
    config["service"]["extensions"].append("k8s_leader_elector")
    # Each watch event and each pull is a batch of its own until batch/events, so a scope set
    # from one record's body is that record's: a watch event ({type, object}) becomes the object
    # itself, then Events, other objects and the heartbeat's Lumigoes get their scopes.
    version = s.origin.operator_version
    config["processors"]["transform/k8s_objects"] = {
        "error_mode": "ignore",
        "log_statements": [
            'set(log.body, log.body["object"]) '
            'where log.body["type"] != nil and log.body["object"] != nil',
            f'set(scope.name, "{EVENTS_SCOPE}") where {EVENT}',
            f'set(scope.name, "{OBJECTS_SCOPE}") '
            f'where log.body["kind"] != "Event" and log.body["kind"] != "{HEARTBEAT_KIND}"',
            f'set(scope.version, "{version}") '
            f'where scope.name == "{EVENTS_SCOPE}" or scope.name == "{OBJECTS_SCOPE}"',
        ],
    }
    config["processors"]["filter/events"] = {
        "error_mode": "ignore",
        "logs": {"log_record": [unsent_event_condition()]},
    }
    enricher = ["lumigo_k8s_enricher"] if s.k8s_enricher else []
    if enricher:
        config["processors"]["lumigo_k8s_enricher"] = k8s_enricher_config(s)
    # The reference's heartbeat body is the Lumigo serialised as a JSON string, not a map.
    config["processors"]["transform/heartbeat"] = {
        "error_mode": "ignore",
        "log_statements": [
            f'set(scope.name, "{HEARTBEAT_SCOPE}") where log.body["kind"] == "{HEARTBEAT_KIND}"',
            f'set(log.body, String(log.body)) where scope.name == "{HEARTBEAT_SCOPE}" '
            "and IsMap(log.body)",
        ],
    }
    # An Event about a pod gets the pod's owner chain (k8s_attributes, associated by the pod's
    # UID, which the first transform copies from the Event to its record's resource: each watched
    # object is a resource of its own), then its root owner in the Event itself. The receiver's
    # k8s.namespace.name goes first, so that the pod's own namespace is what k8s_attributes adds
    # (it never overwrites) and transform/only-<ns> sees: a pod the Event names by a uid of
    # another namespace then has its owner chain removed (resource/ns-<ns> restores the name).
    config["processors"]["transform/event_pod"] = {
        "error_mode": "ignore",
        "log_statements": [
            f'set(resource.attributes["k8s.pod.uid"], {INVOLVED}["uid"]) where {POD_EVENT}',
            f'delete_key(resource.attributes, "k8s.namespace.name") where {POD_EVENT}',
        ],
    }
    config["processors"]["transform/root_owner_reference"] = {
        "error_mode": "ignore",
        "log_statements": root_owner_reference_statements(),
    }
    config["processors"]["k8s_attributes/events"] = {
        **_k8s_attributes(s),
        # The operator's own records: the UID transform/event_pod copied from the Event.
        "pod_association": [{"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]}],
    }
    config["processors"]["batch/events"] = {
        "send_batch_size": s.events_batch_size,
        "timeout": s.events_batch_timeout,
    }
    redact = ["transform/redact"] if s.redaction.enabled else []
    if redact:
        config["processors"]["transform/redact"] = redaction_processor(s.redaction)
    for ns in monitored:
        config["receivers"][f"k8s_objects/{ns.name}"] = {
            "auth_type": s.kube_auth,
            "k8s_leader_elector": "k8s_leader_elector",
            # A new leader (restart, rollout, failover) first sends what exists, so a gap in
            # watching becomes duplicates downstream rather than lost object versions.
            "include_initial_state": True,
            "objects": [_watch(name, group, ns.name) for name, group in COLLECTED_OBJECTS],
        }
        # Another receiver (include_initial_state is for watches only): the same kinds listed
        # every objects_pull_interval, as the reference (what a watch gap lost arrives again),
        # and the namespace's Lumigoes every heartbeat_interval. Both are also listed at start,
        # so each object arrives twice then: duplicates rather than the objects changed between
        # this list and the watch's start.
        config["receivers"][f"k8s_objects/pull-{ns.name}"] = {
            "auth_type": s.kube_auth,
            "k8s_leader_elector": "k8s_leader_elector",
            "objects": [
                _heartbeat(ns.name, s.heartbeat_interval),
                *(
                    _pull(name, group, ns.name, s.objects_pull_interval)
                    for name, group in COLLECTED_OBJECTS
                ),
            ],
        }
        ns_attributes = [
            {"key": "k8s.namespace.name", "value": ns.name, "action": "upsert"},
            {"key": "k8s.namespace.uid", "value": ns.uid, "action": "upsert"},
        ]
        # An Event is an object a namespace admin can write, involvedObject and all: the pod it
        # names must be in the Event's own namespace, or its owners stay off the record.
        config["processors"][f"transform/only-{ns.name}"] = {
            "error_mode": "ignore",
            "log_statements": namespace_guard([ns.name]),
        }
        config["processors"][f"resource/ns-{ns.name}"] = {
            "attributes": [a for a in ns_attributes if a["value"]]
        }
        config["exporters"][f"otlp_http/ns-{ns.name}"] = {
            **_endpoints(s),
            "headers": {"Authorization": f"LumigoToken {ns.token}"},
            "sending_queue": {"sizer": "items", "queue_size": s.events_queue_items},
        }
        config["service"]["pipelines"][f"logs/ns-{ns.name}"] = {
            "receivers": [f"k8s_objects/{ns.name}", f"k8s_objects/pull-{ns.name}"],
            # The enricher before redaction: the objects it sends are redacted too.
            "processors": [
                "transform/k8s_objects",
                "filter/events",
                *enricher,
                *redact,
                "transform/heartbeat",
                "transform/event_pod",
                "k8s_attributes/events",
                f"transform/only-{ns.name}",
                "transform/root_owner_reference",
                "resource/lumigo",
                f"resource/ns-{ns.name}",
                "batch/events",
            ],
            "exporters": [f"otlp_http/ns-{ns.name}"],
        }


def k8s_enricher_config(s: ProxySettings) -> JSON:
    """The `lumigo_k8s_enricher` processor's settings (the proxy's Events, the cluster agent's
    kube-state-metrics owner series)."""
    return {
        "auth_type": s.kube_auth,
        "timeout": s.k8s_enricher_timeout,
        "cache_size": s.k8s_enricher_cache_size,
        "cache_ttl": s.k8s_enricher_cache_ttl,
        "events_scope": EVENTS_SCOPE,
        "objects_scope": OBJECTS_SCOPE,
    }


def unsent_event_condition() -> str:
    """OTTL condition of the Events that are not sent (filter/events drops what matches)."""
    about = " or ".join(
        f'({INVOLVED}["apiVersion"] == "{api_version}" and {INVOLVED}["kind"] == "{kind}")'
        for api_version, kind in EVENT_OBJECTS
    )
    uid = f'{INVOLVED}["uid"]'
    return f'{EVENT} and not ({uid} != nil and {uid} != "" and ({about}))'


def root_owner_reference_statements() -> list[str]:
    """OTTL setting `rootOwnerReference` ({apiVersion, kind, name, namespace, uid}) in an Event's
    body where lumigo_k8s_enricher (when rendered) set none: for a pod, its farthest owner known
    to k8s_attributes (later statements win); for a workload that has no owner of its kind (a
    Deployment, StatefulSet, DaemonSet or CronJob), itself. ReplicaSets and Jobs get none: their
    owners are not known here."""
    target = 'log.body["rootOwnerReference"]'
    namespace = 'log.body["metadata"]["namespace"]'
    # Marked first, so that what this sets does not count as set by the enricher.
    unset = 'log.cache["enriched"] == nil'
    statements = [f'set(log.cache["enriched"], true) where {target} != nil']
    for kind, api_version, attribute in ROOT_OWNER_CHAIN:
        name = f'resource.attributes["k8s.{attribute}.name"]'
        uid = f'resource.attributes["k8s.{attribute}.uid"]'
        reference = (
            f'{{"apiVersion": "{api_version}", "kind": "{kind}", "name": {name}, '
            f'"namespace": {namespace}, "uid": {uid}}}'
        )
        statements.append(
            f"set({target}, {reference}) where {unset} and {POD_EVENT} and {name} != nil"
        )
    top_level = " or ".join(f'{INVOLVED}["kind"] == "{kind}"' for kind in TOP_LEVEL_KINDS)
    itself = ", ".join(
        f'"{key}": {INVOLVED}["{key}"]' for key in ("apiVersion", "kind", "name", "uid")
    )
    itself += f', "namespace": {namespace}'
    statements.append(f"set({target}, {{{itself}}}) where {unset} and {EVENT} and ({top_level})")
    return statements


def _heartbeat(namespace: str, interval: str) -> JSON:
    """The namespace's Lumigo resources, pulled at start and every `interval`."""
    name, group = HEARTBEAT_OBJECTS
    return _pull(name, group, namespace, interval)


def _pull(name: str, group: str, namespace: str, interval: str) -> JSON:
    """Objects listed at start and every `interval`: each one a record of its own."""
    pull: JSON = {"name": name, "mode": "pull", "interval": interval, "namespaces": [namespace]}
    if group:
        pull["group"] = group
    return pull


def _watch(name: str, group: str, namespace: str) -> JSON:
    watch: JSON = {"name": name, "mode": "watch", "namespaces": [namespace]}
    if group:
        watch["group"] = group
    if name == "events":
        watch["exclude_watch_type"] = ["DELETED"]  # an Event expiring (TTL) is not news
    return watch
