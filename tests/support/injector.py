"""Helpers for the injector e2e tests: a real OTLP/HTTP receiver, real processes, test programs.

Nothing here is a mock: the receiver is an HTTP server on loopback that decodes what the Lumigo
distros really send (protobuf with opentelemetry-proto, or OTLP/JSON), and every process is a
real one, stopped even when the test fails.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from api import constants
from envtest.process import free_port, wait_until
from webhook.pod_injection import InjectionSettings, inject

ROOT = Path(__file__).resolve().parents[2]

PROGRAMS = ROOT / "tests" / "e2e" / "injector_programs"
CACHE = Path(
    os.environ.get("LUMIGO_CACHE_DIR", Path.home() / ".cache" / "lumigo-operator")
).expanduser()
TOKEN = "t_0123456789abcdef01234"  # the shape of a Lumigo token: t_ + 21 hex digits
PYTHON_MINORS = ("3.9", "3.10", "3.11", "3.12", "3.13")


@dataclass
class Span:
    name: str
    kind: int  # OTLP SpanKind: 2 = SERVER, 3 = CLIENT
    attributes: dict[str, Any]
    resource: dict[str, Any]
    trace_id: str = ""  # hex, as in OTLP/JSON
    span_id: str = ""
    parent_span_id: str = ""


@dataclass
class Export:
    path: str
    headers: dict[str, str]
    spans: list[Span] = field(default_factory=list)


def _any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind and kind not in ("array_value", "kvlist_value") else None


def _from_protobuf(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = {a.key: _any_value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = {a.key: _any_value(a.value) for a in s.attributes}
                ids = (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex())
                spans.append(Span(s.name, int(s.kind), attrs, resource, *ids))
    return spans


def _json_value(value: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    return None


def _from_json(body: bytes) -> list[Span]:
    """OTLP/JSON (what @opentelemetry/exporter-trace-otlp-http sends)."""
    spans = []
    for rs in json.loads(body).get("resourceSpans", []):
        attrs_of = lambda items: {a["key"]: _json_value(a.get("value", {})) for a in items}  # noqa: E731
        resource = attrs_of(rs.get("resource", {}).get("attributes", []))
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                spans.append(
                    Span(
                        s["name"],
                        int(s.get("kind", 0)),
                        attrs_of(s.get("attributes", [])),
                        resource,
                        s.get("traceId", ""),
                        s.get("spanId", ""),
                        s.get("parentSpanId", ""),
                    )
                )
    return spans


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1 that records every export it gets."""

    def __init__(self) -> None:
        self.exports: list[Export] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self._body()
                if self.headers.get("Content-Encoding", "") == "gzip":
                    body = gzip.decompress(body)
                ctype = self.headers.get("Content-Type", "")
                try:
                    spans = _from_json(body) if "json" in ctype else _from_protobuf(body)
                except Exception as error:  # recorded, so the test shows it
                    receiver.errors.append(f"{self.path} {ctype}: {error!r}")
                    spans = []
                with receiver._lock:
                    receiver.exports.append(Export(self.path, dict(self.headers.items()), spans))
                if "json" in ctype:
                    payload, out_type = b"{}", "application/json"
                else:
                    payload = ExportTraceServiceResponse().SerializeToString()
                    out_type = "application/x-protobuf"
                self.send_response(200)
                self.send_header("Content-Type", out_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length", "0")))
                chunks = []  # Node's exporter streams the body in chunks
                while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[Span]:
        with self._lock:
            return [s for e in self.exports for s in e.spans]

    def server_span(self, route: str) -> Span | None:
        """The SERVER span of the request to `route`, whichever HTTP semantic conventions."""
        for span in self.spans():
            a = span.attributes
            target = a.get("http.target") or a.get("url.path") or a.get("http.route") or ""
            if span.kind == 2 and str(target).startswith(route):
                return span
        return None


def http_attribute(span: Span, *names: str) -> Any:
    """The first of several attribute names (old and stable HTTP semantic conventions)."""
    for name in names:
        if name in span.attributes:
            return span.attributes[name]
    return None


@dataclass
class App:
    proc: subprocess.Popen[bytes]
    port: int
    stdout: Path
    stderr: Path

    def get(self, path: str) -> tuple[int, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return r.status, json.loads(r.read())

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def running_app(
    args: list[str], env: dict[str, str], workdir: Path, poll_interval: float = 0.1
) -> Iterator[App]:
    """Start an HTTP app (env PORT), wait until it listens, always stop its process group.

    `poll_interval` is how often the port is tried: start-up benchmarks need a fine one, since
    the time is only known to within it."""
    port = free_port()
    out, err = workdir / f"app-{port}.out", workdir / f"app-{port}.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            args, env={**env, "PORT": str(port)}, stdout=o, stderr=e, start_new_session=True
        )
    app = App(proc, port, out, err)
    try:

        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"app exited with {proc.returncode}:\n{app.output()}")
            return _port_open(port)

        wait_until(
            listening, timeout=120, what=f"{args[0]} listening on {port}", interval=poll_interval
        )
        yield app
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def base_env(home: Path) -> dict[str, str]:
    """What a container has before the webhook adds anything."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


def webhook_env(
    payload: Path, endpoint: str, container: str, token: str | None = TOKEN
) -> dict[str, str]:
    """The variables the injector webhook adds (reference behaviour §3), pointed at our payload.

    LUMIGO_REPORT_DEPENDENCIES=false is a safety net: the bootstraps default the distros'
    dependency report (straight to Lumigo's public endpoint) off, and test_injector_egress proves
    it with exactly the webhook's env in a loopback-only network namespace; these tests run in
    the host's network, where a regression must still not send anything out.
    """
    env = {
        "LD_PRELOAD": str(payload / "injector" / "lumigo_injector.so"),
        "LUMIGO_ENDPOINT": endpoint,
        "LUMIGO_LOGS_ENDPOINT": endpoint.replace("/v1/traces", "/v1/logs"),
        "LUMIGO_ENABLE_TRACES": "true",
        "LUMIGO_ENABLE_LOGS": "false",
        "LUMIGO_CONTAINER_NAME": container,
        "LUMIGO_REPORT_DEPENDENCIES": "false",
    }
    if token is not None:
        env["LUMIGO_TRACER_TOKEN"] = token
    return env


def python_interpreters() -> dict[str, str]:
    """Every CPython 3.9-3.13 on this machine (pyenv versions, then PATH), by minor version."""
    found: dict[str, str] = {}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for minor in PYTHON_MINORS:
        candidates = sorted(
            glob.glob(str(pyenv / "versions" / f"{minor}.*" / "bin" / f"python{minor}"))
        )
        exe = candidates[-1] if candidates else shutil.which(f"python{minor}")
        if exe:
            probe = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                   capture_output=True, text=True)  # fmt: skip
            if probe.returncode == 0 and probe.stdout.strip() == minor:
                found[minor] = exe
    return found


def flask_python(interpreter: str) -> Path:
    """A venv with Flask (the application's own dependency) for `interpreter`, cached."""
    requirements = PROGRAMS / "requirements-flask.txt"
    key = hashlib.sha256(requirements.read_bytes() + interpreter.encode()).hexdigest()[:12]
    venv = CACHE / "e2e-apps" / f"flask-{Path(interpreter).name}-{key}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-r", str(requirements)], check=True)  # fmt: skip
        (venv / ".complete").write_text(key)
    return python


