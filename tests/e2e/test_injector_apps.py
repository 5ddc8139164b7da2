"""Real Python and Node.js HTTP apps under the injector send real spans to a real OTLP receiver.

Each app is started with only what its container would have plus the env the webhook adds
(LD_PRELOAD, LUMIGO_TRACER_TOKEN, LUMIGO_ENDPOINT, ...), serves one request, and the receiver must
get the SERVER span of that request with the expected service name and HTTP attributes.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.injector import (
    PROGRAMS,
    TOKEN,
    App,
    OtlpReceiver,
    base_env,
    compile_c,
    flask_python,
    http_attribute,
    python_interpreters,
    running_app,
    wait_until,
    webhook_env,
)
from tests.support.otel import running_sink

INTERPRETERS = python_interpreters()
# python3 (3.11 here) must always be there; the other minors are tested where installed (pyenv).
assert "3.11" in INTERPRETERS, f"no CPython 3.11 found: {INTERPRETERS}"


def assert_traced(receiver: OtlpReceiver, app: App, route: str, service: str) -> None:
    status, _ = app.get(route)
    assert status == 200
    wait_until(
        lambda: receiver.server_span(route) is not None,
        timeout=60,
        what=f"a SERVER span for {route} (got {[s.name for s in receiver.spans()]}, "
        f"errors {receiver.errors}); app output:\n{app.output()[-3000:]}",
    )
    span = receiver.server_span(route)
    assert span is not None
    assert span.resource.get("service.name") == service
    assert http_attribute(span, "http.method", "http.request.method") == "GET"
    assert int(http_attribute(span, "http.status_code", "http.response.status_code")) == 200
    assert receiver.errors == []
    auth = {e.headers.get("Authorization") for e in receiver.exports if e.path == "/v1/traces"}
    assert auth == {f"LumigoToken {TOKEN}"}


@pytest.mark.parametrize("minor", sorted(INTERPRETERS, key=lambda v: tuple(map(int, v.split(".")))))
def test_python_app_is_traced(minor: str, injector_payload: Path, tmp_path: Path) -> None:
    python = flask_python(INTERPRETERS[minor])
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": f"flask-{minor}",
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        with running_app([str(python), str(PROGRAMS / "flask_app.py")], env, tmp_path) as app:
            assert_traced(receiver, app, "/hello", f"flask-{minor}")
            _, seen = app.get("/hello")
            # the payload matching this interpreter was picked, and nothing leaked into sys.path
            # but the payload directories, appended after the application's own entries
            tag = "cp" + minor.replace(".", "")
            ours = [p for p in seen["sys_path"] if p.startswith(str(injector_payload))]
            assert ours == [
                str(injector_payload / "python" / f"{tag}-glibc"),
                str(injector_payload / "python" / "common"),
            ]
            assert seen["sys_path"][-2:] == ours


def test_node_app_is_traced(injector_payload: Path, tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": "node-app",
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        with running_app(["node", str(PROGRAMS / "http_app.js")], env, tmp_path) as app:
            assert_traced(receiver, app, "/hello", "node-app")


def test_the_node_distro_starts_from_one_bundled_file(
    injector_payload: Path, tmp_path: Path
) -> None:
    """Start-up reads the bundle (nodejs/lumigo-distro.js), not the ~1,000 modules of
    node_modules, and the distro still knows its own version (nodejs/package.json)."""
    env = {**base_env(tmp_path), **webhook_env(injector_payload, "http://127.0.0.1:9/v1/traces",
                                               "app")}  # fmt: skip
    script = ("const p = process.argv[1]; console.log(JSON.stringify("
              "Object.keys(require.cache).filter((m) => m.startsWith(p))))")  # fmt: skip
    result = subprocess.run(["node", "-e", script, str(injector_payload)], env=env,
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    loaded = json.loads(result.stdout.splitlines()[-1])
    nodejs = injector_payload / "nodejs"
    assert str(nodejs / "lumigo-distro.js") in loaded, loaded
    # What the bundle still requires at run time by a computed name (protobufjs' `long`).
    assert len([m for m in loaded if "/node_modules/" in m]) <= 3, loaded
    version = json.loads((nodejs / "node_modules/@lumigo/opentelemetry/package.json").read_text())
    assert f"Lumigo OpenTelemetry Distro v{version['version']} started" in result.stdout + (
        result.stderr
    )


@pytest.mark.parametrize("runtime", ["python", "node"])
def test_apps_without_token_work_untraced(
    runtime: str, injector_payload: Path, tmp_path: Path
) -> None:
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            **webhook_env(injector_payload, receiver.endpoint, "app", None),
        }
        if runtime == "python":
            args = [str(flask_python(INTERPRETERS["3.11"])), str(PROGRAMS / "flask_app.py")]
        else:
            args = ["node", str(PROGRAMS / "http_app.js")]
        with running_app(args, env, tmp_path) as app:
            for _ in range(3):
                status, seen = app.get("/hello")
                assert status == 200
            assert app.proc.poll() is None
            assert seen["env"].get("PYTHONPATH") is None
            assert seen["env"].get("NODE_OPTIONS") is None
        assert "Traceback" not in app.output()
        assert "lumigo" not in app.output().lower()
        assert receiver.exports == []


@pytest.mark.parametrize("runtime", ["python", "node"])
def test_app_works_when_the_endpoint_is_down(
    runtime: str, injector_payload: Path, tmp_path: Path
) -> None:
    """Nothing listens on LUMIGO_ENDPOINT: the distro's exports fail, the app keeps serving."""
    with OtlpReceiver() as closed:
        endpoint = closed.endpoint
    env = {**base_env(tmp_path), **webhook_env(injector_payload, endpoint, "app")}
    if runtime == "python":
        args = [str(flask_python(INTERPRETERS["3.11"])), str(PROGRAMS / "flask_app.py")]
    else:
        args = ["node", str(PROGRAMS / "http_app.js")]
    with running_app(args, env, tmp_path) as app:
        for _ in range(5):
            assert app.get("/hello")[0] == 200
        assert app.proc.poll() is None


