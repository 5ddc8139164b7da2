"""Build container images as docker-archive tars with Python alone: no registry, no daemon.

`ctr images import` (containerd) and `podman load` accept the archive. Every tar is
reproducible (sorted entries, mtime 0, owner 0:0), so the same inputs give the same image ID and
a cached archive is rebuilt only when its inputs change.

Two small images are defined here because the local node needs them before anything else:
- the **pause** image (the pod sandbox): a static program that waits for a signal;
- the **busybox** image for tests: Debian's static busybox (a shell, nc, wget, nslookup, httpd).

    python -m envtest.ociimage pause|busybox     # build (or find cached) and print the tar path
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(
    os.environ.get("LUMIGO_CACHE_DIR", Path.home() / ".cache" / "lumigo-operator")
).expanduser()
IMAGE_CACHE = CACHE / "images"

# `localhost/...`: if anything ever tried to pull one of these, the request could only go to
# this machine's loopback, never to a public registry.
PAUSE_IMAGE = "localhost/lumigo/pause:3.10-local"
BUSYBOX_IMAGE = "localhost/lumigo/busybox:1.35-local"


@dataclass(frozen=True)
class Entry:
    """One file system entry of a layer: a file (data), a directory or a symlink (target)."""

    path: str  # absolute path inside the image, e.g. "/bin/sh"
    data: bytes | None = None
    mode: int = 0o755
    symlink: str | None = None
    uid: int = 0
    gid: int = 0

    @property
    def is_dir(self) -> bool:
        return self.data is None and self.symlink is None


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config (what a Dockerfile's ENTRYPOINT, CMD, ... set)."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    user: str = ""
    workdir: str = "/"
    labels: Mapping[str, str] = field(default_factory=dict)


def layer(entries: Iterable[Entry]) -> bytes:
    """An uncompressed, reproducible layer tar; parent directories are added as needed."""
    by_path: dict[str, Entry] = {}
    for entry in entries:
        path = entry.path.strip("/")
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            by_path.setdefault(parent, Entry("/" + parent, mode=0o755))
        by_path[path] = entry
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(by_path):
            entry = by_path[path]
            info = tarfile.TarInfo(path)
            info.mtime = 0
            info.mode = entry.mode
            info.uid, info.gid = entry.uid, entry.gid
            if entry.symlink is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.symlink
                info.mode = 0o777
                tar.addfile(info)
            elif entry.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return out.getvalue()


def layer_from_directory(root: Path, prefix: str = "/") -> bytes:
    """A layer holding the tree under `root` (modes kept, owners reset to 0:0), under `prefix`."""
    entries = []
    for path in sorted(root.rglob("*")):
        inner = prefix.rstrip("/") + "/" + str(path.relative_to(root))
        mode = path.lstat().st_mode & 0o7777
        if path.is_symlink():
            entries.append(Entry(inner, symlink=os.readlink(path)))
        elif path.is_dir():
            entries.append(Entry(inner, mode=mode))
        else:
            entries.append(Entry(inner, data=path.read_bytes(), mode=mode))
    return layer(entries)


def docker_archive(name: str, layers: Sequence[bytes], config: ImageConfig) -> bytes:
    """A `docker save`-style archive (manifest.json + config + layer tars) tagged `name`."""
    if name.endswith(":latest") or ":" not in name.rsplit("/", 1)[-1]:
        # `:latest` implies imagePullPolicy Always: the kubelet would try to pull it.
        raise ValueError(f"image {name!r} needs an explicit tag other than latest")
    diff_ids = ["sha256:" + hashlib.sha256(blob).hexdigest() for blob in layers]
    image_config = {
        "architecture": _goarch(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": list(config.entrypoint) or None,
            "Cmd": list(config.cmd) or None,
            "Env": list(config.env),
            "User": config.user,
            "WorkingDir": config.workdir,
            "Labels": dict(config.labels) or None,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hack/ociimage.py"}]
        * len(layers),
    }
    config_blob = json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode()
    config_name = hashlib.sha256(config_blob).hexdigest() + ".json"
    layer_names = [f"{d.removeprefix('sha256:')}/layer.tar" for d in diff_ids]
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": layer_names}]
    files = {"manifest.json": json.dumps(manifest).encode(), config_name: config_blob}
    files.update(zip(layer_names, layers, strict=True))
    return layer(Entry("/" + path, data=blob, mode=0o644) for path, blob in files.items())


def _goarch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def cached_archive(name: str, inputs: bytes, build: Callable[[], bytes]) -> Path:
    """The archive for `name` from the cache, built by `build()` when `inputs` changed."""
    digest = hashlib.sha256(name.encode() + b"\0" + inputs).hexdigest()[:16]
    safe = name.replace("/", "_").replace(":", "_")
    path = IMAGE_CACHE / f"{safe}-{digest}.tar"
    if not path.exists():
        IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=IMAGE_CACHE, prefix=".tmp-")
        with os.fdopen(fd, "wb") as out:
            out.write(build())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return path


# --- the two images the local node needs ------------------------------------------------------

PAUSE_C = rb"""
/* The pod sandbox's process: holds the pod's namespaces, reaps orphans, exits on a signal. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction down = {.sa_handler = stop}, child = {.sa_handler = reap,
                                                           .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &down, 0);
    sigaction(SIGTERM, &down, 0);
    sigaction(SIGCHLD, &child, 0);
    for (;;) pause();
}
"""


def _compiler() -> list[str]:
    if shutil.which("musl-gcc"):
        return ["musl-gcc", "-static", "-Os", "-s"]
    if shutil.which("gcc"):
        return ["gcc", "-static", "-Os", "-s"]
    raise RuntimeError("building the pause image needs musl-gcc (Debian musl-tools) or gcc")


def pause_image() -> Path:
    """The pod sandbox image (`PAUSE_IMAGE`) as a docker-archive tar."""
    compiler = _compiler()

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "pause.c"
            src.write_bytes(PAUSE_C)
            subprocess.run([*compiler, "-o", f"{tmp}/pause", str(src)], check=True)
            binary = (Path(tmp) / "pause").read_bytes()
        return docker_archive(
            PAUSE_IMAGE,
            [layer([Entry("/pause", data=binary, mode=0o755)])],
            ImageConfig(entrypoint=["/pause"], env=(), user="65535:65535"),
        )

    return cached_archive(PAUSE_IMAGE, PAUSE_C + " ".join(compiler).encode(), build)


BUSYBOX = Path("/bin/busybox")


def busybox_image() -> Path:
    """A static busybox (`BUSYBOX_IMAGE`, from Debian's busybox-static) as a docker-archive."""
    if not BUSYBOX.exists():
        raise RuntimeError("the test image needs /bin/busybox: install Debian's busybox-static")
    binary = BUSYBOX.read_bytes()

    def build() -> bytes:
        applets = subprocess.run(
            [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        entries = [Entry("/bin/busybox", data=binary, mode=0o755)]
        entries += [Entry(f"/bin/{a}", symlink="busybox") for a in applets if a != "busybox"]
        entries += [
            Entry(
                "/etc/passwd",
                data=b"root:x:0:0:root:/root:/bin/sh\n"
                b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
                mode=0o644,
            ),
            Entry("/etc/group", data=b"root:x:0:\nnobody:x:65534:\n", mode=0o644),
            Entry("/tmp", mode=0o1777),
            Entry("/root", mode=0o700),
        ]
        return docker_archive(
            BUSYBOX_IMAGE, [layer(entries)], ImageConfig(cmd=["sh"], env=("PATH=/bin",))
        )

    return cached_archive(BUSYBOX_IMAGE, hashlib.sha256(binary).digest() + b"v1", build)


def main() -> int:
    builders = {"pause": pause_image, "busybox": busybox_image}
    if len(sys.argv[1:]) != 1 or sys.argv[1] not in builders:
        print(f"usage: {sys.argv[0]} {'|'.join(builders)}", file=sys.stderr)
        return 2
    print(builders[sys.argv[1]]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
