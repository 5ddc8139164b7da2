"""The cluster agent's container-log records from the real collector (the project's build running
the rendered agent configuration) against a real API server and an OTLP sink (issue 29 item 2):
the reference's scope name; a JSON-object line becomes a map body, every other line stays the
string it was; a huge or hostile JSON line neither stops nor delays the lines after it."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.kube import KubeClient
from controller.telemetry.agent_config import LOG_FILE_SCOPE, AgentSettings, render_agent
from envtest.cluster import FAKE_NODE
from envtest.process import wait_until
from kube.kinds import PODS
from tests.support.otel import Collector, LogSeen, OTLPSink, local_settings, running_sink

TOKEN = "t_0123456789abcdef01234"
DEEP = 150_000  # nesting levels of the hostile line (900 kB with its closing brackets)


@pytest.fixture
def sink() -> Iterator[OTLPSink]:
    with running_sink() as running:
        yield running


def cri(line: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    return f"{stamp} stdout F {line}\n"


def agent(tmp_path: Path, namespace: str, sink_url: str, env: dict[str, str]) -> Collector:
    proxy = local_settings(sink_url, namespace)
    settings = AgentSettings(
        "lumigo-system",
        proxy=proxy,
        pods_dir=str(tmp_path / "pods"),
        state_dir=str(tmp_path / "state"),
    )
    run = tmp_path / "agent"
    run.mkdir()
    env = {**env, "K8S_NODE_NAME": FAKE_NODE, "LUMIGO_CLUSTER_TOKEN": TOKEN}
    return Collector(render_agent(settings), run, proxy.health_port, env)


def last_line_seen(sink: OTLPSink) -> bool:
    return any(isinstance(r.body, dict) and r.body.get("message") == "last" for r in sink.logs())


def test_json_lines_become_maps_and_other_lines_stay_strings(
    kube: KubeClient, cluster: Any, namespace: str, sink: OTLPSink, tmp_path: Path
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "writer", "namespace": namespace},
        "spec": {"nodeName": FAKE_NODE, "containers": [{"name": "app", "image": "app:test"}]},
    }
    uid = kube.create(PODS, pod, namespace)["metadata"]["uid"]
    path = tmp_path / "pods" / f"{namespace}_writer_{uid}" / "app" / "0.log"
    path.parent.mkdir(parents=True)
    tag = "t-" + uid[:8]
    big = "y" * 600_000
    lines = [
        # Indented, but the file's first record (nothing to join it to): still an object.
        "  " + json.dumps({"tag": tag, "message": "indented first record"}),
        json.dumps({"tag": tag, "message": "hello", "level": "info", "n": 3, "ok": True}),
        f"{tag} a plain line",
        "null",  # JSON, but not an object: stays text (not an empty map)
        "42",
        f"{{{tag} looks like an object but is not",
        json.dumps([tag, "an array stays text"]),
        f'  {{"tag": "{tag}", "message": "indented: a continuation line"}}',
        '{"a":' * DEEP + f'"{tag}"' + "}" * DEEP,  # hostile: nested deeper than any parser goes
        json.dumps({"tag": tag, "message": big}),
        json.dumps({"tag": tag, "message": "last"}),
    ]
    path.write_text("".join(cri(line) for line in lines))

    collector = agent(tmp_path, namespace, sink.url, cluster.env()).start()
    try:
        wait_until(lambda: last_line_seen(sink), 60, "the last line")
        assert collector.alive(), collector.log_tail()
    finally:
        collector.stop()

    seen: list[LogSeen] = sink.logs()  # this test's file is the only one the agent reads
    assert {r.scope for r in seen} == {LOG_FILE_SCOPE}
    maps = [r.body for r in seen if isinstance(r.body, dict)]
    strings = [r.body for r in seen if isinstance(r.body, str)]
    assert maps[0] == {"tag": tag, "message": "indented first record"}
    assert maps[1] == {"tag": tag, "message": "hello", "level": "info", "n": 3, "ok": True}
    assert [m["message"] for m in maps[2:]] == [big, "last"]
    assert f"{tag} a plain line" in strings
    assert "null" in strings
    assert "42" in strings
    assert f"{{{tag} looks like an object but is not" in strings
    # The indented line is a continuation, joined to the line before it, which stays text.
    continued = f'\n  {{"tag": "{tag}", "message": "indented: a continuation line"}}'
    assert json.dumps([tag, "an array stays text"]) + continued in strings
    (deep,) = [s for s in strings if s.startswith('{"a":{"a":')]
    assert deep.endswith("}" * 10)
    for record in seen:
        assert record.resource["k8s.pod.uid"] == uid
        # From the file's path, as the reference's log-file collector sends them.
        assert record.resource["k8s.container.name"] == "app"
        assert record.resource["k8s.container.restart_count"] == "0"
        assert record.authorization == f"LumigoToken {TOKEN}"
