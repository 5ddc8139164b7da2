"""A user's LD_PRELOAD from an optional ConfigMap or Secret key, through the real mutation and
real processes under the real injector (issue 28, item 9).

The container's environment is made as the kubelet makes it (`kubelet_env`: an optional source
that is missing leaves the variable unset, and a `$(VAR)` reference to an unset variable is left
verbatim). With the source missing ld.so must print nothing, in the first process or any child;
with it present, the user's library is preloaded in the first process (the same pid) and in its
children.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from api import constants
from tests.support.injector import PROGRAMS, ROOT, compile_c, injected_pod_spec

JSON = dict[str, Any]
SOURCES = {
    "configmap": {"configMapKeyRef": {"name": "preload", "key": "libs", "optional": True}},
    "secret": {"secretKeyRef": {"name": "preload", "key": "libs", "optional": True}},
}
# Prints the pid it runs as, and LD_PRELOAD; then a child process (each loaded library prints
# its own line).
SCRIPT = 'echo "sh $$ LD_PRELOAD=$LD_PRELOAD" >&2; /bin/true'


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: `$$` is `$`, an undefined reference stays as written."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([^)]*)\)", one, value)


def kubelet_env(container: JSON, stores: dict[str, dict[str, dict[str, str]]]) -> dict[str, str]:
    """The environment the kubelet gives the container; `stores` holds the ConfigMaps and
    Secrets that exist: {"configMapKeyRef"|"secretKeyRef": {name: {key: value}}}."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = _expand(entry["value"], env)
            continue
        source = entry["valueFrom"]
        kind = next(iter(source))
        ref = source[kind]
        value = stores.get(kind, {}).get(ref["name"], {}).get(ref["key"])
        if value is None:
            if ref.get("optional") is True:
                continue  # the kubelet skips it: the variable is not set at all
            raise AssertionError(f"CreateContainerConfigError: {entry}")
        env[entry["name"]] = value
    return env


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lumigo_injector.so built from the source with the payload's own flags, at
    <payload>/injector/lumigo_injector.so."""
    loader = importlib.machinery.SourceFileLoader("build_payload", str(ROOT / "injector" /
                                                                      "build-payload"))  # fmt: skip
    spec = importlib.util.spec_from_loader("build_payload", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    root = tmp_path_factory.mktemp("payload")
    (root / "injector").mkdir()
    so = root / "injector" / "lumigo_injector.so"
    subprocess.run(["gcc", *module.CFLAGS, "-o", str(so),
                    str(ROOT / "injector" / "src" / "lumigo_injector.c")], check=True)  # fmt: skip
    return root


@pytest.fixture(scope="module")
def user_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("user") / "libuser.so"
    return compile_c(PROGRAMS / "user_preload_pid.c", out, "gcc", "-shared", "-fPIC",
                     "-nostdlib")  # fmt: skip


def container_with_user_preload(source: JSON) -> JSON:
    pod_spec = {"containers": [{"name": "app", "image": "app:1",
                                "env": [{"name": "LD_PRELOAD", "valueFrom": source}]}]}  # fmt: skip
    return dict(injected_pod_spec(pod_spec)["containers"][0])


def run_in_container(env: dict[str, str], payload: Path) -> subprocess.CompletedProcess[str]:
    """/bin/sh (dynamically linked) and a child, with the container's environment, the payload
    mounted at /opt/lumigo being `payload` here."""
    here = {k: v.replace(constants.LUMIGO_MOUNT_PATH, str(payload)) for k, v in env.items()}
    shell = shutil.which("sh")
    assert shell is not None
    return subprocess.run(
        [shell, "-c", SCRIPT],
        env={"PATH": "/usr/bin:/bin", **here},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.parametrize("kind", SOURCES)
def test_a_missing_optional_source_makes_ld_so_print_nothing(kind: str, payload: Path) -> None:
    container = container_with_user_preload(SOURCES[kind])
    env = kubelet_env(container, stores={})  # the ConfigMap / Secret does not exist
    assert "$(" not in env["LD_PRELOAD"]
    result = run_in_container(env, payload)
    assert "ld.so" not in result.stderr, result.stderr
    assert "$(" not in result.stderr, result.stderr
    assert f"LD_PRELOAD={payload}/injector/lumigo_injector.so\n" in result.stderr


@pytest.mark.parametrize("kind", SOURCES)
def test_a_present_optional_source_is_preloaded_in_the_first_process_and_its_children(
    kind: str, payload: Path, user_lib: Path
) -> None:
    container = container_with_user_preload(SOURCES[kind])
    source = SOURCES[kind]
    ref_kind = next(iter(source))
    stores = {ref_kind: {"preload": {"libs": str(user_lib)}}}
    result = run_in_container(kubelet_env(container, stores), payload)
    assert "ld.so" not in result.stderr, result.stderr
    pids = re.findall(r"userlib loaded in pid (\d+)", result.stderr)
    shell = re.search(r"sh (\d+) LD_PRELOAD=(\S+)", result.stderr)
    assert shell is not None, result.stderr
    # Once in the shell itself (executed again with it: the same pid), once in its child.
    assert len(pids) == 2, result.stderr
    assert pids[0] == shell.group(1)
    assert pids[1] != shell.group(1)
    assert shell.group(2) == f"{payload}/injector/lumigo_injector.so:{user_lib}"


def test_an_unresolved_reference_left_by_an_earlier_version_reaches_no_child(
    payload: Path,
) -> None:
    """A workload chained with `$(...)` before this fix, its source missing: ld.so of the first
    process has already read LD_PRELOAD, but no child gets the literal."""
    env = {"LD_PRELOAD": f"{constants.LD_PRELOAD_VALUE}:$({constants.ENV_ORIGINAL_LD_PRELOAD})"}
    result = run_in_container(env, payload)
    assert result.stderr.count("ld.so") == 1, result.stderr  # the first process only
    assert f"LD_PRELOAD={payload}/injector/lumigo_injector.so\n" in result.stderr
