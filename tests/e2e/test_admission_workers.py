"""Admission served by worker processes (issue 18): each worker answers from its own Lumigo cache,
their metrics add up on the manager's /metrics, a dead worker is restarted (the manager is not
ready meanwhile), and no worker outlives the manager."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import signal
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, EVENTS, MUTATING_WEBHOOK_CONFIGURATIONS
from tests.support import reviews
from tests.support.checks import TOKEN, is_active, lumigo_yaml
from tests.support.lumigo import create_token_secret
from tests.support.webhook_server import peer_fingerprint

INJECT = "/v1alpha1/inject"


def worker_pids(parent: int) -> list[int]:
    """The manager's admission workers: its children started by multiprocessing's spawn."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == parent and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def process_state(pid: int) -> str:
    """R, S, T (stopped), Z (a zombie) ...; "" when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def alive(pid: int) -> bool:
    return process_state(pid) not in ("", "Z")


def webhook_context(kube: KubeClient, op: OperatorProcess) -> ssl.SSLContext:
    """Trusts the CA the operator wrote into its webhook configuration."""
    config = kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, op.config_name)
    bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    return ssl.create_default_context(cadata=bundle.decode())


def admit(port: int, context: ssl.SSLContext, namespace: str, uid: str) -> dict[str, object]:
    """One admission on a new connection (a new connection goes to a worker that accepts)."""
    client = reviews.Client(port, context, timeout=10)
    try:
        body = reviews.body_of(reviews.review(reviews.deployment("shop", namespace), uid=uid))
        status, reply = client.post(INJECT, body)
    finally:
        client.close()
    assert status == 200, reply
    response: dict[str, object] = json.loads(reply)["response"]
    return response


def injections(op: OperatorProcess) -> float:
    """controller_runtime_webhook_requests_total of the inject route, code 200, as the manager
    shows it."""
    total = 0.0
    for line in op.probe("/metrics")[1].splitlines():
        if line.startswith("controller_runtime_webhook_requests_total{") and (
            f'webhook="{INJECT}"' in line and 'code="200"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process cannot accept connections meanwhile: the others get them all."""
    os.kill(pid, signal.SIGSTOP)
    try:
        # Stopped for real before anyone connects (else it may still accept one and then sit
        # on it): the kernel shows the state as T.
        wait_until(lambda: process_state(pid) == "T", 10, "the process to stop")
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
def operator(cluster: LocalCluster, kube: KubeClient, crd: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, kube, extra_args=("--webhook-workers=2",)).setup()
    try:
        op.start().wait_ready()
        yield op
    finally:
        op.teardown()


def test_each_worker_admits_from_its_own_cache_and_metrics_add_up(
    cluster: LocalCluster, kube: KubeClient, operator: OperatorProcess
) -> None:
    assert operator.proc is not None
    workers = worker_pids(operator.proc.pid)
    assert len(workers) == 2
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    context = webhook_context(kube, operator)
    before = injections(operator)
    sent = 0
    for serving, paused in ((workers[0], workers[1]), (workers[1], workers[0])):
        with stopped(paused):
            # Only `serving` accepts now: it must see the new Lumigo through its own watch.
            wait_until(lambda: bool(admit(operator.webhook_port, context, ns, "probe")
                                    .get("patch")), 30, f"worker {serving} to inject")  # fmt: skip
            sent += 1
            for i in range(5):
                response = admit(operator.webhook_port, context, ns, f"{serving}-{i}")
                assert response["allowed"] is True
                assert response.get("patch"), "no injection from this worker"
                sent += 1
    # Both workers' counts are on the manager's /metrics (each served six).
    wait_until(lambda: injections(operator) - before >= sent, 10, "the workers' counts")
    status, text = operator.probe("/readyz?verbose")
    assert status == 200
    assert "[+]webhook-server ok" in text


