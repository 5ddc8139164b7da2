"""A real, throw-away Kubernetes control plane on loopback, for tests and `make run`.

Minimal mode starts etcd + kube-apiserver with the flags envtest uses (fresh certificates, RBAC,
a service-account signing key, the admin user as a client certificate in `system:masters`).
Full mode adds kube-controller-manager, kube-scheduler and kwok with one fake node, so that
Deployments get ReplicaSets, pods get scheduled and become Running, and garbage collection works.

Optionally (`audit=True`, off by default) the API server writes an audit log of every request
made by a ServiceAccount (level Metadata: who did which verb on which object, and the answer),
so that a test can compare what an installed identity really does with what its RBAC grants.

Every process is started in its own session with PR_SET_PDEATHSIG, so even a SIGKILLed parent
leaves no orphan; `stop()` terminates them and removes the work directory.

    python -m envtest.cluster up [--full]     # start, print the kubeconfig path, wait for Ctrl-C
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from envtest.process import Process, Supervisor, free_port, wait_for_a_stop_signal, wait_healthy
from kube import certs

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("LUMIGO_BIN_DIR", ROOT / "bin"))
FAKE_NODE = "kwok-node-0"

# --- certificates -------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write_key(path: Path, key: Any) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


OPERATOR_USER = "lumigo-operator"  # the user name of `operator_kubeconfig`
FRONT_PROXY_CLIENT = "front-proxy-client"  # the aggregation layer's client certificate


def make_pki(directory: Path) -> dict[str, KeyPair]:
    """A CA, the apiserver serving cert, admin and operator client certs, the SA signing key."""
    now = dt.datetime.now(dt.UTC)
    # Made as the webhook's CA is (kube.certs), with the local cluster's name.
    policy = certs.CertPolicy(service="kubernetes", namespace="default")
    ca = certs.generate_ca(policy, now, common_name="lumigo-local-cluster-ca")

    def leaf(cn: str, orgs: list[str], server: bool, path: str) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.DNSName("kubernetes"),
                        x509.DNSName("kubernetes.default"),
                        x509.DNSName("kubernetes.default.svc"),
                        x509.DNSName("kubernetes.default.svc.cluster.local"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(ca.key, hashes.SHA256())
        pair = KeyPair(directory / f"{path}.crt", directory / f"{path}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair

    ca_pair = KeyPair(directory / "ca.crt", directory / "ca.key")
    ca_pair.cert.write_bytes(ca.cert_pem)
    _write_key(ca_pair.key, ca.key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa = KeyPair(directory / "sa.pub", directory / "sa.key")
    _write_key(sa.key, sa_key)
    sa.cert.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return {
        "ca": ca_pair,
        "apiserver": leaf("kube-apiserver", [], True, "apiserver"),
        "admin": leaf("admin", ["system:masters"], False, "admin"),
        # The operator's own identity, as a ServiceAccount is in a cluster: the injector's
        # matchConditions tell its writes from everyone else's (OPERATOR_USER).
        "operator": leaf(OPERATOR_USER, ["system:masters"], False, "operator"),
        "kwok": leaf("kwok", [], True, "kwok"),
        # The aggregation layer's client (--proxy-client-cert-file): an extension API server
        # (metrics-server in the node tier) trusts the user it names in X-Remote-User.
        "front-proxy": leaf(FRONT_PROXY_CLIENT, [], False, "front-proxy-client"),
        "sa": sa,
    }


# --- processes ----------------------------------------------------------------------------


class KubectlError(RuntimeError):
    def __init__(self, args: tuple[str, ...], code: int, output: str) -> None:
        self.output = output
        super().__init__(f"kubectl {' '.join(args)} exited {code}:\n{output.strip()}")


WORKDIR_PREFIX = "lumigo-cluster-"

# Metadata of ServiceAccounts' requests only: the admin's and the control plane's own traffic is
# not what a test wants to know, and logging it would cost every request.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def sweep_stale_workdirs(prefix: str = WORKDIR_PREFIX) -> None:
    """Remove work directories left by a parent that was SIGKILLed (its children died with it)."""
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            pid = int((path / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass


class LocalCluster:
    """etcd + kube-apiserver (+ controller-manager, scheduler, kwok in full mode)."""

    def __init__(
        self,
        workdir: Path | None = None,
        full: bool = False,
        *,
        audit: bool = False,
        service_accounts: bool = False,
    ) -> None:
        self._own_workdir = workdir is None
        if workdir is None:
            sweep_stale_workdirs()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        self.full = False
        self._want_full = full
        self.audit = audit
        # The ServiceAccount admission plugin mounts a token into every pod: what an operator pod
        # on a real node needs. Off by default: with it, the API server rejects a pod created
        # before its namespace's `default` ServiceAccount exists, and kwok pods need no token.
        self.service_accounts = service_accounts
        self.etcd_port = free_port()
        self.apiserver_port = free_port()
        self.processes = Supervisor()
        self.pki: dict[str, KeyPair] = {}

    # -- public API ------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def operator_kubeconfig(self) -> Path:
        """As `kubeconfig`, but the client is OPERATOR_USER (also in system:masters)."""
        return self.workdir / "operator.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit events written so far (`audit=True` only), oldest first."""
        if not self.audit:
            raise RuntimeError("this cluster was started without audit=True")
        if not self.audit_log.exists():
            return []
        lines = self.audit_log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def start(self) -> LocalCluster:
        try:
            (self.workdir / "pki").mkdir(parents=True, exist_ok=True)
            (self.workdir / "logs").mkdir(exist_ok=True)
            self.pki = make_pki(self.workdir / "pki")
            self._write_kubeconfig()
            self._start_etcd()
            self._start_apiserver()
            if self._want_full:
                self.start_full()
        except BaseException:
            self.stop()
            raise
        return self

    def start_full(self) -> None:
        """Add controller-manager, scheduler and kwok to a running minimal cluster."""
        if self.full:
            return
        self._start_controller_manager()
        self._start_scheduler()
        self._start_kwok()
        self.full = True

    def stop(self) -> None:
        self.processes.stop(
            ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
        )
        if self._own_workdir and not os.environ.get("LUMIGO_KEEP_CLUSTER"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def process_report(self) -> str:
        """One line per component (running, or its exit code and last log lines if it died):
        attached to failing tests so that a dead controller-manager is not mistaken for a bug."""
        return self.processes.report()

    def pids(self) -> list[int]:
        return self.processes.pids()

    def stop_apiserver(self) -> None:
        self.processes.pop("kube-apiserver").stop()

    def start_apiserver(self) -> None:
        self._start_apiserver()

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision, so older resourceVersions get 410 Gone."""
        header = self._etcd_call("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        revision = int(header["header"]["revision"])
        self._etcd_call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki["ca"].cert))
        ctx.load_cert_chain(str(self.pki["admin"].cert), str(self.pki["admin"].key))
        return ctx

    def request(self, path: str, method: str = "GET", body: Any = None) -> Any:
        """A raw admin call, used by the fixture itself (readiness, the fake node)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise KubectlError(args, proc.returncode, proc.stdout + proc.stderr)
        return proc.stdout if check else proc.stdout + proc.stderr

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> Process:
        return self.processes.run(Process(name, args, self.workdir / "logs" / f"{name}.log"))

    def _start_etcd(self) -> None:
        peer = free_port()
        data = self.workdir / "etcd"
        proc = self._spawn(
            "etcd",
            [
                str(BIN / "etcd"),
                f"--data-dir={data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")

        wait_healthy(proc, healthy, 60)

    def _start_apiserver(self) -> None:
        pki = self.pki
        proc = self._spawn(
            "kube-apiserver",
            [
                str(BIN / "kube-apiserver"),
                "--advertise-address=127.0.0.1",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--etcd-servers={self.etcd_url}",
                f"--tls-cert-file={pki['apiserver'].cert}",
                f"--tls-private-key-file={pki['apiserver'].key}",
                f"--client-ca-file={pki['ca'].cert}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--authorization-mode=RBAC",
                *([] if self.service_accounts else ["--disable-admission-plugins=ServiceAccount"]),
                f"--service-account-issuer=https://127.0.0.1:{self.apiserver_port}/",
                f"--service-account-key-file={pki['sa'].cert}",
                f"--service-account-signing-key-file={pki['sa'].key}",
                f"--cert-dir={self.workdir / 'pki'}",
                "--profiling=false",
                "--event-ttl=1h",
                # Reach a kubelet (kubectl logs/exec on a real node, envtest/node) by its
                # node IP: the default tries its host name first, a DNS query off the machine.
                "--kubelet-preferred-address-types=InternalIP",
                # The aggregation layer (APIServices), as a kubeadm cluster configures it.
                f"--requestheader-client-ca-file={pki['ca'].cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki['front-proxy'].cert}",
                f"--proxy-client-key-file={pki['front-proxy'].key}",
                *self._audit_flags(),
            ],
        )

        def ready() -> bool:
            return self.request("/readyz") == "ok"

        wait_healthy(proc, ready, 120)

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # written before the response: nothing is lost
        ]

    def _write_kubeconfig(self) -> None:
        for path, user in ((self.kubeconfig, "admin"), (self.operator_kubeconfig, "operator")):
            path.write_text(json.dumps(self._kubeconfig_of(user), indent=2))
            path.chmod(0o600)

    def _kubeconfig_of(self, user: str) -> dict[str, Any]:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self.pki["ca"].cert),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(self.pki[user].cert),
                        "client-key-data": b64(self.pki[user].key),
                    },
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }

    def _start_controller_manager(self) -> None:
        self._start_control_loop(
            "kube-controller-manager",
            "kcm",
            f"--service-account-private-key-file={self.pki['sa'].key}",
            f"--root-ca-file={self.pki['ca'].cert}",
            "--controllers=*",
            "--concurrent-gc-syncs=5",
        )

    def _start_scheduler(self) -> None:
        self._start_control_loop("kube-scheduler", "scheduler")

    def _start_control_loop(self, binary: str, cert_dir: str, *flags: str) -> None:
        """kube-controller-manager or kube-scheduler: one instance (no leader election), its
        own serving certificate, /healthz on a free loopback port."""
        port = free_port()
        proc = self._spawn(
            binary,
            [
                str(BIN / binary),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'pki' / cert_dir}",
                # The defaults (20 qps) starve the Deployment controller while the namespace
                # controller cleans up after hundreds of test objects.
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--profiling=false",
                *flags,
            ],
        )
        wait_healthy(proc, lambda: self._https_ok(port, "/healthz"), 60)

    def _start_kwok(self) -> None:
        stages_dir = BIN / "kwok-stages"
        parts = [
            "node/fast/node-initialize.yaml",
            "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
            "pod/fast/pod-ready.yaml",
            "pod/fast/pod-complete.yaml",
            "pod/fast/pod-delete.yaml",
        ]
        config = self.workdir / "kwok.yaml"
        config.write_text("\n---\n".join((stages_dir / p).read_text() for p in parts))
        port = free_port()
        proc = self._spawn(
            "kwok",
            [
                str(BIN / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{port}",
                f"--tls-cert-file={self.pki['kwok'].cert}",
                f"--tls-private-key-file={self.pki['kwok'].key}",
            ],
        )
        wait_healthy(proc, lambda: self._https_ok(port, "/healthz", verify=False), 60)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": FAKE_NODE,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": FAKE_NODE,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
            "status": {
                "allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "20000"},
                "capacity": {"cpu": "1000", "memory": "4Ti", "pods": "20000"},
            },
        }
        with contextlib.suppress(urllib.error.HTTPError):
            self.request("/api/v1/nodes", "POST", node)

        def node_ready() -> bool:
            status = self.request(f"/api/v1/nodes/{FAKE_NODE}").get("status", {})
            return any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions", [])
            )

        wait_healthy(proc, node_ready, 60)

    def _https_ok(self, port: int, path: str, verify: bool = False) -> bool:
        ctx = ssl.create_default_context()
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{port}{path}"
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
                return bool(resp.status == HTTPStatus.OK)
        except urllib.error.HTTPError as err:
            # 401/403 still proves the server is up and serving.
            return err.code in (401, 403)

    def _etcd_call(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())


def main() -> int:
    parser = argparse.ArgumentParser(description="Run a local Kubernetes control plane.")
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--full", action="store_true", help="also run KCM, scheduler and kwok")
    args = parser.parse_args()
    with LocalCluster(full=args.full) as cluster:
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
        wait_for_a_stop_signal()
    return 0


if __name__ == "__main__":
    sys.exit(main())
