"""Controllers and the manager on a real API server: mapping, requeues, probes, metrics."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from controller.runtime.informer import Informer, metadata_projection
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Controller, Manager, ManagerOptions, Result
from controller.runtime.resources import CONFIGMAPS, DEPLOYMENTS, REPLICASETS
from controller.runtime.store import ObjectKey
from localcluster import LocalCluster, wait_until

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
        REPLICASETS, namespace=namespace, transform=metadata_projection()
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


def test_errors_are_retried_with_backoff_and_requeue_after_works(
    kube: KubeClient, namespace: str, managers: list[Manager]
) -> None:
    manager = new_manager(kube, namespace, leader_election=False)
    calls = Calls()
    failures = {"flaky": 3}

    def reconcile(key: ObjectKey) -> Result:
        calls.add(key)
        if failures.get(key.name, 0) > 0:
            failures[key.name] -= 1
            raise RuntimeError("transient trouble")
        if key.name == "periodic" and calls.count(key) < 3:
            return Result(requeue_after=0.2)
        return Result()

    cms = manager.informer(CONFIGMAPS, namespace=namespace)
    controller = Controller("cm", reconcile, workers=2).for_(cms)
    manager.add_controller(controller)
    managers.append(manager)
    manager.start()
    for name in ("flaky", "periodic", "plain"):
        kube.create(CONFIGMAPS, {"metadata": {"name": name}, "data": {}}, namespace)
    wait_until(lambda: calls.count(ObjectKey(namespace, "flaky")) == 4, 30, "3 retries + success")
    wait_until(lambda: calls.count(ObjectKey(namespace, "periodic")) == 3, 30, "2 requeues")
    assert controller.queue.num_requeues(ObjectKey(namespace, "flaky")) == 0  # forgotten
    _, metrics = get(f"http://127.0.0.1:{manager.metrics_server.port}/metrics")  # type: ignore[union-attr]
    assert 'controller_runtime_reconcile_total{controller="cm",result="error"} 3.0' in metrics
    assert 'controller_runtime_reconcile_errors_total{controller="cm"} 3.0' in metrics


def test_probes_and_metrics_names(
    kube: KubeClient, namespace: str, managers: list[Manager]
) -> None:
    manager = new_manager(kube, namespace, leader_election=True, lease_duration=4,
                          renew_deadline=3, retry_period=1)  # fmt: skip
    cms = manager.informer(CONFIGMAPS, namespace=namespace)
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

    dead = Dead(kube, CONFIGMAPS, namespace="kube-system")
    manager._informers[("dead",)] = dead
    dead.start()
    wait_until(lambda: get(f"{probes}/healthz")[0] == 500, 10, "/healthz to fail")
    code, text = get(f"{probes}/healthz?verbose")
    assert code == 500
    assert "informer threads died: configmaps@kube-system" in text
