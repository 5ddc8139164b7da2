"""Controllers and the manager on a real API server: mapping, requeues, probes, metrics."""

from __future__ import annotations

import io
import itertools
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from controller.runtime.informer import Informer, Selection, metadata_projection
from controller.runtime.kube import KubeClient
from controller.runtime.logs import JSONFormatter
from controller.runtime.manager import (
    Controller,
    Manager,
    ManagerOptions,
    ReconcileError,
    Result,
    Runnable,
)
from controller.runtime.ratelimit import ItemExponentialFailureRateLimiter
from controller.runtime.store import ObjectKey
from controller.runtime.workqueue import RateLimitingQueue
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import CONFIGMAPS, DEPLOYMENTS, REPLICASETS

JSON = dict[str, Any]


class Calls:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: list[ObjectKey] = []

    def add(self, key: ObjectKey) -> None:
        with self.lock:
            self.keys.append(key)

    def count(self, key: ObjectKey) -> int:
        with self.lock:
            return self.keys.count(key)


@pytest.fixture
def managers() -> Iterator[list[Manager]]:
    started: list[Manager] = []
    yield started
    for m in started:
        m.stop()


def new_manager(kube: KubeClient, namespace: str, **kwargs: Any) -> Manager:
    opts = ManagerOptions(
        namespace=namespace,
        health_probe_bind_address="127.0.0.1:0",
        metrics_bind_address="localhost:0",  # a different address: its own server
        graceful_shutdown_timeout=5,
        **kwargs,
    )
    return Manager(kube, opts)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_an_owned_replicaset_event_enqueues_its_deployment(
    full_cluster: LocalCluster, kube: KubeClient, namespace: str, managers: list[Manager]
) -> None:
    manager = new_manager(kube, namespace, leader_election=False)
    calls = Calls()

    def reconcile(key: ObjectKey) -> Result:
        calls.add(key)
        return Result()

    replicasets = manager.informer(
        Selection(REPLICASETS, namespace=namespace), transform=metadata_projection()
    )
    manager.add_controller(Controller("deploy", reconcile).owns(replicasets, DEPLOYMENTS))
    managers.append(manager)
    manager.start()
    kube.create(
        DEPLOYMENTS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
                },
            },
        },
        namespace,
    )
    # Only ReplicaSets are watched: the Deployment's key can come only from the owner mapping.
    wait_until(lambda: calls.count(ObjectKey(namespace, "web")) >= 1, 60, "the owner's key")
    assert all(k == ObjectKey(namespace, "web") for k in calls.keys)


def test_errors_are_retried_with_growing_backoff_and_requeue_after_works(
    kube: KubeClient, namespace: str, managers: list[Manager]
) -> None:
    manager = new_manager(kube, namespace, leader_election=False)
    calls = Calls()
    failures = {"flaky": 3}
    called_at: dict[str, list[float]] = {"flaky": [], "periodic": []}

    def reconcile(key: ObjectKey) -> Result:
        calls.add(key)
        called_at.get(key.name, []).append(time.monotonic())
        if failures.get(key.name, 0) > 0:
            failures[key.name] -= 1
            raise RuntimeError("transient trouble")
        if key.name == "periodic" and calls.count(key) < 3:
            return Result(requeue_after=0.2)
        return Result()

    cms = manager.informer(Selection(CONFIGMAPS, namespace=namespace))
    # Backoff of 0.2 s doubling: each retry of "flaky" waits at least twice the one before.
    limiter = ItemExponentialFailureRateLimiter(base_delay=0.2, max_delay=10)
    queue = RateLimitingQueue[ObjectKey](name="cm", rate_limiter=limiter)
    controller = Controller("cm", reconcile, workers=2, queue=queue).for_(cms)
    manager.add_controller(controller)
    managers.append(manager)
    manager.start()
    for name in ("flaky", "periodic", "plain"):
        kube.create(CONFIGMAPS, {"metadata": {"name": name}, "data": {}}, namespace)
    wait_until(lambda: calls.count(ObjectKey(namespace, "flaky")) == 4, 30, "3 retries + success")
    wait_until(lambda: calls.count(ObjectKey(namespace, "periodic")) == 3, 30, "2 requeues")
    # A retry never comes before its backoff (lower bounds only: a busy machine is only later).
    flaky = called_at["flaky"]
    gaps = [later - earlier for earlier, later in itertools.pairwise(flaky)]
    assert [gap >= 0.2 * 2**i for i, gap in enumerate(gaps)] == [True, True, True], gaps
    periodic = called_at["periodic"]
    assert all(later - earlier >= 0.2 for earlier, later in itertools.pairwise(periodic))
    _, metrics = get(f"http://127.0.0.1:{manager.metrics_server.port}/metrics")  # type: ignore[union-attr]
    assert 'controller_runtime_reconcile_total{controller="cm",result="error"} 3.0' in metrics
    assert 'controller_runtime_reconcile_errors_total{controller="cm"} 3.0' in metrics
    # Success resets the backoff: the next failure of "flaky" waits the base delay again.
    assert limiter.when(ObjectKey(namespace, "flaky")) == 0.2


