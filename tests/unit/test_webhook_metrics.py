"""Webhook metrics: controller-runtime names and labels, no `_created` series (Go parity)."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from webhook.admission import metrics
from webhook.inject_handler import INJECTIONS_TOTAL


def test_metrics_have_the_controller_runtime_names_and_labels() -> None:
    metrics.REQUESTS_TOTAL.labels("/v1alpha1/inject", "200").inc()
    metrics.LATENCY_SECONDS.labels("/v1alpha1/inject").observe(0.002)
    metrics.REQUESTS_IN_FLIGHT.labels("/v1alpha1/inject").set(0)
    INJECTIONS_TOTAL.labels("ns", "Deployment", "injected", "lumigo").inc()
    metrics.CERTIFICATE_EXPIRY.labels("serving").set(1_900_000_000)
    text = generate_latest(REGISTRY).decode()
    assert (
        'controller_runtime_webhook_requests_total{code="200",webhook="/v1alpha1/inject"}' in text
    )
    assert (
        'controller_runtime_webhook_latency_seconds_bucket{le="0.0025",webhook="/v1alpha1/inject"}'
        in text
    )
    assert 'controller_runtime_webhook_requests_in_flight{webhook="/v1alpha1/inject"}' in text
    assert (
        'lumigo_injections_total{kind="Deployment",namespace="ns",reason="lumigo",result="injected"}'
        in text
    )
    assert 'lumigo_webhook_certificate_expiry_timestamp_seconds{kind="serving"} 1.9e+09' in text
    for family in ("controller_runtime_webhook_requests", "lumigo_injections"):
        assert f"{family}_created" not in text
