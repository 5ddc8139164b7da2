"""The watchdog's resource-usage gauges (the reference watchdog's "top" watcher).

Every `top_interval` the watchdog lists the PodMetrics of its namespace from the resource
metrics API (`metrics.k8s.io/v1beta1`, served by metrics-server through the API server) and
sends, for each container of each pod, two OTLP gauges under the reference's names and units:

- `lumigo_operator_pod_container_resource_usage_cpu`: millicores (unit `m`, a double, whole
  millicores rounded up as the reference's `MilliValue()`);
- `lumigo_operator_pod_container_resource_usage_memory`: bytes (unit `By`, an integer),

with the attributes `namespace`, `pod` and `container`, in the scope the reference's meter names,
with the watchdog's resource and the cluster-collection token, to the metrics endpoint.

Without metrics.k8s.io (no metrics-server: 404, or its APIService unavailable: 503) nothing is
sent and one line is logged when that changes; any other failure is tried again next interval.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, DecimalException
from typing import Any

from controller.runtime.kube import KubeClient
from kube import objects, quantity
from kube.objects import JSON
from kube.rest import ApiError

log = logging.getLogger("lumigo.watchdog")

# The reference watchdog's meter (its OTLP scope) and its two gauges.
METER = "lumigo-io/lumigo-kubernetes-operator/watchdog"
CPU_METRIC = "lumigo_operator_pod_container_resource_usage_cpu"
MEMORY_METRIC = "lumigo_operator_pod_container_resource_usage_memory"
CPU_UNIT, MEMORY_UNIT = "m", "By"
METRICS_API = "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods"
UNAVAILABLE = (404, 503)  # no metrics-server, or its APIService not available
MAX_CONTAINERS = 200  # data points per gauge and pass
MAX_QUANTITY_TEXT = 64  # characters: longer is refused before parsing
MAX_QUANTITY = Decimal(2**53)  # cores or bytes: far above any usage, and exact in a double


def parse_quantity(text: str) -> Decimal:
    """A usage quantity (`250m`, `12345n`, `64Mi`, `1e3`) as a number: the webhook's quantity
    parser, bounded to what a usage can be (not negative, at most `MAX_QUANTITY`)."""
    if len(text) > MAX_QUANTITY_TEXT:
        raise ValueError(f"not a Kubernetes quantity: {text[:MAX_QUANTITY_TEXT]!r}…")
    try:
        value = quantity.parse_quantity(text.strip())
    except DecimalException as err:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from err
    if value < 0:
        raise ValueError(f"a negative usage: {text!r}")
    if value > MAX_QUANTITY:
        raise ValueError(f"an impossible usage: {text!r}")
    return value


def millicores(text: str) -> float:
    """CPU usage in whole millicores, rounded up (the reference's `MilliValue()`)."""
    return float((parse_quantity(text) * 1000).to_integral_value(ROUND_CEILING))


def memory_bytes(text: str) -> int:
    """Memory usage in bytes, rounded up (the reference's `Value()`)."""
    return int(parse_quantity(text).to_integral_value(ROUND_CEILING))


@dataclass(frozen=True)
class ContainerUsage:
    pod: str
    container: str
    cpu: float  # millicores
    memory: int  # bytes


def container_usages(pod_metrics: JSON, limit: int = MAX_CONTAINERS) -> list[ContainerUsage]:
    """The containers of a PodMetricsList (at most `limit`; one whose usage cannot be read is
    left out, logged)."""
    out: list[ContainerUsage] = []
    for item in pod_metrics.get("items") or []:
        pod = str(objects.metadata(item).get("name") or "")
        for container in item.get("containers") or []:
            usage = container.get("usage") or {}
            name = str(container.get("name") or "")
            try:
                cpu = millicores(str(usage.get("cpu") or ""))
                memory = memory_bytes(str(usage.get("memory") or ""))
            except ValueError as err:
                log.debug(
                    "unreadable container usage",
                    extra={"pod": pod, "container": name, "error": str(err)},
                )
                continue
            if len(out) >= limit:
                return out
            out.append(ContainerUsage(pod, name, cpu, memory))
    return out


def otlp_metrics(
    usages: list[ContainerUsage],
    namespace: str,
    resource: list[JSON],
    time_ns: int,
) -> JSON:
    """An OTLP/HTTP JSON ExportMetricsServiceRequest of the two gauges (`resource`: OTLP
    key-values)."""

    def points(value: Any) -> list[JSON]:
        return [
            {
                "attributes": [
                    {"key": "namespace", "value": {"stringValue": namespace}},
                    {"key": "pod", "value": {"stringValue": u.pod}},
                    {"key": "container", "value": {"stringValue": u.container}},
                ],
                "timeUnixNano": str(time_ns),
                **value(u),
            }
            for u in usages
        ]

    metrics = [
        {
            "name": CPU_METRIC,
            "description": "CPU usage in millicores",
            "unit": CPU_UNIT,
            "gauge": {"dataPoints": points(lambda u: {"asDouble": u.cpu})},
        },
        {
            "name": MEMORY_METRIC,
            "description": "Memory usage in bytes",
            "unit": MEMORY_UNIT,
            "gauge": {"dataPoints": points(lambda u: {"asInt": str(u.memory)})},
        },
    ]
    return {
        "resourceMetrics": [
            {
                "resource": {"attributes": resource},
                "scopeMetrics": [{"scope": {"name": METER}, "metrics": metrics}],
            }
        ]
    }


@dataclass(eq=False)
class TopReader:
    """Reads the namespace's PodMetrics; logs a change of availability once."""

    client: KubeClient
    namespace: str
    available: bool | None = None  # None until the first read

    def read(self) -> list[ContainerUsage] | None:
        """The containers' usage; None when the API is not served (nothing to send) or could
        not be read this time (ApiError other than 404/503 is raised)."""
        try:
            body = self.client.request(
                "GET", METRICS_API.format(namespace=self.namespace), retry=False
            )
        except ApiError as err:
            if err.code not in UNAVAILABLE:
                raise
            if self.available is not False:
                log.info(
                    "metrics.k8s.io is not served (is metrics-server installed?): the "
                    "container resource-usage metrics are not sent",
                    extra={"status": err.code},
                )
            self.available = False
            return None
        if self.available is False:
            log.info("metrics.k8s.io is served again: container resource-usage metrics resume")
        self.available = True
        return container_usages(body if isinstance(body, dict) else {})
