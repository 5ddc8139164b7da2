"""The pure part of the Python bootstrap: which payload directories fit which interpreter.

The musl and unsupported-interpreter branches cannot be run end to end on this machine (no musl
CPython), so they are pinned here; tests/e2e runs the glibc branch with real interpreters.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "injector" / "python" / "bootstrap" / "sitecustomize.py"


@pytest.fixture(scope="module")
def bootstrap() -> ModuleType:
    """Loaded under another name, so that its start-up code (`_main`) does not run."""
    spec = importlib.util.spec_from_file_location("lumigo_bootstrap_under_test", BOOTSTRAP)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    for name in ("common", "cp39-glibc", "cp313-musl", "cp311-glibc"):
        (tmp_path / name).mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("version", "libc", "expected"),
    [((3, 9, 18), "glibc", "cp39-glibc"), ((3, 13, 0), "musl", "cp313-musl")],
)
def test_picks_the_build_for_minor_version_and_libc(
    bootstrap: ModuleType, payload: Path, version: tuple[int, ...], libc: str, expected: str
) -> None:
    dirs, reason = bootstrap.payload_dirs(str(payload), version, libc, "cpython", False)
    assert reason is None
    assert dirs == [str(payload / expected), str(payload / "common")]


@pytest.mark.parametrize(
    ("interpreter", "why"),
    [
        (((3, 8, 10), "cpython", False), "Python 3.8 is not supported"),
        (((3, 14, 0), "cpython", False), "Python 3.14 is not supported"),
        (((2, 7, 18), "cpython2", False), "implementation cpython2 is not supported"),
        (((3, 11, 0), "pypy", False), "implementation pypy is not supported"),
        (((3, 13, 0), "cpython", True), "free-threaded CPython is not supported"),
        (((3, 12, 1), "cpython", False), "no payload for this interpreter"),  # build missing
    ],
)
def test_stands_down_on_interpreters_it_has_no_build_for(
    bootstrap: ModuleType, payload: Path, interpreter: tuple[tuple[int, ...], str, bool], why: str
) -> None:
    version, implementation, gil_disabled = interpreter
    dirs, reason = bootstrap.payload_dirs(
        str(payload), version, "glibc", implementation, gil_disabled
    )
    assert dirs is None
    assert why in reason


def test_every_supported_minor_has_a_lock_for_both_libcs(bootstrap: ModuleType) -> None:
    """The bootstrap's list and the builder's inputs must agree, or a version is never traced."""
    locks = {p.stem for p in (ROOT / "injector" / "python" / "locks").glob("*.txt")}
    expected = {f"cp{a}{b}-{libc}" for a, b in bootstrap.SUPPORTED for libc in ("glibc", "musl")}
    assert locks == expected


def test_this_interpreter_is_glibc(bootstrap: ModuleType) -> None:
    assert sys.platform == "linux"
    assert bootstrap.detect_libc() == "glibc"
