#!/usr/bin/env python3
"""A real Kubernetes node on this machine, joined to a running LocalCluster's API server.

containerd (+ runc and the CNI plugins) runs real containers, the kubelet registers a Node,
kube-proxy programs Service IPs, and CoreDNS serves `cluster.local` to the pods, which live on a
local bridge. It is what `hack/local-up-cluster.sh` does for Kubernetes itself, in Python, with
everything a test needs to trust it:

- **Nothing leaves this machine.** Before the kubelet starts (so before any pod exists), an
  nftables table of this node rejects every packet from the bridge or the pod CIDR whose
  destination is not in the pod CIDR (Service IPs are DNAT-ed to pod IPs before that check; the
  node itself is reached through INPUT, not FORWARD). The CNI bridge does no masquerade. CoreDNS
  is built without any forwarding plugin. The kubelet's `clusterDNS` is that CoreDNS, and even
  `dnsPolicy: Default` pods get a resolv.conf naming it. No image is ever pulled: images are
  imported with `ctr images import` (see `import_image`), and a pull that still happens is sent
  by containerd to 127.0.0.1:9 (a `hosts.toml` for the common registries). The node's own
  processes (containerd, the shims, kubelet, kube-proxy, CoreDNS) run in its cgroup, and an
  output rule matching that cgroup lets them reach only loopback and the pod network.
- **Pods reach the API server** at `kubernetes.default.svc` (an operator pod needs it): the API
  server listens on loopback only, so the node DNATs the `kubernetes` Service IP from the bridge
  to it (with `route_localnet` on the bridge alone).
- **Its own work directory** (`/tmp/lumigo-node-*`) holds containerd's root and state, the
  kubelet's root, the pods' logs, the network namespaces and the IPAM state. The bridge, the
  nftables table and the cgroup root carry a per-node id, so the names never collide.
- **`stop()` leaves nothing behind**: it kills every process in the node's cgroup tree (the
  runtime, the shims and every container), unmounts everything under the work directory, deletes
  the bridge and any veth left on it, deletes the nftables tables (this node's and kube-proxy's),
  the kubelet's iptables canary chains and the cgroups, and restores `ip_forward`. It is
  idempotent, and a node whose owner was SIGKILLed is cleaned the same way by the next start.

kube-proxy's rules are machine-wide (one `kube-proxy` nftables table), so one local node runs
per machine at a time: a second `start()` fails with a message naming the running one.

    python hack/localnode.py up       # a full LocalCluster plus this node; prints KUBECONFIG
    python hack/localnode.py check    # preflight only: names any missing component or feature
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ociimage
from localcluster import BIN, FAKE_NODE, LocalCluster, Process, free_port, wait_healthy

WORKDIR_PREFIX = "lumigo-node-"
LOCK_FILE = Path("/run/lumigo-localnode.lock")
CNI_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
SYSTEM_BIN_DIRS = ("/usr/sbin", "/sbin")  # root's tools, also when PATH lacks them
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
# One /24 per node out of 10.244.0.0/16 (the CIDR kind and kubeadm clusters use): 253 pods.
POD_SUPERNET = "10.244.0.0/16"
DNS_SERVICE_IP = "10.0.0.10"  # inside LocalCluster's --service-cluster-ip-range=10.0.0.0/24
NODE_LABEL = "lumigo.io/node"  # value "real" on this node; kwok's fake node has type=kwok
# Registries that a pull could name by accident; containerd sends them to 127.0.0.1:9.
BLOCKED_REGISTRIES = (
    "docker.io",
    "registry.k8s.io",
    "quay.io",
    "ghcr.io",
    "gcr.io",
    "public.ecr.aws",
)
_PR_SET_PDEATHSIG = 1


class NodeError(RuntimeError):
    """The node cannot run here (a missing component or kernel feature), or failed to start."""


# --- preflight ------------------------------------------------------------------------------


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


# --- state shared by stop() and the stale sweep -----------------------------------------------


@dataclass
class NodeState:
    """What teardown needs to know, written to <workdir>/state.json before anything is made."""

    workdir: str
    node_id: str
    bridge: str
    nft_table: str
    cgroup_root: str
    pod_cidr: str
    node_ip: str
    sysctls_before: dict[str, str] = field(default_factory=dict)
    tables_before: list[list[str]] = field(default_factory=list)
    shim_dir_existed: bool = True

    @classmethod
    def load(cls, path: Path) -> NodeState:
        return cls(**json.loads(path.read_text()))


def _sh(
    *args: str, check: bool = False, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, input=input, timeout=60)
    if check and proc.returncode != 0:
        raise NodeError(f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _cgroup_dirs(state: NodeState) -> list[Path]:
    return [h.mount / state.cgroup_root.strip("/") for h in cgroup_hierarchies()]


def _kill_cgroup_tree(state: NodeState, timeout: float = 20) -> None:
    """SIGKILL every process in the node's cgroups (runtime, shims, containers) until none is
    left, then wait until they are reaped, so that none is seen afterwards even as a zombie.

    The freezer (v1) stops the tree first, so nothing forks while it is being killed."""
    roots = [d for d in _cgroup_dirs(state) if d.exists()]
    freezer = next((d for d in roots if (d / "freezer.state").exists()), None)
    deadline = time.monotonic() + timeout
    killed: set[int] = set()
    while True:
        pids: set[int] = set()
        for root in roots:
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        pids.discard(os.getpid())
        if not pids:
            break
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")
        if time.monotonic() > deadline:
            raise NodeError(f"processes {sorted(pids)} in {state.cgroup_root} would not die")
        time.sleep(0.05)
    while any(Path(f"/proc/{pid}").exists() for pid in killed):  # reaped by their new parent
        if time.monotonic() > deadline:
            left = sorted(pid for pid in killed if Path(f"/proc/{pid}").exists())
            raise NodeError(f"processes {left} were killed but not reaped")
        time.sleep(0.05)


SHIM_SOCKET_DIR = Path("/run/containerd/s")  # fixed in containerd 1.6 and 2, whatever its state dir


def _remove_shim_sockets(state: NodeState) -> None:
    """A killed shim leaves its socket, named sha256(<containerd address>/<ns>/<task id>)."""
    address = Path(state.workdir) / "run" / "containerd.sock"
    tasks = Path(state.workdir) / "run" / "containerd" / "io.containerd.runtime.v2.task"
    for task in tasks.glob("*/*"):
        name = hashlib.sha256(f"{address}/{task.parent.name}/{task.name}".encode()).hexdigest()
        (SHIM_SOCKET_DIR / name).unlink(missing_ok=True)
    if not state.shim_dir_existed:  # containerd made /run/containerd/s for us: remove it
        for path in (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent):
            with contextlib.suppress(OSError):
                path.rmdir()  # only if empty: another containerd's sockets stay


def _mounts_under(path: str) -> list[str]:
    """Mount points at or under `path`, deepest first (from /proc/self/mountinfo)."""
    prefix = path.rstrip("/")
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def _unmount_all(path: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for _ in range(5):  # mounts stacked on the same point need more than one pass
        points = _mounts_under(path)
        if not points:
            return
        for point in points:
            libc.umount2(point.encode(), 2)  # MNT_DETACH: busy or not, it goes now
    left = _mounts_under(path)
    if left:
        raise NodeError(f"could not unmount {left}")


def _links(master: str | None = None) -> list[dict[str, Any]]:
    args = ["ip", "-j", "link", "show"] + (["master", master] if master else [])
    out = _sh(*args)
    return list(json.loads(out.stdout or "[]")) if out.returncode == 0 else []


IPTABLES_TABLES = {"filter", "nat", "mangle", "raw", "security"}
OUR_CHAINS = ("KUBE-", "CNI-")  # the kubelet's canaries, kube-proxy's and the CNI plugins'


def nft_tables() -> list[list[str]]:
    """[family, name] of every nftables table on the machine."""
    out = _sh("nft", "-j", "list", "tables")
    items = json.loads(out.stdout or "{}").get("nftables", []) if out.returncode == 0 else []
    return [[i["table"]["family"], i["table"]["name"]] for i in items if "table" in i]


def _delete_node_rules(tables_before: list[list[str]]) -> None:
    """kube-proxy's nftables tables, and the KUBE-*/CNI-* iptables chains (kubelet canaries,
    portmap) with the rules that jump to them; iptables tables that did not exist before the
    node started and are now empty are deleted too, so the ruleset is as it was."""
    for family in ("ip", "ip6"):
        if [family, "kube-proxy"] in nft_tables():
            _sh("nft", "delete", "table", family, "kube-proxy", check=True)
    out = _sh("nft", "-j", "list", "ruleset")
    items = json.loads(out.stdout or "{}").get("nftables", []) if out.returncode == 0 else []
    rules = [i["rule"] for i in items if "rule" in i]
    chains = [i["chain"] for i in items if "chain" in i]
    ours = [c for c in chains if c["name"].startswith(OUR_CHAINS)]
    for rule in rules:
        jumps = [e for e in rule.get("expr", []) if "jump" in e or "goto" in e]
        target = next(iter(jumps[0].values()))["target"] if jumps else ""
        if target.startswith(OUR_CHAINS) and not rule["chain"].startswith(OUR_CHAINS):
            _sh(
                "nft",
                "delete",
                "rule",
                rule["family"],
                rule["table"],
                rule["chain"],
                "handle",
                str(rule["handle"]),
                check=True,
            )
    for chain in ours:
        _sh("nft", "flush", "chain", chain["family"], chain["table"], chain["name"], check=True)
    for chain in ours:
        _sh("nft", "delete", "chain", chain["family"], chain["table"], chain["name"], check=True)
    for family, name in nft_tables():
        if name not in IPTABLES_TABLES or [family, name] in tables_before:
            continue
        listing = json.loads(_sh("nft", "-j", "list", "table", family, name).stdout or "{}")
        if not any("rule" in i for i in listing.get("nftables", [])):
            _sh("nft", "delete", "table", family, name, check=True)


def teardown(state: NodeState) -> None:
    """Remove everything a node made; safe to run twice and on a half-started node."""
    errors: list[str] = []

    def step(what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as err:  # keep cleaning; report everything at the end
            errors.append(f"{what}: {err}")

    step("processes", lambda: _kill_cgroup_tree(state))
    step("shim sockets", lambda: _remove_shim_sockets(state))
    step("mounts", lambda: _unmount_all(state.workdir))

    def network() -> None:
        for link in _links(state.bridge):
            _sh("ip", "link", "del", link["ifname"])
        if any(link["ifname"] == state.bridge for link in _links()):
            _sh("ip", "link", "del", state.bridge, check=True)

    step("network", network)

    def firewall() -> None:
        if _sh("nft", "list", "table", "inet", state.nft_table).returncode == 0:
            _sh("nft", "delete", "table", "inet", state.nft_table, check=True)

    step("firewall", firewall)
    step("kube-proxy and kubelet rules", lambda: _delete_node_rules(state.tables_before))

    def cgroups() -> None:
        for root in _cgroup_dirs(state):
            if not root.exists():
                continue
            for path in sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                path.rmdir()
            root.rmdir()

    step("cgroups", cgroups)

    def sysctls() -> None:
        for key, value in state.sysctls_before.items():
            Path("/proc/sys", key).write_text(value)

    step("sysctls", sysctls)
    if errors:
        raise NodeError("the local node was not fully cleaned up:\n  " + "\n  ".join(errors))
    shutil.rmtree(state.workdir, ignore_errors=True)


def sweep_stale_nodes() -> None:
    """Clean up nodes whose owner process died without stopping them (e.g. SIGKILL)."""
    for path in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((path / "owner.pid").read_text())
            state = NodeState.load(path / "state.json")
        except (OSError, ValueError, TypeError):
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            teardown(state)
        except PermissionError:
            pass


# --- the node -------------------------------------------------------------------------------


class NodeProcess(Process):
    """A localcluster Process started inside the node's cgroups (so teardown can find it)."""

    cgroup_procs: list[Path]

    def start(self) -> None:
        binary = Path(self.args[0])
        if not binary.exists():
            raise NodeError(f"{binary} is missing: run `hack/install-tools node`")
        targets = [str(p) for p in self.cgroup_procs]

        def setup() -> None:  # between fork and exec: own session, die with us, join cgroups
            os.setsid()
            with contextlib.suppress(OSError):
                ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            for target in targets:
                with open(target, "w") as procs:
                    procs.write(str(os.getpid()))

        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                preexec_fn=setup,  # noqa: PLW1509 - setsid, pdeathsig and cgroups only
            )


