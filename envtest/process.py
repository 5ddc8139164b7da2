"""The processes of a local cluster or node: start, stop, report; and the one `wait_until`.

Every process is started in its own session with PR_SET_PDEATHSIG (SIGKILL), so even a SIGKILLed
parent leaves no orphan. A `Supervisor` holds a component's named processes, stops them in the
order given and reports, one line each, which are running and which died (with the end of their
log): the report attached to failing tests, so that a dead component is not mistaken for a bug.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    """Own session, and SIGKILL when the parent dies.

    SIGKILL, not SIGTERM: a kube-apiserver whose etcd vanished at the same moment would hang in
    graceful shutdown forever.
    """
    os.setsid()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll `check` until it passes; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_for_a_stop_signal() -> None:
    """Block until SIGINT or SIGTERM: a command-line `up` runs until Ctrl-C or `kill`."""
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: stopped.set())
    while not stopped.wait(0.2):
        pass


def wait_healthy(
    proc: Process,
    check: Callable[[], bool],
    timeout: float,
    error: type[Exception] = TimeoutError,
) -> None:
    """Wait until `check()` passes for a process just started; a process that exits, or never
    becomes healthy, raises `error` with the end of its log (the reason is usually there)."""

    def ok() -> bool:
        if not proc.alive():
            raise (RuntimeError if error is TimeoutError else error)(
                f"{proc.name} exited during start-up:\n{proc.log_tail()}"
            )
        try:
            return check()
        except (OSError, ValueError):  # urllib's URLError is an OSError
            return False

    try:
        wait_until(ok, timeout, f"{proc.name} to become healthy", interval=0.2)
    except TimeoutError as err:
        raise error(f"{err}\n{proc.log_tail()}") from None


@dataclass
class Process:
    """One component's process, its output appended to `log`."""

    name: str
    args: list[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    missing_hint: str = field(default="run `hack/install-tools` (or `make tools`) first")

    def start(self) -> None:
        binary = Path(self.args[0])
        if not binary.exists():
            raise self.missing(f"{binary} is missing: {self.missing_hint}")
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                preexec_fn=self.preexec,  # noqa: PLW1509 - setsid + pdeathsig (+ cgroups), nothing else
            )

    def missing(self, message: str) -> Exception:
        """The error for a binary that is not installed (a node raises its own NodeError)."""
        return FileNotFoundError(message)

    def preexec(self) -> None:
        """Between fork and exec in the child: own session, die with the parent."""
        die_with_parent()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.popen = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def report(self) -> str:
        """`name: running`, or its exit code and the end of its log if it died."""
        if self.alive():
            return f"{self.name}: running"
        code = self.popen.returncode if self.popen is not None else None
        return f"{self.name}: EXITED ({code})\n{self.log_tail(20)}"


class Supervisor(dict[str, Process]):
    """A component's processes by name (a dict, so a test can reach one by its name)."""

    def run(self, proc: Process) -> Process:
        """Start `proc` and keep it under its name."""
        proc.start()
        self[proc.name] = proc
        return proc

    def stop(self, order: Iterable[str], timeout: float = 10) -> None:
        """Stop (and forget) the processes named in `order`, in that order."""
        for name in order:
            proc = self.pop(name, None)
            if proc is not None:
                proc.stop(timeout=timeout)

    def report(self) -> str:
        """One line per process (running, or its exit code and last log lines if it died)."""
        return "\n".join(proc.report() for proc in self.values())

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.values() if p.popen is not None]
