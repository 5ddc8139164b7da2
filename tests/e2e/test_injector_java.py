"""A real JVM (the host's OpenJDK) under the injector: the OpenTelemetry Java agent of the payload
is activated through JAVA_TOOL_OPTIONS and exports the app's spans to a real OTLP receiver with the
LumigoToken header; a JVM that has its own -javaagent keeps it and gets nothing of ours; without
a token nothing changes. The app is the node tier's JVM test app (hack/images/jvm-app)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.injector import (
    TOKEN,
    OtlpReceiver,
    base_env,
    http_attribute,
    running_app,
    wait_until,
    webhook_env,
)

ROOT = Path(__file__).resolve().parents[2]
APP_SOURCE = ROOT / "hack" / "images" / "jvm-app" / "App.java"
OWN_AGENT = """
public final class OwnAgent {
    public static void premain(String args) { System.out.println("own agent loaded"); }
}
"""

pytestmark = pytest.mark.skipif(shutil.which("javac") is None, reason="no JDK on this machine")


@pytest.fixture(scope="module")
def jvm_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """App.java compiled; with OwnAgent.jar, a -javaagent of the user's own, beside it."""
    out = tmp_path_factory.mktemp("jvm-app")
    subprocess.run(["javac", "-d", str(out), str(APP_SOURCE)], check=True)
    (out / "OwnAgent.java").write_text(OWN_AGENT)
    subprocess.run(["javac", "-d", str(out), str(out / "OwnAgent.java")], check=True)
    (out / "manifest.txt").write_text("Premain-Class: OwnAgent\n")
    subprocess.run(["jar", "cfm", str(out / "OwnAgent.jar"), str(out / "manifest.txt"), "-C",
                    str(out), "OwnAgent.class"], check=True)  # fmt: skip
    return out


def java(app: Path) -> list[str]:
    return ["java", "-cp", str(app), "App"]


def test_a_jvm_is_traced_by_the_java_agent(
    jvm_app: Path, injector_payload: Path, tmp_path: Path
) -> None:
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            "OTEL_SERVICE_NAME": "jvm-app",
            **webhook_env(injector_payload, receiver.endpoint, "app"),
        }
        with running_app(java(jvm_app), env, tmp_path) as app:
            status, seen = app.get("/hello")
            assert status == 200
            assert seen["traced"] is True
            agent = injector_payload / "java" / "opentelemetry-javaagent.jar"
            assert seen["env"]["JAVA_TOOL_OPTIONS"] == f"-javaagent:{agent}"
            wait_until(
                lambda: receiver.server_span("/hello") is not None,
                timeout=90,
                what=f"a SERVER span for /hello (got {[s.name for s in receiver.spans()]}); "
                f"app output:\n{app.output()[-3000:]}",
            )
            span = receiver.server_span("/hello")
            assert span is not None
            assert span.resource.get("service.name") == "jvm-app"
            assert span.resource.get("telemetry.sdk.language") == "java"
            assert http_attribute(span, "http.method", "http.request.method") == "GET"
            auth = {e.headers.get("Authorization") for e in receiver.exports}
            assert auth == {f"LumigoToken {TOKEN}"}
            assert {e.path for e in receiver.exports} == {"/v1/traces"}  # metrics, logs: off
        # The token never appears in what the JVM prints (it prints JAVA_TOOL_OPTIONS).
        assert "Picked up JAVA_TOOL_OPTIONS" in app.output()
        assert TOKEN not in app.output()


def test_a_jvm_with_its_own_agent_keeps_it_and_gets_nothing_of_ours(
    jvm_app: Path, injector_payload: Path, tmp_path: Path
) -> None:
    own = f"-javaagent:{jvm_app / 'OwnAgent.jar'}"
    with OtlpReceiver() as receiver:
        for how in ("JAVA_TOOL_OPTIONS", "command line"):
            env = {**base_env(tmp_path), **webhook_env(injector_payload, receiver.endpoint, "app")}
            args = java(jvm_app)
            if how == "JAVA_TOOL_OPTIONS":
                env["JAVA_TOOL_OPTIONS"] = own
            else:
                args = ["java", own, "-cp", str(jvm_app), "App"]
            with running_app(args, env, tmp_path) as app:
                status, seen = app.get("/hello")
                assert status == 200
                assert seen["env"]["JAVA_TOOL_OPTIONS"] == (own if how != "command line" else None)
            assert "own agent loaded" in app.output()
        assert receiver.exports == []


def test_a_jvm_with_its_own_agent_after_a_long_classpath_keeps_it(
    jvm_app: Path, injector_payload: Path, tmp_path: Path
) -> None:
    """The user's -javaagent after a 110 KiB classpath (a JVM with many dependencies): it is
    found on the command line however far into it it is, so the JVM is not instrumented twice."""
    own = f"-javaagent:{jvm_app / 'OwnAgent.jar'}"
    dependencies = [f"/nonexistent/lib/dependency-{i:05}.jar" for i in range(2900)]
    classpath = ":".join([*dependencies, str(jvm_app)])
    assert 100 * 1024 < len(classpath) < 128 * 1024  # one argument's limit (MAX_ARG_STRLEN)
    with OtlpReceiver() as receiver:
        env = {**base_env(tmp_path), **webhook_env(injector_payload, receiver.endpoint, "app")}
        with running_app(["java", "-cp", classpath, own, "App"], env, tmp_path) as app:
            status, seen = app.get("/hello")
            assert status == 200
            assert seen["env"]["JAVA_TOOL_OPTIONS"] is None
        assert "own agent loaded" in app.output()
        assert "Picked up JAVA_TOOL_OPTIONS" not in app.output()
        assert receiver.exports == []


def test_a_jvm_without_a_token_runs_untouched(
    jvm_app: Path, injector_payload: Path, tmp_path: Path
) -> None:
    with OtlpReceiver() as receiver:
        env = {
            **base_env(tmp_path),
            **webhook_env(injector_payload, receiver.endpoint, "app", None),
        }
        with running_app(java(jvm_app), env, tmp_path) as app:
            status, seen = app.get("/hello")
            assert status == 200
            assert seen["traced"] is False
            assert seen["env"]["JAVA_TOOL_OPTIONS"] is None
        assert "JAVA_TOOL_OPTIONS" not in app.output()
        assert receiver.exports == []
