"""The node tier: real containers on a real kubelet (envtest/node), on a control plane of
its own, so that no other tier's pods are ever scheduled onto it.

`LUMIGO_NODE=on` runs the tier; a missing component or kernel feature then fails its tests with
a message naming what is missing (never a silent skip). `LUMIGO_NODE=off` deselects the tier and
the summary line says so. Unset, `NODE_TIER_DEFAULT` decides.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from envtest.cluster import FAKE_NODE, LocalCluster
from envtest.node import LocalNode, NodeError, preflight, require
from envtest.registry import LocalRegistry, RegistryError
from tests.conftest import _namespace_name

# The tier is part of `make test`; LUMIGO_NODE=off is the one way to leave it out.
NODE_TIER_DEFAULT = "on"
NODE_DIR = Path(__file__).resolve().parent


def node_tier_setting() -> str:
    value = os.environ.get("LUMIGO_NODE", NODE_TIER_DEFAULT).strip().lower()
    if value not in ("on", "off"):
        raise pytest.UsageError(f"LUMIGO_NODE must be 'on' or 'off', not {value!r}")
    return value


def _in_node_tier(item: pytest.Item) -> bool:
    return NODE_DIR in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if node_tier_setting() == "on":
        return
    off = [item for item in items if _in_node_tier(item)]
    if off:
        config.hook.pytest_deselected(items=off)
        items[:] = [item for item in items if not _in_node_tier(item)]
    config.stash[_OFF_COUNT] = len(off)


_OFF_COUNT = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    off = terminalreporter.config.stash.get(_OFF_COUNT, None)
    if off is None:
        terminalreporter.write_line("node tier: on (real containers on a local kubelet)")
    else:
        terminalreporter.write_line(
            f"node tier: off (LUMIGO_NODE={os.environ.get('LUMIGO_NODE', 'unset')}): "
            f"{off} node tests not run; LUMIGO_NODE=on runs them"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing node test reports the node's processes (a dead kubelet is not a product bug)."""
    report = yield
    if report.failed and _in_node_tier(item):
        holder = _HOLDER.get("node")
        if isinstance(holder, NodeHolder) and holder.node is not None:
            report.sections.append(("local node", holder.node.process_report()))
    return report


class NodeHolder:
    """The tier's one node, started on first use. A test that needs the machine to itself (only
    one local node runs at a time) releases it; the next test that asks gets a new one."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.node: LocalNode | None = None
        self.error: NodeError | None = None  # a node that failed to start fails every test

    def get(self) -> LocalNode:
        if self.error is not None:
            raise self.error
        if self.node is None:
            try:
                self.node = LocalNode(self.cluster).start()
            except NodeError as err:
                self.error = err
                raise
        return self.node

    def release(self) -> None:
        if self.node is not None:
            node, self.node = self.node, None
            node.stop()


_HOLDER: dict[str, NodeHolder] = {}


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[LocalCluster]:
    """A full control plane for the node tier; kwok's fake node is deleted, so the real node is
    the cluster's only one, as on a user's cluster (every pod runs on it, and the operator's
    `--injection-mode=auto` sees a node that can mount image volumes)."""
    try:  # fail with the missing component's name before anything starts
        require(*preflight())
    except NodeError as err:
        pytest.fail(str(err), pytrace=False)
    with LocalCluster(full=True) as cluster:
        cluster.kubectl("delete", "node", FAKE_NODE)
        yield cluster


@pytest.fixture(scope="session")
def node_holder(node_cluster: LocalCluster) -> Iterator[NodeHolder]:
    holder = NodeHolder(node_cluster)
    _HOLDER["node"] = holder
    try:
        yield holder
    finally:
        holder.release()
        _HOLDER.pop("node", None)


@pytest.fixture
def node(node_holder: NodeHolder) -> LocalNode:
    """The running real node (containerd + kubelet + kube-proxy + CoreDNS)."""
    try:
        return node_holder.get()
    except NodeError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture
def node_namespace(
    node: LocalNode, node_cluster: LocalCluster, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace on the node-tier cluster, deleted afterwards (without waiting)."""
    name = _namespace_name(request)
    node_cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        node_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def registry() -> Iterator[LocalRegistry]:
    """The tier's OCI registry (envtest/registry.py: HTTPS from a private CA, basic auth), started
    once on first use: what a user's cluster pulls the product's images from."""
    try:
        started = LocalRegistry().start()
    except RegistryError as err:
        pytest.fail(str(err), pytrace=False)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def registry_node(node: LocalNode, registry: LocalRegistry) -> LocalNode:
    """The running node, its containerd trusting the registry's CA (no credentials: those come
    from each pod's imagePullSecrets)."""
    node.trust_registry(registry.host, registry.ca_pem)
    return node