def test_probes_and_metrics_names(
    kube: KubeClient, namespace: str, managers: list[Manager]
) -> None:
    manager = new_manager(kube, namespace, leader_election=True, lease_duration=4,
                          renew_deadline=3, retry_period=1)  # fmt: skip
    cms = manager.informer(Selection(CONFIGMAPS, namespace=namespace))
    manager.add_controller(Controller("probe-test", lambda key: Result()).for_(cms))
    managers.append(manager)
    manager.start()
    wait_until(lambda: manager.is_leader, 30, "leadership")
    probes = f"http://127.0.0.1:{manager.probes.port}"
    assert get(f"{probes}/healthz") == (200, "ok")
    assert get(f"{probes}/readyz") == (200, "ok")
    assert get(f"{probes}/metrics")[0] == 404  # metrics have their own port here
    kube.create(CONFIGMAPS, {"metadata": {"name": "x"}, "data": {}}, namespace)
    _, metrics = get(f"http://127.0.0.1:{manager.metrics_server.port}/metrics")  # type: ignore[union-attr]
    for name in (
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_retries_total",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds",
        "controller_runtime_active_workers",
        "controller_runtime_max_concurrent_reconciles",
        "leader_election_master_status",
        "rest_client_requests_total",
    ):
        assert f"\n{name}" in metrics, name
    assert f'leader_election_master_status{{name="{manager.options.leader_election_id}"}} 1.0' in (
        metrics
    )
    assert "_created" not in metrics  # parity with Go exporters

    # A dead informer turns /healthz red and says which one.
    class Dead(Informer):
        def _run(self) -> None:
            return

    dead = Dead(kube, Selection(CONFIGMAPS, namespace="kube-system"))
    manager._informers[dead.selection] = dead
    dead.start()
    wait_until(lambda: get(f"{probes}/healthz")[0] == 500, 10, "/healthz to fail")
    code, text = get(f"{probes}/healthz?verbose")
    assert code == 500
    assert "informer threads died: configmaps@kube-system" in text


def test_a_second_informer_with_another_projection_or_index_is_refused(
    kube: KubeClient, namespace: str
) -> None:
    manager = new_manager(kube, namespace, leader_election=False)
    projection, cms = metadata_projection(), Selection(CONFIGMAPS, namespace=namespace)
    shared = manager.informer(cms, transform=projection)
    assert manager.informer(cms, transform=projection) is shared
    with pytest.raises(ValueError, match="another transform or other indexed labels"):
        manager.informer(cms)  # would get projections, not objects
    with pytest.raises(ValueError, match="another transform or other indexed labels"):
        manager.informer(cms, transform=projection, indexed_labels=("tier",))
    assert manager.informer(Selection(CONFIGMAPS, namespace="other")) is not shared  # another cache


class Lifecycle:
    """A runnable that records its start and stop calls; its start can wait for something."""

    def __init__(self, name: str, started_when: threading.Event | None = None) -> None:
        self.name = name
        self.started_when = started_when
        self.started = threading.Event()
        self.stopped = threading.Event()

    def start(self) -> None:
        self.started.set()
        if self.started_when is not None:
            self.started_when.wait(30)

    def stop(self) -> None:
        self.stopped.set()


def test_a_runnable_being_started_when_shutdown_begins_is_stopped_and_no_later_one_starts(
    kube: KubeClient, namespace: str, managers: list[Manager]
) -> None:
    manager = new_manager(kube, namespace, leader_election=False)
    controller = Controller("shutdown-race", lambda key: Result())
    manager.add_controller(controller)
    shutdown_began = threading.Event()
    slow = Lifecycle("slow", started_when=shutdown_began)  # still starting when stop() begins
    later = Lifecycle("later")
    manager.add_runnable(Runnable("slow", slow.start, slow.stop, leader_only=True))
    manager.add_runnable(Runnable("later", later.start, later.stop, leader_only=True))
    starting = threading.Thread(target=manager.start)
    starting.start()
    wait_until(slow.started.is_set, 30, "the slow runnable to be starting")
    stopping = threading.Thread(target=manager.stop)
    stopping.start()
    # The first thing stop() does is drain controllers: their queues shut down.
    wait_until(controller.queue.shutting_down, 10, "shutdown to begin")
    shutdown_began.set()
    starting.join(30)
    stopping.join(30)
    assert not starting.is_alive()
    assert not stopping.is_alive()
    assert slow.stopped.is_set()  # it was started, so it is stopped
    assert not later.started.is_set()  # shutdown had begun: never started, never leaked


