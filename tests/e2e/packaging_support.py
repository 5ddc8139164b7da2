"""Helpers for the packaging tests: run the pinned tools, render the chart, clean up after Helm.

Everything runs the real binaries from bin/ (built by hack/install-tools) against the session's
real kube-apiserver; a failing command fails the test with its full output.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import LocalCluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "bin"
CHART = ROOT / "charts" / "lumigo-operator"
CRD_NAME = "lumigoes.operator.lumigo.io"
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
