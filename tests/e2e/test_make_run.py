"""`make run` as a newcomer uses it: it comes up traced, kubectl works, Ctrl-C leaves nothing."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from localcluster import wait_until

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
