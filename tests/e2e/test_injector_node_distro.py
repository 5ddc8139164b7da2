"""A Node.js application that itself does `require('@lumigo/opentelemetry')` under the injector.

Apps add their own spans through the distro (Lumigo's documentation shows it): the injected
distro must resolve by name, and the app and the auto-instrumentation must share one tracer (the
app's span is a child of the instrumented SERVER span, one SDK, one export). An app that brings
its own copy in its node_modules keeps it, and is traced once, by that copy. Real node, the real
payload and injector, a real OTLP receiver.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.support.injector import (
    PROGRAMS,
    TOKEN,
    App,
    OtlpReceiver,
    Span,
    base_env,
    node_runtime,
    running_app,
    wait_until,
    webhook_env,
)


def _request_spans(receiver: OtlpReceiver, app: App, route: str) -> tuple[list[Span], Span, dict]:
    """One request to `route`; the SERVER span(s) of it and the app's own span, once arrived."""
    status, seen = app.get(route)
    assert status == 200

    def arrived() -> bool:
        names = [s.name for s in receiver.spans()]
        return receiver.server_span(route) is not None and "app-work" in names

    wait_until(
        arrived,
        timeout=60,
        what=f"the SERVER span of {route} and the app's span (got "
        f"{[s.name for s in receiver.spans()]}); app output:\n{app.output()[-3000:]}",
    )
    servers = [s for s in receiver.spans() if s.kind == 2]
    (own,) = [s for s in receiver.spans() if s.name == "app-work"]
    return servers, own, seen


def _assert_one_tracer(servers: list[Span], own: Span, service: str) -> None:
    # Not traced twice: each copy of the distro would wrap `http` again (one SERVER span each).
    assert len(servers) == 1, [(s.name, s.span_id) for s in servers]
    (server,) = servers
    # One SDK: the app's span is the child of the instrumented request, in the same trace.
    assert (own.trace_id, own.parent_span_id) == (server.trace_id, server.span_id)
    assert own.resource.get("service.name") == server.resource.get("service.name") == service


def test_an_app_that_requires_the_distro_by_name_shares_the_injected_tracer(
    injector_payload: Path, tmp_path: Path
) -> None:
    """The app's own `require('@lumigo/opentelemetry')` gets the distro the injector started (the
    same instance: its `init` resolves to the running SDK), and a span through the app's own
    @opentelemetry/api (the reference's test client's way) joins the same trace; a user's
    NODE_PATH is kept, first."""
    app_dir = tmp_path / "app"
    shutil.copytree(injector_payload / "nodejs" / "node_modules" / "@opentelemetry" / "api",
                    app_dir / "node_modules" / "@opentelemetry" / "api")  # fmt: skip
    shutil.copy(PROGRAMS / "distro_app.js", app_dir / "app.js")
    userlib = tmp_path / "userlib"
    (userlib / "user-module").mkdir(parents=True)
    (userlib / "user-module" / "index.js").write_text("module.exports = 'from NODE_PATH';\n")
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": "distro-by-name",
            "NODE_PATH": str(userlib),
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        with running_app(["node", str(app_dir / "app.js")], env, tmp_path) as app:
            servers, own, seen = _request_spans(receiver, app, "/hello")
            wait_until(lambda: [s for s in receiver.spans() if s.name == "api-work"], timeout=60,
                       what="the span made through the app's own @opentelemetry/api")  # fmt: skip
        _assert_one_tracer(servers, own, "distro-by-name")
        (through_api,) = [s for s in receiver.spans() if s.name == "api-work"]
        assert (through_api.trace_id, through_api.parent_span_id) == (own.trace_id, own.span_id)
        assert receiver.errors == []
        auth = {e.headers.get("Authorization") for e in receiver.exports}
        assert auth == {f"LumigoToken {TOKEN}"}
    nodejs = injector_payload / "nodejs"
    assert seen["env"]["NODE_PATH"] == f"{userlib}:{nodejs / 'node_path'}"
    assert seen["user_module"] == "from NODE_PATH"
    assert seen["distro"].startswith(str(nodejs / "node_path") + "/")
    # The bundle the bootstrap loaded, and no second copy from node_modules.
    assert str(nodejs / "lumigo-distro.js") in seen["loaded"]
    assert not [m for m in seen["loaded"] if "/node_modules/@lumigo/opentelemetry/" in m]
    assert app.output().count("OpenTelemetry Distro v") == 1, app.output()


