"""The certificate writer and the telemetry proxy run as ordinary single-key controllers of the
runtime: one key in a work queue, the runtime's rate limiter for backoff, its reconcile metrics.

No API server is needed to see the loop: the client points at a loopback port where nothing
listens, so every API call fails for real (connection refused) and the controller must back off.
"""

from __future__ import annotations

import datetime as dt

import pykube
from prometheus_client import REGISTRY

from controller.lumigo.resources import LUMIGOES
from controller.operator import cert_writer_controller
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Result
from controller.runtime.singlekey import KEY
from controller.telemetry.config import ProxySettings
from controller.telemetry.proxy_reconciler import ProxyTarget, TelemetryProxyReconciler
from envtest.process import wait_until
from kube import certs
from kube.cert_manager import CertWriter, ManagedCert

DEAD = "https://127.0.0.1:1"


def dead_client() -> KubeClient:
    config = pykube.KubeConfig.from_url(DEAD)
    return KubeClient(config, timeout=2.0, retry_attempts=1)


def errors(controller: str) -> float:
    labels = {"controller": controller}
    return REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total", labels) or 0.0


def test_the_cert_writer_backs_off_while_the_api_server_fails() -> None:
    policy = certs.CertPolicy(
        service="hook",
        namespace="ops",
        ca_validity=dt.timedelta(days=365),
        serving_validity=dt.timedelta(days=30),
        ca_lookahead=dt.timedelta(days=30),
        serving_lookahead=dt.timedelta(days=7),
    )
    writer = CertWriter(dead_client(), ManagedCert(policy, "hook-certs", mutating=["hook"]))
    controller = cert_writer_controller(writer)
    before = errors(controller.name)
    controller.start()  # the key is already queued: a first pass runs at once
    try:
        wait_until(lambda: errors(controller.name) >= before + 2, 30, "two failed passes")
        # Backing off, not forgotten (the error is counted just before the key is requeued).
        wait_until(lambda: controller.queue.num_requeues(KEY) >= 2, 30, "two requeues")
        writer.trigger()  # an event wakes it early: same single key, same backoff
        wait_until(lambda: errors(controller.name) >= before + 3, 30, "a woken pass")
    finally:
        controller.stop()
    # The old loop's curve: 0.5 s doubling up to 60 s.
    limiter = controller.queue.rate_limiter
    assert [round(limiter.when("probe"), 3) for _ in range(9)] == [
        0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0,
    ]  # fmt: skip


def test_the_proxy_waits_for_the_lumigo_cache_and_then_resyncs() -> None:
    client = dead_client()
    lumigoes = Informer(client, Selection(LUMIGOES))  # never started: never synced
    reconciler = TelemetryProxyReconciler(
        client, lumigoes, ProxyTarget("ops", "proxy-config", "proxy"), ProxySettings()
    )
    # An empty cache would render "no namespaces": look again soon, write nothing.
    assert reconciler.reconcile() == Result(requeue_after=1.0)
    controller = reconciler.controller()
    assert controller.name == "telemetry-proxy"
    limiter = controller.queue.rate_limiter
    assert [limiter.when("probe") for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