def node_runtime() -> Path:
    """The node binary of the node-app image (hack/images/node-runtime: Node.js 22, which has
    module.registerHooks, unlike Debian's), installed with npm from its lock file, cached."""
    runtime = ROOT / "hack" / "images" / "node-runtime"
    lock = runtime / "package-lock.json"
    arch = {"x86_64": "x64", "aarch64": "arm64"}[os.uname().machine]
    key = hashlib.sha256(lock.read_bytes() + arch.encode()).hexdigest()[:12]
    dest = CACHE / "e2e-apps" / f"node-runtime-{key}"
    node = dest / "node_modules" / f"node-linux-{arch}" / "bin" / "node"
    if not (dest / ".complete").exists():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(runtime / name, dest / name)
        subprocess.run(["npm", "ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund",
                        "--loglevel=error", "--cpu", arch, "--os", "linux"], cwd=dest,
                       check=True)  # fmt: skip
        (dest / ".complete").write_text(key)
    return node


def compile_c(source: Path, out: Path, compiler: str = "gcc", *flags: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([compiler, "-O2", "-o", str(out), str(source), *flags], check=True)
    return out


def injected_pod_spec(
    pod_spec: dict[str, Any], settings: InjectionSettings | None = None
) -> dict[str, Any]:
    """The pod spec of a Deployment after the real webhook injection (pod_injection.inject)."""
    labels = {"app": "app"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "app", "namespace": "default", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    mutated = inject(deployment, settings or InjectionSettings())
    spec: dict[str, Any] = mutated["spec"]["template"]["spec"]
    return spec


def init_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The injected init container of an injected pod spec."""
    for container in pod_spec["initContainers"]:
        if container["name"] == constants.INJECTOR_INIT_CONTAINER:
            return dict(container)
    raise AssertionError(f"no {constants.INJECTOR_INIT_CONTAINER} init container in {pod_spec}")


def container_env(container: dict[str, Any], payload: Path, token: str = TOKEN) -> dict[str, str]:
    """A container's env as its process gets it: the token Secret reference resolved to `token`,
    and the volume's mount path (/opt/lumigo) replaced by where the payload is here."""
    env = {}
    for entry in container.get("env") or []:
        if "valueFrom" in entry:
            assert "secretKeyRef" in entry["valueFrom"], entry
            env[entry["name"]] = token
        else:
            env[entry["name"]] = entry["value"].replace(constants.LUMIGO_MOUNT_PATH, str(payload))
    return env
