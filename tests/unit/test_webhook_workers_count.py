"""Admission worker processes: how many (the flag, and the container's CPU limit behind
'auto'), their metrics directories, and their readiness."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from controller import webhook_workers
from controller.cli import _parser
from controller.options import run_options
from kube.http.readiness import NotReady


def parse(*args: str) -> int:
    return run_options(_parser().parse_args(["run", *args])).webhook_workers


def test_the_flag_takes_auto_a_number_or_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LUMIGO_WEBHOOK_WORKERS", raising=False)
    assert parse() == -1  # auto: decided at start-up
    assert parse("--webhook-workers=auto") == -1
    assert parse("--webhook-workers=0") == 0
    assert parse("--webhook-workers=3") == 3
    monkeypatch.setenv("LUMIGO_WEBHOOK_WORKERS", "2")
    assert parse() == 2


@pytest.mark.parametrize("bad", ["-1", "65", "two"])
def test_a_bad_count_is_refused_with_a_clear_message(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(f"--webhook-workers={bad}")
    assert "webhook worker" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("cpu_max", "cpus", "expected"),
    [
        ("max 100000\n", 2, 2),  # no limit: every CPU we may run on
        ("50000 100000\n", 2, 1),  # 500m (the chart's default) -> 1
        ("150000 100000\n", 4, 2),  # 1.5 -> 2, rounded up
        ("800000 100000\n", 2, 2),  # a limit above the CPUs we have
    ],
)
def test_auto_follows_the_cgroup_v2_cpu_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_max: str, cpus: int, expected: int
) -> None:
    (tmp_path / "cpu.max").write_text(cpu_max)
    real_path = webhook_workers.Path

    def fake_path(*parts: str) -> Path:
        joined = real_path(*parts)
        if str(joined) == "/sys/fs/cgroup/cpu.max":
            return tmp_path / "cpu.max"
        return tmp_path / "absent" if str(joined).startswith("/sys/fs/cgroup") else joined

    monkeypatch.setattr(webhook_workers, "Path", fake_path)
    monkeypatch.setattr(webhook_workers.os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    assert webhook_workers.default_worker_count() == expected


def test_auto_follows_the_cgroup_v1_quota(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    v1 = tmp_path / "cpu,cpuacct"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    real_path = webhook_workers.Path

    def fake_path(*parts: str) -> Path:
        joined = real_path(*parts)
        if str(joined).startswith("/sys/fs/cgroup/cpu,cpuacct"):
            return v1 / joined.name
        return tmp_path / "absent" if str(joined).startswith("/sys/fs/cgroup") else joined

    monkeypatch.setattr(webhook_workers, "Path", fake_path)
    monkeypatch.setattr(webhook_workers.os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert webhook_workers.default_worker_count() == 3  # 2.5 CPUs, rounded up


def test_metrics_directories_of_managers_that_are_gone_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A killed manager leaves its directory in /tmp (an emptyDir that outlives the container)."""
    monkeypatch.setattr(webhook_workers.tempfile, "gettempdir", lambda: str(tmp_path))
    prefix = "lumigo-webhook-metrics-"
    ours = tmp_path / f"{prefix}{webhook_workers._process_identity()}-abc"
    reused_pid = tmp_path / f"{prefix}{os.getpid()}.1-def"  # our pid, another start time
    dead = tmp_path / f"{prefix}999999999.5-ghi"
    unrelated = tmp_path / "something-else"
    for path in (ours, reused_pid, dead, unrelated):
        path.mkdir()
    webhook_workers._remove_stale_metrics_dirs()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name, unrelated.name])


class _Manager:
    """The worker's pipe to its manager: what it was told, and whether the heap was frozen."""

    def __init__(self) -> None:
        self.told: list[tuple[str, object]] = []
        self.frozen_when_told: list[int] = []

    def send(self, message: tuple[str, object]) -> bool:
        self.told.append(message)
        self.frozen_when_told.append(gc.get_freeze_count())
        return True


def test_a_worker_freezes_its_start_up_heap_once_ready_before_it_says_so() -> None:
    """A full collection in a worker would walk every start-up object (20-50 ms on busy cores,
    an admission waiting behind it); once ready, the start-up heap is out of its sight."""
    gc.unfreeze()
    synced = False

    def check() -> None:
        if not synced:
            raise NotReady("the Lumigo cache has not synced yet")

    manager = _Manager()
    readiness = webhook_workers.Readiness(check, manager)  # type: ignore[arg-type]
    try:
        readiness.report()
        assert manager.told == [("ready", (False, "the Lumigo cache has not synced yet"))]
        assert gc.get_freeze_count() == 0  # not while starting: start-up garbage still goes
        synced = True
        readiness.report()
        assert manager.told[-1] == ("ready", (True, ""))
        assert manager.frozen_when_told[-1] > 1000  # frozen before the manager heard "ready"
        readiness.report()
        assert len(manager.told) == 2  # told once per change
    finally:
        gc.unfreeze()
