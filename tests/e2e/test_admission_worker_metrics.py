"""Metric files of dead admission workers do not pile up (issue 28 item 8).

Workers write their webhook metrics to prometheus_client multiprocess files named after their
pid; a worker killed and restarted again and again used to leave its counter and histogram files
behind every time (only its live gauge was removed), so the directory, and every scrape's work,
grew with each restart. Now a dead worker's files are folded into `*_retired.db` files: the
directory holds the live workers' files and the retired ones, and the counts stay exact.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from tests.e2e.test_admission_workers import (
    admit,
    alive,
    injections,
    stopped,
    webhook_context,
    worker_pids,
)

RESTARTS = 4
PER_LIFE = 3  # admissions each worker life serves before it is killed


def metrics_dir(op: OperatorProcess) -> Path:
    assert op.proc is not None
    (found,) = Path(tempfile.gettempdir()).glob(f"lumigo-webhook-metrics-{op.proc.pid}.*")
    return found


def pids_with_files(directory: Path) -> set[str]:
    """The process ids (or "retired") the metric files are named after."""
    return {path.name[: -len(".db")].rpartition("_")[2] for path in directory.glob("*.db")}


@pytest.fixture
def operator(cluster: LocalCluster, kube: KubeClient, crd: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, kube, extra_args=("--webhook-workers=2",)).setup()
    try:
        op.start().wait_ready()
        yield op
    finally:
        op.teardown()


def test_restarted_workers_leave_no_files_and_counts_stay_exact(
    cluster: LocalCluster, kube: KubeClient, operator: OperatorProcess
) -> None:
    assert operator.proc is not None
    manager = operator.proc.pid
    directory = metrics_dir(operator)
    context = webhook_context(kube, operator)
    before = injections(operator)
    sent = 0
    for life in range(RESTARTS):
        victim, other = worker_pids(manager)
        with stopped(other):  # only the victim accepts: it serves these admissions
            for i in range(PER_LIFE):
                assert admit(operator.webhook_port, context, "default", f"{life}-{i}")["allowed"]
                sent += 1
        os.kill(victim, signal.SIGKILL)

        def dead(v: int = victim) -> bool:
            return not alive(v)

        def replaced(v: int = victim) -> bool:
            now = worker_pids(manager)
            return len(now) == 2 and v not in now

        wait_until(dead, 10, "the worker to die")

        wait_until(replaced, 60, "a new worker in its place")
        wait_until(lambda: operator.probe("/readyz")[0] == 200, 60, "ready again")

    live = {str(pid) for pid in worker_pids(manager)}
    # Only live workers' files and the retired ones: none of the four dead workers' files.
    assert pids_with_files(directory) <= live | {"retired"}, sorted(directory.iterdir())
    # At most one retired file per type (and gauge mode), however many workers died.
    retired = {path.name for path in directory.glob("*_retired.db")}
    assert retired <= {f"{kind}_retired.db" for kind in (
        "counter", "histogram", "summary", "gauge_sum", "gauge_max", "gauge_min",
        "gauge_mostrecent")}, retired  # fmt: skip
    # Every admission the dead workers served is still counted, once.
    assert injections(operator) - before == sent
    assert (
        f"lumigo_webhook_worker_restarts_total {float(RESTARTS)}" in (operator.probe("/metrics")[1])
    )
