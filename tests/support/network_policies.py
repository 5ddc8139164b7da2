"""NetworkPolicy enforcement on the real node: kube-router's network policy controller (built by
`hack/install-tools node` from its Go module), run beside the kubelet as a process of the node,
with routing, the service proxy and its CNI off. It programs iptables (nftables underneath) and
ipsets from the API's NetworkPolicies, pods and namespaces, as it does as a DaemonSet.

SIG Network's kube-network-policies was the first choice: it sends connections to an nfqueue with
nftables' `queue` statement, which this machine's kernel lacks (CONFIG_NFT_QUEUE is not set: "Could
not process rule: No such file or directory"), so nothing could be enforced.

Also: a pod that tries TCP connections and says which succeeded, for the flows table.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

from envtest.cluster import LocalCluster
from envtest.node.localnode import LocalNode
from envtest.process import free_port, wait_until
from tests.support.packaging import tool

SERVICE_RANGE = "10.0.0.0/24"  # LocalCluster's --service-cluster-ip-range


def _programmed() -> bool:
    """kube-router's policy chains are in the filter table."""
    out = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True)
    return "KUBE-ROUTER-FORWARD" in out.stdout


def _cleanup(binary: str) -> None:
    """kube-router's own clean-up: its chains and ipsets removed."""
    subprocess.run([binary, "--cleanup-config", "--run-router=false",
                    "--run-service-proxy=false"], capture_output=True, timeout=120)  # fmt: skip


@contextlib.contextmanager
def enforcing(cluster: LocalCluster, node: LocalNode, workdir: Path) -> Iterator[None]:
    """NetworkPolicies enforced on `node` while inside; none afterwards."""
    binary = tool("kube-router")
    health = free_port()
    log_path = workdir / "kube-router.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [binary, f"--kubeconfig={cluster.kubeconfig}", f"--hostname-override={node.name}",
         "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
         "--enable-cni=false", f"--service-cluster-ip-range={SERVICE_RANGE}",
         f"--health-port={health}", "--iptables-sync-period=10s", "-v=1"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        try:
            wait_until(lambda: process.poll() is not None or _programmed(), 90,
                       "kube-router's iptables chains")  # fmt: skip
            if process.poll() is not None:
                raise RuntimeError(f"kube-router exited {process.returncode}")
        except Exception as err:
            raise AssertionError(f"{err}; its log:\n{log_path.read_text()[-4000:]}") from err
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        _cleanup(binary)


# Run in a pod: one TCP connection per "host:port" argument; prints {"host:port": bool}.
PROBE = """
import json, socket, sys
seen = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        seen[target] = True
    except OSError:
        seen[target] = False
print(json.dumps(seen))
"""


def connects(
    cluster: LocalCluster, namespace: str, pod: str, targets: list[str]
) -> dict[str, bool]:
    """Which of `targets` ("host:port") a pod with python3 can open a TCP connection to."""
    out = cluster.kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", PROBE, *targets)
    result: dict[str, bool] = json.loads(out.strip().splitlines()[-1])
    return result
