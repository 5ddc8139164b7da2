"""`lumigo-operator uninstall` leaves no Lumigo and no instrumented workload, operator or not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DAEMONSETS, DEPLOYMENTS, STATEFULSETS
from tests.support.checks import (
    TOKEN,
    clean,
    create,
    has_event,
    instrumented,
    is_active,
    lumigo_yaml,
)
from tests.support.lumigo import create_token_secret
from tests.support.workloads import workload


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


def test_a_label_opted_in_workload_through_its_life(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    """A namespace without a Lumigo, workloads opted in with `lumigo.auto-trace=true`: injection
    rewrites the label to `lumigo-operator.v<version>`, so the webhook must still be called when
    the user relabels it `false` (opt-out) or edits it; uninstall leaves nothing of ours, also on
    a workload labelled `false` that still carries our instrumentation (a re-applied export)."""
    label = constants.LABEL_AUTO_TRACE
    op = OperatorProcess(cluster, kube).setup()
    try:
        op.start().wait_ready()
        ns = op.new_namespace()

        # Opt in: the opted-in webhook entry injects it with its label settings.
        app = create(kube, ns, DEPLOYMENTS, "app", **{label: "true"})
        assert instrumented(app)
        injected_template = app["spec"]["template"]

        # An unrelated edit keeps it instrumented.
        def edit(current: dict[str, Any]) -> dict[str, Any]:
            current["spec"]["replicas"] = 2
            current["spec"]["template"]["metadata"].setdefault("annotations", {})["rev"] = "2"
            return current

        # (The Deployment controller may have written its status since: retry on conflict.)
        app = kube.update_with_retry(DEPLOYMENTS, "app", ns, edit, current=app)
        assert app is not None
        assert instrumented(app)
        assert app["spec"]["template"]["metadata"]["annotations"]["rev"] == "2"

        # Opt out: the webhook removes the instrumentation on that very update; the label stays.
        app = kube.merge_patch(DEPLOYMENTS, "app", {"metadata": {"labels": {label: "false"}}}, ns)
        assert clean(app), app["spec"]["template"]
        assert app["metadata"]["labels"][label] == "false"
        wait_until(lambda: has_event(kube, ns, "app", "LumigoRemovedInstrumentation"), 30,
                   "the opt-out's Removed event")  # fmt: skip

        # Opt in again.
        app = kube.merge_patch(DEPLOYMENTS, "app", {"metadata": {"labels": {label: "true"}}}, ns)
        assert instrumented(app)

        # Labelled `false` from the start but carrying our instrumentation (an exported
        # manifest applied again): admitted as it is; uninstall still cleans it.
        copy = workload(DEPLOYMENTS, "copy", {label: "false"})
        copy["spec"]["template"] = {
            **injected_template,
            "metadata": {"labels": {"app": "copy"}},
        }
        copy["spec"]["selector"] = {"matchLabels": {"app": "copy"}}
        assert not clean(kube.create(DEPLOYMENTS, copy, ns))

        result = op.uninstall("30s")
        assert result.returncode == 0, result.stdout + result.stderr
        assert_nothing_left(kube, {ns: [(DEPLOYMENTS, "app")]})
        copied = kube.get(DEPLOYMENTS, "copy", ns)
        assert clean(copied), copied["spec"]["template"]
        assert copied["metadata"]["labels"][label] == "false"  # the user's: kept
    finally:
        op.teardown()