def test_python_user_values_are_kept(injector_payload: Path, tmp_path: Path) -> None:
    """The user's PYTHONPATH, own sitecustomize and own LD_PRELOAD library all still work."""
    userlib = tmp_path / "userlib"
    userlib.mkdir()
    (userlib / "usermod.py").write_text("VALUE = 'from the user PYTHONPATH'\n")
    (userlib / "sitecustomize.py").write_text("USER_SITECUSTOMIZE = True\n")
    user_so = compile_c(PROGRAMS / "user_preload.c", tmp_path / "user_preload.so", "gcc",
                        "-shared", "-fPIC")  # fmt: skip
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": "flask-user",
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        # the webhook prepends ours to an existing LD_PRELOAD with ':'
        env["LD_PRELOAD"] = f"{env['LD_PRELOAD']}:{user_so}"
        env["PYTHONPATH"] = str(userlib)
        python = flask_python(INTERPRETERS["3.11"])
        with running_app([str(python), str(PROGRAMS / "flask_app.py")], env, tmp_path) as app:
            assert_traced(receiver, app, "/hello", "flask-user")
            _, seen = app.get("/hello")
    assert seen["env"]["LD_PRELOAD"] == env["LD_PRELOAD"]
    assert seen["env"]["USER_PRELOAD_LOADED"] == "1"
    assert seen["env"]["PYTHONPATH"] == f"{injector_payload}/python/bootstrap:{userlib}"
    assert seen["user_module"] == "from the user PYTHONPATH"
    assert seen["user_sitecustomize"] is True
    assert str(userlib) in seen["sys_path"]
    assert str(injector_payload / "python" / "bootstrap") not in seen["sys_path"]


