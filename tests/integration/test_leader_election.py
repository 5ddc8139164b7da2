"""Two processes campaigning for one Lease: exactly one leads; the other takes over."""

from __future__ import annotations

import datetime as dt
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import LEASES

ROOT = Path(__file__).resolve().parents[2]

CANDIDATE = """
import signal, sys, threading
from controller.runtime.kube import KubeClient
from controller.runtime.leader import LeaderElector, LeaseSettings
from controller.runtime.logs import setup_logging

setup_logging("warning")
done = threading.Event()
lost = threading.Event()
def stopped():
    print("LOST", flush=True)
    lost.set()
lease_duration = float(sys.argv[4])
elector = LeaderElector(
    KubeClient.from_kubeconfig(sys.argv[1]).clone(timeout=2, retry_attempts=1),
    LeaseSettings(
        sys.argv[2], "test-lease", identity=sys.argv[3],
        lease_duration=lease_duration, renew_deadline=0.75 * lease_duration, retry_period=1,
    ),
    on_started_leading=lambda: print("LEADING", flush=True),
    on_stopped_leading=stopped,
)
signal.signal(signal.SIGTERM, lambda *_: done.set())
elector.start()
while not done.wait(0.1) and not lost.is_set():
    pass
elector.stop()
print("EXIT", flush=True)
"""


class Candidate:
    def __init__(
        self, cluster: LocalCluster, namespace: str, identity: str, lease_duration: int = 4
    ) -> None:
        self.identity = identity
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CANDIDATE,
                str(cluster.kubeconfig),
                namespace,
                identity,
                str(lease_duration),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def said(self, word: str) -> bool:
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return word in self.seen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def candidates(cluster: LocalCluster, namespace: str) -> Iterator[list[Candidate]]:
    group = [Candidate(cluster, namespace, f"candidate-{i}") for i in range(2)]
    yield group
    for c in group:
        c.stop()


@pytest.fixture
def long_lease_candidates(cluster: LocalCluster, namespace: str) -> Iterator[list[Candidate]]:
    """Candidates whose lease lasts 15 s: long enough to tell a release from an expiry."""
    group = [Candidate(cluster, namespace, f"candidate-{i}", lease_duration=15) for i in range(2)]
    yield group
    for c in group:
        c.stop()


def holder(kube: KubeClient, namespace: str) -> str:
    lease = kube.get_or_none(LEASES, "test-lease", namespace) or {}
    return str((lease.get("spec") or {}).get("holderIdentity", ""))


def test_exactly_one_leads_and_the_other_takes_over_after_a_kill(
    kube: KubeClient, namespace: str, candidates: list[Candidate]
) -> None:
    wait_until(lambda: any(c.said("LEADING") for c in candidates), 30, "a leader")
    leaders = [c for c in candidates if c.said("LEADING")]
    assert len(leaders) == 1
    leader = leaders[0]
    other = next(c for c in candidates if c is not leader)
    assert holder(kube, namespace) == leader.identity
    # The follower keeps following while the leader renews (several lease durations).
    deadline = time.monotonic() + 9
    while time.monotonic() < deadline:
        assert not other.said("LEADING")
        time.sleep(0.5)

    leader.proc.send_signal(signal.SIGKILL)  # no release: the lease must expire
    # Takeover is bounded by the lease duration (4 s) plus a retry period; the deadline leaves
    # room for a loaded 2-core machine.
    wait_until(lambda: other.said("LEADING"), 20, "the follower to take over")
    assert holder(kube, namespace) == other.identity
    lease = kube.get(LEASES, "test-lease", namespace)
    assert lease["spec"]["leaseTransitions"] >= 1


def lease_time(value: str) -> dt.datetime:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)


def test_graceful_stop_releases_the_lease(
    kube: KubeClient, namespace: str, long_lease_candidates: list[Candidate]
) -> None:
    candidates = long_lease_candidates
    wait_until(lambda: any(c.said("LEADING") for c in candidates), 30, "a leader")
    leader = next(c for c in candidates if c.said("LEADING"))
    other = next(c for c in candidates if c is not leader)
    held = kube.get(LEASES, "test-lease", namespace)["spec"]
    assert held["holderIdentity"] == leader.identity
    # The old lease is valid at least until then: renewals only push this later.
    valid_until = lease_time(held["renewTime"]) + dt.timedelta(seconds=held["leaseDurationSeconds"])

    leader.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: leader.said("EXIT"), 20, "the leader to exit")
    wait_until(lambda: other.said("LEADING"), 40, "the follower to take over")
    taken = kube.get(LEASES, "test-lease", namespace)["spec"]
    assert taken["holderIdentity"] == other.identity
    assert taken["leaseTransitions"] == held["leaseTransitions"] + 1
    # Only a release lets the follower in while the old lease has not expired yet (both times
    # are written by processes on this machine, so one clock).
    assert lease_time(taken["acquireTime"]) < valid_until, (taken, held)
