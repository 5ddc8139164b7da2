"""Run the images hack/build-images made straight from their docker-archive tars with runc.

What a container runtime does with an image, without containerd or a kubelet: unpack the layers
(whiteouts applied) into a root file system, turn the image config (entrypoint, cmd, env, user,
working directory) into an OCI runtime spec, and start it with runc. So a broken image fails here,
in seconds and with its own output, before any pod uses it.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD_IMAGES = ROOT / "hack" / "build-images"
MANIFEST = ROOT / "build" / "images" / "manifest.json"


def build_images() -> dict[str, dict[str, Any]]:
    """Build what changed (a warm run only hashes inputs) and return the manifest's images."""
    proc = subprocess.run(
        [sys.executable, str(BUILD_IMAGES)], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise AssertionError(f"hack/build-images failed:\n{tail}")
    return dict(json.loads(MANIFEST.read_text())["images"])


def archive_index(tar: Path) -> tuple[list[str], dict[str, Any]]:
    """The RepoTags and the image config of a docker-archive."""
    with tarfile.open(tar) as archive:
        manifest = json.load(_member(archive, "manifest.json"))[0]
        config = json.load(_member(archive, manifest["Config"]))
    return list(manifest["RepoTags"]), dict(config)


def _member(archive: tarfile.TarFile, name: str) -> Any:
    handle = archive.extractfile(name)
    assert handle is not None, f"{name} missing from {archive.name!r}"
    return handle


def unpack(tar: Path, rootfs: Path) -> dict[str, Any]:
    """Apply every layer of the archive to rootfs; returns the image's runtime config."""
    with tarfile.open(tar) as archive:
        manifest = json.load(_member(archive, "manifest.json"))[0]
        config = json.load(_member(archive, manifest["Config"]))
        for name in manifest["Layers"]:
            with tarfile.open(fileobj=_member(archive, name)) as layer:
                _apply_layer(layer, rootfs)
    return dict(config.get("config") or {})


def _apply_layer(layer: tarfile.TarFile, rootfs: Path) -> None:
    members = layer.getmembers()
    for member in members:  # whiteouts first: they hide what lower layers had
        parent, base = posixpath.split(posixpath.normpath(member.name))
        if base == ".wh..wh..opq":
            for child in (rootfs / parent).glob("*"):
                _remove(child)
        elif base.startswith(".wh."):
            _remove(rootfs / parent / base.removeprefix(".wh."))
    keep = [m for m in members if not posixpath.basename(m.name).startswith(".wh.")]
    layer.extractall(rootfs, members=keep, numeric_owner=True, filter="fully_trusted")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@dataclass
class Container:
    """One image, unpacked and ready to run as a runc container (a fresh one per start)."""

    tar: Path
    workdir: Path
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rootfs = self.workdir / "rootfs"
        self.rootfs.mkdir(parents=True)
        self.config = unpack(self.tar, self.rootfs)
        self.state = self.workdir / "runc-state"

    def spec(
        self,
        args: Sequence[str] | None,
        *,
        env: dict[str, str] | None = None,
        user: tuple[int, int] | None = None,
        mounts: dict[str, Path] | None = None,
        host_network: bool = False,
    ) -> Path:
        """A bundle whose config.json runs args (default: entrypoint + cmd) like a kubelet would:
        the image's env and user, a read-only root, a new network namespace unless host_network."""
        bundle = self.workdir / f"bundle-{uuid.uuid4().hex[:8]}"
        bundle.mkdir()
        subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
        spec = json.loads((bundle / "config.json").read_text())
        image_env = dict(e.split("=", 1) for e in self.config.get("Env") or [])
        process = spec["process"]
        process["terminal"] = False
        process["args"] = list(
            args
            if args is not None
            else (self.config.get("Entrypoint") or []) + (self.config.get("Cmd") or [])
        )
        process["env"] = [f"{k}={v}" for k, v in {**image_env, **(env or {})}.items()]
        process["cwd"] = self.config.get("WorkingDir") or "/"
        uid, gid = user or _numeric_user(self.config.get("User") or "0:0")
        process["user"] = {"uid": uid, "gid": gid}
        spec["root"] = {"path": str(self.rootfs), "readonly": True}
        spec["hostname"] = "image-test"
        for destination, source in (mounts or {}).items():
            spec["mounts"].append(
                {
                    "destination": destination,
                    "type": "bind",
                    "source": str(source),
                    "options": ["rbind", "rw"],
                }
            )
        if host_network:
            spec["linux"]["namespaces"] = [
                ns for ns in spec["linux"]["namespaces"] if ns["type"] != "network"
            ]
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle

    def run(
        self, args: Sequence[str] | None = None, *, timeout: float = 60, **options: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run to completion; returns the exit code and the output."""
        bundle = self.spec(args, **options)
        cid = f"lumigo-image-{uuid.uuid4().hex[:8]}"
        try:
            return subprocess.run(
                ["runc", "--root", str(self.state), "run", "--bundle", str(bundle), cid],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        finally:
            self._delete(cid)

    @contextlib.contextmanager
    def serve(
        self, port: int, args: Sequence[str] | None = None, **options: Any
    ) -> Iterator[Served]:
        """Start args (default: the image's own command) with PORT=port in the host network
        namespace (tests use loopback only); stopped with SIGTERM, as a kubelet would, when the
        block ends."""
        env = {"PORT": str(port), **options.pop("env", {})}
        bundle = self.spec(args, env=env, host_network=True, **options)
        cid = f"lumigo-image-{uuid.uuid4().hex[:8]}"
        served = Served(self.workdir / f"{cid}.log")
        with served.log.open("w") as out:
            served.proc = subprocess.Popen(
                ["runc", "--root", str(self.state), "run", "--bundle", str(bundle), cid],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            yield served
        finally:
            subprocess.run(["runc", "--root", str(self.state), "kill", cid, "TERM"],
                           capture_output=True)  # fmt: skip
            try:
                served.stopped = served.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                served.stopped = None  # did not stop on SIGTERM: the delete kills it
            finally:
                self._delete(cid)

    def _delete(self, cid: str) -> None:
        subprocess.run(["runc", "--root", str(self.state), "delete", "--force", cid],
                       capture_output=True)  # fmt: skip


@dataclass
class Served:
    """A running server container: its runc process and its output file."""

    log: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped: int | None = None  # exit code after SIGTERM; None if it ignored the signal

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _numeric_user(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"non-numeric image user {user!r}"
    assert not gid or gid.isdigit(), f"non-numeric image group {user!r}"
    return int(uid), int(gid or uid)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, *, deadline: float, served: Served | None = None) -> str:
    """GET url, retrying until it answers 200 or the deadline passes (or the server exits)."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if served is not None and served.proc is not None and served.proc.poll() is not None:
            raise AssertionError(
                f"the container exited ({served.proc.returncode}) before {url} answered:\n"
                + served.output()
            )
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            last = error
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer: {last}")


def tree_digest(root: Path, *, skip: Sequence[str] = ()) -> dict[str, tuple[int, str]]:
    """relative path -> (size, sha256) of every file under root; symlinks -> (-1, target)."""
    import hashlib

    found: dict[str, tuple[int, str]] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if rel in skip:
                continue
            if path.is_symlink():
                found[rel] = (-1, os.readlink(path))
            else:
                with path.open("rb") as f:
                    found[rel] = (path.stat().st_size, hashlib.file_digest(f, "sha256").hexdigest())
    return found