def json_lines(stream: io.StringIO) -> list[JSON]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """JSON log lines of the process, as the operator writes them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    test_logger = logging.getLogger("test.reconcile")
    test_logger.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    test_logger.setLevel(logging.NOTSET)


def test_unexpected_exceptions_are_panics_and_every_line_of_a_reconcile_has_its_id(
    kube: KubeClient, namespace: str, managers: list[Manager], log_lines: io.StringIO
) -> None:
    manager = new_manager(kube, namespace, leader_election=False)
    log = logging.getLogger("test.reconcile")
    attempts = Calls()

    def reconcile(key: ObjectKey) -> Result:
        attempts.add(key)
        log.info("reconciling", extra={"attempt": attempts.count(key)})
        if key.name == "bug" and attempts.count(key) == 1:
            return {}["missing"]  # type: ignore[no-any-return]  # a bug: KeyError
        if key.name == "expected" and attempts.count(key) == 1:
            raise ReconcileError("not yet")
        return Result()

    cms = manager.informer(Selection(CONFIGMAPS, namespace=namespace))
    manager.add_controller(Controller("panics", reconcile).for_(cms))
    managers.append(manager)
    manager.start()
    for name in ("bug", "expected"):
        kube.create(CONFIGMAPS, {"metadata": {"name": name}, "data": {}}, namespace)
    for name in ("bug", "expected"):
        wait_until(lambda n=name: attempts.count(ObjectKey(namespace, n)) == 2, 30, "a retry")
    _, metrics = get(f"http://127.0.0.1:{manager.metrics_server.port}/metrics")  # type: ignore[union-attr]
    assert 'controller_runtime_reconcile_panics_total{controller="panics"} 1.0' in metrics
    assert 'controller_runtime_reconcile_errors_total{controller="panics"} 2.0' in metrics

    ours = {f"{namespace}/bug", f"{namespace}/expected"}  # not the namespace's CA ConfigMap
    lines = [line for line in json_lines(log_lines) if line.get("key") in ours]
    by_id: dict[str, list[JSON]] = {}
    for line in lines:
        by_id.setdefault(line["reconcileID"], []).append(line)  # KeyError: a line without one
    assert len(by_id) == 4  # two reconciles of each key, each with its own ID
    failed = [group for group in by_id.values() if len(group) == 2]
    assert len(failed) == 2  # "reconciling" and the failure, under one ID
    panic = next(g for g in failed if g[0]["key"] == f"{namespace}/bug")
    assert "KeyError" in panic[1]["stacktrace"]
    expected = next(g for g in failed if g[0]["key"] == f"{namespace}/expected")
    assert (expected[1]["error"], "stacktrace" in expected[1]) == ("not yet", False)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_runnables_and_controllers_report_their_health(
    kube: KubeClient, namespace: str, managers: list[Manager]
) -> None:
    manager = new_manager(kube, namespace, leader_election=False)
    broken = threading.Event()

    def webhook_health() -> None:
        if broken.is_set():
            raise RuntimeError("serving thread died")

    def idle_health() -> None:
        raise RuntimeError("not started, so never asked")

    manager.add_runnable(Runnable("webhook", lambda: None, lambda: None, healthy=webhook_health))

    def reconcile(key: ObjectKey) -> Result:
        if key.name == "fatal":
            raise SystemExit  # not an Exception: it ends the worker thread
        return Result()

    cms = manager.informer(Selection(CONFIGMAPS, namespace=namespace))
    manager.add_controller(Controller("fragile", reconcile).for_(cms))
    managers.append(manager)
    manager.start()
    # Added after the start: such a runnable is never started, and is not judged.
    manager.add_runnable(Runnable("idle", lambda: None, lambda: None, healthy=idle_health))
    probes = f"http://127.0.0.1:{manager.probes.port}"
    assert get(f"{probes}/healthz") == (200, "ok")

    broken.set()
    code, text = get(f"{probes}/healthz?verbose")
    assert code == 500
    assert "[-]webhook failed: serving thread died" in text
    assert "[+]idle ok" in text
    broken.clear()

    kube.create(CONFIGMAPS, {"metadata": {"name": "fatal"}, "data": {}}, namespace)
    wait_until(lambda: get(f"{probes}/healthz")[0] == 500, 30, "/healthz to fail")
    code, text = get(f"{probes}/healthz?verbose")
    assert "[-]controller-fragile failed: worker threads died: fragile-worker-0" in text
