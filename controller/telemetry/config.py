"""The telemetry proxy's OpenTelemetry Collector configuration, rendered from the active Lumigoes.

A pure function: the same inputs give the same bytes (sorted keys, sorted namespaces), so the
reconciler can compare rendered texts to decide whether the proxy must restart.

Two kinds of pipelines share one upstream collector:

- the proxy: OTLP/HTTP on 4318 from the injected tracers -> k8s attributes (pod, namespace,
  owner chain) -> operator attributes -> batch -> OTLP/HTTP upstream. The exporter forwards each
  request's own `Authorization` header (tenancy per request), so this part holds no token and is
  the same whatever the Lumigoes are; batching is keyed on that header so that no batch mixes two
  tenants.
- one events pipeline per namespace whose active Lumigo wants Kubernetes events: a
  `k8s_objects` receiver watching Events and the 7 object kinds of that namespace only, exported
  with that namespace's token. One receiver and exporter per namespace (rather than a routing
  table) keeps tenants apart by construction: a namespace's records can only reach the exporter
  that carries its own token. The receivers run only on the Lease holder
  (`k8s_leader_elector`), so scaling the proxy never duplicates collection.
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

from api.constants import ANNOTATION_PROVIDER_ID
from controller.telemetry.redaction import Redaction
from controller.telemetry.redaction import processor as redaction_processor

JSON = dict[str, Any]

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
# A collector duration: what `heartbeat_interval` may be (it comes from a flag).
DURATION = re.compile(r"^[1-9][0-9]{0,5}(ms|s|m|h)$")

# Events, and those about a pod (OTTL conditions on a watched Event's record).
INVOLVED = 'log.body["object"]["involvedObject"]'
EVENT = 'log.body["object"]["kind"] == "Event"'
POD_EVENT = f'{EVENT} and {INVOLVED}["kind"] == "Pod"'
# A pod's owners from the nearest to the farthest: (kind, apiVersion, k8s_attributes name).
ROOT_OWNER_CHAIN = (
    ("Pod", "v1", "pod"),
    ("ReplicaSet", "apps/v1", "replicaset"),
    ("Deployment", "apps/v1", "deployment"),
    ("StatefulSet", "apps/v1", "statefulset"),
    ("DaemonSet", "apps/v1", "daemonset"),
    ("Job", "batch/v1", "job"),
    ("CronJob", "batch/v1", "cronjob"),
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


@dataclass(frozen=True)
class MonitoredNamespace:
    """A namespace whose Kubernetes events and objects are collected, with its Lumigo token."""

    name: str
    uid: str
    token: str = field(repr=False)  # never in a repr, hence never in a log line by accident


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
    # Bound on distinct Authorization values batched at once (one batcher each).
    max_tenants: int = 1000
    # Spans/records held for retry while upstream is unreachable: bounded memory; beyond it
    # the proxy refuses new data (the tracers drop it) instead of being OOM-killed.
    queue_items: int = 100_000
    # Kubernetes events/objects: small batches, the volume is low and freshness matters.
    events_batch_size: int = 100
    events_batch_timeout: str = "1s"
    events_queue_items: int = 20_000
    # How often each monitored namespace's Lumigo resources are sent (the heartbeat).
    heartbeat_interval: str = "1h"
    # What the object collection redacts before it leaves (controller.telemetry.redaction).
    redaction: Redaction = field(default_factory=Redaction)
    log_level: str = "info"

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
        if not DURATION.match(self.heartbeat_interval):
            raise ValueError(
                f"invalid heartbeat interval {self.heartbeat_interval!r}: expected a duration "
                "such as 1h, 10m or 30s"
            )


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
    by_name: dict[str, MonitoredNamespace] = {}
    for ns in namespaces:
        by_name.setdefault(ns.name, ns)  # one Lumigo per namespace; first one wins
    monitored = [by_name[name] for name in sorted(by_name)]

    s = settings
    config: JSON = {
        "extensions": {
            "headers_setter": {
                "headers": [
                    {"action": "upsert", "key": "Authorization", "from_context": "authorization"}
                ]
            },
            "health_check": {"endpoint": f"{s.listen_host}:{s.health_port}"},
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "http": {
                        "endpoint": f"{s.listen_host}:{s.otlp_port}",
                        "include_metadata": True,
                    }
                }
            }
        },
        "processors": {
            "k8s_attributes": {
                "auth_type": s.kube_auth,
                # Spans are only forwarded once the pod cache is synced, so that none leaves
                # unenriched after a restart; a proxy that cannot sync never becomes ready and
                # the rollout keeps the old pods serving.
                "wait_for_metadata": True,
                "wait_for_metadata_timeout": "60s",
                "extract": k8s_extract(),
                "pod_association": [
                    {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]},
                    {"sources": [{"from": "resource_attribute", "name": "k8s.pod.ip"}]},
                    {"sources": [{"from": "connection"}]},
                ],
            },
            "resource/lumigo": {"attributes": operator_attributes(s)},
            "batch/proxy": {
                "send_batch_size": s.batch_size,
                "send_batch_max_size": s.batch_max_size,
                "timeout": s.batch_timeout,
                "metadata_keys": ["authorization"],
                "metadata_cardinality_limit": s.max_tenants,
            },
        },
        "exporters": {
            "otlp_http/lumigo": {
                **_endpoints(s),
                "auth": {"authenticator": "headers_setter"},
                "sending_queue": {"sizer": "items", "queue_size": s.queue_items},
            }
        },
        "service": {
            "extensions": ["headers_setter", "health_check"],
            "pipelines": {
                signal: {
                    "receivers": ["otlp"],
                    "processors": ["k8s_attributes", "resource/lumigo", "batch/proxy"],
                    "exporters": ["otlp_http/lumigo"],
                }
                for signal in ("traces", "logs")
            },
            "telemetry": self_telemetry(s),
        },
    }
    if monitored:
        _add_events_pipelines(config, monitored, s)
    return config


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
    # Each pull is a batch of its own until batch/events: only the heartbeat's records get the
    # heartbeat scope (a watched object's body is {type, object}, a pulled one is the object).
    config["processors"]["transform/heartbeat"] = {
        "error_mode": "ignore",
        "log_statements": [
            f'set(scope.name, "{HEARTBEAT_SCOPE}") where log.body["kind"] == "{HEARTBEAT_KIND}"'
        ],
    }
    # An Event about a pod gets the pod's owner chain (k8s_attributes, associated by the pod's
    # UID, which the first transform copies from the Event to its record's resource: each watched
    # object is a resource of its own), then its root owner in the Event itself.
    config["processors"]["transform/event_pod"] = {
        "error_mode": "ignore",
        "log_statements": [
            f'set(resource.attributes["k8s.pod.uid"], {INVOLVED}["uid"]) where {POD_EVENT}'
        ],
    }
    config["processors"]["transform/root_owner_reference"] = {
        "error_mode": "ignore",
        "log_statements": root_owner_reference_statements(),
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
        # Its own receiver: include_initial_state is for watches only.
        config["receivers"][f"k8s_objects/heartbeat-{ns.name}"] = {
            "auth_type": s.kube_auth,
            "k8s_leader_elector": "k8s_leader_elector",
            "objects": [_heartbeat(ns.name, s.heartbeat_interval)],
        }
        ns_attributes = [
            {"key": "k8s.namespace.name", "value": ns.name, "action": "upsert"},
            {"key": "k8s.namespace.uid", "value": ns.uid, "action": "upsert"},
        ]
        config["processors"][f"resource/ns-{ns.name}"] = {
            "attributes": [a for a in ns_attributes if a["value"]]
        }
        config["exporters"][f"otlp_http/ns-{ns.name}"] = {
            **_endpoints(s),
            "headers": {"Authorization": f"LumigoToken {ns.token}"},
            "sending_queue": {"sizer": "items", "queue_size": s.events_queue_items},
        }
        config["service"]["pipelines"][f"logs/ns-{ns.name}"] = {
            "receivers": [f"k8s_objects/{ns.name}", f"k8s_objects/heartbeat-{ns.name}"],
            "processors": [
                *redact,
                "transform/heartbeat",
                "transform/event_pod",
                "k8s_attributes",
                "transform/root_owner_reference",
                "resource/lumigo",
                f"resource/ns-{ns.name}",
                "batch/events",
            ],
            "exporters": [f"otlp_http/ns-{ns.name}"],
        }


def root_owner_reference_statements() -> list[str]:
    """OTTL setting `rootOwnerReference` ({apiVersion, kind, name, uid}) in an Event's body: for
    a pod, its farthest owner known to k8s_attributes (later statements win); for a workload
    that has no owner of its kind (a Deployment, StatefulSet, DaemonSet or CronJob), itself.
    ReplicaSets and Jobs get none: their owners are not known here."""
    target = 'log.body["object"]["rootOwnerReference"]'
    statements = []
    for kind, api_version, attribute in ROOT_OWNER_CHAIN:
        name = f'resource.attributes["k8s.{attribute}.name"]'
        uid = f'resource.attributes["k8s.{attribute}.uid"]'
        reference = (
            f'{{"apiVersion": "{api_version}", "kind": "{kind}", "name": {name}, "uid": {uid}}}'
        )
        statements.append(f"set({target}, {reference}) where {POD_EVENT} and {name} != nil")
    top_level = " or ".join(f'{INVOLVED}["kind"] == "{kind}"' for kind in TOP_LEVEL_KINDS)
    itself = ", ".join(
        f'"{key}": {INVOLVED}["{key}"]' for key in ("apiVersion", "kind", "name", "uid")
    )
    statements.append(f"set({target}, {{{itself}}}) where {EVENT} and ({top_level})")
    return statements


def _heartbeat(namespace: str, interval: str) -> JSON:
    """The namespace's Lumigo resources, pulled at start and every `interval`."""
    name, group = HEARTBEAT_OBJECTS
    return {"name": name, "group": group, "mode": "pull", "interval": interval,
            "namespaces": [namespace]}  # fmt: skip


def _watch(name: str, group: str, namespace: str) -> JSON:
    watch: JSON = {"name": name, "mode": "watch", "namespaces": [namespace]}
    if group:
        watch["group"] = group
    if name == "events":
        watch["exclude_watch_type"] = ["DELETED"]  # an Event expiring (TTL) is not news
    return watch
