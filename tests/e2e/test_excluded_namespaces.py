"""A Lumigo in `kube-system` or in the operator's own namespace takes no effect (issue 28, item
9): the injector webhook's namespaceSelector leaves these namespaces out, and the controller
must not instrument their workloads either. The real operator process, the real API server."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, NAMESPACES, SECRETS
from kube.rest import ApiError
from tests.support.checks import (
    TOKEN,
    clean,
    condition,
    create,
    instrumented,
    is_active,
    lumigo_yaml,
)
from tests.support.lumigo import create_token_secret


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: KubeClient, crd: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, kube).setup()
    op.start().wait_ready()
    yield op
    op.teardown()


def reconciles_done(operator: OperatorProcess, key: str) -> int:
    """Reconciles of `key` that ended, from the operator's debug log (one line each)."""
    done = 0
    for line in operator.log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        done += entry.get("msg") == "reconcile done" and entry.get("key") == key
    return done


def monitored(kube: KubeClient, namespace: str) -> bool:
    labels = kube.get(NAMESPACES, namespace)["metadata"].get("labels") or {}
    return constants.LABEL_MONITORED in labels


@pytest.mark.parametrize("which", ["operator", "kube-system"])
def test_a_lumigo_in_an_excluded_namespace_instruments_nothing_and_says_why(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient, which: str
) -> None:
    # A control namespace: the same Lumigo and workload are instrumented there.
    control = operator.new_namespace()
    create(kube, control, DEPLOYMENTS, "app")
    create_token_secret(kube, control, TOKEN)
    cluster.kubectl("apply", "-n", control, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, control), 60, "the control Lumigo Active")
    wait_until(lambda: instrumented(kube.get(DEPLOYMENTS, "app", control)), 60,
               "the control workload instrumented")  # fmt: skip

    ns = operator.namespace if which == "operator" else "kube-system"
    app = f"app-{operator.id}"
    create(kube, ns, DEPLOYMENTS, app)
    create_token_secret(kube, ns, TOKEN, name=f"lumigo-credentials-{operator.id}")
    body = json.loads(lumigo_yaml())
    body["metadata"]["name"] = f"lumigo-{operator.id}"
    body["spec"]["lumigoToken"]["secretRef"]["name"] = f"lumigo-credentials-{operator.id}"
    name = body["metadata"]["name"]
    try:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
        wait_until(lambda: _excluded(kube, ns, name), 60, "the Error condition saying why")
        error = condition(kube, ns, "Error", name)
        assert error is not None
        assert f"the '{ns}' namespace is" in error["message"]
        assert "no workload is instrumented here" in error["message"]
        active = condition(kube, ns, "Active", name)
        assert active is None or active["status"] == "False"
        # Several more reconciles: still nothing instrumented, the namespace never labelled
        # for the injector webhook.
        done = reconciles_done(operator, f"{ns}/{name}")
        wait_until(lambda: reconciles_done(operator, f"{ns}/{name}") >= done + 2, 60,
                   "two more reconciles")  # fmt: skip
        assert clean(kube.get(DEPLOYMENTS, app, ns))
        assert not monitored(kube, ns)
        status = kube.get(LUMIGOES, name, ns).get("status") or {}
        assert status.get("instrumentedResources", []) == []
    finally:
        with contextlib.suppress(ApiError):  # not created
            kube.merge_patch(LUMIGOES, name, {"metadata": {"finalizers": None}}, ns)
        kube.delete(LUMIGOES, name, ns)
        kube.delete(DEPLOYMENTS, app, ns)
        kube.delete(SECRETS, f"lumigo-credentials-{operator.id}", ns)


def _excluded(kube: KubeClient, namespace: str, name: str) -> bool:
    error = condition(kube, namespace, "Error", name)
    return bool(error and error["status"] == "True" and error["reason"] == "ExcludedNamespace")
