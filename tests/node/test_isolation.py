"""Nothing leaves this machine: a pod's packets to an outside address are rejected on the node,
the cluster DNS answers only `cluster.local`, and an image that is not present is never fetched
from a registry."""

from __future__ import annotations

import json
import re
import subprocess
import time

from envtest.cluster import LocalCluster
from envtest.node import LocalNode
from tests.support.pods import apply, container, get, logs, pod, wait_pod

# Documentation addresses (RFC 5737): never a real host, and the firewall must stop them anyway.
OUTSIDE_TCP = "203.0.113.1"
OUTSIDE_DNS = "198.51.100.53"


def firewall_counters(node: LocalNode) -> dict[str, int]:
    """Packets rejected so far by each rule of the node's nftables table, keyed by rule text."""
    table = node.state.nft_table if node.state else ""
    out = subprocess.run(
        ["nft", "-j", "list", "table", "inet", table], capture_output=True, text=True, check=True
    ).stdout
    counters = {}
    for item in json.loads(out)["nftables"]:
        rule = item.get("rule")
        if not rule:
            continue
        exprs = rule["expr"]
        packets = next((e["counter"]["packets"] for e in exprs if "counter" in e), 0)
        counters[f"{rule['chain']}:{rule['handle']}"] = packets
    return counters


def test_a_pod_cannot_reach_an_outside_address_by_tcp_or_dns(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    before = firewall_counters(node)
    # Checked first, so that a node without its firewall never sends this test's packets out.
    assert any(key.startswith("forward:") for key in before), "the node has no forward rule"

    script = (
        f"nc -w 3 {OUTSIDE_TCP} 80 </dev/null 2>&1; echo tcp-exit=$?; "
        f"nslookup example.com {OUTSIDE_DNS} 2>&1; echo dns-exit=$?; "
        "nslookup example.com 2>&1; echo cluster-dns-exit=$?; "
        "nslookup kubernetes.default.svc.cluster.local 2>&1; echo cluster-name-exit=$?; "
        "exec sleep 3600"
    )
    apply(node_cluster, node_namespace, pod("prober", [container("probe", script)]))
    wait_pod(node_cluster, node_namespace, "prober")
    deadline = time.monotonic() + 60
    while "cluster-name-exit" not in (out := logs(node_cluster, node_namespace, "prober")):
        assert time.monotonic() < deadline, out
        time.sleep(0.5)

    # Rejected at once (ICMP from the node), not timed out somewhere outside.
    assert "tcp-exit=1" in out, out
    assert "Connection refused" in out, out
    assert re.search(rf"write to '{OUTSIDE_DNS}'.*Connection refused", out), out
    # CoreDNS has no forwarder: a public name fails, a cluster name resolves.
    assert "server can't find example.com" in out, out
    assert "cluster-dns-exit=1" in out, out
    assert "cluster-name-exit=0" in out, out
    assert "Address: 10.0.0.1" in out, out
    after = firewall_counters(node)
    rejected = sum(after[k] - before.get(k, 0) for k in after if k.startswith("forward:"))
    assert rejected >= 2, (before, after)  # the TCP SYN and the DNS query, at least


def test_the_pod_network_is_not_masqueraded(node: LocalNode) -> None:
    """No NAT rule rewrites pod traffic to the node's address on its way out: the CNI bridge
    runs with ipMasq off, and the only masquerade on the machine is kube-proxy's, which applies
    to Service traffic it marked (hairpin, node to Service), as on any cluster."""
    conflist = json.loads(next((node.workdir / "cni" / "net.d").glob("*.conflist")).read_text())
    assert conflist["plugins"][0]["ipMasq"] is False
    ruleset = subprocess.run(
        ["nft", "-j", "list", "ruleset"], capture_output=True, text=True, check=True
    ).stdout
    rules = [i["rule"] for i in json.loads(ruleset)["nftables"] if "rule" in i]
    masquerades = [r for r in rules if any("masquerade" in e for e in r["expr"])]
    assert all(r["table"] == "kube-proxy" for r in masquerades), masquerades


def test_an_absent_image_is_never_pulled_from_a_registry(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    """Images are imported, not pulled. If a pod names one that is not there, containerd's
    registry configuration sends the pull to 127.0.0.1:9 (refused) instead of the registry."""
    spec = pod("absent", [container("app", "true")])
    spec["spec"]["containers"][0].update(
        image="docker.io/library/busybox:1.36.1", imagePullPolicy="IfNotPresent"
    )
    apply(node_cluster, node_namespace, spec)
    deadline = time.monotonic() + 60
    while True:
        status = get(node_cluster, node_namespace, "pod", "absent")["status"]
        waiting = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
        if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.3)
    events = node_cluster.kubectl(
        "get", "events", "-n", node_namespace, "--field-selector", "involvedObject.name=absent"
    )
    assert "127.0.0.1:9" in events, events
