"""`make run` as a newcomer uses it: it comes up traced, kubectl works, Ctrl-C leaves nothing."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from envtest.process import wait_until

# `make run` starts a real node where the machine can: it runs with the node tier (hack/test-tiers).
pytestmark = pytest.mark.real_node

ROOT = Path(__file__).resolve().parents[2]


def test_make_run_comes_up_with_a_traced_demo_and_stops_cleanly() -> None:
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "hack" / "run-local")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()

    def said(text: str) -> bool:
        while not lines.empty():
            seen.append(lines.get())
        return any(text in line for line in seen)

    try:
        wait_until(lambda: said("Press Ctrl-C") or proc.poll() is not None, 240, "make run")
        assert proc.poll() is None, "".join(seen)
        kubeconfig = ROOT / ".local-cluster" / "kubeconfig"
        kubectl = [str(ROOT / "bin" / "kubectl"), "--kubeconfig", str(kubeconfig)]
        table = subprocess.run([*kubectl, "get", "lumigoes", "-A"], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
        assert table.splitlines()[1].split()[:3] == ["demo", "lumigo", "True"]
        deployment = json.loads(subprocess.run(
            [*kubectl, "get", "deployment", "hello-python", "-n", "demo", "-o", "json"],
            capture_output=True, text=True, check=True,
        ).stdout)  # fmt: skip
        init = [c["name"] for c in deployment["spec"]["template"]["spec"]["initContainers"]]
        assert init == ["lumigo-injector"]
        if os.environ.get("LUMIGO_NODE", "").lower() != "off":
            # On a machine that runs containers the demo is a real pod: its init container
            # copied the tracer (exit 0) and the traced app's log is there to read.
            assert not said("No real node"), "".join(seen)
            pods = json.loads(subprocess.run(
                [*kubectl, "get", "pods", "-n", "demo", "-l", "app=hello-python", "-o", "json"],
                capture_output=True, text=True, check=True,
            ).stdout)["items"]  # fmt: skip
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            assert running, json.dumps([p["status"] for p in pods])[:3000]
            (init_status,) = running[0]["status"]["initContainerStatuses"]
            assert init_status["state"]["terminated"]["exitCode"] == 0
            name = running[0]["metadata"]["name"]
            copy_log = subprocess.run(
                [*kubectl, "logs", "-n", "demo", name, "-c", "lumigo-injector"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "lumigo-copy: copied" in copy_log
            subprocess.run([*kubectl, "logs", "-n", "demo", name], check=True, capture_output=True)
            # The newcomer sees a real span of the demo app, and where to see more.
            (first,) = [
                seen[i + 1] for i, line in enumerate(seen) if "spans arrive at a receiver" in line
            ]
            assert "(python)" in first, first
            assert "GET" in first, first
            spans_log = ROOT / ".local-cluster" / "spans.log"
            assert said(f"tail -f {spans_log}")
            ip = running[0]["status"]["podIP"]
            with urllib.request.urlopen(f"http://{ip}:8080/?newcomer=1", timeout=30) as resp:
                assert resp.status == 200
            wait_until(
                lambda: "newcomer=1" in spans_log.read_text(), 60, "the request's line in spans.log"
            )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert said("Stopped; nothing left running.")
    assert proc.returncode == 0
    assert not (ROOT / ".local-cluster").exists()
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(ROOT / ".local-cluster") not in ps
