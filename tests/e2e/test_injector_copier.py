"""The injected init container's copier, run exactly as a real node runs it (issue 14, item 9).

A kubelet creates the emptyDir owned by root (0777; root:<fsGroup> 2777 with an fsGroup) and runs
the init container as the non-root UID/GID of the securityContext the webhook sets, with the
fsGroup as a supplementary group, no capabilities and no_new_privs. The application container
then runs as another UID and must read and execute everything copied. Here the real webhook
mutation gives the securityContexts, `setpriv` applies them to the real static copier (tests run
as root), and the application side is real python3 and node under LD_PRELOAD from the copy.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.injector import (
    ROOT,
    container_env,
    init_container,
    injected_pod_spec,
)

COPIER = ROOT / "build" / "injector" / platform.machine() / "lumigo-copy"
# The autotrace image's USER and an application image's USER (used when the pod sets none).
IMAGE_USER = {"init": (1234, 1234), "app": (1500, 1500)}
# What the application can be: a CPython the payload has a build for (Debian's 3.11: outside
# /root, so any UID can run it) and Node.js; both activate tracing from the copied payload.
SYSTEM_PYTHON = "/usr/bin/python3"
NODE = "/usr/bin/node"

POD_SECURITY_CONTEXTS = {
    "no-fsgroup": {},
    "fsgroup-2000": {"fsGroup": 2000},
    "user-1000-no-fsgroup": {"runAsUser": 1000, "runAsGroup": 1000},
    "distroless-nonroot-65532": {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
    },
    "user-1500-fsgroup-2000-supplemental": {
        "runAsUser": 1500,
        "fsGroup": 2000,
        "supplementalGroups": [3000],
    },
    "fsgroup-0": {"runAsUser": 1000, "fsGroup": 0},
}


@dataclass(frozen=True)
class Identity:
    """The credentials a container's process gets from its pod and container securityContext."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    no_new_privs: bool

    def setpriv(self) -> list[str]:
        """util-linux setpriv arguments that switch to this identity with no capabilities."""
        groups = [f"--groups={','.join(map(str, self.groups))}"] if self.groups else []
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            *(groups or ["--clear-groups"]),
            "--inh-caps=-all",
            "--bounding-set=-all",
            *(["--no-new-privs"] if self.no_new_privs else []),
        ]


def identity(pod_spec: dict[str, Any], container: dict[str, Any], image: str) -> Identity:
    """What the kubelet gives the container: container fields over pod fields over the image's
    USER; fsGroup and supplementalGroups become supplementary groups."""
    pod = pod_spec.get("securityContext") or {}
    own = container.get("securityContext") or {}
    uid = own.get("runAsUser", pod.get("runAsUser", IMAGE_USER[image][0]))
    gid = own.get("runAsGroup", pod.get("runAsGroup", IMAGE_USER[image][1]))
    groups = ([pod["fsGroup"]] if "fsGroup" in pod else []) + pod.get("supplementalGroups", [])
    if own.get("runAsNonRoot", pod.get("runAsNonRoot")):
        assert uid != 0, "the kubelet refuses to start a runAsNonRoot container as root"
    return Identity(uid, gid, tuple(groups), own.get("allowPrivilegeEscalation") is False)


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """A directory every UID can traverse (pytest's tmp_path is 0700 root), removed afterwards.
    On tmpfs where there is one (an emptyDir with `medium: Memory` is tmpfs): copying the payload
    to this VM's disk takes 30 times longer, with the same ownership and mode semantics."""
    shm = Path("/dev/shm")
    path = Path(tempfile.mkdtemp(prefix="lumigo-copier-", dir=shm if shm.is_dir() else None))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def kubelet_empty_dir(path: Path, fs_group: int | None) -> Path:
    """The emptyDir as the kubelet makes it: root:root 0777, or root:<fsGroup> 2777."""
    path.mkdir()
    os.chown(path, 0, fs_group if fs_group is not None else 0)
    path.chmod(0o2777 if fs_group is not None else 0o777)
    return path


def run_copier(who: Identity, payload: Path, volume: Path) -> subprocess.CompletedProcess[str]:
    """The init container's process: its env, its credentials, a hostile umask for good measure."""
    return subprocess.run(
        [*who.setpriv(), str(COPIER), str(payload)],
        env={"TARGET_DIRECTORY": str(volume)},
        capture_output=True,
        text=True,
        timeout=300,
        umask=0o077,
    )


