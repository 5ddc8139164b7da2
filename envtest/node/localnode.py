"""The local node: containerd, CoreDNS, kube-proxy and the kubelet, started in its cgroups."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import IO

from envtest import ociimage
from envtest.cluster import FAKE_NODE, LocalCluster
from envtest.node.cleanup import (
    SHIM_SOCKET_DIR,
    WORKDIR_PREFIX,
    NodeState,
    nft_tables,
    sh,
    sweep_stale_nodes,
    teardown,
)
from envtest.node.components import (
    CGROUP_ROOT,
    Components,
    NodeError,
    cgroup_hierarchies,
    preflight,
    require,
)
from envtest.process import (
    Process,
    Supervisor,
    die_with_parent,
    free_port,
    wait_for_a_stop_signal,
    wait_healthy,
)

LOCK_FILE = Path("/run/lumigo-localnode.lock")
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


# --- the node -------------------------------------------------------------------------------


@dataclass
class NodeProcess(Process):
    """A Process started inside the node's cgroups (so teardown can find it)."""

    cgroup_procs: list[Path] = field(default_factory=list)
    missing_hint: str = "run `hack/install-tools node`"

    def missing(self, message: str) -> Exception:
        return NodeError(message)

    def preexec(self) -> None:  # between fork and exec: own session, die with us, join cgroups
        die_with_parent()
        for target in self.cgroup_procs:
            with open(target, "w") as procs:
                procs.write(str(os.getpid()))


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
        self.processes = Supervisor()
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
        self.processes.stop(("kubelet", "kube-proxy", "coredns", "containerd"), timeout=5)
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

    def trust_registry(self, host: str, ca_pem: bytes) -> None:
        """Let this node's containerd pull from the HTTPS registry `host` (`ip:port`), verifying
        its certificate against `ca_pem` only. containerd reads `certs.d` on every pull, so this
        works on a running node. No credentials here: they come from `imagePullSecrets`."""
        directory = self.workdir / "config" / "certs.d" / host
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(ca_pem)
        (directory / "hosts.toml").write_text(
            f'server = "https://{host}"\n\n[host."https://{host}"]\n'
            f'  capabilities = ["pull", "resolve"]\n  ca = "{directory / "ca.crt"}"\n'
        )

    def ctr(self, *args: str) -> str:
        assert self.components is not None
        proc = sh(
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
        return self.processes.report()

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
        for line in sh("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
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
        sh("ip", "link", "add", state.bridge, "type", "bridge", check=True)
        sh("ip", "addr", "add", f"{state.node_ip}/{prefix}", "dev", state.bridge, check=True)
        sh("ip", "link", "set", state.bridge, "up", check=True)
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
        sh("nft", "-f", "-", input=ruleset, check=True)
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
                and sh(
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
            table = sh("nft", "list", "table", "ip", "kube-proxy").stdout
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
            # Images are imported (a few pulled from the tests' registry, envtest/registry.py):
            # the kubelet must never garbage-collect them.
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
        log = self.workdir / "logs" / f"{name}.log"
        return self.processes.run(NodeProcess(name, args, log, env, cgroup_procs=self._procs_files))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == HTTPStatus.OK)
    except (OSError, urllib.error.URLError):
        return False


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
    with LocalCluster(full=True) as cluster, LocalNode(cluster) as node:
        cluster.kubectl("cordon", FAKE_NODE)  # every pod goes to the real node
        print(f"export KUBECONFIG={cluster.kubeconfig}  # node {node.name}", flush=True)
        wait_for_a_stop_signal()
    return 0


if __name__ == "__main__":
    sys.exit(main())
