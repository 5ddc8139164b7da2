"""OLM v0 as local processes, and a Subscription to the project's catalog.

`running_olm(cluster)` starts OLM's olm and catalog operators and `opm serve catalog/` against a
LocalCluster; `subscribe(olm)` applies a CatalogSource (spec.address), an OperatorGroup and a
Subscription and waits for the CSV to succeed. Afterwards every object OLM made for the operator
is gone (its defaulter webhook has failurePolicy Fail and would break every later Lumigo).
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envtest.cluster import LocalCluster
from envtest.process import Process, free_port, wait_until
from tests.support.packaging import BIN, CRD_NAME, ROOT, get_json, tool

PACKAGE = "lumigo-operator"
CSV_NAME = "lumigo-operator.v0.1.0"


@dataclass
class LocalOlm:
    cluster: LocalCluster
    olm_namespace: str
    operator_namespace: str
    catalog_address: str


def _started(cluster: LocalCluster, name: str, args: list[str], env: dict[str, str]) -> Process:
    # envtest.process.Process passes no environment: env(1) sets it, then execs the tool in place,
    # so the process group that Process.stop() signals is the tool's.
    assignments = [f"{k}={v}" for k, v in env.items()]
    proc = Process(
        name, ["/usr/bin/env", *assignments, *args], cluster.workdir / "logs" / f"{name}.log"
    )
    proc.start()
    return proc


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _install_olm_crds(cluster: LocalCluster) -> None:
    crds = sorted((BIN / "helm-olm-crds").glob("*.yaml"))
    assert crds, "bin/helm-olm-crds is missing: run `hack/install-tools packaging`"
    for path in crds:  # server-side: the CSV CRD is too large for the last-applied annotation
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for path in crds:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")


def olm_owned(cluster: LocalCluster, operator_namespace: str) -> list[str]:
    """Cluster-scoped objects OLM created for the operator installed in `operator_namespace`."""
    out = cluster.kubectl(
        "get", "mutatingwebhookconfigurations,clusterroles,clusterrolebindings",
        "-l", f"olm.owner.namespace={operator_namespace}", "-o", "name",
    )  # fmt: skip
    return out.split()


@contextlib.contextmanager
def running_olm(cluster: LocalCluster, catalog: Path = ROOT / "catalog") -> Iterator[LocalOlm]:
    """OLM's olm and catalog operators and `opm serve <catalog>`, as local processes."""
    suffix = uuid.uuid4().hex[:5]
    olm_ns, operator_ns = f"t-olm-{suffix}", f"t-olm-operators-{suffix}"
    _install_olm_crds(cluster)
    cluster.kubectl("create", "namespace", olm_ns)
    cluster.kubectl("create", "namespace", operator_ns)
    # No copies of the CSV in every namespace of the (shared) cluster.
    olm_config = {
        "apiVersion": "operators.coreos.com/v1",
        "kind": "OLMConfig",
        "metadata": {"name": "cluster"},
        "spec": {"features": {"disableCopiedCSVs": True}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(olm_config))
    port = free_port()
    env = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "OPERATOR_NAMESPACE": olm_ns,
        "OPERATOR_NAME": "olm-operator",
    }
    processes: list[Process] = []
    try:
        processes.append(
            _started(
                cluster, "olm",
                [tool("olm"), "--namespace", olm_ns, "--writeStatusName", "",
                 "--writePackageServerStatusName", ""],
                env,
            )
        )  # fmt: skip
        processes.append(
            _started(
                cluster, "catalog",
                [tool("catalog"), "--kubeconfig", str(cluster.kubeconfig), "--namespace", olm_ns,
                 "--writeStatusName", ""],
                env,
            )
        )  # fmt: skip
        processes.append(
            _started(
                cluster, "opm-serve",
                [tool("opm"), "serve", str(catalog), "--port", str(port),
                 "--pprof-addr", f"127.0.0.1:{free_port()}",
                 "--termination-log", str(cluster.workdir / "logs" / "opm-serve.termination")],
                env,
            )
        )  # fmt: skip

        def serving() -> bool:
            for proc in processes:
                if not proc.alive():
                    raise AssertionError(f"{proc.name} exited:\n{proc.log_tail()}")
            return _port_open(port)

        wait_until(serving, 60, "opm serve to listen")
        yield LocalOlm(cluster, olm_ns, operator_ns, f"127.0.0.1:{port}")
    finally:
        # Let OLM itself tear down what it made, while it still runs; then make sure.
        cluster.kubectl(
            "delete", "subscriptions,csv,operatorgroups", "--all", "-n", operator_ns, check=False
        )
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not olm_owned(cluster, operator_ns), 60, "OLM to clean up")
        for proc in reversed(processes):
            proc.stop()
        for leftover in olm_owned(cluster, operator_ns):
            cluster.kubectl("delete", leftover, "--ignore-not-found", check=False)
        # OLM's aggregated admin/edit/view roles for the CRD (owned by the CRD, which the
        # session keeps).
        for role in ("admin", "edit", "view", "crdview"):
            cluster.kubectl("delete", "clusterrole", f"{CRD_NAME}-v1alpha1-{role}",
                            "--ignore-not-found", check=False)  # fmt: skip
        cluster.kubectl("delete", "olmconfig", "cluster", "--ignore-not-found", check=False)
        for ns in (operator_ns, olm_ns):
            cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")