def test_a_worker_that_dies_is_restarted(
    cluster: LocalCluster, kube: KubeClient, operator: OperatorProcess
) -> None:
    assert operator.proc is not None
    first = worker_pids(operator.proc.pid)
    os.kill(first[0], signal.SIGKILL)
    wait_until(lambda: not alive(first[0]), 10, "the worker to die")

    def replaced() -> bool:
        assert operator.proc is not None
        now = worker_pids(operator.proc.pid)
        return len(now) == 2 and first[0] not in now and first[1] in now

    wait_until(replaced, 30, "a new worker in its place")
    wait_until(lambda: operator.probe("/readyz")[0] == 200, 60, "ready again")
    context = webhook_context(kube, operator)
    for i in range(4):
        assert admit(operator.webhook_port, context, "default", f"after-{i}")["allowed"] is True
    assert "admission worker exited; restarting it" in operator.log_tail(400)
    assert "lumigo_webhook_worker_restarts_total 1.0" in operator.probe("/metrics")[1]


def test_unready_while_a_worker_is_missing(
    cluster: LocalCluster, kube: KubeClient, operator: OperatorProcess
) -> None:
    assert operator.proc is not None
    pids = worker_pids(operator.proc.pid)
    with stopped(pids[1]):
        os.kill(pids[0], signal.SIGKILL)
        # The replacement cannot be ready before its cache syncs; the manager says which.
        wait_until(lambda: "admission worker 0" in operator.probe("/readyz?verbose")[1], 10,
                   "readyz to name the missing worker")  # fmt: skip
        status, text = operator.probe("/readyz?verbose")
        assert status != 200
        assert "[-]webhook-server failed: admission worker 0" in text
    wait_until(lambda: operator.probe("/readyz")[0] == 200, 60, "ready again")


