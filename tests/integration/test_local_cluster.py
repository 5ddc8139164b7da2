"""The foundation: the CRD on a real kube-apiserver, the kubeconfig with kubectl, clean teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from api.lumigo import dump_spec, load_spec
from envtest.cluster import LocalCluster
from envtest.process import wait_until

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "config" / "samples" / "operator_v1alpha1_lumigo.yaml"


def test_seed_readme_yaml_applies_and_api_server_fills_defaults(
    cluster: LocalCluster, crd: Path, namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    stored = json.loads(cluster.kubectl("get", "lumigo", "lumigo", "-n", namespace, "-o", "json"))
    expected = dump_spec(load_spec({"lumigoToken": {"secretRef": {"name": "n", "key": "k"}}}))
    expected["lumigoToken"] = {"secretRef": {"name": "lumigo-credentials", "key": "token"}}
    assert stored["spec"] == expected
    assert stored["spec"]["tracing"]["injection"]["injectLumigoIntoExistingResourcesOnCreation"]
    assert stored["spec"]["logging"] == {"enabled": False}
    assert stored["metadata"]["labels"]["app.kubernetes.io/part-of"] == "lumigo-operator"


def test_readme_settings_snippets_keep_other_defaults(
    cluster: LocalCluster, crd: Path, namespace: str
) -> None:
    manifest = textwrap.dedent(
        """
        apiVersion: operator.lumigo.io/v1alpha1
        kind: Lumigo
        metadata:
          name: lumigo
        spec:
          lumigoToken:
            secretRef:
              name: lumigo-credentials
              key: token
          tracing:
            injection:
              injectLumigoIntoExistingResourcesOnCreation: false # Default: true
          infrastructure:
            kubeEvents:
              enabled: false # Default: true
        """
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    spec = json.loads(cluster.kubectl("get", "lumigo", "lumigo", "-n", namespace, "-o", "json"))[
        "spec"
    ]
    assert spec["tracing"] == {
        "enabled": True,
        "injection": {
            "enabled": True,
            "injectLumigoIntoExistingResourcesOnCreation": False,
            "removeLumigoFromResourcesOnDeletion": True,
            "maxConcurrentRollouts": 5,
        },
    }
    assert spec["infrastructure"] == {"enabled": True, "kubeEvents": {"enabled": False}}


def test_invalid_cr_is_rejected_with_the_field_name(
    cluster: LocalCluster, crd: Path, namespace: str
) -> None:
    bad = {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": "bad"},
        "spec": {
            "lumigoToken": {"secretRef": {"name": "s", "key": "token"}},
            "tracing": {"injection": {"enabled": "yes"}},
        },
    }
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(bad), check=False)
    assert "spec.tracing.injection.enabled" in out
    assert "boolean" in out
    missing = cluster.kubectl(
        "get", "lumigo", "bad", "-n", namespace, "--ignore-not-found", "-o", "name"
    )
    assert missing.strip() == ""


def test_kubectl_shows_printer_columns(cluster: LocalCluster, crd: Path, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    table = cluster.kubectl("get", "lumigoes", "-A")
    header = table.splitlines()[0].split()
    assert header == ["NAMESPACE", "NAME", "ACTIVE", "ERROR", "ROLLING", "PENDING", "AGE"]
    assert any(line.split()[:2] == [namespace, "lumigo"] for line in table.splitlines()[1:])
    assert "lumigo" in cluster.kubectl("get", "lmg", "-n", namespace, "-o", "name")


def test_deployment_gets_running_pods_and_is_garbage_collected(
    full_cluster: LocalCluster, namespace: str
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
            },
        },
    }
    full_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(deployment))

    def pods(phase: str | None = None) -> list[dict[str, object]]:
        items = json.loads(full_cluster.kubectl("get", "pods", "-n", namespace, "-o", "json"))[
            "items"
        ]
        return [p for p in items if phase is None or p["status"].get("phase") == phase]

    wait_until(lambda: len(pods("Running")) == 2, 60, "2 Running pods")
    rs = json.loads(full_cluster.kubectl("get", "rs", "-n", namespace, "-o", "json"))["items"]
    assert len(rs) == 1
    assert rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    full_cluster.kubectl("delete", "deployment", "web", "-n", namespace)

    def gone() -> bool:
        left = json.loads(full_cluster.kubectl("get", "rs", "-n", namespace, "-o", "json"))
        return not left["items"] and not pods()

    wait_until(gone, 60, "the ReplicaSet and pods to be garbage-collected")


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -ww" not in line]


CHILD = """
import time
from envtest.cluster import LocalCluster
c = LocalCluster(full={full})
c.start()
print(c.workdir, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("full", [False, True])
def test_killed_parent_leaves_no_orphan_processes(full: bool) -> None:
    code = CHILD.format(full=full)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        workdir = proc.stdout.readline().strip()
        assert workdir, "the child cluster did not start"
        expected = 5 if full else 2
        assert len(_processes_mentioning(workdir)) >= expected
    finally:
        proc.kill()
        proc.wait()
    wait_until(lambda: not _processes_mentioning(workdir), 30, "children to exit")


def test_stop_and_ctrl_c_stop_everything() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "envtest.cluster", "up"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("export KUBECONFIG=")
    kubeconfig = Path(line.split("=", 1)[1].strip())
    config = yaml.safe_load(kubeconfig.read_text())
    assert config["clusters"][0]["cluster"]["server"].startswith("https://127.0.0.1:")
    workdir = str(kubeconfig.parent)
    assert _processes_mentioning(workdir)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    assert not _processes_mentioning(workdir)
    assert not kubeconfig.parent.exists()


def test_apiserver_restart_and_etcd_compaction(disposable_cluster: LocalCluster) -> None:
    cluster = disposable_cluster
    before = cluster.compact_etcd()
    cluster.restart_apiserver()
    started = time.monotonic()
    assert cluster.request("/readyz") == "ok"
    assert time.monotonic() - started < 60
    assert cluster.compact_etcd() >= before
