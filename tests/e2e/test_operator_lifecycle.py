"""The operator process's life cycle: repair after webhook downtime, SIGTERM, bad flags."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import CRONJOBS, DAEMONSETS, DEPLOYMENTS, LEASES, STATEFULSETS
from kube.rest import ApiError
from tests.support.checks import (
    TOKEN,
    clean,
    condition,
    create,
    instrumented,
    is_active,
    lumigo_yaml,
    status,
    utc_now,
)
from tests.support.lumigo import create_token_secret

ROOT = Path(__file__).resolve().parents[2]


def test_uninstrumented_workloads_are_repaired(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    """Workloads created while the webhook was down (failurePolicy Ignore) get instrumented."""
    op = OperatorProcess(cluster, kube).setup()
    try:
        op.start().wait_ready()
        ns = op.new_namespace()
        create_token_secret(kube, ns, TOKEN)
        cluster.kubectl("apply", "-n", ns, "-f", "-",
                        input=lumigo_yaml(tracing={"injection": {
                            "injectLumigoIntoExistingResourcesOnCreation": False}}))  # fmt: skip
        wait_until(lambda: is_active(kube, ns), 60, "Active")
        op.stop()
        # Creation timestamps have a one-second resolution: make sure these are visibly newer.
        activated = (condition(kube, ns, "Active") or {})["lastTransitionTime"]
        wait_until(lambda: utc_now() > activated, 5, "the next second")
        missed = [(DEPLOYMENTS, "d1"), (STATEFULSETS, "s1"), (DAEMONSETS, "ds1"),
                  (CRONJOBS, "c1")]  # fmt: skip
        for resource, name in missed:
            assert clean(create(kube, ns, resource, name))  # nobody injected them
        op.start().wait_ready()
        for resource, name in missed:
            wait_until(lambda r=resource, n=name: instrumented(kube.get(r, n, ns)), 60,
                       f"{name} repaired")  # fmt: skip
        wait_until(lambda: len(status(kube, ns)["instrumentedResources"]) == 4, 30, "4 listed")
    finally:
        op.teardown()


def test_sigterm_releases_the_lease(cluster: LocalCluster, kube: KubeClient, crd: Path) -> None:
    op = OperatorProcess(cluster, kube, extra_args=("--leader-election-id=sigterm-test",)).setup()
    try:
        op.start().wait_ready()
        leading = 'leader_election_master_status{name="sigterm-test"} 1.0'
        wait_until(lambda: leading in op.probe("/metrics")[1], 30, "leadership")
        assert op.stop() == 0
        lease = kube.get(LEASES, "sigterm-test", op.namespace)
        assert lease["spec"]["holderIdentity"] == ""
    finally:
        op.teardown()


def test_bad_flags_exit_with_one_line(cluster: LocalCluster, kube: KubeClient) -> None:
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "lumigo-operator"), "run", "--kubeconfig=/nonexistent"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().startswith("lumigo-operator run:")
    assert len(out.stderr.strip().splitlines()) == 1
    with pytest.raises(ApiError):
        kube.get(LUMIGOES, "missing", "default")
