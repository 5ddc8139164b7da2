"""Webhook metrics as a scrape sees them after real admissions through the real server:
controller-runtime names and labels, no `_created` series (Go parity)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.runtime.probe_server import ProbeServer
from kube.http.tls import ServingTLS
from tests.support import reviews
from tests.support.webhook_server import client_context, new_pki, real_routes, running

INJECT = "/v1alpha1/inject"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def metrics_url() -> Iterator[str]:
    server = ProbeServer("127.0.0.1:0", probes=False)  # the operator's /metrics endpoint
    server.start()
    yield f"http://127.0.0.1:{server.port}/metrics"
    server.stop()


def scrape(url: str) -> tuple[str, Samples]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_admissions_through_the_server_move_the_controller_runtime_series(
    metrics_url: str,
) -> None:
    pki = new_pki()
    tls = ServingTLS()
    tls.load_pem(pki.serving.cert_pem, pki.serving.key_pem)
    _, before = scrape(metrics_url)
    with running(real_routes(), tls) as server:
        client = reviews.Client(server.port, client_context(pki))
        try:
            for i in range(3):
                review = reviews.review(reviews.deployment(f"shop-{i}"), uid=f"uid-{i}")
                status, body = client.post(INJECT, reviews.body_of(review))
                assert status == 200
                assert json.loads(body)["response"]["allowed"] is True
            status, _ = client.post(INJECT, b"{not json")
            assert status == 400
        finally:
            client.close()
    text, after = scrape(metrics_url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "controller_runtime_webhook_requests_total"
    assert delta(requests, webhook=INJECT, code="200") == 3
    assert delta(requests, webhook=INJECT, code="400") == 1
    latency = "controller_runtime_webhook_latency_seconds"
    assert delta(f"{latency}_count", webhook=INJECT) == 4
    assert delta(f"{latency}_bucket", webhook=INJECT, le="+Inf") == 4
    assert (f"{latency}_bucket", frozenset({("webhook", INJECT), ("le", "0.0025")})) in after
    assert value(after, "controller_runtime_webhook_requests_in_flight", webhook=INJECT) == 0
    injected = dict(namespace="default", kind="Deployment", result="injected", reason="lumigo")
    assert delta("lumigo_injections_total", **injected) == 3
    expiry = pki.serving.cert.not_valid_after_utc.timestamp()
    assert value(after, "lumigo_webhook_certificate_expiry_timestamp_seconds", kind="serving") == (
        expiry
    )
    for family in ("controller_runtime_webhook_requests", "lumigo_injections"):
        assert f"{family}_created" not in text
