"""Webhook metrics on the default registry (names and labels follow controller-runtime).

Dashboards and alerts written for controller-runtime operators keep working: the three
`controller_runtime_webhook_*` series are recorded by the HTTPS server per route path (like
controller-runtime's `InstrumentedHook`); the Lumigo series are ours.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS_TOTAL = Counter(
    "controller_runtime_webhook_requests_total",
    "Total number of admission requests by HTTP status code.",
    ["webhook", "code"],
)
LATENCY_SECONDS = Histogram(
    "controller_runtime_webhook_latency_seconds",
    "Histogram of the latency of processing admission requests",
    ["webhook"],
)
REQUESTS_IN_FLIGHT = Gauge(
    "controller_runtime_webhook_requests_in_flight",
    "Current number of admission requests being served.",
    ["webhook"],
)
INJECTIONS_TOTAL = Counter(
    "lumigo_injections_total",
    "Workload admissions seen by the injector webhook, by outcome and reason.",
    ["namespace", "kind", "result", "reason"],
)
CERTIFICATE_EXPIRY = Gauge(
    "lumigo_webhook_certificate_expiry_timestamp_seconds",
    "Unix time at which the webhook certificate expires (kind=ca|serving).",
    ["kind"],
)