def test_an_app_with_a_newer_setuptools_is_traced(injector_payload: Path, tmp_path: Path) -> None:
    """The distro declares setuptools<=80.9.0 but never imports it: the payload does not ship
    it, and an application with a newer one (most virtualenvs) is traced, not stood down."""
    site = tmp_path / "site"
    for package in ("setuptools", "pkg_resources", "_distutils_hack"):  # what setuptools installs
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    (site / "setuptools-81.0.0.dist-info").mkdir()
    (site / "setuptools-81.0.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: setuptools\nVersion: 81.0.0\n"
    )
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": "flask-setuptools",
            "PYTHONPATH": str(site),
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        python = flask_python(INTERPRETERS["3.11"])
        with running_app([str(python), str(PROGRAMS / "flask_app.py")], env, tmp_path) as app:
            assert_traced(receiver, app, "/hello", "flask-setuptools")
            assert "tracing not activated" not in app.output()
    shipped = {p.name for p in (injector_payload / "python").glob("*/*")}
    assert not shipped & {"setuptools", "pkg_resources", "_distutils_hack"}


def test_the_payload_ships_no_tests_stubs_or_sources_and_its_links_stay_inside(
    injector_payload: Path,
) -> None:
    python = injector_payload / "python"
    names = {p.name for p in python.rglob("*")}
    assert not names & {"tests", "test", "ci"}
    assert not [n for n in names if n.endswith((".pyi", ".proto", ".c"))]
    links = [p for p in python.rglob("*") if p.is_symlink()]
    assert links, "shared distributions are linked from the targets' directories"
    for link in links:
        target = os.readlink(link)
        assert not os.path.isabs(target), link
        assert link.resolve().is_relative_to((python / "shared").resolve()), link
        assert link.exists(), link


def test_node_user_values_are_kept(injector_payload: Path, tmp_path: Path) -> None:
    """The user's NODE_OPTIONS (a --require of their own and a flag) and LD_PRELOAD still work."""
    user_js = tmp_path / "user.js"
    user_js.write_text("global.USER_REQUIRE_LOADED = true;\n")
    user_so = compile_c(PROGRAMS / "user_preload.c", tmp_path / "user_preload.so", "gcc",
                        "-shared", "-fPIC")  # fmt: skip
    user_options = f"--require {user_js} --max-http-header-size=32768"
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": "node-user",
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        env["LD_PRELOAD"] = f"{env['LD_PRELOAD']}:{user_so}"
        env["NODE_OPTIONS"] = user_options
        with running_app(["node", str(PROGRAMS / "http_app.js")], env, tmp_path) as app:
            assert_traced(receiver, app, "/hello", "node-user")
            _, seen = app.get("/hello")
    bootstrap = injector_payload / "nodejs" / "lumigo-bootstrap.js"
    assert seen["env"]["NODE_OPTIONS"] == f"--require {bootstrap} {user_options}"
    assert seen["user_require"] is True
    assert seen["env"]["LD_PRELOAD"] == env["LD_PRELOAD"]
    assert seen["env"]["USER_PRELOAD_LOADED"] == "1"


