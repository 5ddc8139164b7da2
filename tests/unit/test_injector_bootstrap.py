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


# --- the application's own packages against the tracer's constraints (issue 19, item 4) ------


@pytest.mark.parametrize(
    "version",
    ["3.20.3", "4.25.0", "5.0", "5.0rc1", "6.33.5", "6.33.4", "6.33.5.post1", "7.0", "7.0.0rc2",
     "8.0.0", "1.52", "1.52.9", "1.53", "2.0", "3", "0.0.16", "4.5.0", "4.4.0", "80.9.0", "81.0"],
)  # fmt: skip
@pytest.mark.parametrize(
    "spec",
    ["<8.0.0", ">=6.33.5", "<7.0", ">=5.0", "~=1.52", "~=2.7", "==0.0.16", "!=4.4.0", "<=80.9.0",
     ">3", "==6.*", "!=5.*", "~=3.0", ">=4.5.0"],
)  # fmt: skip
def test_version_constraints_agree_with_pep_440(
    bootstrap: ModuleType, version: str, spec: str
) -> None:
    from packaging.specifiers import Specifier

    (parsed,) = [Specifier(spec)]
    expected = parsed.contains(version, prereleases=True)
    assert bootstrap.satisfies(version, parsed.operator, parsed.version) is expected


def site(tmp_path: Path, name: str, dist: str, version: str, files: dict[str, str]) -> str:
    entry = tmp_path / name
    for rel, text in files.items():
        (entry / rel).parent.mkdir(parents=True, exist_ok=True)
        (entry / rel).write_text(text)
    info = entry / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return str(entry)


DEPENDENCIES = {
    "protobuf": {
        "modules": ["google._upb", "google.protobuf"],
        "requires": [["<", "7.0"], [">=", "5.0"]],
        "required_by": ["opentelemetry-proto"],
    },
    "requests": {"modules": ["requests"], "requires": [["~=", "2.7"]], "required_by": ["x"]},
}


def test_an_application_protobuf_outside_the_constraints_is_a_conflict(
    bootstrap: ModuleType, tmp_path: Path
) -> None:
    old = site(tmp_path, "app", "protobuf", "3.20.3", {"google/protobuf/__init__.py": ""})
    fine = site(tmp_path, "other", "requests", "2.31.0", {"requests/__init__.py": ""})
    conflict = bootstrap.dependency_conflict(DEPENDENCIES, [fine, old])
    assert conflict == (
        f"the application's protobuf 3.20.3 (in {old}) does not satisfy protobuf<7.0,>=5.0,"
        " which opentelemetry-proto need"
    )


def test_what_the_application_does_not_have_or_has_in_a_fitting_version_is_no_conflict(
    bootstrap: ModuleType, tmp_path: Path
) -> None:
    ok = site(tmp_path, "app", "protobuf", "6.1.0", {"google/protobuf/__init__.py": ""})
    other_google = site(tmp_path, "g", "google-auth", "2.0.0", {"google/auth/__init__.py": ""})
    assert bootstrap.dependency_conflict(DEPENDENCIES, [other_google, ok]) is None
    assert bootstrap.dependency_conflict(DEPENDENCIES, [other_google]) is None
    # A module without metadata: its version cannot be told, which is no reason to stand down.
    bare = tmp_path / "bare"
    (bare / "requests").mkdir(parents=True)
    assert bootstrap.dependency_conflict(DEPENDENCIES, [str(bare)]) is None


def test_versions_are_read_from_egg_info_too(bootstrap: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "protobuf.egg-info").write_text("Metadata-Version: 1.1\nVersion: 3.21.12\n\n")
    assert bootstrap.installed_version(str(tmp_path), "protobuf") == "3.21.12"
    (tmp_path / "typing_extensions-4.4.0.egg-info").mkdir()
    assert bootstrap.installed_version(str(tmp_path), "typing-extensions") == "4.4.0"
