"""A local node's components: where each binary is, and what this machine lacks to run one."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from envtest.cluster import BIN

CNI_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
SYSTEM_BIN_DIRS = ("/usr/sbin", "/sbin")  # root's tools, also when PATH lacks them
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


class NodeError(RuntimeError):
    """The node cannot run here (a missing component or kernel feature), or failed to start."""


@dataclass(frozen=True)
class Components:
    """Where each node component is, and where it came from (for messages and reports)."""

    kubelet: Path
    kube_proxy: Path
    coredns: Path
    containerd: Path
    containerd_shim: Path
    ctr: Path
    runc: Path
    cni_dir: Path
    nft: Path
    ip: Path

    def describe(self) -> list[str]:
        """One line per component: version and origin (built here / Debian package)."""
        lines = []
        for name, path in (("kubelet", self.kubelet), ("kube-proxy", self.kube_proxy)):
            lines.append(f"{name} {_first_line([str(path), '--version'])} (built, {path})")
        lines.append(
            f"coredns {_first_line([str(self.coredns), '-version'])} (built, {self.coredns})"
        )
        containerd = _first_line([str(self.containerd), "--version"])
        lines.append(f"{containerd} (built, {self.containerd})")
        for name in ("runc", "containernetworking-plugins", "nftables"):
            lines.append(f"{name} {_debian_version(name)} (Debian)")
        return lines


def _first_line(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10)
    except OSError as err:
        return f"unavailable ({err})"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "?"


def _debian_version(package: str) -> str:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 else "(not from a Debian package)"


def find_components() -> tuple[Components | None, list[str]]:
    """The node's binaries, or the list of what is missing and how to get it."""
    missing: list[str] = []

    def built(name: str) -> Path:
        path = BIN / name
        if not path.exists():
            missing.append(f"{name} (run `hack/install-tools node`)")
        return path

    search = os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_BIN_DIRS])

    def debian(name: str, package: str) -> Path:
        found = shutil.which(name, path=search)
        if found is None:
            missing.append(f"{name} (Debian package {package}: run `hack/install-system-deps`)")
            return Path(name)
        return Path(found)

    kubelet, kube_proxy, coredns = built("kubelet"), built("kube-proxy"), built("coredns")
    containerd, shim, ctr = built("containerd"), built("containerd-shim-runc-v2"), built("ctr")
    runc = debian("runc", "runc")
    nft = debian("nft", "nftables")
    ip = debian("ip", "iproute2")
    cni_dir = next((d for d in CNI_DIRS if (d / "bridge").exists()), CNI_DIRS[0])
    absent = [p for p in CNI_PLUGINS if not (cni_dir / p).exists()]
    if absent:
        missing.append(
            f"CNI plugins {', '.join(absent)} in {cni_dir} (Debian package "
            "containernetworking-plugins: run `hack/install-system-deps`)"
        )
    if missing:
        return None, missing
    return (
        Components(kubelet, kube_proxy, coredns, containerd, shim, ctr, runc, cni_dir, nft, ip),
        [],
    )


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: a v1 controller set, or the v2 unified tree."""

    mount: Path
    controllers: frozenset[str]
    v2: bool


def cgroup_hierarchies() -> list[Hierarchy]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _source, options = [*right.split(), "", "", ""][:3]
        mount = Path(left.split()[4])
        if fstype == "cgroup2":
            controllers = frozenset((mount / "cgroup.controllers").read_text().split())
            found.append(Hierarchy(mount, controllers, True))
        elif fstype == "cgroup":
            opts = set(options.split(","))
            names = {o for o in opts if o in V1_CONTROLLERS} | {
                o for o in opts if o.startswith("name=")
            }
            found.append(Hierarchy(mount, frozenset(names), False))
    return found


V1_CONTROLLERS = {
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "blkio",
    "pids",
    "hugetlb",
    "net_cls",
    "net_prio",
    "perf_event",
    "rdma",
    "misc",
}
REQUIRED_CONTROLLERS = ("cpu", "cpuset", "memory", "pids")
CGROUP_ROOT = Path("/sys/fs/cgroup")  # nft resolves `socket cgroupv2` paths relative to it


def preflight() -> tuple[Components | None, list[str]]:
    """Everything the node needs from this machine; each problem names what is missing."""
    components, problems = find_components()
    if os.geteuid() != 0:
        problems.append("root: the node runs containerd and the kubelet, which need root")
        return components, problems
    filesystems = Path("/proc/filesystems").read_text()
    if "overlay" not in filesystems:
        problems.append("kernel feature overlayfs (containerd's overlayfs snapshotter)")
    hierarchies = cgroup_hierarchies()
    have = {c for h in hierarchies for c in h.controllers}
    for controller in REQUIRED_CONTROLLERS:
        if controller not in have:
            problems.append(f"kernel feature: cgroup controller {controller!r} is not mounted")
    if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True)
        if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
            problems.append(
                "kernel feature br_netfilter (Service traffic between pods on one bridge)"
            )
    if components is not None:
        probe = f"lmgchk{os.getpid() % 100000}"
        made = subprocess.run(
            [str(components.ip), "link", "add", probe, "type", "veth", "peer", "name", probe + "p"],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            problems.append(f"kernel feature veth: {made.stderr.strip()}")
        else:
            subprocess.run([str(components.ip), "link", "del", probe], capture_output=True)
        tables = subprocess.run([str(components.nft), "list", "tables"], capture_output=True)
        if tables.returncode != 0:
            problems.append(f"kernel feature nf_tables: {tables.stderr.decode().strip()}")
    return components, problems


def require(components: Components | None, problems: list[str]) -> Components:
    if problems or components is None:
        raise NodeError(
            "the real node cannot run on this machine; missing:\n  - "
            + "\n  - ".join(problems)
            + "\n(LUMIGO_NODE=off runs the tests without the node tier)"
        )
    return components
