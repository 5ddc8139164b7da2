"""The admission workers fit the container's memory limit (issue 28 item 3).

Handling one maximum-size review takes ~235 MiB; each worker used to handle one on its own, so
two workers under the chart's 512 Mi could be OOM-killed by concurrent 7 MiB requests. The
workers of a pod now share large-body slots (flock: a killed worker gives its slot back), their
body budgets are shared out, and `auto` starts no more workers than the memory limit holds.
The measured side is tests/unit/test_webhook_memory.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controller import webhook_workers
from envtest.process import wait_until
from kube.http import memory
from kube.http.messages import MAX_BODY_BYTES

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def fake_cgroup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpus: float, limit: str) -> None:
    (tmp_path / "cpu.max").write_text(f"{int(cpus * 100000)} 100000\n")
    (tmp_path / "memory.max").write_text(limit + "\n")
    real_path = webhook_workers.Path

    def fake_path(*parts: str) -> Path:
        joined = real_path(*parts)
        if str(joined) == "/sys/fs/cgroup/cpu.max":
            return tmp_path / "cpu.max"
        return tmp_path / "absent" if str(joined).startswith("/sys/fs/cgroup") else joined

    monkeypatch.setattr(webhook_workers, "Path", fake_path)
    monkeypatch.setattr(webhook_workers.os, "sched_getaffinity", lambda _pid: set(range(64)))
    monkeypatch.setattr(memory, "_LIMIT_FILES", (str(tmp_path / "memory.max"),))


@pytest.mark.parametrize(
    ("cpus", "limit", "expected"),
    [
        (0.5, str(512 * MiB), 1),  # the chart's default
        (2, str(512 * MiB), 1),  # two CPUs, but two workers do not fit 512 Mi
        (2, str(768 * MiB), 2),  # +256 Mi per worker beyond the first, as values.yaml says
        (4, str(1024 * MiB), 4),  # 4 workers, 2 large bodies at once: ~896 MiB
        (8, str(1024 * MiB), 7),  # 7 workers, 1 at once: ~887 MiB
        (4, "max", 4),  # no memory limit: the CPU limit alone
    ],
)
def test_auto_starts_no_more_workers_than_the_memory_limit_holds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpus: float, limit: str, expected: int
) -> None:
    fake_cgroup(monkeypatch, tmp_path, cpus, limit)
    assert webhook_workers.default_worker_count() == expected


def test_the_limit_can_be_given_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_cgroup(monkeypatch, tmp_path, 4, "max")
    monkeypatch.setenv(memory.LIMIT_ENV, str(768 * MiB))  # the downward API's limits.memory
    assert memory.container_memory_limit() == 768 * MiB
    monkeypatch.setenv(memory.LIMIT_ENV, "512Mi")
    with pytest.raises(ValueError, match="LUMIGO_MEMORY_LIMIT must be a number of bytes"):
        memory.container_memory_limit()


@pytest.mark.parametrize("limit_mib", [256, 384, 512, 768, 1024, 2048, 4096])
def test_every_worker_count_auto_can_choose_fits_its_limit(limit_mib: int) -> None:
    for wanted in range(1, 65):
        count = memory.workers_that_fit(wanted, limit_mib * MiB, MAX_BODY_BYTES)
        plan = memory.plan(count, limit_mib * MiB, MAX_BODY_BYTES)
        assert plan.fits or count == 1, plan.describe()
        assert plan.large_slots >= 1
        assert plan.body_budget_bytes >= MAX_BODY_BYTES  # the largest body can still arrive


def test_the_pod_wide_body_budget_is_shared_out_over_the_workers() -> None:
    assert memory.plan(1, None, MAX_BODY_BYTES).body_budget_bytes == 32 * MiB
    assert memory.plan(4, None, MAX_BODY_BYTES).body_budget_bytes == 8 * MiB
    assert memory.plan(2, 512 * MiB, MAX_BODY_BYTES).large_slots == 1
    assert memory.plan(4, 4096 * MiB, MAX_BODY_BYTES).large_slots == 4


HOLDER = """
import sys, time
from pathlib import Path
from kube.http.memory import LargeBodySlots
with LargeBodySlots(Path(sys.argv[1])).hold(5) as held:
    assert held
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_slot_held_by_a_killed_process_comes_free(tmp_path: Path) -> None:
    slots = memory.LargeBodySlots.create(tmp_path, 1)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with slots.hold(0.1) as held:
            assert not held  # another process has it
        holder.kill()  # as the kernel's OOM killer would
        holder.wait(30)

        def free() -> bool:
            with slots.hold(0) as held:
                return held

        wait_until(free, 10, "the killed process's slot to come free")
    finally:
        holder.kill()
        holder.wait(30)
