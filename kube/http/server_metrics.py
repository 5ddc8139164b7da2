"""Webhook metrics, defined once on the default registry.

Names and labels follow controller-runtime, so dashboards and alerts written for Go operators
keep working: the HTTPS server records the three `controller_runtime_webhook_*` series per route
(`webhook` = the path, e.g. "/v1alpha1/inject") and the certificate manager sets the expiry gauge.
The inject handler's `lumigo_injections_total` is Lumigo's: `webhook.inject_handler`.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

# Go's client has no `_created` series; parity keeps queries and recording rules identical.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Go's DefBuckets, plus 1 ms and 2.5 ms: admissions take a few milliseconds, and a latency SLO of
# 5 ms needs buckets below it.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS_TOTAL = Counter(
    "controller_runtime_webhook_requests_total",
    "Total number of admission requests by HTTP status code.",
    ["webhook", "code"],
)
LATENCY_SECONDS = Histogram(
    "controller_runtime_webhook_latency_seconds",
    "Histogram of the latency of processing admission requests",
    ["webhook"],
    buckets=LATENCY_BUCKETS,
)
REQUESTS_IN_FLIGHT = Gauge(
    "controller_runtime_webhook_requests_in_flight",
    "Current number of admission requests being served.",
    ["webhook"],
    multiprocess_mode="livesum",  # summed over the live admission worker processes
)
CERTIFICATE_EXPIRY = Gauge(
    "lumigo_webhook_certificate_expiry_timestamp_seconds",
    "Unix time at which the webhook certificate expires (kind=ca|serving).",
    ["kind"],
)