def assert_copied(payload: Path, volume: Path, owner: int) -> None:
    """Same tree and contents; what the copier made is the init UID's, with modes any UID can
    use (directories 0755, files 0644 or 0755 when executable); the volume's root untouched."""
    count = 0
    for src_dir, dirs, files in os.walk(payload):
        rel = Path(src_dir).relative_to(payload)
        for name in [*dirs, *files]:
            src, dst = Path(src_dir) / name, volume / rel / name
            have = dst.lstat()
            assert have.st_uid == owner, dst
            if src.is_symlink():
                assert os.readlink(dst) == os.readlink(src), dst
            elif src.is_dir():
                assert stat.S_ISDIR(have.st_mode), dst
                # a new directory inherits the setgid bit of an fsGroup volume
                assert stat.S_IMODE(have.st_mode) in (0o755, 0o2755), (dst, oct(have.st_mode))
            else:
                executable = src.stat().st_mode & 0o111
                assert stat.S_IMODE(have.st_mode) == (0o755 if executable else 0o644), dst
                assert dst.read_bytes() == src.read_bytes(), dst
                count += 1
    assert count > 1000  # the whole payload, not a part of it


@pytest.mark.parametrize("pod_context", POD_SECURITY_CONTEXTS.values(), ids=POD_SECURITY_CONTEXTS)
def test_injected_init_container_copies_into_a_kubelet_volume(
    pod_context: dict[str, Any], injector_payload: Path, node_dir: Path
) -> None:
    assert COPIER.is_file(), f"{COPIER} not built (injector/build-payload needs musl-gcc)"
    pod_spec = injected_pod_spec(
        {"securityContext": pod_context, "containers": [{"name": "app", "image": "app"}]}
    )
    init = init_container(pod_spec)
    context = init["securityContext"]
    # what setpriv below applies is what the webhook asks for
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert init["env"] == [{"name": "TARGET_DIRECTORY", "value": "/target"}]
    copier = identity(pod_spec, init, "init")
    assert copier.uid != 0
    fs_group = pod_context.get("fsGroup")
    volume = kubelet_empty_dir(node_dir / "volume", fs_group)

    first = run_copier(copier, injector_payload, volume)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    assert_copied(injector_payload, volume, copier.uid)
    assert stat.S_IMODE(volume.stat().st_mode) == (0o2777 if fs_group is not None else 0o777)

    app = pod_spec["containers"][0]
    assert_app_can_use(identity(pod_spec, app, "app"), container_env(app, volume), node_dir)

    # the pod restarts: the emptyDir keeps the first run's files, the init container runs again
    again = run_copier(copier, injector_payload, volume)
    assert again.returncode == 0, again.stderr
    assert_copied(injector_payload, volume, copier.uid)


def assert_app_can_use(app: Identity, env: dict[str, str], node_dir: Path) -> None:
    """As the application's UID: the .so preloads, and Python and Node.js load their distro
    from the copied payload (every module the distro imports must be readable)."""
    volume = Path(env["LD_PRELOAD"]).parents[1]
    env = {
        **env,
        "PATH": "/usr/bin:/bin",
        "HOME": str(node_dir),
        "LUMIGO_INJECTOR_DEBUG": "true",
        "LUMIGO_ENDPOINT": "http://127.0.0.1:9/v1/traces",  # nothing is exported here
        "LUMIGO_REPORT_DEPENDENCIES": "false",  # never reach for the public endpoint
    }
    programs = {
        "python": (
            [SYSTEM_PYTHON, "-c", "import lumigo_opentelemetry as d; print(d.__file__)"],
            f"tracing with lumigo_opentelemetry from {volume}/python/cp311-glibc",
        ),
        "node": (
            [NODE, "-e", "console.log(Object.keys(require.cache).find("
             "(m) => m.endsWith('/nodejs/lumigo-distro.js')))"],
            f"tracing with @lumigo/opentelemetry from {volume}/nodejs",
        ),
    }  # fmt: skip
    for name, (args, activated) in programs.items():
        result = subprocess.run([*app.setpriv(), *args], env=env, cwd=node_dir,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, (name, result.stderr)
        assert activated in result.stderr, (name, app, result.stderr)
        assert "cannot be preloaded" not in result.stderr
        assert "not activated" not in result.stderr
        # the distro came from the copy, not from anywhere else
        loaded_from = result.stdout.splitlines()[-1]  # after the distro's own log lines
        assert loaded_from.startswith(f"{volume}/{name.replace('node', 'nodejs')}/"), result


def test_a_failed_copy_is_said_and_lets_the_pod_start(
    injector_payload: Path, node_dir: Path
) -> None:
    """A volume the init UID cannot write to: an error that names the path, then that the
    payload is incomplete; exit 0, so the application containers start (untraced: there is no
    payload.json, the completion marker, for the injector to find)."""
    volume = node_dir / "volume"
    volume.mkdir(mode=0o755)  # root's, not writable by others
    result = run_copier(Identity(1234, 1234, (), True), injector_payload, volume)
    assert result.returncode == 0
    first, last = result.stderr.splitlines()
    assert first == f"lumigo-copy: cannot create directory {volume}/injector: Permission denied"
    assert last == (
        f"lumigo-copy: the payload in {volume} is incomplete: this pod's containers start "
        "without Lumigo tracing"
    )
    assert not (volume / "payload.json").exists()


def test_the_completion_marker_is_copied_last_and_no_file_is_ever_left_half_written(
    injector_payload: Path, node_dir: Path
) -> None:
    """A volume that fills up after the injector: the library is whole, the rest stops at the
    first file that does not fit, with nothing under a real name that is not complete."""
    volume = node_dir / "small"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0777", "tmpfs", str(volume)],
                   check=True)  # fmt: skip
    try:
        result = run_copier(Identity(1234, 1234, (), True), injector_payload, volume)
        assert result.returncode == 0
        assert "No space left on device" in result.stderr, result.stderr
        assert "is incomplete" in result.stderr
        assert not (volume / "payload.json").exists()
        so = "injector/lumigo_injector.so"
        assert (volume / so).read_bytes() == (injector_payload / so).read_bytes()
        for copied in volume.rglob("*"):
            assert not copied.name.endswith(".lumigo-partial"), copied
            if copied.is_file() and not copied.is_symlink():
                original = injector_payload / copied.relative_to(volume)
                assert copied.stat().st_size == original.stat().st_size, copied
    finally:
        subprocess.run(["umount", str(volume)], check=True)


