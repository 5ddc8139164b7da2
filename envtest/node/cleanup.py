"""Removing everything a local node made: also a node whose owner was SIGKILLed (the sweep)."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envtest.node.components import NodeError, cgroup_hierarchies

WORKDIR_PREFIX = "lumigo-node-"


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


def sh(
    *args: str, check: bool = False, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, input=input, timeout=60)
    if check and proc.returncode != 0:
        raise NodeError(f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _cgroup_dirs(state: NodeState) -> list[Path]:
    return [h.mount / state.cgroup_root.strip("/") for h in cgroup_hierarchies()]


def _pids_in(roots: list[Path]) -> set[int]:
    pids: set[int] = set()
    for root in roots:
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    pids.discard(os.getpid())
    return pids


def _freeze(freezer: Path | None, state: str) -> None:
    if freezer is not None:
        with contextlib.suppress(OSError):
            (freezer / "freezer.state").write_text(state)


def _kill_cgroup_tree(state: NodeState, timeout: float = 20) -> None:
    """SIGKILL every process in the node's cgroups (runtime, shims, containers) until none is
    left, then wait until they are reaped, so that none is seen afterwards even as a zombie.

    The freezer (v1) stops the tree first, so nothing forks while it is being killed."""
    roots = [d for d in _cgroup_dirs(state) if d.exists()]
    freezer = next((d for d in roots if (d / "freezer.state").exists()), None)
    deadline = time.monotonic() + timeout
    killed: set[int] = set()
    while pids := _pids_in(roots):
        _freeze(freezer, "FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        _freeze(freezer, "THAWED")
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
    out = sh(*args)
    return list(json.loads(out.stdout or "[]")) if out.returncode == 0 else []


IPTABLES_TABLES = {"filter", "nat", "mangle", "raw", "security"}
OUR_CHAINS = ("KUBE-", "CNI-")  # the kubelet's canaries, kube-proxy's and the CNI plugins'


def nft_tables() -> list[list[str]]:
    """[family, name] of every nftables table on the machine."""
    out = sh("nft", "-j", "list", "tables")
    items = json.loads(out.stdout or "{}").get("nftables", []) if out.returncode == 0 else []
    return [[i["table"]["family"], i["table"]["name"]] for i in items if "table" in i]


def _delete_node_rules(tables_before: list[list[str]]) -> None:
    """kube-proxy's nftables tables, and the KUBE-*/CNI-* iptables chains (kubelet canaries,
    portmap) with the rules that jump to them; iptables tables that did not exist before the
    node started and are now empty are deleted too, so the ruleset is as it was."""
    for family in ("ip", "ip6"):
        if [family, "kube-proxy"] in nft_tables():
            sh("nft", "delete", "table", family, "kube-proxy", check=True)
    out = sh("nft", "-j", "list", "ruleset")
    items = json.loads(out.stdout or "{}").get("nftables", []) if out.returncode == 0 else []
    rules = [i["rule"] for i in items if "rule" in i]
    chains = [i["chain"] for i in items if "chain" in i]
    ours = [c for c in chains if c["name"].startswith(OUR_CHAINS)]
    for rule in rules:
        jumps = [e for e in rule.get("expr", []) if "jump" in e or "goto" in e]
        target = next(iter(jumps[0].values()))["target"] if jumps else ""
        if target.startswith(OUR_CHAINS) and not rule["chain"].startswith(OUR_CHAINS):
            sh(
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
        sh("nft", "flush", "chain", chain["family"], chain["table"], chain["name"], check=True)
    for chain in ours:
        sh("nft", "delete", "chain", chain["family"], chain["table"], chain["name"], check=True)
    for family, name in nft_tables():
        if name not in IPTABLES_TABLES or [family, name] in tables_before:
            continue
        listing = json.loads(sh("nft", "-j", "list", "table", family, name).stdout or "{}")
        if not any("rule" in i for i in listing.get("nftables", [])):
            sh("nft", "delete", "table", family, name, check=True)


def _remove_links(state: NodeState) -> None:
    for link in _links(state.bridge):
        sh("ip", "link", "del", link["ifname"])
    if any(link["ifname"] == state.bridge for link in _links()):
        sh("ip", "link", "del", state.bridge, check=True)


def _remove_firewall(state: NodeState) -> None:
    if sh("nft", "list", "table", "inet", state.nft_table).returncode == 0:
        sh("nft", "delete", "table", "inet", state.nft_table, check=True)


def _remove_cgroups(state: NodeState) -> None:
    for root in _cgroup_dirs(state):
        if not root.exists():
            continue
        for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            path.rmdir()
        root.rmdir()


def _restore_sysctls(state: NodeState) -> None:
    for key, value in state.sysctls_before.items():
        Path("/proc/sys", key).write_text(value)


# What teardown undoes, in this order; each step runs even when an earlier one failed.
TEARDOWN_STEPS: tuple[tuple[str, Callable[[NodeState], None]], ...] = (
    ("processes", _kill_cgroup_tree),
    ("shim sockets", _remove_shim_sockets),
    ("mounts", lambda state: _unmount_all(state.workdir)),
    ("network", _remove_links),
    ("firewall", _remove_firewall),
    ("kube-proxy and kubelet rules", lambda state: _delete_node_rules(state.tables_before)),
    ("cgroups", _remove_cgroups),
    ("sysctls", _restore_sysctls),
)


def teardown(state: NodeState) -> None:
    """Remove everything a node made; safe to run twice and on a half-started node."""
    errors: list[str] = []
    for what, action in TEARDOWN_STEPS:
        try:
            action(state)
        except Exception as err:  # keep cleaning; report everything at the end
            errors.append(f"{what}: {err}")
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