def test_an_app_with_its_own_copy_of_the_distro_keeps_it_and_is_traced_once(
    injector_payload: Path, tmp_path: Path
) -> None:
    """The app's node_modules has @lumigo/opentelemetry (and what it needs): that copy is the one
    the app gets and the one that traces; the injected one is not loaded at all."""
    app_dir = tmp_path / "app"
    shutil.copytree(injector_payload / "nodejs" / "node_modules", app_dir / "node_modules",
                    symlinks=True)  # fmt: skip
    shutil.copy(PROGRAMS / "distro_app.js", app_dir / "app.js")
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": "own-distro",
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        with running_app(["node", str(app_dir / "app.js")], env, tmp_path) as app:
            servers, own, seen = _request_spans(receiver, app, "/hello")
        _assert_one_tracer(servers, own, "own-distro")
    own_copy = app_dir / "node_modules" / "@lumigo" / "opentelemetry"
    assert seen["distro"].startswith(str(own_copy) + "/")
    # Of the payload, only the bootstrap (which started the app's copy) is loaded.
    ours = [m for m in seen["loaded"] if m.startswith(str(injector_payload))]
    assert ours == [str(injector_payload / "nodejs" / "lumigo-bootstrap.js")], ours
    assert app.output().count("OpenTelemetry Distro v") == 1, app.output()
    assert "tracing not activated" not in app.output()


def test_without_a_token_an_app_that_requires_the_distro_runs_untraced(
    injector_payload: Path, tmp_path: Path
) -> None:
    """The token's Secret key is missing (an optional source): nothing is traced, and an app that
    requires the distro by name still starts instead of failing with `Cannot find module`."""
    with OtlpReceiver() as receiver:
        env = {**base_env(tmp_path), **webhook_env(injector_payload, receiver.endpoint, "c", None)}
        script = (
            "require('@lumigo/opentelemetry').init.then(() => console.log('ran'))"
            ".catch((e) => { console.log('rejected', e.message); process.exitCode = 4; })"
        )
        ran = subprocess.run(["node", "-e", script], env=env, capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)  # fmt: skip
        assert (ran.returncode, ran.stdout.splitlines()[-1:]) == (0, ["ran"]), ran.stderr
        assert receiver.exports == []


def test_a_user_node_path_that_already_has_ours_is_left_as_it_is(
    injector_payload: Path, tmp_path: Path
) -> None:
    """Child processes inherit the edited NODE_PATH: it is not appended to a second time."""
    ours = str(injector_payload / "nodejs" / "node_path")
    env = {
        **base_env(tmp_path),
        "NODE_PATH": f"/somewhere:{ours}",
        **webhook_env(injector_payload, "http://127.0.0.1:9/v1/traces", "c", None),
    }
    script = "console.log(JSON.stringify(process.env.NODE_PATH))"
    ran = subprocess.run(["node", "-e", script], env=env, capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert json.loads(ran.stdout.splitlines()[-1]) == f"/somewhere:{ours}"


def test_a_user_require_of_the_distro_in_node_options_gets_the_injected_one(
    injector_payload: Path, tmp_path: Path
) -> None:
    """`NODE_OPTIONS=--require @lumigo/opentelemetry`, the distro's documented activation, left in
    a workload that no longer ships the distro: it resolves (from the working directory, through
    NODE_PATH) to the one the bootstrap started, which starts once."""
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            **webhook_env(injector_payload, receiver.endpoint, "c"),
            "NODE_OPTIONS": "--require @lumigo/opentelemetry",
        }
        script = (
            "require('@lumigo/opentelemetry').init"
            ".then((sdk) => console.log(typeof sdk.tracerProvider))"
        )
        ran = subprocess.run(["node", "-e", script], env=env, capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)  # fmt: skip
    output = ran.stdout + ran.stderr
    assert (ran.returncode, ran.stdout.splitlines()[-1:]) == (0, ["object"]), output
    assert output.count("OpenTelemetry Distro v") == 1, output


def test_an_es_module_that_imports_the_distro_by_name_gets_the_injected_one(
    injector_payload: Path, tmp_path: Path
) -> None:
    """`import { init } from '@lumigo/opentelemetry'` does not read NODE_PATH; on a Node.js with
    module.registerHooks (the node-app image's 22) the bootstrap's resolve hook gives it the
    injected distro, the same instance, started once."""
    node = node_runtime()
    app = tmp_path / "app.mjs"
    app.write_text(
        "import { init } from '@lumigo/opentelemetry';\n"
        "const sdk = await init;\n"
        "console.log(typeof sdk.tracerProvider);\n"
    )
    with OtlpReceiver() as receiver:
        env = {**base_env(tmp_path), **webhook_env(injector_payload, receiver.endpoint, "c")}
        ran = subprocess.run([str(node), str(app)], env=env, capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)  # fmt: skip
    output = ran.stdout + ran.stderr
    assert (ran.returncode, ran.stdout.splitlines()[-1:]) == (0, ["object"]), output
    assert output.count("OpenTelemetry Distro v") == 1, output