class LocalNode:
    """containerd + kubelet + kube-proxy + CoreDNS joined to `cluster` (see the module doc)."""

    def __init__(
        self,
        cluster: LocalCluster,
        *,
        taints: list[dict[str, str]] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.taints = taints or []
        self.labels = {NODE_LABEL: "real", **(labels or {})}
        self.node_id = uuid.uuid4().hex[:8]
        self.name = f"lumigo-node-{self.node_id}"
        self.provider_id = f"lumigo-local:///{self.name}"
        self.workdir = Path(tempfile.gettempdir()) / f"{WORKDIR_PREFIX}{self.node_id}"
        self.processes: dict[str, Process] = {}
        self.components: Components | None = None
        self.state: NodeState | None = None
        self._lock: IO[str] | None = None
        self.timings: dict[str, float] = {}  # seconds per start-up step, for bench/
        self.kubelet_port = free_port()
        self.ports = {
            name: free_port()
            for name in (
                "kubelet-healthz",
                "proxy-healthz",
                "proxy-metrics",
                "dns-health",
                "dns-ready",
            )
        }

    # -- public API ----------------------------------------------------------------------
    @property
    def pod_cidr(self) -> str:
        return self._state().pod_cidr

    @property
    def node_ip(self) -> str:
        return self._state().node_ip

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "run" / "containerd.sock"

    @property
    def dns_ip(self) -> str:
        return DNS_SERVICE_IP

    def start(self) -> LocalNode:
        started = time.monotonic()
        self.components = require(*preflight())
        self._take_lock()
        try:
            steps: list[tuple[str, Callable[[], None]]] = [
                ("sweep", sweep_stale_nodes),
                ("state", self._make_state),
                ("cgroups", self._setup_cgroups),
                ("network", self._setup_network),
                ("containerd", self._start_containerd),
                ("images", self._import_base_images),
                ("dns-service", self._create_dns_service),
                ("coredns", self._start_coredns),
                # kube-proxy waits for its Node object, which the kubelet registers.
                ("kube-proxy", self._start_kube_proxy),
                ("kubelet", self._start_kubelet),
                ("kube-proxy-ready", self._wait_kube_proxy),
            ]
            for name, action in steps:
                began = time.monotonic()
                action()
                self.timings[name] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop everything and remove every trace; idempotent."""
        for name in ("kubelet", "kube-proxy", "coredns", "containerd"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop(timeout=5)
        if self.state is not None:
            with contextlib.suppress(Exception):
                self.cluster.kubectl(
                    "delete", "node", self.name, "--ignore-not-found", "--wait=false"
                )
            state, self.state = self.state, None
            teardown(state)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> LocalNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _import_base_images(self) -> None:
        for archive in (ociimage.pause_image(), ociimage.busybox_image()):
            self.import_image(archive)

    def import_image(self, archive: Path) -> None:
        """Import a docker-archive/OCI tar into the node's containerd (namespace k8s.io)."""
        self.ctr("images", "import", "--no-unpack=false", str(archive))

    def ctr(self, *args: str) -> str:
        assert self.components is not None
        proc = _sh(
            str(self.components.ctr),
            "--address",
            str(self.containerd_socket),
            "-n",
            "k8s.io",
            *args,
        )
        if proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def process_report(self) -> str:
        lines = []
        for name, proc in self.processes.items():
            if proc.alive():
                lines.append(f"{name}: running")
            else:
                code = proc.popen.returncode if proc.popen is not None else None
                lines.append(f"{name}: EXITED ({code})\n{proc.log_tail(20)}")
        return "\n".join(lines)

    # -- internals -----------------------------------------------------------------------
    def _state(self) -> NodeState:
        if self.state is None:
            raise NodeError("the node is not running")
        return self.state

    def _take_lock(self) -> None:
        self._lock = LOCK_FILE.open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip()
            self._lock.close()
            self._lock = None
            raise NodeError(
                f"another local node is running on this machine ({holder}); kube-proxy's "
                "rules are machine-wide, so only one runs at a time"
            ) from None
        self._lock.truncate(0)
        self._lock.write(f"pid {os.getpid()}, {self.workdir}\n")
        self._lock.flush()

    def _make_state(self) -> None:
        self.workdir.mkdir(mode=0o755)
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        for sub in ("logs", "run", "config", "cni", "kubelet", "pod-logs"):
            (self.workdir / sub).mkdir()
        subnet = self._free_subnet()
        hosts = subnet.hosts()
        self.state = NodeState(
            workdir=str(self.workdir),
            node_id=self.node_id,
            bridge=f"lmg{self.node_id}",
            nft_table=f"lumigo_{self.node_id}",
            cgroup_root=f"/lumigo-node-{self.node_id}",
            pod_cidr=str(subnet),
            node_ip=str(next(hosts)),
            tables_before=nft_tables(),
            shim_dir_existed=SHIM_SOCKET_DIR.exists(),
        )
        self._save_state()

    def _save_state(self) -> None:
        state = self._state()
        (self.workdir / "state.json").write_text(json.dumps(asdict(state), indent=2))

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of 10.244.0.0/16 that no route or address of this machine overlaps."""
        used = []
        for line in _sh("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
            word = line.split()[0] if line.split() else ""
            with contextlib.suppress(ValueError):
                if word not in ("default", "broadcast", "local", "unreachable"):
                    used.append(ipaddress.ip_network(word, strict=False))
        supernet = ipaddress.IPv4Network(POD_SUPERNET)
        for subnet in supernet.subnets(new_prefix=24):
            if not any(subnet.overlaps(u) for u in used):
                return subnet
        raise NodeError(f"no free /24 in {POD_SUPERNET} for the pod network")

    # cgroups
    def _setup_cgroups(self) -> None:
        state = self._state()
        self._procs_files: list[Path] = []
        for h in cgroup_hierarchies():
            root = h.mount / state.cgroup_root.strip("/")
            runtime = root / "runtime"
            for path in (root, runtime):
                path.mkdir(exist_ok=True)
                if "cpuset" in h.controllers and not h.v2:
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        (path / name).write_text((path.parent / name).read_text())
            if h.v2:
                wanted = h.controllers & {"cpu", "cpuset", "memory", "pids", "io", "hugetlb"}
                for path in (h.mount, root):
                    with contextlib.suppress(OSError):
                        (path / "cgroup.subtree_control").write_text(
                            " ".join(f"+{c}" for c in sorted(wanted))
                        )
            self._procs_files.append(runtime / "cgroup.procs")

    # network and firewall
    def _setup_network(self) -> None:
        state = self._state()
        prefix = ipaddress.ip_network(state.pod_cidr).prefixlen
        _sh("ip", "link", "add", state.bridge, "type", "bridge", check=True)
        _sh("ip", "addr", "add", f"{state.node_ip}/{prefix}", "dev", state.bridge, check=True)
        _sh("ip", "link", "set", state.bridge, "up", check=True)
        # The firewall exists before the kubelet does, so before any pod: everything from the
        # pod network to anything but the pod network is rejected (after Service DNAT).
        # Pods reach the API server (it listens on loopback only, and its `kubernetes` Service
        # has no endpoints: loopback ones are invalid) through the Service IP, which is sent to
        # 127.0.0.1 before kube-proxy sees it; route_localnet on the bridge alone allows that.
        api_ip = self.cluster.request("/api/v1/namespaces/default/services/kubernetes")["spec"][
            "clusterIP"
        ]
        api = f"127.0.0.1:{self.cluster.apiserver_port}"
        Path("/proc/sys/net/ipv4/conf", state.bridge, "route_localnet").write_text("1")
        ruleset = f"""
table inet {state.nft_table} {{
    chain forward {{
        type filter hook forward priority filter - 10; policy accept;
        iifname "{state.bridge}" ip daddr != {state.pod_cidr} counter reject
        ip saddr {state.pod_cidr} ip daddr != {state.pod_cidr} counter reject
        iifname "{state.bridge}" meta nfproto ipv6 counter reject
    }}
    chain prerouting {{
        type nat hook prerouting priority dstnat - 20; policy accept;
        iifname "{state.bridge}" ip daddr {api_ip} tcp dport 443 counter dnat ip to {api}
    }}
{self._output_chain()}}}
"""
        _sh("nft", "-f", "-", input=ruleset, check=True)
        sysctls = {
            "net/ipv4/ip_forward": "1",  # pod -> Service IP -> pod is routed by the host
            "net/bridge/bridge-nf-call-iptables": "1",  # ... and its reply on the bridge seen
        }
        for key, value in sysctls.items():
            path = Path("/proc/sys", key)
            before = path.read_text().strip()
            if before != value:
                state.sysctls_before[key] = before
                self._save_state()
                path.write_text(value)
        (self.workdir / "cni" / "net.d").mkdir(parents=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": f"lumigo-{self.node_id}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": state.bridge,
                    "isGateway": True,
                    "isDefaultGateway": True,  # as on any cluster; the firewall guards it
                    "ipMasq": False,  # no masquerade: nothing is NAT-ed out of the machine
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": state.pod_cidr, "gateway": state.node_ip}]],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (self.workdir / "cni" / "net.d" / "10-lumigo.conflist").write_text(
            json.dumps(conflist, indent=2)
        )

    def _output_chain(self) -> str:
        """The node's own processes (containerd, shims, kubelet, kube-proxy, CoreDNS) may talk to
        loopback and the pod network only: a pull or a DNS lookup never leaves the machine.
        Matched by their cgroup v2 path (all of them run in the node's cgroup tree)."""
        state = self._state()
        unified = next((h for h in cgroup_hierarchies() if h.v2), None)
        if unified is None:
            return ""
        path = (unified.mount / state.cgroup_root.strip("/")).relative_to(CGROUP_ROOT)
        ours = f'socket cgroupv2 level 1 "{path}"'
        allowed = f"{{ 127.0.0.0/8, {state.pod_cidr} }}"
        return f"""    chain output {{
        type filter hook output priority filter - 10; policy accept;
        {ours} ip daddr != {allowed} counter reject
        {ours} meta nfproto ipv6 ip6 daddr != ::1 counter reject
    }}
"""

    # containerd
    def _start_containerd(self) -> None:
        components = self.components
        assert components is not None
        run = self.workdir / "run"
        certs = self.workdir / "config" / "certs.d"
        for registry in BLOCKED_REGISTRIES:
            (certs / registry).mkdir(parents=True)
            (certs / registry / "hosts.toml").write_text(
                'server = "http://127.0.0.1:9"\n\n[host."http://127.0.0.1:9"]\n'
                '  capabilities = ["pull", "resolve"]\n'
            )
        # containerd 2's own (version 3) layout; nothing is imported from /etc/containerd, and
        # NRI (a socket under /var/run) and the snapshotters the node does not use are off.
        config = f"""version = 3
root = "{self.workdir / "containerd"}"
state = "{run / "containerd"}"
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{run / "containerd.sock.ttrpc"}"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.workdir / "containerd" / "opt"}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{ociimage.PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{certs}"
[plugins."io.containerd.cri.v1.runtime"]
  # This VM withholds CAP_SYS_RESOURCE: a negative oom_score_adj fails inside runc.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{components.runc}"
        Root = "{run / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{components.cni_dir}"]
    conf_dir = "{self.workdir / "cni" / "net.d"}"
    max_conf_num = 1
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        path = self.workdir / "config" / "containerd.toml"
        path.write_text(config)
        env = dict(os.environ)
        env["PATH"] = f"{components.containerd_shim.parent}:{components.runc.parent}:" + env.get(
            "PATH", ""
        )
        proc = self._spawn("containerd", [str(components.containerd), "--config", str(path)], env)

        def ready() -> bool:
            return (
                self.containerd_socket.exists()
                and _sh(
                    str(components.ctr), "--address", str(self.containerd_socket), "version"
                ).returncode
                == 0
            )

        wait_healthy(proc, ready, 60, NodeError)

    # cluster DNS
    def _create_dns_service(self) -> None:
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kube-dns",
                "namespace": "kube-system",
                "labels": {"k8s-app": "kube-dns"},
            },
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                ],
            },
        }
        # CoreDNS runs on the node itself; its endpoint is the node's bridge address.
        endpoints = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-local-node",
                "namespace": "kube-system",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "lumigo-localnode",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.node_ip], "conditions": {"ready": True}}],
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        }
        for obj in (service, endpoints):
            self.cluster.kubectl(
                "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(obj)
            )

    def _start_coredns(self) -> None:
        assert self.components is not None
        corefile = self.workdir / "config" / "Corefile"
        corefile.write_text(f"""\
.:53 {{
    bind {self.node_ip}
    errors
    health 127.0.0.1:{self.ports["dns-health"]}
    ready 127.0.0.1:{self.ports["dns-ready"]}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
    loadbalance
}}
""")
        proc = self._spawn("coredns", [str(self.components.coredns), "-conf", str(corefile)])
        wait_healthy(
            proc,
            lambda: _http_ok(f"http://127.0.0.1:{self.ports['dns-ready']}/ready"),
            60,
            NodeError,
        )

    # kube-proxy
    def _start_kube_proxy(self) -> None:
        assert self.components is not None
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig)},
            "hostnameOverride": self.name,
            "bindAddress": self.node_ip,
            "healthzBindAddress": f"127.0.0.1:{self.ports['proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{self.ports['proxy-metrics']}",
            "mode": "nftables",
            "clusterCIDR": self.pod_cidr,
            "nodePortAddresses": [f"{self.node_ip}/32"],
            "oomScoreAdj": 0,  # a negative value needs CAP_SYS_RESOURCE, withheld on this VM
            # Leave the machine's conntrack sysctls as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        path = self.workdir / "config" / "kube-proxy.json"
        path.write_text(json.dumps(config, indent=2))
        self._spawn("kube-proxy", [str(self.components.kube_proxy), f"--config={path}", "--v=1"])

    def _wait_kube_proxy(self) -> None:
        """Healthy, and the cluster DNS Service programmed (so a pod's first lookup works)."""

        def programmed() -> bool:
            healthz = f"http://127.0.0.1:{self.ports['proxy-healthz']}/healthz"
            table = _sh("nft", "list", "table", "ip", "kube-proxy").stdout
            return _http_ok(healthz) and DNS_SERVICE_IP in table

        wait_healthy(self.processes["kube-proxy"], programmed, 60, NodeError)

    # kubelet
    def _start_kubelet(self) -> None:
        assert self.components is not None
        state = self._state()
        resolv = self.workdir / "config" / "resolv.conf"
        resolv.write_text(f"nameserver {self.node_ip}\n")  # dnsPolicy: Default pods too
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet-healthz"],
            # The API server is the only client (kubectl logs/exec); it presents no client
            # certificate for the kubelet, so the kubelet's API is open on the node address.
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cluster.pki["ca"].cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": state.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "oomScoreAdj": 0,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "imageServiceEndpoint": f"unix://{self.containerd_socket}",
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "kubelet" / "volume-plugins"),
            "registerWithTaints": self.taints,
            # As a cloud's kubelet registers its Node (`<provider>://<instance>`): telemetry
            # carries it as k8s.provider.id.
            "providerID": self.provider_id,
            # Images are imported, never pulled: the kubelet must never garbage-collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            # emptyDir sizeLimit is enforced from these stats: measure often.
            "volumeStatsAggPeriod": "5s",
            "evictionPressureTransitionPeriod": "5s",
            "shutdownGracePeriod": "0s",
            "serializeImagePulls": False,
        }
        path = self.workdir / "config" / "kubelet.json"
        path.write_text(json.dumps(config, indent=2))
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        proc = self._spawn(
            "kubelet",
            [
                str(self.components.kubelet),
                f"--config={path}",
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--root-dir={self.workdir / 'kubelet'}",
                f"--cert-dir={self.workdir / 'kubelet' / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.node_ip}",
                f"--node-labels={labels}",
                "--v=1",
            ],
        )
        wait_healthy(proc, self._node_ready, 120, NodeError)

    def _node_ready(self) -> bool:
        try:
            node = self.cluster.request(f"/api/v1/nodes/{self.name}")
        except urllib.error.HTTPError:
            return False
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )

    # processes
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        proc = NodeProcess(name, args, self.workdir / "logs" / f"{name}.log", env)
        proc.cgroup_procs = self._procs_files
        proc.start()
        self.processes[name] = proc
        return proc


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextlib.contextmanager
def running_node(cluster: LocalCluster, **kwargs: Any) -> Iterator[LocalNode]:
    node = LocalNode(cluster, **kwargs)
    try:
        yield node.start()
    finally:
        node.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description="Run a real local Kubernetes node.")
    parser.add_argument("command", choices=["up", "check"])
    args = parser.parse_args()
    if args.command == "check":
        components, problems = preflight()
        if components is not None:
            print("\n".join(components.describe()))
        for problem in problems:
            print(f"missing: {problem}", file=sys.stderr)
        return 1 if problems else 0
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with LocalCluster(full=True) as cluster, running_node(cluster) as node:
        cluster.kubectl("cordon", FAKE_NODE)  # every pod goes to the real node
        print(f"export KUBECONFIG={cluster.kubeconfig}  # node {node.name}", flush=True)
        while not stop:
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
