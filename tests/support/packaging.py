"""Helpers for the packaging tests: run the pinned tools, render the chart, clean up after Helm,
ask the API server what an installed ServiceAccount may do, and run an install's manager as a
local process.

Everything runs the real binaries from bin/ (built by hack/install-tools) against the session's
real kube-apiserver; a failing command fails the test with its full output.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from api import constants
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess, release_metrics_reader
from envtest.process import wait_until
from kube.kinds import NAMESPACES

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "bin"
CHART = ROOT / "charts" / "lumigo-operator"
CRD_NAME = "lumigoes.operator.lumigo.io"
OPERATOR_SA = "lumigo-kubernetes-operator"
# Helm keeps its caches and repository config here, not in the user's home; removed at exit.
HELM_HOME = Path(tempfile.mkdtemp(prefix="lumigo-helm-home-"))
atexit.register(shutil.rmtree, HELM_HOME, ignore_errors=True)


def run(args: list[str], *, env: dict[str, str] | None = None, input: str | None = None,
        timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run a command; on failure raise with the command line and everything it printed."""
    proc = subprocess.run(
        args, env=env, input=input, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"`{' '.join(args)}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        raise AssertionError(f"{path} is missing: run `hack/install-tools packaging`")
    return str(path)


def helm_env(cluster: LocalCluster | None = None) -> dict[str, str]:
    env = cluster.env() if cluster is not None else dict(os.environ)
    env.update(
        HELM_CACHE_HOME=str(HELM_HOME / "cache"),
        HELM_CONFIG_HOME=str(HELM_HOME / "config"),
        HELM_DATA_HOME=str(HELM_HOME / "data"),
    )
    if cluster is None:
        env.pop("KUBECONFIG", None)
    return env


def helm(*args: str, cluster: LocalCluster | None = None, check: bool = True,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return run([tool("helm"), *args], env=helm_env(cluster), check=check, timeout=timeout)


def load_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def load_file(path: Path) -> list[dict[str, Any]]:
    return load_docs(path.read_text())


def render_chart(release: str, namespace: str, values: dict[str, Any] | None = None) -> str:
    """`helm template` of the chart, as Helm would install it (hooks included)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        if values is not None:
            yaml.safe_dump(values, values_file)
            values_file.flush()
            args += ["--values", values_file.name]
        return helm(*args).stdout


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def get_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


def exists(cluster: LocalCluster, *args: str) -> bool:
    out = cluster.kubectl("get", *args, "--ignore-not-found", "-o", "name")
    return bool(out.strip())


def deployment_available(cluster: LocalCluster, namespace: str, name: str) -> bool:
    deployment = get_json(cluster, "deployment", name, "-n", namespace)
    return any(
        c["type"] == "Available" and c["status"] == "True"
        for c in deployment.get("status", {}).get("conditions", [])
    )


def adopt_crd_for_helm(cluster: LocalCluster, release: str, namespace: str) -> None:
    """Let a Helm release take over a CRD that kubectl installed earlier (as the `crd` fixture
    does), exactly as a user moving from `kubectl apply` to Helm would: Helm refuses to install
    over an object that does not carry its ownership metadata."""
    if not exists(cluster, "crd", CRD_NAME):
        return
    cluster.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    cluster.kubectl(
        "annotate", "crd", CRD_NAME, "--overwrite",
        f"meta.helm.sh/release-name={release}", f"meta.helm.sh/release-namespace={namespace}",
    )  # fmt: skip


@dataclass
class HelmRelease:
    """A release of the chart installed on the session cluster."""

    cluster: LocalCluster
    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-lumigo-operator"

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return helm(*args, "--namespace", self.namespace, cluster=self.cluster, check=check)

    def install(self, *extra: str) -> str:
        adopt_crd_for_helm(self.cluster, self.name, self.namespace)
        return self.helm(
            "install", self.name, str(CHART), "--wait", "--timeout", "180s", *extra
        ).stdout

    def uninstall(self) -> str:
        return self.helm("uninstall", self.name, "--wait", "--timeout", "180s").stdout

    def cluster_scoped_leftovers(self) -> list[str]:
        """Cluster-scoped objects of this release still present (the kept CRD aside)."""
        selector = f"app.kubernetes.io/instance={self.name}"
        out = self.cluster.kubectl(
            "get", "clusterroles,clusterrolebindings,mutatingwebhookconfigurations",
            "-l", selector, "-o", "name",
        )  # fmt: skip
        return out.split()

    def force_cleanup(self) -> None:
        """Whatever happened in the test: nothing of this release may outlive it, in particular
        not its defaulter webhook (failurePolicy Fail, pointing at a pod that does not serve)."""
        self.helm("uninstall", self.name, "--no-hooks", "--wait", "--timeout", "120s", check=False)
        for leftover in self.cluster_scoped_leftovers():
            self.cluster.kubectl("delete", leftover, "--ignore-not-found", check=False)


def namespace_gone(cluster: LocalCluster, name: str, timeout: float = 180) -> None:
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")
    wait_until(lambda: not exists(cluster, "namespace", name), timeout, f"namespace {name} deleted")


@contextlib.contextmanager
def restricted_namespace(cluster: LocalCluster, name: str) -> Iterator[str]:
    """A namespace that enforces the restricted Pod Security Standard, deleted afterwards."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


@contextlib.contextmanager
def helm_release(cluster: LocalCluster, prefix: str = "t-helm") -> Iterator[HelmRelease]:
    """A release `lumigo` in its own restricted namespace; removed whatever the test did."""
    with restricted_namespace(cluster, f"{prefix}-{uuid.uuid4().hex[:5]}") as namespace:
        rel = HelmRelease(cluster, "lumigo", namespace)
        try:
            yield rel
        finally:
            rel.force_cleanup()


# --- what installed ServiceAccounts may do -------------------------------------------------


def can_i(cluster: LocalCluster, namespace: str, sa: str, *args: str) -> bool:
    """`kubectl auth can-i` as system:serviceaccount:<namespace>:<sa>."""
    out = cluster.kubectl(
        "auth", "can-i", *args, f"--as=system:serviceaccount:{namespace}:{sa}", check=False
    )
    return out.strip().splitlines()[0] == "yes"


def denied(cluster: LocalCluster, namespace: str, sa: str, checks: list[list[str]]) -> list[str]:
    """The checks the API server refuses to the ServiceAccount ([] when all are allowed)."""
    return [" ".join(c) for c in checks if not can_i(cluster, namespace, sa, *c)]


def telemetry_reconciler_requests(namespace: str, fullname: str) -> list[list[str]]:
    """Each request controller/telemetry/proxy_reconciler.py makes, as `kubectl auth can-i` args."""
    deployment = f"deployments.apps/{fullname}-telemetry-proxy"
    secret = f"secrets/{fullname}-telemetry-proxy-config"
    return [
        ["list", "lumigoes.operator.lumigo.io", "--all-namespaces"],  # the shared informer
        ["watch", "lumigoes.operator.lumigo.io", "--all-namespaces"],
        ["get", "secrets/lumigo-credentials", "-n", "some-app"],  # each namespace's token
        ["get", "namespaces/some-app"],  # its UID
        ["get", "namespaces/kube-system"],  # the cluster's UID
        ["get", deployment, "-n", namespace],  # owner of the Secret, current hash
        ["patch", deployment, "-n", namespace],  # the rollout
        ["create", "secrets", "-n", namespace],  # the configuration
        ["get", secret, "-n", namespace],
        ["update", secret, "-n", namespace],
    ]


PROXY_READS = (
    "pods", "events", "namespaces", "deployments.apps", "daemonsets.apps", "replicasets.apps",
    "statefulsets.apps", "cronjobs.batch", "jobs.batch",
)  # fmt: skip


def telemetry_proxy_requests(namespace: str, fullname: str) -> list[list[str]]:
    """What the rendered collector configuration reads (k8s_attributes, k8s_objects, the cluster
    UID) and its Lease, as `kubectl auth can-i` args, for the proxy's ServiceAccount."""
    lease = f"leases.coordination.k8s.io/{fullname}-telemetry-proxy-k8s-objects"
    checks = [
        ["get", "namespaces/kube-system"],
        ["create", "leases.coordination.k8s.io", "-n", namespace],
        ["get", lease, "-n", namespace],
        ["update", lease, "-n", namespace],
    ]
    for resource in PROXY_READS:
        checks += [[verb, resource, "--all-namespaces"] for verb in ("list", "watch")]
    checks.append(["list", "lumigoes.operator.lumigo.io", "--all-namespaces"])  # the heartbeat
    return checks


# --- an install's manager as a local process ----------------------------------------------


def service_account_kubeconfig(cluster: LocalCluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig authenticating as a ServiceAccount with a TokenRequest token, like a pod's:
    whatever runs with it has exactly the install's RBAC."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").strip()
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"] = [{"name": sa, "user": {"token": token}}]
    config["contexts"] = [{"name": sa, "context": {"cluster": "local", "user": sa}}]
    config["current-context"] = sa
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of env values, for variables defined earlier."""
    for name, known in env.items():
        value = value.replace(f"$({name})", known)
    return value


WEBHOOK_CONTAINER = "webhook"


class InstalledOperator(OperatorProcess):
    """The manager of a kubectl or Helm install, run as a local process: the container's own
    command, args and env read from the installed Deployment (as the kubelet would pass them),
    the install's ServiceAccount token, only the listening addresses moved to 127.0.0.1.

    With a webhook Deployment (`<name>-webhook`, where the manager is
    `<name>-controller-manager`), `self.webhook` runs it the same way, as its own
    ServiceAccount: `start`, `stop` and `wait_ready` handle both processes.

    kwok runs no containers, so the API server cannot reach a webhook Service; `setup()` points
    the install's two webhook configurations at the serving process with `url:` client
    configurations (the manager writes their caBundle itself). `teardown()` deletes them again,
    strips the finalizer of any Lumigo left in the namespaces made by `new_namespace()`
    (nothing would process it once the operator is gone), stops the processes and deletes those
    namespaces.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        kube: KubeClient,
        *,
        namespace: str,
        deployment: str,
        kubeconfig: Path,
        container: str = "manager",
    ) -> None:
        super().__init__(cluster, kube, namespace=namespace)
        pod = get_json(cluster, "deployment", deployment, "-n", namespace)["spec"]["template"]
        (self.container,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
        self.service_account = pod["spec"]["serviceAccountName"]
        self.kubeconfig = kubeconfig
        flags = dict(a.split("=", 1) for a in self.container["args"] if "=" in a)
        self.webhook_configurations = flags["--webhook-configurations"].split(",")
        self.app_namespaces: list[str] = []
        self.webhook: InstalledOperator | None = None
        webhook = deployment.removesuffix("-controller-manager") + "-webhook"
        if container != WEBHOOK_CONTAINER and exists(cluster, "deployment", webhook, "-n",
                                                     namespace):  # fmt: skip
            sa = get_json(cluster, "deployment", webhook, "-n", namespace)["spec"]["template"][
                "spec"]["serviceAccountName"]  # fmt: skip
            webhook_kubeconfig = service_account_kubeconfig(
                cluster, namespace, sa, kubeconfig.with_name(f"{sa}.kubeconfig")
            )
            self.webhook = InstalledOperator(
                cluster, kube, namespace=namespace, deployment=webhook,
                kubeconfig=webhook_kubeconfig, container=WEBHOOK_CONTAINER,
            )  # fmt: skip

    @property
    def serving(self) -> InstalledOperator:
        """The process that serves admissions."""
        return self.webhook or self

    def pod_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = _expand(var["value"], env)
            elif var["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[var["name"]] = self.namespace
            else:
                raise AssertionError(f"cannot emulate env var {var}")
        return env

    def args(self) -> list[str]:
        env = [f"{k}={v}" for k, v in self.pod_env().items()]
        # The image's entrypoint is `lumigo-operator run`; the webhook's command says `webhook`.
        command = self.container.get("command") or ["lumigo-operator", "run"]
        assert command[0] == "lumigo-operator", command
        return [
            "/usr/bin/env", *env,  # exec'd in place: the process group is the operator's
            str(ROOT / ".venv" / "bin" / "lumigo-operator"), *command[1:],
            *self.container["args"],
            # argparse keeps the last value: only where it listens and how it reaches the API.
            f"--kubeconfig={self.kubeconfig}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            "--webhook-cert-extra-sans=127.0.0.1",
        ]  # fmt: skip

    def start(self) -> InstalledOperator:
        super().start()
        if self.webhook is not None:
            self.webhook.start()
        return self

    def wait_ready(self, timeout: float = 60) -> InstalledOperator:
        if self.webhook is None:
            super().wait_ready(timeout)
            return self
        # The manager first: it writes the serving certificate the webhook waits for.
        self._wait_process_ready(timeout)
        self.webhook._wait_process_ready(timeout)
        self.wait_admitting(timeout)
        return self

    def _wait_process_ready(self, timeout: float) -> None:
        name = self.container["name"]

        def ready() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited:\n{OperatorProcess.log_tail(self)}")
            return self.probe("/readyz")[0] == 200

        try:
            wait_until(ready, timeout, f"the {name} to be ready")
        except TimeoutError:
            raise TimeoutError(
                f"{name}: {self.probe('/readyz?verbose')}\n{OperatorProcess.log_tail(self)}"
            ) from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int | None:
        if self.webhook is not None:
            self.webhook.stop(sig, timeout)
        return super().stop(sig, timeout)

    def log_tail(self, lines: int = 60) -> str:
        tail = super().log_tail(lines)
        if self.webhook is not None:
            tail += "\n--- webhook ---\n" + self.webhook.log_tail(lines)
        return tail

    def setup(self) -> InstalledOperator:
        port = self.serving.webhook_port
        for name in self.webhook_configurations:
            config = get_json(self.cluster, "mutatingwebhookconfiguration", name)
            patch = []
            for i, webhook in enumerate(config["webhooks"]):
                path = webhook["clientConfig"]["service"]["path"]
                patch += [
                    {"op": "remove", "path": f"/webhooks/{i}/clientConfig/service"},
                    {"op": "add", "path": f"/webhooks/{i}/clientConfig/url",
                     "value": f"https://127.0.0.1:{port}{path}"},
                ]  # fmt: skip
            self.cluster.kubectl(
                "patch", "mutatingwebhookconfiguration", name, "--type=json", "-p",
                json.dumps(patch),
            )  # fmt: skip
        return self

    def new_namespace(self, name: str | None = None) -> str:
        name = name or f"t-app-{uuid.uuid4().hex[:6]}"
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self.kube.create(NAMESPACES, body)
        self.app_namespaces.append(name)
        return name

    def teardown(self) -> None:
        for name in self.webhook_configurations:
            self.cluster.kubectl(
                "delete", "mutatingwebhookconfiguration", name, "--ignore-not-found", check=False
            )
        self.stop()
        release_metrics_reader(self.cluster, self.metrics_reader)
        if self.webhook is not None:
            release_metrics_reader(self.cluster, self.webhook.metrics_reader)
        self.release_namespaces(self.app_namespaces)

    def log_text(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text + (self.webhook.log_text() if self.webhook is not None else "")


@contextlib.contextmanager
def installed_operator(
    cluster: LocalCluster, kube: KubeClient, namespace: str, deployment: str, workdir: Path
) -> Iterator[InstalledOperator]:
    """The install's manager, ready, as its own ServiceAccount; cleaned up whatever happens."""
    kubeconfig = service_account_kubeconfig(
        cluster, namespace, OPERATOR_SA, workdir / "operator.kubeconfig"
    )
    operator = InstalledOperator(
        cluster, kube, namespace=namespace, deployment=deployment, kubeconfig=kubeconfig
    )
    try:
        operator.setup().start().wait_ready()
        yield operator
    finally:
        operator.teardown()


def is_injected(obj: dict[str, Any]) -> bool:
    """Stored with the instrumentation of the installed operator's version."""
    labels = obj["metadata"].get("labels") or {}
    pod = obj["spec"]["template"]
    init = [c["name"] for c in pod["spec"].get("initContainers") or []]
    return (
        labels.get(constants.LABEL_AUTO_TRACE, "").startswith("lumigo-operator.v")
        and init == ["lumigo-injector"]
        and all(
            any(e["name"] == "LD_PRELOAD" for e in c.get("env", []))
            for c in pod["spec"]["containers"]
        )
    )