def _old_interpreters() -> dict[str, str]:
    """CPython versions the payload has no build for, where installed (pyenv)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = {}
    for minor in ("2.7", "3.6", "3.7", "3.8"):
        candidates = sorted(
            glob.glob(str(pyenv / "versions" / f"{minor}.*" / "bin" / f"python{minor}"))
        )
        if candidates:
            found[minor] = candidates[-1]
    return found


@pytest.mark.parametrize(
    ("label", "interpreter"),
    [*sorted(_old_interpreters().items()), ("own-opentelemetry", sys.executable)],
)
def test_python_stands_down_and_says_so_once(
    label: str, interpreter: str, injector_payload: Path, tmp_path: Path
) -> None:
    """No build for this interpreter, or the app brings its own OpenTelemetry (this test venv
    has opentelemetry-proto): the program runs exactly as without the injector, and one line on
    stderr says that tracing is not on, and why."""
    script = "import sys; print('ran', sys.version_info[0]); sys.exit(3)"
    env = {
        **base_env(tmp_path),
        **webhook_env(injector_payload, "http://127.0.0.1:9/v1/traces", "c"),
    }
    with_injector = subprocess.run(
        [interpreter, "-c", script], env=env, capture_output=True, text=True
    )
    plain = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    without = subprocess.run([interpreter, "-c", script], env=plain, capture_output=True, text=True)
    assert (with_injector.returncode, with_injector.stdout) == (without.returncode, without.stdout)
    assert with_injector.returncode == 3
    reason = (
        "the application already has OpenTelemetry"
        if label == "own-opentelemetry"
        else (f"Python {label} is not supported")
    )
    if label == "2.7":
        reason = "implementation cpython2 is not supported"
    said = f"lumigo-injector: python: tracing not activated: {reason}\n"
    assert with_injector.stderr == said + without.stderr


def test_a_python_stand_down_is_reported_once_to_the_proxy_and_never_breaks_the_exit(
    injector_payload: Path, tmp_path: Path
) -> None:
    """The app brings its own OpenTelemetry (this venv has it): besides the stderr line, one OTLP
    log record goes to LUMIGO_LOGS_ENDPOINT with the token and the reason. The report's thread
    may still be connecting when a short program exits: 30 immediate exits all exit cleanly."""
    with running_sink() as sink:
        env = {**base_env(tmp_path), **webhook_env(injector_payload, sink.url + "/v1/traces", "c")}
        script = "import time; time.sleep(0.5); print('ran')"
        ran = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True
        )
        assert (ran.returncode, ran.stdout) == (0, "ran\n"), ran.stderr
        wait_until(sink.logs, timeout=10, what="the stand-down record")
        (record,) = sink.logs()
        reason = "the application already has OpenTelemetry"
        assert record.body == f"tracing not activated: {reason}"
        assert record.attributes == {"lumigo.injector.runtime": "python",
                                     "lumigo.injector.reason": reason}  # fmt: skip
        assert (record.scope, record.authorization) == ("lumigo-injector", f"LumigoToken {TOKEN}")
        assert record.resource["k8s.container.name"] == "c"
        exits = {
            subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True).returncode
            for _ in range(30)
        }
        assert exits == {0}


def test_a_node_stand_down_is_reported_once_and_never_keeps_the_process_alive(
    injector_payload: Path, tmp_path: Path
) -> None:
    """The bootstrap alone, without the distro next to it (a broken payload): one stderr line,
    one record at the proxy; with the proxy unreachable the program still exits at once."""
    bootstrap = tmp_path / "lumigo-bootstrap.js"
    bootstrap.write_text((injector_payload / "nodejs" / "lumigo-bootstrap.js").read_text())
    with running_sink() as sink:
        env = {**base_env(tmp_path), "LUMIGO_TRACER_TOKEN": TOKEN,
               "LUMIGO_LOGS_ENDPOINT": sink.url + "/v1/logs"}  # fmt: skip
        program = ["node", "--require", str(bootstrap), "-e", "setTimeout(() => 0, 300)"]
        ran = subprocess.run(program, env=env, capture_output=True, text=True)
        assert ran.returncode == 0
        (line,) = ran.stderr.splitlines()
        assert line.startswith("lumigo-injector: node: tracing not activated: Cannot find module")
        wait_until(sink.logs, timeout=10, what="the stand-down record")
        (record,) = sink.logs()
        assert record.body == line.removeprefix("lumigo-injector: node: ")
        assert record.attributes["lumigo.injector.runtime"] == "node"
        assert record.authorization == f"LumigoToken {TOKEN}"
    unreachable = {**env, "LUMIGO_LOGS_ENDPOINT": "http://10.255.255.1:4318/v1/logs"}
    started = time.monotonic()
    ran = subprocess.run(["node", "--require", str(bootstrap), "-e", "0"], env=unreachable,
                         capture_output=True, text=True)  # fmt: skip
    assert ran.returncode == 0
    assert time.monotonic() - started < 1.5, "the report's request kept the process alive"
