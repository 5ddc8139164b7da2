"""Tracer traffic goes only to the configured endpoint, and a failed export stays quiet (issue 14,
item 11).

Each app runs with exactly the env the real webhook mutation gives its container, in a network
namespace whose only interface is loopback (nothing it tries can leave this machine), under
`strace -f -e trace=connect`, which records every connect() of every thread and child. With the
receiver up, every address the app tried must be the receiver's; with it down, the app's output
must not carry a traceback or a stack trace.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from envtest.process import free_port, wait_until
from tests.support.injector import (
    PROGRAMS,
    OtlpReceiver,
    base_env,
    container_env,
    flask_python,
    injected_pod_spec,
    python_interpreters,
    running_app,
)
from webhook.pod_injection import InjectionSettings

CLONE_NEWNET = 0x40000000
CONNECT = re.compile(r"connect\(\d+, \{sa_family=(AF_\w+), (.*?)\}, \d+\)")
INET_PORT = re.compile(r"sin6?_port=htons\((\d+)\)")
REFUSED = re.compile(r"Connection refused|ECONNREFUSED")
# Python's traceback; a JavaScript stack, also when flattened into JSON ("\\n    at f (file:1:2)")
STACK_TRACE = re.compile(r"Traceback \(most recent call last\)|(\n|\\n) {4}at \S")
NSCD = 'sun_path="/var/run/nscd/socket"'
INET_ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')


@pytest.fixture
def loopback_only() -> Iterator[Path]:
    """A network namespace with nothing but loopback (up), kept alive by a sleeping process."""
    holder = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "up\n"
        yield Path(f"/proc/{holder.pid}/ns/net")
    finally:
        holder.kill()
        holder.wait()


@contextmanager
def entered(netns: Path) -> Iterator[None]:
    """Run the block in `netns`: setns(2) moves only this thread, and every socket, thread and
    process it creates meanwhile belongs to the namespace (the receiver, the app, the client)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/thread-self/ns/net") as home, open(netns) as target:
        if libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
        try:
            yield
        finally:
            if libc.setns(home.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")


@dataclass(frozen=True)
class Connect:
    family: str
    address: str  # "host:port" for AF_INET/AF_INET6, the path for AF_UNIX

    def __str__(self) -> str:
        return f"{self.family} {self.address}"


def connects(trace: Path) -> list[Connect]:
    """Every connect() strace recorded, but for two that never leave the machine: AF_UNSPEC (a
    UDP socket's disconnect) and glibc asking a local nscd for users and groups (the distros'
    process detectors look up the process owner; there is no nscd here, so a host name lookup
    would go on to a DNS server, and be seen)."""
    found = []
    for match in CONNECT.finditer(trace.read_text(errors="replace")):
        family, fields = match.groups()
        if family in ("AF_INET", "AF_INET6"):
            port, host = INET_PORT.search(fields), INET_ADDRESS.search(fields)
            assert port, fields
            assert host, fields
            found.append(Connect(family, f"{host.group(1) or host.group(2)}:{port.group(1)}"))
        elif family != "AF_UNSPEC" and fields != NSCD:
            found.append(Connect(family, fields))
    return found


def traced(args: list[str], trace: Path) -> list[str]:
    # -o FILE PROG: strace blocks fatal signals itself, so a signal to the group reaches the app
    return ["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=connect", "-o", str(trace), *args]


def app_args(runtime: str) -> list[str]:
    if runtime == "python":
        return [str(flask_python(python_interpreters()["3.11"])), str(PROGRAMS / "flask_app.py")]
    return ["node", str(PROGRAMS / "http_app.js")]


def webhook_env(payload: Path, proxy: str, home: Path) -> dict[str, str]:
    """What the app container has: a base env plus exactly what the real mutation injects."""
    settings = InjectionSettings(telemetry_proxy_endpoint=proxy)
    pod_spec = injected_pod_spec({"containers": [{"name": "app", "image": "app"}]}, settings)
    env = {**base_env(home), **container_env(pod_spec["containers"][0], payload)}
    assert not any(name.startswith("LUMIGO_REPORT") for name in env), env
    return env


def interrupt(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C: the app shuts down cleanly (Python's distro flushes at exit), so whatever it
    prints about its exports is in its output once it has exited."""
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)


@pytest.mark.parametrize("runtime", ["python", "node"])
def test_traced_app_connects_only_to_the_configured_endpoint(
    runtime: str, injector_payload: Path, tmp_path: Path, loopback_only: Path
) -> None:
    trace = tmp_path / "connect.trace"
    args = traced(app_args(runtime), trace)  # outside: may install the app's venv first
    with entered(loopback_only), OtlpReceiver() as receiver:
        env = webhook_env(injector_payload, f"http://127.0.0.1:{receiver.port}", tmp_path)
        env["OTEL_SERVICE_NAME"] = f"egress-{runtime}"
        with running_app(args, env, tmp_path) as app:
            assert app.get("/hello")[0] == 200
            wait_until(
                lambda: receiver.server_span("/hello") is not None,
                timeout=60,
                what=f"the SERVER span at the receiver; app output:\n{app.output()[-3000:]}",
            )
            interrupt(app.proc)
    tried = connects(trace)
    assert Connect("AF_INET", f"127.0.0.1:{receiver.port}") in tried
    others = [str(c) for c in tried if c != Connect("AF_INET", f"127.0.0.1:{receiver.port}")]
    assert others == [], f"the app tried more than the proxy:\n{trace.read_text()[-5000:]}"


@pytest.mark.parametrize("runtime", ["python", "node"])
def test_failed_exports_print_no_traceback(
    runtime: str, injector_payload: Path, tmp_path: Path, loopback_only: Path
) -> None:
    trace = tmp_path / "connect.trace"
    args = traced(app_args(runtime), trace)
    with entered(loopback_only):
        down = free_port()  # nothing listens there
        env = webhook_env(injector_payload, f"http://127.0.0.1:{down}", tmp_path)
        with running_app(args, env, tmp_path) as app:
            for _ in range(3):
                assert app.get("/hello")[0] == 200
            # however it is printed, the failure names the refused connection
            wait_until(
                lambda: REFUSED.search(app.output()) is not None,
                timeout=60,
                what=f"the app reporting its failed export; output:\n{app.output()[-3000:]}",
            )
            interrupt(app.proc)
    output = app.output()
    assert STACK_TRACE.search(output) is None, output
    assert len(REFUSED.findall(output)) == 1, output  # once, however many exports failed
    assert {str(c) for c in connects(trace)} == {f"AF_INET 127.0.0.1:{down}"}


USER_PROGRAMS = {
    "python": """
import logging, os, sys
logging.basicConfig(level=logging.DEBUG, format="USER %(name)s %(message)s")
logging.getLogger("app").warning("the app's own log line")
print(sys.modules.get("lumigo_opentelemetry") is not None,
      os.environ.get("LUMIGO_REPORT_DEPENDENCIES"),
      [type(h).__name__ for h in logging.getLogger().handlers])
""",
    "node": """
console.log(Object.keys(require.cache).some((m) => m.endsWith('/nodejs/lumigo-distro.js')),
            process.env.LUMIGO_REPORT_DEPENDENCIES);
""",
}


@pytest.mark.parametrize("runtime", ["python", "node"])
def test_app_environment_and_logging_are_its_own(
    runtime: str, injector_payload: Path, tmp_path: Path, loopback_only: Path
) -> None:
    """The report's default is set only while the distro starts, and quieting OpenTelemetry's
    loggers leaves the application's own logging configuration working as before."""
    program = app_args(runtime)[0]
    args = [program, "-c" if runtime == "python" else "-e", USER_PROGRAMS[runtime]]
    with entered(loopback_only):
        env = webhook_env(injector_payload, "http://127.0.0.1:9", tmp_path)
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    if runtime == "python":
        assert result.stdout.splitlines()[-1] == "True None ['StreamHandler']"
        assert "USER app the app's own log line" in result.stderr
    else:
        assert result.stdout.splitlines()[-1] == "true undefined"
