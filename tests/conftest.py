"""Shared fixtures: one real local control plane per test session, per-test namespaces.

Tiers are markers derived from the directory (tests/unit, tests/integration, tests/e2e), so
`pytest -m unit` runs the seconds-fast tier and `make test` runs everything.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster

# A run started in the background by a non-interactive shell inherits SIGINT ignored, and so would
# every app a test starts (an ignored signal survives exec): Python then never installs its
# KeyboardInterrupt handler, and the tests that stop a traced app with Ctrl-C wait in vain. A
# handler, unlike SIG_IGN, is reset to the default in the children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent

# Shared 2-core CI machines are slow and noisy: no per-example deadlines, no too_slow checks.
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("ci")

CRD_FILE = ROOT / "config" / "crd" / "bases" / "operator.lumigo.io_lumigoes.yaml"
TIERS = ("unit", "integration", "e2e", "node")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).parent
    for item in items:
        try:
            tier = Path(str(item.path)).relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test that used a control plane reports the state of its processes."""
    report = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in ("cluster", "full_cluster", "disposable_cluster"):
            local = funcargs.get(name)
            if isinstance(local, LocalCluster):
                report.sections.append((f"control plane ({name})", local.process_report()))
    return report


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """etcd + kube-apiserver for the whole session; full mode is added on first demand
    (LUMIGO_TEST_FULL=1 starts it at once, to check that no test depends on the order)."""
    with LocalCluster(full=os.environ.get("LUMIGO_TEST_FULL") == "1") as local:
        yield local


@pytest.fixture(scope="session")
def disposable_cluster() -> Iterator[LocalCluster]:
    """A second, minimal control plane for tests that restart the API server or compact etcd.

    Doing that to the session cluster leaves its controller-manager in client-go's reconnect
    backoff (up to a minute, with jitter) and later tests that wait on a Deployment controller
    time out; so disruption gets a cluster of its own, started on first demand.
    """
    with LocalCluster() as local:
        yield local


@pytest.fixture(scope="session")
def disposable_kube(disposable_cluster: LocalCluster) -> KubeClient:
    return KubeClient.from_kubeconfig(disposable_cluster.kubeconfig)


@pytest.fixture
def disposable_namespace(disposable_cluster: LocalCluster, request: pytest.FixtureRequest) -> str:
    """A fresh namespace in the disposable cluster (which is thrown away with its contents)."""
    name = _namespace_name(request)
    disposable_cluster.kubectl("create", "namespace", name)
    return name


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> KubeClient:
    """The operator's own API client, as the cluster admin."""
    return KubeClient.from_kubeconfig(cluster.kubeconfig)


@pytest.fixture
def full_cluster(cluster: LocalCluster) -> LocalCluster:
    """The session cluster with controller-manager, scheduler and a kwok node running."""
    cluster.start_full()
    return cluster


@pytest.fixture(scope="session")
def crd(cluster: LocalCluster) -> Path:
    """The Lumigo CRD installed and Established."""
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/lumigoes.operator.lumigo.io"
    )
    return CRD_FILE


def _namespace_name(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    return f"t-{base}-{uuid.uuid4().hex[:5]}"


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    name = _namespace_name(request)
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def injector_payload() -> Path:
    """The injector payload tree (what the init container copies to /opt/lumigo).

    `make test` builds it first (`make payload`); building here again is a cached no-op.
    """
    out = ROOT / "build" / "payload"
    subprocess.run(
        [sys.executable, str(ROOT / "injector" / "build-payload"), "--out", str(out)], check=True
    )
    return out
