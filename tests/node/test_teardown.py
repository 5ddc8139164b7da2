"""Stopping a node leaves nothing behind: no process, mount, network interface, firewall rule or
cgroup of it survives `stop()`, even with pods, volumes and Services in place."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from envtest.cluster import LocalCluster
from envtest.node import LocalNode, cgroup_hierarchies
from tests.node.conftest import NodeHolder
from tests.support.pods import apply, container, pod, wait_pod


def links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True)
    return {link["ifname"] for link in json.loads(out.stdout)}


def mounts() -> set[tuple[str, str]]:
    """(mount point, file system type) of every mount."""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        found.add((left.split()[4], right.split()[0]))
    return found


def ruleset() -> list[dict[str, Any]]:
    """Every nftables table, chain and rule (iptables-nft included), without handles/counters."""
    out = subprocess.run(
        ["nft", "-j", "list", "ruleset"], capture_output=True, text=True, check=True
    ).stdout
    items = [i for i in json.loads(out)["nftables"] if "metainfo" not in i]
    for item in items:
        for body in item.values():
            body.pop("handle", None)
            for expr in body.get("expr", []):
                expr.pop("counter", None)
    return items


def top_cgroups() -> set[str]:
    return {str(p) for h in cgroup_hierarchies() for p in h.mount.iterdir() if p.is_dir()}


def start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def node_pids(node: LocalNode) -> dict[int, str | None]:
    """Every process of the node: its components, shims and containers (its cgroup tree)."""
    assert node.state is not None
    pids: set[int] = {p.popen.pid for p in node.processes.values() if p.popen is not None}
    for h in cgroup_hierarchies():
        root = h.mount / node.state.cgroup_root.strip("/")
        for procs in root.rglob("cgroup.procs"):
            pids.update(int(p) for p in procs.read_text().split())
    return {pid: start_time(pid) for pid in pids}


def test_stop_leaves_no_process_mount_interface_rule_or_cgroup(
    node_holder: NodeHolder, node_cluster: LocalCluster
) -> None:
    node_holder.release()  # one local node per machine: this test needs its own
    links_before, mounts_before, rules_before = links(), mounts(), ruleset()
    cgroups_before = top_cgroups()
    forward_before = Path("/proc/sys/net/ipv4/ip_forward").read_text()

    node = LocalNode(node_cluster).start()
    try:
        namespace = f"teardown-{node.node_id}"
        node_cluster.kubectl("create", "namespace", namespace)
        node_cluster.kubectl(
            "create", "secret", "generic", "s", "-n", namespace, "--from-literal=k=v"
        )
        apply(
            node_cluster,
            namespace,
            pod(
                "busy",
                [
                    container(
                        "app",
                        "exec httpd -f -p 8080",
                        volumeMounts=[
                            {"name": "mem", "mountPath": "/mem"},
                            {"name": "secret", "mountPath": "/secret"},
                        ],
                    )
                ],
                initContainers=[container("init", "true")],
                volumes=[
                    {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    {"name": "secret", "secret": {"secretName": "s"}},
                ],
            ),
        )
        apply(
            node_cluster,
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "busy"},
                "spec": {"selector": {"app": "busy"}, "ports": [{"port": 80, "targetPort": 8080}]},
            },
        )
        wait_pod(node_cluster, namespace, "busy")
        assert node.state is not None
        state = node.state
        pids = node_pids(node)
        our_mounts = {m for m in mounts() if m[0].startswith(str(node.workdir))}
        veths = {
            link["ifname"]
            for link in json.loads(
                subprocess.run(
                    ["ip", "-j", "link", "show", "master", state.bridge],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )
        }
        cgroups = {
            str(p)
            for h in cgroup_hierarchies()
            for p in (h.mount / state.cgroup_root.strip("/")).rglob("*")
            if p.is_dir()
        }
        tables = {(t["table"]["family"], t["table"]["name"]) for t in ruleset() if "table" in t}
        # What is checked below was really there (so its absence later means something).
        assert len(pids) >= 6, pids  # 4 components, a shim, the pause and app processes
        assert {fs for _, fs in our_mounts} >= {"overlay", "nsfs", "tmpfs"}, our_mounts
        assert veths
        assert state.bridge in links()
        assert any("kubepods" in c for c in cgroups), cgroups
        assert ("inet", state.nft_table) in tables
        assert ("ip", "kube-proxy") in tables
    finally:
        node.stop()
    node.stop()  # idempotent

    alive = {pid for pid, started in pids.items() if started and start_time(pid) == started}
    assert not alive, f"processes left: {alive}"
    assert not (our_mounts & mounts()), our_mounts & mounts()
    assert mounts() - mounts_before == set()
    assert not (veths | {state.bridge}) & links()
    assert links() == links_before
    assert ruleset() == rules_before
    assert not [c for c in cgroups if Path(c).exists()]
    assert top_cgroups() == cgroups_before
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forward_before
    assert not node.workdir.exists()


OWNER = """
import sys, time
from pathlib import Path
from envtest.cluster import KeyPair, LocalCluster
from envtest.node import LocalNode

# The session's cluster, seen from another process (without taking over its work directory).
cluster = LocalCluster.__new__(LocalCluster)
cluster.workdir, cluster.apiserver_port = Path(sys.argv[1]), int(sys.argv[2])
pki = cluster.workdir / "pki"
cluster.pki = {n: KeyPair(pki / f"{n}.crt", pki / f"{n}.key") for n in ("ca", "admin")}
node = LocalNode(cluster).start()
print(node.name, node.workdir, node.state.bridge, node.state.cgroup_root, flush=True)
time.sleep(3600)
"""


def test_a_node_whose_owner_was_killed_is_cleaned_up_by_the_next_start(
    node_holder: NodeHolder, node_cluster: LocalCluster
) -> None:
    """SIGKILL leaves the shims, containers, mounts and bridge of a node behind (containerd and
    the kubelet die with their parent); the next node's start removes all of it."""
    node_holder.release()
    root = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            OWNER,
            str(node_cluster.workdir),
            str(node_cluster.apiserver_port),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    try:
        assert owner.stdout is not None
        name, workdir, bridge, cgroup_root = owner.stdout.readline().split()
        namespace = f"orphan-{name.rsplit('-', 1)[1]}"
        node_cluster.kubectl("create", "namespace", namespace)
        apply(node_cluster, namespace, pod("orphan", [container("app", "exec sleep 3600")]))
        wait_pod(node_cluster, namespace, "orphan")
    finally:
        owner.kill()
        owner.wait()
    node_cluster.kubectl("delete", "node", name, "--wait=false")
    memory_cgroup = Path("/sys/fs/cgroup/memory", cgroup_root.strip("/"))
    survivors = [
        int(p) for procs in memory_cgroup.rglob("cgroup.procs") for p in procs.read_text().split()
    ]
    assert survivors, "nothing survived the owner: this test would prove nothing"
    assert bridge in links()

    LocalNode(node_cluster).start().stop()

    assert not Path(workdir).exists()
    assert bridge not in links()
    assert not memory_cgroup.exists()
    assert not [m for m in mounts() if m[0].startswith(workdir)]
    assert not [pid for pid in survivors if Path(f"/proc/{pid}").exists()]