# seccomp: what the kernel's getdents64 returns is decided by a filter (seccomp(2)); the numbers
# are the audit architecture and the directory-listing system calls of each architecture.
SECCOMP_ARCH = {"x86_64": (0xC000003E, (217, 78)), "aarch64": (0xC00000B7, (61,))}


def failing_listings(first_fd: int, error: int) -> Callable[[], None]:
    """A preexec_fn: in the child (setpriv, then the copier it executes), listing a directory
    through any file descriptor >= first_fd fails with `error`, as a failing disk or network
    filesystem makes it fail: a real getdents64 that returns the error to the real copier."""
    audit_arch, listing_calls = SECCOMP_ARCH[platform.machine()]
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET
    allow, fail_with = 0x7FFF0000, 0x00050000 | error  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
    n = len(listing_calls)
    # 0 arch; 1 ours? (else allow); 2 nr; 3.. a listing call? (else allow); 3+n fd = args[0]
    # (low word); 4+n fd >= first_fd?; 5+n fail; 6+n allow. Jumps count from the next insn.
    program = [
        (ld_abs, 0, 0, 4),
        (jeq, 0, n + 4, audit_arch),
        (ld_abs, 0, 0, 0),
        *[(jeq, n - 1 - i, n - i + 2, nr) for i, nr in enumerate(listing_calls)],
        (ld_abs, 0, 0, 16),
        (jge, 0, 1, first_fd),
        (ret, 0, 0, fail_with),
        (ret, 0, 0, allow),
    ]

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]  # fmt: skip

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(program))(*[SockFilter(*insn) for insn in program])
    fprog = SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)

    def install() -> None:
        pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
        if (
            libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0
            or libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0
        ):
            raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")

    return install


def test_a_directory_listing_that_fails_fails_the_copy(node_dir: Path) -> None:
    """A directory whose listing fails part-way (EIO from getdents64: a failing disk, a network
    filesystem) is not a shorter directory: the copier says which directory it could not read,
    and the payload stays incomplete (no payload.json), so the injector activates nothing rather
    than a tracer with missing modules. The pod still starts (exit 0, as for every failed copy).

    The payload's top level is listed through file descriptor 3 and each of its directories
    through 4: the filter lets the top level and injector/ be read and fails the rest."""
    if platform.machine() not in SECCOMP_ARCH:
        pytest.skip(f"no seccomp numbers for {platform.machine()} here")
    assert COPIER.is_file(), f"{COPIER} not built (injector/build-payload needs musl-gcc)"
    payload = node_dir / "payload"
    for name, content in {
        "injector/lumigo_injector.so": "library",
        "python/bootstrap/sitecustomize.py": "import sys",
        "nodejs/lumigo-bootstrap.js": "require('x')",
        "payload.json": "{}",
    }.items():
        (payload / name).parent.mkdir(parents=True, exist_ok=True)
        (payload / name).write_text(content)
    volume = kubelet_empty_dir(node_dir / "volume", None)
    result = subprocess.run(
        [*Identity(1234, 1234, (), True).setpriv(), str(COPIER), str(payload)],
        env={"TARGET_DIRECTORY": str(volume)},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=failing_listings(4, errno.EIO),
    )
    assert result.returncode == 0, result.stderr
    assert not (volume / "payload.json").exists(), (result.stdout, result.stderr)
    assert (volume / "injector" / "lumigo_injector.so").read_text() == "library"
    first, last = result.stderr.splitlines()
    unread = {f"{payload}/python", f"{payload}/nodejs"}
    assert first in {f"lumigo-copy: cannot read directory {d}: I/O error" for d in unread} | {
        f"lumigo-copy: cannot read directory {d}: Input/output error" for d in unread
    }, result.stderr
    assert last == (
        f"lumigo-copy: the payload in {volume} is incomplete: this pod's containers start "
        "without Lumigo tracing"
    )
    assert result.stdout == ""
