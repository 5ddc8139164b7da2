"""NetworkPolicy enforcement on the real node: SIG Network's kube-network-policies (built by
`hack/install-tools node` from its Go module) as a hostNetwork pod, the way its own manifests
install it. It sends the first packet of every connection to or from a pod to an nfqueue and
drops it unless the pod's NetworkPolicies allow it; the node's root processes (the kubelet's
probes, the API server of this single-machine cluster) are never filtered.

Also: a pod that tries TCP connections and says which succeeded, for the flows table.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envtest.cluster import LocalCluster
from envtest.node.cleanup import NETWORK_POLICY_TABLE, nft_tables
from envtest.node.localnode import LocalNode
from envtest.ociimage import Entry, ImageConfig, cached_archive, docker_archive, layer
from envtest.process import wait_until
from tests.support.packaging import tool

JSON = dict[str, Any]
IMAGE = "localhost/lumigo/kube-network-policies:v0.8.0-local"
NAMESPACE, NAME = "kube-system", "kube-network-policies"
METRICS_ADDRESS = "127.0.0.1:19080"  # hostNetwork: on the node's loopback


def enforcer_image() -> Path:
    """The enforcer's static binary as the only file of an image (a docker-archive tar)."""
    binary = Path(tool("kube-network-policies")).read_bytes()

    def build() -> bytes:
        entry = Entry("/kube-network-policies", data=binary, mode=0o755)
        config = ImageConfig(entrypoint=["/kube-network-policies"], env=())
        return docker_archive(IMAGE, [layer([entry])], config)

    return cached_archive(IMAGE, hashlib.sha256(binary).digest(), build)


def _manifests(node: str, apiserver_port: int) -> str:
    rules = [
        {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
         "verbs": ["list", "watch"]},
    ]  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app": NAME}},
        "spec": {
            "nodeName": node, "hostNetwork": True, "serviceAccountName": NAME,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "enforcer", "image": IMAGE, "imagePullPolicy": "Never",
                "args": [f"--hostname-override={node}", "--disable-nri",
                         # The kernel here (6.12+) has the conntrack fix.
                         "--netfilter-bug-1766-fix=false",
                         f"--metrics-bind-address={METRICS_ADDRESS}", "-v=2"],
                "securityContext": {"privileged": True},
                # On the node's network the Service IP is not translated (the node's DNAT is for
                # pods), and this API server listens on the node's loopback.
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": str(apiserver_port)}],
            }],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
    }  # fmt: skip
    items = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": NAME}, "rules": rules},
        binding, pod,
    ]  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def _programmed() -> bool:
    return ["inet", NETWORK_POLICY_TABLE] in nft_tables()


@contextlib.contextmanager
def enforcing(cluster: LocalCluster, node: LocalNode) -> Iterator[None]:
    """NetworkPolicies enforced on `node` while inside; none afterwards (table removed)."""
    node.import_image(enforcer_image())
    cluster.kubectl("apply", "-f", "-", input=_manifests(node.name, cluster.apiserver_port))
    try:
        try:
            cluster.kubectl("wait", "pod", NAME, "-n", NAMESPACE, "--for=condition=Ready",
                            "--timeout=120s")  # fmt: skip
            wait_until(_programmed, 60, "the enforcer's nftables table")
        except Exception as err:
            logs = cluster.kubectl("logs", NAME, "-n", NAMESPACE, "--tail=60", check=False)
            raise AssertionError(f"{err}; the enforcer's log:\n{logs}") from err
        yield
    finally:
        cluster.kubectl("delete", "pod", NAME, "-n", NAMESPACE, "--ignore-not-found",
                        "--timeout=60s", check=False)  # fmt: skip
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", NAME, "--ignore-not-found",
                        check=False)  # fmt: skip
        if _programmed():  # it removes its table when stopped; make sure
            subprocess.run(["nft", "delete", "table", "inet", NETWORK_POLICY_TABLE], check=False)


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


def connects(cluster: LocalCluster, namespace: str, pod: str, targets: list[str],
             container: str | None = None) -> dict[str, bool]:  # fmt: skip
    """Which of `targets` ("host:port") a pod with python3 can open a TCP connection to."""
    where = ["-c", container] if container else []
    out = cluster.kubectl("exec", "-n", namespace, pod, *where, "--", "python3", "-c", PROBE,
                          *targets)  # fmt: skip
    result: dict[str, bool] = json.loads(out.strip().splitlines()[-1])
    return result
