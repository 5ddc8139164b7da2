"""hack/build-images without building: what it hashes, what it copies, and the Dockerfiles.

An image is rebuilt only when its input hash changes, so the hash must follow every input (and
nothing else); the local autotrace Containerfile must stay the release's final stage; the
project's Dockerfile must still build with docker from a pulled python image.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.scripts import hack_script

ROOT = Path(__file__).resolve().parents[2]


bi = hack_script("build-images")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), " ".join(rest.split())))
    return found


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_the_operator_context_is_what_the_dockerfile_copies() -> None:
    assert bi.copy_sources(ROOT / "Dockerfile") == [
        "requirements-runtime.lock", "pyproject.toml", "README.md", "kube/", "api/",
        "webhook/", "controller/",
    ]  # fmt: skip
    files = bi.context_of(ROOT / "Dockerfile", ROOT)
    assert "controller/cli.py" in files
    assert "pyproject.toml" in files
    assert not [f for f in files if f.endswith(".pyc") or "__pycache__" in f]
    assert not [f for f in files if f.startswith(("tests/", "hack/", ".venv/", "build/"))]


def test_copy_sources_reads_flags_json_form_and_continuations_and_skips_stages(
    tmp_path: Path,
) -> None:
    dockerfile = tmp_path / "Containerfile"
    dockerfile.write_text(
        "FROM scratch AS one\n"
        "COPY --chown=1:1 a.txt \\\n    b/ /dst/\n"
        'ADD ["c d.txt", "/dst/"]\n'
        "COPY --from=one /x /y\n"
        "copy --link e /e\n"
        "RUN echo COPY f /f\n"
    )
    assert bi.copy_sources(dockerfile) == ["a.txt", "b/", "c d.txt", "e"]


def _image(tmp_path: Path, **overrides: object) -> object:
    containerfile = tmp_path / "Containerfile"
    if not containerfile.exists():
        containerfile.write_text("FROM scratch\nCOPY app /app\n")
    fields: dict[str, object] = {
        "name": "t", "repository": "localhost/lumigo/t", "label": "1",
        "inputs": lambda: None, "description": "test", "containerfile": containerfile,
        "base_args": {"BASE_IMAGE": "base"},
    }  # fmt: skip
    fields.update(overrides)
    return bi.Image(**fields)


def test_the_input_hash_follows_every_input_and_nothing_else(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.write_text("v1")
    image = _image(tmp_path)

    def digest(base: str = "b1") -> str:
        inputs = bi.Inputs({"app": app}, ("fact",))
        return str(bi.input_hash(image, inputs, {"base": base}))

    first = digest()
    (tmp_path / "unrelated").write_text("x")
    assert digest() == first, "a file outside the context changed the hash"
    changes = []
    app.write_text("v2")
    changes.append(digest())
    app.chmod(0o755)  # COPY keeps the mode
    changes.append(digest())
    (tmp_path / "Containerfile").write_text("FROM scratch\nCOPY app /srv/app\n")
    changes.append(digest())
    changes.append(digest(base="b2"))  # a rebuilt base rebuilds what is built on it
    assert len({first, *changes}) == 5


def test_bytecode_caches_stay_out_of_the_operator_context_but_not_out_of_the_payload(
    tmp_path: Path,
) -> None:
    (tmp_path / "api" / "__pycache__").mkdir(parents=True)
    (tmp_path / "api" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / "api" / "m.py").write_text("")
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY api/ api/\n")
    assert list(bi.context_of(tmp_path / "Dockerfile", tmp_path)) == ["api/m.py"]
    assert sorted(bi.tree(tmp_path / "api", "payload/")) == [
        "payload/__pycache__/m.cpython-311.pyc", "payload/m.py",
    ]  # fmt: skip


def test_the_local_autotrace_image_is_the_release_final_stage() -> None:
    """Same user, env, entrypoint and copied paths as injector/Dockerfile's `FROM scratch`."""
    release = final_stage(ROOT / "injector" / "Dockerfile")
    local = final_stage(ROOT / "hack" / "images" / "autotrace" / "Containerfile")

    def runtime(stage: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(w, a) for w, a in stage if w in ("FROM", "USER", "ENV", "ENTRYPOINT", "CMD")]

    def destinations(stage: list[tuple[str, str]]) -> set[str]:
        return {a.split()[-1].rstrip("/") for w, a in stage if w == "COPY"}

    assert runtime(local) == runtime(release)
    # the release adds each CPython minor's .pyc files over /payload/python; build/payload has them
    assert destinations(local) == destinations(release) - {"/payload/python"}
    assert destinations(local) == {"/payload", "/lumigo-copy"}


def test_the_operator_dockerfile_still_builds_from_a_pulled_python_by_default() -> None:
    """docker buildx of a release needs no build argument: the local base is only an override."""
    steps = instructions(ROOT / "Dockerfile")
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim") in steps
    froms = [args for word, args in steps if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    assert all(not args.startswith("python ") for word, args in steps if word == "RUN")


@pytest.mark.parametrize("name", [n for n, i in bi.IMAGES.items() if i.containerfile])
def test_build_args_are_declared_with_pinned_public_defaults(name: str) -> None:
    image = bi.IMAGES[name]
    declared = dict(
        args.split("=", 1) for word, args in instructions(image.containerfile) if word == "ARG"
    )
    for arg in image.base_args:
        assert arg in declared, f"{name}: --build-arg {arg} would not be used"
        default = declared[arg]
        assert ":" in default, f"{name}: {arg} default {default!r} has no tag"
        assert not default.endswith(":latest")


def test_refs_are_local_pinned_and_distinct() -> None:
    repositories = [image.repository for image in bi.IMAGES.values()]
    assert len(set(repositories)) == len(repositories)
    for image in bi.IMAGES.values():
        assert image.repository.startswith("localhost/lumigo/")
        assert image.label not in ("", "latest")


def test_test_app_dependencies_are_locked_with_hashes() -> None:
    requirements = (ROOT / "hack" / "images" / "python-app" / "requirements.txt").read_text()
    pins = re.findall(r"^([a-z0-9_.-]+)==(\S+) \\\n((?:\s+--hash=sha256:\w+(?: \\)?\n)+)",
                      requirements, re.M)  # fmt: skip
    assert "flask" in {name for name, _, _ in pins}
    assert len(pins) == len(re.findall(r"^[a-z]", requirements, re.M))
    for directory in ("node-app", "node-runtime"):
        lock = json.loads((ROOT / "hack" / "images" / directory / "package-lock.json").read_text())
        for path, package in lock["packages"].items():
            if path:
                assert package["integrity"].startswith("sha512-"), path
