"""The arm64 injector, run for real: an arm64 program under qemu-user with Debian's arm64 glibc.

The same checks as on x86_64 for what matters most: a runtime (a copy named `node` /
`python3.12`) sees our values through getenv() and environ with the user's values kept, and a
non-target sees nothing change.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_injector_native import probe
from tests.support.injector import PROGRAMS, ROOT, TOKEN, compile_c

SYSROOT = Path("/usr/aarch64-linux-gnu")
SO = ROOT / "build" / "injector" / "aarch64" / "lumigo_injector.so"


@pytest.fixture(scope="module")
def arm64(tmp_path_factory: pytest.TempPathFactory, injector_payload: Path) -> Path:
    """arm64 envprobe (+ runtime-named copies) next to a payload holding the arm64 .so."""
    for tool in ("qemu-aarch64", "aarch64-linux-gnu-gcc"):
        assert shutil.which(tool), f"{tool} missing: hack/install-system-deps installs it"
    out = tmp_path_factory.mktemp("arm64")
    probe_bin = compile_c(PROGRAMS / "envprobe.c", out / "envprobe", "aarch64-linux-gnu-gcc")
    for name in ("node", "python3.12"):
        shutil.copy2(probe_bin, out / name)
    payload = out / "payload"
    (payload / "injector").mkdir(parents=True)
    shutil.copy2(SO, payload / "injector" / "lumigo_injector.so")
    for part in ("nodejs", "python", "payload.json"):  # payload.json: the completion marker
        (payload / part).symlink_to(injector_payload / part)
    return out


def run_arm64(folder: Path, program: str, **env: str) -> dict[str, str | None]:
    so = folder / "payload" / "injector" / "lumigo_injector.so"
    guest = [arg for k, v in env.items() for arg in ("-E", f"{k}={v}")]
    proc = subprocess.run(
        ["qemu-aarch64", "-L", str(SYSROOT), "-E", f"LD_PRELOAD={so}", *guest,
         str(folder / program)],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "ERROR: ld.so" not in proc.stderr, proc.stderr
    return probe(proc.stdout)


def test_arm64_runtimes_get_our_values_and_keep_theirs(arm64: Path) -> None:
    payload = arm64 / "payload"
    user = {"NODE_OPTIONS": "--max-old-space-size=64", "PYTHONPATH": "/srv/app/lib"}
    node = run_arm64(arm64, "node", LUMIGO_TRACER_TOKEN=TOKEN, **user)
    python = run_arm64(arm64, "python3.12", LUMIGO_TRACER_TOKEN=TOKEN, **user)
    for how in ("getenv", "environ"):
        assert node[f"{how} NODE_OPTIONS"] == (
            f"--require {payload}/nodejs/lumigo-bootstrap.js --max-old-space-size=64"
        )
        assert python[f"{how} PYTHONPATH"] == f"{payload}/python/bootstrap:/srv/app/lib"
        assert python[f"{how} NODE_OPTIONS"] == "--max-old-space-size=64"


def test_arm64_non_targets_and_untokened_runtimes_are_untouched(arm64: Path) -> None:
    user = {"NODE_OPTIONS": "--max-old-space-size=64", "PYTHONPATH": "/srv/app/lib"}
    itself = run_arm64(arm64, "envprobe", LUMIGO_TRACER_TOKEN=TOKEN, **user)
    untokened = run_arm64(arm64, "node", **user)
    for seen in (itself, untokened):
        for how in ("getenv", "environ"):
            assert seen[f"{how} NODE_OPTIONS"] == "--max-old-space-size=64"
            assert seen[f"{how} PYTHONPATH"] == "/srv/app/lib"
