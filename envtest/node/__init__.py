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

    python -m envtest.node up       # a full LocalCluster plus this node; prints KUBECONFIG
    python -m envtest.node check    # preflight only: names any missing component or feature
"""

from envtest.node.components import Components, NodeError, cgroup_hierarchies, preflight, require
from envtest.node.localnode import NODE_LABEL, LocalNode

__all__ = [
    "NODE_LABEL",
    "Components",
    "LocalNode",
    "NodeError",
    "cgroup_hierarchies",
    "preflight",
    "require",
]
