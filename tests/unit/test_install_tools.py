"""hack/install-tools' Kubernetes family: the tools on the Kubernetes 1.36 libraries share one
wrapper module, one set of build tags and one build order, so that a cold build compiles every
shared package once. Any of these broken, a cold CI compiles the shared packages again (minutes
on two cores) or builds a tool the module does not pin."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_install_tools() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("install_tools", str(ROOT / "hack/install-tools"))
    spec = importlib.util.spec_from_loader("install_tools", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["install_tools"] = module  # dataclasses resolve annotations through it
    loader.exec_module(module)
    return module


TOOLS_MODULE = load_install_tools()
FAMILY = [t for t in TOOLS_MODULE.TOOLS.values() if t.source == TOOLS_MODULE.KUBERNETES_FAMILY]


def test_the_family_holds_every_tool_on_the_kubernetes_libraries() -> None:
    names = {t.name for t in FAMILY}
    assert names >= {"kubernetes", "kubelet", "etcd", "kwok", "helm-olm", "kube-state-metrics"}
    assert names >= {"metrics-server", "coredns", "containerd", "cosign"}
    assert all(t.src == ROOT / "hack/tools/kubernetes-family" for t in FAMILY)


def test_the_family_builds_in_one_chain_with_one_set_of_tags() -> None:
    """Two family builds side by side would each compile the shared packages; different tags
    could give them different cache keys."""
    assert {t.tags for t in FAMILY} == {TOOLS_MODULE.FAMILY_TAGS}
    firsts = [t.name for t in FAMILY if t.after is None]
    assert firsts == ["kubernetes"]
    afters = [t.after for t in FAMILY if t.after is not None]
    assert len(afters) == len(set(afters)) == len(FAMILY) - 1  # a chain, not a tree
    chain, names = ["kubernetes"], {t.name for t in FAMILY}
    follower = {t.after: t.name for t in FAMILY}
    while chain[-1] in follower:
        chain.append(follower[chain[-1]])
    assert set(chain) == names


def test_the_family_module_pins_every_package_it_builds() -> None:
    tools_go = (ROOT / "hack/tools/kubernetes-family/tools.go").read_text()
    imported = set(re.findall(r'_ "([^"]+)"', tools_go))
    local = "lumigo-operator/hack/tools/kubernetes-family/"
    for tool in FAMILY:
        for package in tool.binaries.values():
            if package.startswith(local):
                assert (ROOT / "hack/tools/kubernetes-family" / package[len(local) :]).is_dir()
            else:
                assert package in imported, f"{tool.name}: {package} is not in tools.go"
    go_mod = (ROOT / "hack/tools/kubernetes-family/go.mod").read_text()
    assert re.search(r"^module lumigo-operator/hack/tools/kubernetes-family$", go_mod, re.M)
    for tool in FAMILY:
        if tool.name not in ("kubernetes", "kubelet", "coredns"):
            assert f"\t{tool.module} {tool.version}\n" in go_mod, tool.name


def test_the_cache_key_changes_with_a_family_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """coredns/main.go is the family's own code: editing it must rebuild CoreDNS."""
    shutil.copytree(ROOT / "hack/tools/kubernetes-family", tmp_path / "kubernetes-family")
    monkeypatch.setattr(TOOLS_MODULE, "TOOLS_SRC", tmp_path)
    coredns = TOOLS_MODULE.TOOLS["coredns"]
    before = TOOLS_MODULE.tool_dir(coredns)
    main_go = tmp_path / "kubernetes-family" / "coredns" / "main.go"
    main_go.write_text(main_go.read_text() + "\n// changed\n")
    assert TOOLS_MODULE.tool_dir(coredns) != before
