"""injector/build-payload's Python assembly: what is shipped, and each distribution stored once.

Synthetic sites (a RECORD and a few files per distribution) stand in for pip's per-target
installs; tests/e2e/test_injector_apps.py runs real interpreters against the assembled payload.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "injector" / "build-payload"


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("build_payload_under_test", str(BUILDER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def install(site: Path, dist: str, files: dict[str, str]) -> None:
    """A distribution as pip leaves it: its files and a RECORD listing them."""
    info = f"{dist}.dist-info"
    files = {**files, f"{info}/METADATA": f"Name: {dist}\n", f"{info}/licenses/LICENSE": "MIT"}
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    record = [f"{rel},sha256=x,{len(text)}" for rel, text in files.items()]
    (site / info / "RECORD").write_text("\n".join([*record, f"{info}/RECORD,,"]) + "\n")


@pytest.mark.parametrize(
    ("rel", "expected"),
    [
        ("requests/__init__.py", True),
        ("google/_upb/_message.abi3.so", True),
        ("certifi/cacert.pem", True),
        ("requests-2.0.dist-info/licenses/LICENSE.md", True),
        ("test/integration/flask/app.py", False),
        ("ci/tested_versions_utils.py", False),
        ("certifi/tests/test_certify.py", False),
        ("google/protobuf/descriptor.pyi", False),
        ("google/api/http.proto", False),
        ("urllib3/README.md", False),
        ("wrapt/_wrappers.c", False),
    ],
)
def test_only_what_a_process_reads_is_shipped(
    builder: ModuleType, rel: str, expected: bool
) -> None:
    assert builder.shipped(rel) is expected


def test_a_distribution_is_stored_once_and_linked_where_several_targets_have_it(
    builder: ModuleType, tmp_path: Path
) -> None:
    sites = {
        name: tmp_path / "sites" / name for name in ("cp311-glibc", "cp312-glibc", "cp39-glibc")
    }
    for name, site in sites.items():
        # in every target: common/
        install(site, "idna-3.0", {"idna/__init__.py": "IDNA = 1\n", "idna/tests/t.py": ""})
        # the same build in two targets, the older interpreter has another version: shared/
        version = "2.0" if name == "cp39-glibc" else "2.8"
        install(site, f"urllib3-{version}", {"urllib3/__init__.py": f"V = '{version}'\n"})
        # a namespace package split between a shared and a per-target distribution
        protobuf = "5.0" if name == "cp39-glibc" else "6.0"
        install(site, f"protobuf-{protobuf}", {"google/protobuf/__init__.py": f"P = {protobuf!r}"})
        install(
            site, "fast-1.0", {"google/fast/__init__.py": f"BUILD = '{name}'\n", "fast.pyi": ""}
        )
        install(site, "single-1.0", {"single.py": "S = 1\n"} if name != "cp39-glibc" else {})
    out = tmp_path / "python"
    builder.assemble_python(sites, out)

    assert (out / "common" / "idna" / "__init__.py").read_text() == "IDNA = 1\n"
    assert not (out / "common" / "idna" / "tests").exists()
    shared = sorted((out / "shared").iterdir())
    assert [p.name.rsplit("-", 1)[0] for p in shared] == [
        "protobuf-6.0",
        "single-1.0",
        "urllib3-2.8",
    ]
    shared_urllib3 = shared[2]
    for name in ("cp311-glibc", "cp312-glibc"):
        link = out / name / "urllib3"
        assert link.is_symlink()
        assert not os.path.isabs(os.readlink(link))
        assert link.resolve() == (shared_urllib3 / "urllib3").resolve()
        assert (link / "__init__.py").read_text() == "V = '2.8'\n"
        assert (out / name / "urllib3-2.8.dist-info" / "METADATA").is_file()
        # a lone module is copied, not linked (its bytecode lives next to it)
        assert (out / name / "single.py").is_file()
        assert not (out / name / "single.py").is_symlink()
        # google/ holds a shared and a per-target distribution: a real directory, one link in it
        assert not (out / name / "google").is_symlink()
        assert (out / name / "google" / "protobuf").is_symlink()
        assert (out / name / "google" / "protobuf" / "__init__.py").read_text() == "P = '6.0'"
        assert (out / name / "google" / "fast" / "__init__.py").read_text() == f"BUILD = '{name}'\n"
    assert not (out / "cp39-glibc" / "urllib3").is_symlink()  # only that target has 2.0
    assert (out / "cp39-glibc" / "urllib3" / "__init__.py").read_text() == "V = '2.0'\n"
    assert not any(out.rglob("*.pyi"))
    # The RECORD lists exactly what was shipped.
    record = (out / "common" / "idna-3.0.dist-info" / "RECORD").read_text().splitlines()
    listed = sorted(line.rsplit(",", 2)[0] for line in record)
    assert listed == [
        "idna-3.0.dist-info/METADATA",
        "idna-3.0.dist-info/RECORD",
        "idna-3.0.dist-info/licenses/LICENSE",
        "idna/__init__.py",
    ]


def test_links_go_as_deep_as_another_distribution_of_the_target_reaches(
    builder: ModuleType,
) -> None:
    owned = {
        "google/protobuf/__init__.py": "protobuf",
        "google/protobuf/message.py": "protobuf",
        "google/_upb/_message.so": "protobuf",
        "google/api/http_pb2.py": "googleapis",
        "protobuf.dist-info/METADATA": "protobuf",
        "proto.py": "protobuf",
    }
    assert builder.link_points(owned, "protobuf") == {
        "google/protobuf",
        "google/_upb",
        "protobuf.dist-info",
        "proto.py",
    }
    assert builder.link_points(owned, "googleapis") == {"google/api"}
