"""`lumigo-operator uninstall` leaves no Lumigo and no instrumented workload, operator or not."""

from __future__ import annotations

from pathlib import Path

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from controller.runtime.resources import DAEMONSETS, DEPLOYMENTS, STATEFULSETS
from localcluster import LocalCluster, wait_until
from localoperator import OperatorProcess
from tests.support.checks import TOKEN, clean, create, instrumented, is_active, lumigo_yaml
from tests.support.lumigo import create_token_secret


def instrumented_namespace(op: OperatorProcess, cluster: LocalCluster, kube: KubeClient) -> str:
    ns = op.new_namespace()
    create(kube, ns, DEPLOYMENTS, "web")
    create(kube, ns, STATEFULSETS, "db")
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    wait_until(lambda: instrumented(kube.get(STATEFULSETS, "db", ns)), 30, "instrumented")
    assert instrumented(create(kube, ns, DAEMONSETS, "agent"))  # via the webhook
    return ns


def opted_in_namespace(op: OperatorProcess, kube: KubeClient) -> str:
    """No Lumigo; a workload opted in with the label (the webhook's label settings)."""
    ns = op.new_namespace()
    obj = create(kube, ns, DEPLOYMENTS, "opted-in", **{constants.LABEL_AUTO_TRACE: "true"})
    assert instrumented(obj)
    return ns


def assert_nothing_left(kube: KubeClient, namespaces: dict[str, list[tuple[object, str]]]) -> None:
    items, _ = kube.list(LUMIGOES)
    assert items == []
    for ns, workloads in namespaces.items():
        for resource, name in workloads:
            obj = kube.get(resource, name, ns)  # type: ignore[arg-type]
            assert clean(obj), f"{ns}/{name}"
            assert constants.LABEL_AUTO_TRACE not in (obj["metadata"].get("labels") or {})


def test_uninstall_with_the_operator_running(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    op = OperatorProcess(cluster, kube).setup()
    try:
        op.start().wait_ready()
        a = instrumented_namespace(op, cluster, kube)
        b = instrumented_namespace(op, cluster, kube)
        c = opted_in_namespace(op, kube)
        result = op.uninstall("90s")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "removed instrumentation" in result.stdout
        workloads = [(DEPLOYMENTS, "web"), (STATEFULSETS, "db"), (DAEMONSETS, "agent")]
        assert_nothing_left(kube, {a: workloads, b: workloads, c: [(DEPLOYMENTS, "opted-in")]})
    finally:
        op.teardown()


def test_uninstall_without_an_operator_does_the_work_itself(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    op = OperatorProcess(cluster, kube).setup()
    try:
        op.start().wait_ready()
        a = instrumented_namespace(op, cluster, kube)
        c = opted_in_namespace(op, kube)
        op.stop()  # the operator is gone (e.g. its Deployment was deleted first)
        lumigo = kube.get(LUMIGOES, "lumigo", a)
        assert constants.FINALIZER in lumigo["metadata"]["finalizers"]
        result = op.uninstall("3s")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "finalized" in result.stdout
        workloads = [(DEPLOYMENTS, "web"), (STATEFULSETS, "db"), (DAEMONSETS, "agent")]
        assert_nothing_left(kube, {a: workloads, c: [(DEPLOYMENTS, "opted-in")]})
    finally:
        op.teardown()