def csv_phase(cluster: LocalCluster, namespace: str) -> str:
    items = get_json(cluster, "csv", "-n", namespace)["items"]
    return str(items[0].get("status", {}).get("phase", "")) if items else ""


def subscribe(olm: LocalOlm, env: list[dict[str, str]] | None = None) -> None:
    """CatalogSource + OperatorGroup (AllNamespaces) + Subscription; wait for the CSV to
    succeed. `env`: the Subscription's config.env (OLM sets it on every container)."""
    subscription: dict[str, Any] = {
        "channel": "stable",
        "name": PACKAGE,
        "source": "lumigo",
        "sourceNamespace": olm.olm_namespace,
        "installPlanApproval": "Automatic",
    }
    if env:
        subscription["config"] = {"env": env}
    manifests = [
        {
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "CatalogSource",
            "metadata": {"name": "lumigo", "namespace": olm.olm_namespace},
            "spec": {
                "sourceType": "grpc",
                "address": olm.catalog_address,
                "displayName": "Lumigo",
                "publisher": "Lumigo",
            },
        },
        {
            "apiVersion": "operators.coreos.com/v1",
            "kind": "OperatorGroup",
            "metadata": {"name": "lumigo", "namespace": olm.operator_namespace},
            "spec": {},  # AllNamespaces, the only install mode the CSV supports
        },
        {
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "Subscription",
            "metadata": {"name": PACKAGE, "namespace": olm.operator_namespace},
            "spec": subscription,
        },
    ]
    cluster = olm.cluster
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests))

    def catalog_ready() -> bool:
        source = get_json(cluster, "catalogsource", "lumigo", "-n", olm.olm_namespace)
        state = source.get("status", {}).get("connectionState", {})
        return state.get("lastObservedState") == "READY"

    wait_until(catalog_ready, 120, "the CatalogSource to connect to opm serve")
    wait_until(
        lambda: csv_phase(cluster, olm.operator_namespace) == "Succeeded",
        240,
        f"CSV {CSV_NAME} Succeeded",
    )


def _rolled_out(deployment: dict[str, Any]) -> bool:
    """Every pod is of the current template and available, none of an older one is left."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    want = spec.get("replicas", 1)
    return (
        status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
        and status.get("replicas", 0) == want
        and status.get("updatedReplicas", 0) == want
        and status.get("availableReplicas", 0) == want
    )


def _env_names(deployment: dict[str, Any]) -> set[str]:
    containers = deployment["spec"]["template"]["spec"].get("containers") or []
    return {e["name"] for c in containers for e in c.get("env") or []}


def wait_for_subscription_env(olm: LocalOlm, names: set[str], stable: float = 10.0) -> None:
    """Wait until every Deployment of the CSV runs, rolled out, with the Subscription's
    config.env (`names`), and stays so for `stable` seconds.

    OLM takes the Subscription's config from its cache, found by `status.installedCSV`; a
    Deployment it installs before that cache shows it gets no config, and OLM adds the env with
    an update moments later (a second ReplicaSet; operator-framework/operator-lifecycle-manager
    #2725). Until then the operator runs without the user's settings.
    """
    cluster, namespace = olm.cluster, olm.operator_namespace
    since: float | None = None

    def settled() -> bool:
        nonlocal since
        deployments = get_json(cluster, "deployments", "-n", namespace, "-l",
                               f"olm.owner={CSV_NAME}")["items"]  # fmt: skip
        ok = bool(deployments) and all(
            names <= _env_names(d) and _rolled_out(d) for d in deployments
        )
        if not ok:
            since = None
            return False
        now = time.monotonic()
        since = since if since is not None else now
        return now - since >= stable

    what = f"the CSV's Deployments rolled out with the env {sorted(names)}"
    try:
        wait_until(settled, 180, what, interval=1.0)
    except TimeoutError as err:
        deployments = get_json(cluster, "deployments", "-n", namespace)["items"]
        state = [(d["metadata"]["name"], sorted(_env_names(d)), _rolled_out(d))
                 for d in deployments]  # fmt: skip
        status = get_json(cluster, "subscription", PACKAGE, "-n", namespace).get("status", {})
        installed = status.get("installedCSV")
        raise AssertionError(f"{err}: {state}; Subscription installedCSV {installed!r}") from err