def test_each_worker_serves_a_renewed_certificate_without_restarting(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    """The leader renews the serving certificate (here every ~10 s: 40 s validity, renewed 30 s
    before expiry); every worker swaps it in from its own watch of the Secret, for new
    connections, while an open keep-alive connection keeps the one it started with."""
    renewing = ("--webhook-workers=2", "--cert-validity=40s", "--cert-lookahead=30s",
                "--cert-check-interval=1s")  # fmt: skip
    op = OperatorProcess(cluster, kube, extra_args=renewing).setup()
    try:
        op.start().wait_ready()
        assert op.proc is not None
        workers = worker_pids(op.proc.pid)
        context = webhook_context(kube, op)
        body = reviews.body_of(reviews.review(reviews.deployment("shop", "default")))
        kept = reviews.Client(op.webhook_port, context)
        try:
            assert kept.post(INJECT, body)[0] == 200
            assert kept.conn.sock is not None
            first = peer_fingerprint(kept.conn.sock)  # type: ignore[arg-type]

            def renewed() -> bool:
                client = reviews.Client(op.webhook_port, context, timeout=10)
                try:
                    assert client.post(INJECT, body)[0] == 200
                    assert client.conn.sock is not None
                    return peer_fingerprint(client.conn.sock) != first  # type: ignore[arg-type]
                finally:
                    client.close()

            for serving, paused in ((workers[0], workers[1]), (workers[1], workers[0])):
                with stopped(paused):
                    wait_until(renewed, 60, f"worker {serving} to serve a renewed certificate")
            assert kept.post(INJECT, body)[0] == 200  # the open connection was not dropped
            assert peer_fingerprint(kept.conn.sock) == first  # type: ignore[arg-type]
        finally:
            kept.close()
        assert worker_pids(op.proc.pid) == workers  # swapped in place, no restart
    finally:
        op.teardown()


def test_no_worker_outlives_the_manager(
    cluster: LocalCluster, kube: KubeClient, operator: OperatorProcess
) -> None:
    assert operator.proc is not None
    workers = worker_pids(operator.proc.pid)
    assert workers
    os.kill(operator.proc.pid, signal.SIGKILL)  # the manager only, not its process group
    operator.proc.wait(10)
    wait_until(lambda: not any(alive(pid) for pid in workers), 15, "the workers to exit")


def test_sigterm_stops_the_workers_gracefully(
    cluster: LocalCluster, kube: KubeClient, operator: OperatorProcess
) -> None:
    assert operator.proc is not None
    workers = worker_pids(operator.proc.pid)
    os.kill(operator.proc.pid, signal.SIGTERM)  # as the kubelet does, to the manager
    assert operator.proc.wait(40) == 0
    assert not any(alive(pid) for pid in workers)
    assert "admission workers stopped" in operator.log_tail(200)


def test_after_sigterm_the_webhook_serves_on_while_not_ready_for_the_shutdown_delay(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    """A pod leaves its Service's endpoints a moment after SIGTERM: until then admissions still
    reach it, and must be answered, not refused (with `failurePolicy: Ignore` a refused one is a
    workload created uninstrumented during an upgrade of the operator)."""
    op = OperatorProcess(cluster, kube, extra_args=("--webhook-workers=2",
                                                    "--shutdown-delay=4s")).setup()  # fmt: skip
    try:
        op.start().wait_ready()
        assert op.proc is not None
        context = webhook_context(kube, op)
        kept = reviews.Client(op.webhook_port, context, timeout=10)  # a keep-alive connection
        review = reviews.review(reviews.deployment("shop", "default"), uid="kept")
        assert kept.post(INJECT, reviews.body_of(review))[0] == 200
        assert kept.last_headers is not None
        assert kept.last_headers.get("connection") is None
        os.kill(op.proc.pid, signal.SIGTERM)
        wait_until(lambda: op.probe("/readyz")[0] == 500, 3, "/readyz to fail at once")
        assert "shutting down" in op.probe("/readyz?verbose")[1]
        # The connection still in use is answered, and told to close (its worker drains).
        assert kept.post(INJECT, reviews.body_of(review))[0] == 200
        assert kept.last_headers.get("connection") == "close"
        kept.close()
        for attempt in range(3):  # new connections, to every worker, while not ready
            assert admit(op.webhook_port, context, "default", f"late-{attempt}")["allowed"]
        assert op.proc.poll() is None
        assert op.proc.wait(40) == 0
        assert "admission workers stopped" in op.log_tail(200)
    finally:
        op.teardown()


def dropped_not_found(op: OperatorProcess) -> float:
    """lumigo_events_dropped_total{why="not-found"} on the manager's /metrics."""
    for line in op.probe("/metrics")[1].splitlines():
        if line.startswith('lumigo_events_dropped_total{why="not-found"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_forged_reviews_post_no_event_while_real_admissions_do(
    cluster: LocalCluster, kube: KubeClient, operator: OperatorProcess
) -> None:
    """Issue 28 item 2: anyone reaching the webhook port can post a review naming any object,
    uid and namespace; the workers forward its events to the manager, which posts them only
    about an object the API has as the review names it."""
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    real = reviews.deployment("real", ns)
    created = kube.create(DEPLOYMENTS, real, ns)  # through the API server and the webhook

    def webhook_events() -> list[dict[str, Any]]:
        items, _ = kube.list(EVENTS, ns)
        return [e for e in items if e.get("source", {}).get("component", "").endswith("webhook")]

    wait_until(webhook_events, 30, "the real admission's event")
    (event,) = webhook_events()
    assert event["involvedObject"]["uid"] == created["metadata"]["uid"]
    # A CREATE's object has no uid: one that existed before the review is not its object.
    stamp = dt.datetime.fromisoformat(created["metadata"]["creationTimestamp"]).timestamp()
    wait_until(lambda: time.time() > stamp + 7, 15, "the Deployment to be older than the slack")
    before = dropped_not_found(operator)
    context = webhook_context(kube, operator)
    forged = [
        ("UPDATE", {**real, "metadata": {**real["metadata"], "uid": str(uuid.uuid4())}}),
        ("UPDATE", {**real, "metadata": {**real["metadata"], "name": "ghost", "uid": "u-1"}}),
        ("CREATE", real),
    ]
    for i, (operation, obj) in enumerate(forged):
        client = reviews.Client(operator.webhook_port, context, timeout=10)
        try:
            body = reviews.body_of(reviews.review(obj, uid=f"forged-{i}", operation=operation))
            assert client.post(INJECT, body)[0] == 200
        finally:
            client.close()
    # Each waits for its object (5 s), then is dropped; without the fix each is posted at once.
    wait_until(lambda: dropped_not_found(operator) >= before + len(forged), 60, "the drops")
    (event,) = webhook_events()
    assert event["involvedObject"]["uid"] == created["metadata"]["uid"]
    assert event["count"] == 1
