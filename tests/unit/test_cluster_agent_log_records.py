"""The cluster agent's container-log records as the reference sends them (issue 29 item 2): the
scope `lumigo-operator.log_file_collector`, and a JSON-object line parsed into a map body while
any other line stays a string. The real collector's behaviour on such lines is in
tests/integration/test_cluster_agent_logs.py."""

from __future__ import annotations

from controller.telemetry.agent_config import (
    JSON_BODY,
    LOG_FILE_SCOPE,
    AgentSettings,
    MetricsSettings,
    build_agent,
)
from controller.telemetry.config import ProxySettings


def test_log_file_records_carry_the_reference_scope_name() -> None:
    assert LOG_FILE_SCOPE == "lumigo-operator.log_file_collector"
    config = build_agent(AgentSettings("ops", metrics=MetricsSettings(enabled=True)))
    pipelines = config["service"]["pipelines"]
    logs = pipelines["logs/container-files"]["processors"]
    (scope,) = [p for p in logs if p.startswith("transform/") and p != "transform/root_owner"]
    (block,) = config["processors"][scope]["log_statements"]
    assert block == {
        "context": "scope",
        "statements": [f'set(name, "{LOG_FILE_SCOPE}")'],
    }
    # Only the log records: the metrics keep their receivers' scopes.
    for name, pipeline in pipelines.items():
        if name.startswith("metrics/"):
            assert scope not in pipeline["processors"]


def test_a_json_object_line_becomes_a_map_body_and_any_other_line_stays_a_string() -> None:
    # With an upstream collector image: stanza's json_parser.
    config = build_agent(AgentSettings("ops"))
    assert JSON_BODY not in config["processors"]
    operators = config["receivers"]["filelog"]["operators"]
    parser = operators[-1]
    # After the runtime's format and the multi-line joining: the whole record is parsed.
    assert [o["type"] for o in operators[:-1]] == ["container", "recombine"]
    assert parser["type"] == "json_parser"
    assert parser["parse_to"] == "body"
    # Only what looks like an object is tried; a failure keeps the line and logs nothing (a
    # tenant's malformed lines cannot flood the agent's own log).
    assert parser["if"] == 'body matches "^\\\\s*\\\\{"'
    assert parser["on_error"] == "send_quiet"


def test_our_collector_parses_json_bodies_with_its_own_processor_first() -> None:
    # An image of this operator's distribution (collector/lumigojsonbody): the same maps, cheaper;
    # its Go tests compare every body with the json_parser's.
    config = build_agent(AgentSettings("ops", proxy=ProxySettings(k8s_enricher=True)))
    operators = config["receivers"]["filelog"]["operators"]
    assert [o["type"] for o in operators] == ["container", "recombine"]
    logs = config["service"]["pipelines"]["logs/container-files"]["processors"]
    assert logs[0] == JSON_BODY == "lumigo_json_body"
    assert config["processors"][JSON_BODY] == {}
    # Only the container logs' pipeline has it.
    metrics = build_agent(
        AgentSettings(
            "ops", metrics=MetricsSettings(enabled=True), proxy=ProxySettings(k8s_enricher=True)
        )
    )["service"]["pipelines"]
    assert [n for n, p in metrics.items() if JSON_BODY in p["processors"]] == [
        "logs/container-files"
    ]


def test_without_logs_there_is_no_log_processor() -> None:
    config = build_agent(AgentSettings("ops", logs=False, metrics=MetricsSettings(enabled=True)))
    assert "transform/log_files" not in config["processors"]
