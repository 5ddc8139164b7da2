"""Redaction of what the object collection sends upstream (issue 28 item 10): the rendered
configuration, the flags, and the expressions themselves on JSON as the collector writes it.
What the real collector does with them: tests/e2e/test_telemetry_events.py."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import pytest
import yaml

from controller.options import add_run_flags, run_options
from controller.telemetry.config import MonitoredNamespace, ProxySettings, build, render
from controller.telemetry.redaction import (
    NAME_VALUE,
    REDACTED,
    InvalidRedactionError,
    Redaction,
    parse_patterns,
)

NAMESPACES = [
    MonitoredNamespace("team-a", "uid-a", "t_" + "a" * 21),
    MonitoredNamespace("team-b", "uid-b", "t_" + "b" * 21),
]


def events_pipelines(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config["service"]["pipelines"].items() if k.startswith("logs/ns-")}


def test_off_by_default_and_the_configuration_is_unchanged() -> None:
    """As the reference: whole objects, so the backend keeps reading what it reads today; and
    an upgrade renders the same bytes (no proxy restart)."""
    default = render(NAMESPACES, ProxySettings())
    assert default == render(NAMESPACES, ProxySettings(redaction=Redaction()))
    assert "transform/redact" not in default
    assert REDACTED not in default


@pytest.mark.parametrize(
    "redaction",
    [Redaction(env_values=True), Redaction(annotations=("secret/.*",))],
    ids=["env", "annotations"],
)
@pytest.mark.parametrize("enricher", [False, True], ids=["upstream-image", "enricher"])
def test_redaction_runs_before_anything_reads_or_sends_the_objects(
    redaction: Redaction, enricher: bool
) -> None:
    """Right after the watch events are unwrapped and the enricher added the objects it sends
    (issue 29 item 1): before any other processor of every events pipeline."""
    config = build(NAMESPACES, ProxySettings(redaction=redaction, k8s_enricher=enricher))
    pipelines = events_pipelines(config)
    assert sorted(pipelines) == ["logs/ns-team-a", "logs/ns-team-b"]
    first = [
        "transform/k8s_objects",
        "filter/events",
        *(["lumigo_k8s_enricher"] if enricher else []),
    ]
    for pipeline in pipelines.values():
        assert pipeline["processors"][: len(first) + 1] == [*first, "transform/redact"]
    processor = config["processors"]["transform/redact"]
    assert processor["error_mode"] == "propagate"  # fails closed: never unredacted
    assert processor["log_statements"]
    # the tracers' pipelines (spans and logs a pod sends itself) are not object collection
    for name, pipeline in config["service"]["pipelines"].items():
        if not name.startswith("logs/ns-"):
            assert "transform/redact" not in pipeline["processors"], name


def test_env_statements_reach_every_pod_spec_and_container_list() -> None:
    statements = "\n".join(
        build(NAMESPACES, ProxySettings(redaction=Redaction(env_values=True)))["processors"][
            "transform/redact"
        ]["log_statements"]
    )
    for spec in (
        'log.body["spec"]',
        'log.body["spec"]["template"]["spec"]',
        'log.body["spec"]["jobTemplate"]["spec"]["template"]["spec"]',
    ):
        assert f'set(log.cache["spec"], {spec})' in statements
        assert f'set({spec}, log.cache["spec"])' in statements
    for kind in ("Pod", "Deployment", "DaemonSet", "ReplicaSet", "StatefulSet", "Job", "CronJob"):
        assert f'log.body["kind"] == "{kind}"' in statements
    for name in ("containers", "initContainers", "ephemeralContainers"):
        assert f'String(log.cache["spec"]["{name}"][0]["env"])' in statements


def test_the_replacement_group_is_written_for_the_collector() -> None:
    """`$` is the collector's expansion character: the rendered text says `$${1}`, which the
    collector reads as the regexp group `${1}`."""
    text = render(NAMESPACES, ProxySettings(redaction=Redaction(env_values=True)))
    assert "$${1}" in text
    assert re.search(r"(?<!\$)\$\{1\}", text) is None


def test_annotation_patterns_are_anchored_and_quoted() -> None:
    redaction = Redaction(annotations=("vault\\.hashicorp\\.com/.*", 'team/"quoted"'))
    statements = build(NAMESPACES, ProxySettings(redaction=redaction))["processors"][
        "transform/redact"
    ]["log_statements"]
    keep = [s for s in statements if s.startswith("keep_matching_keys(")]
    assert len(keep) == 4  # object, pod template, job template, its pod template
    assert keep[0].endswith(
        '"^(?:(?:vault\\\\.hashicorp\\\\.com/.*)|(?:team/\\"quoted\\"))$") '
        'where log.cache["annotations"]["0"] != nil'
    )


def go_json(value: Any) -> str:
    """JSON as Go's encoding/json writes a map (what OTTL's String gives): sorted keys,
    compact. (`<`, `>`, `&` escaped too: not needed here.)"""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def redact(text: str) -> str:
    """NAME_VALUE applied as replace_pattern applies it (Python's re agrees with RE2 on it)."""
    return re.sub(NAME_VALUE, lambda m: f'{{"name":{m.group(1)},"value":"{REDACTED}"}}', text)


def test_the_env_expression_replaces_literal_values_only() -> None:
    env = [
        {"name": "PASSWORD", "value": 'hunter2 "quoted" \\ {"name":"x","value":"y"}'},
        {"name": "EMPTY", "value": ""},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": 'WEIRD "NAME"', "value": "v"},
    ]
    assert json.loads(redact(go_json(env))) == [
        {"name": "PASSWORD", "value": REDACTED},
        {"name": "EMPTY", "value": REDACTED},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": 'WEIRD "NAME"', "value": REDACTED},
    ]


@pytest.mark.parametrize(
    "redaction",
    [Redaction(env_values=True), Redaction(annotations=("x",))],
    ids=["env", "annotations"],
)
def test_the_last_applied_configuration_is_redacted_whole(redaction: Redaction) -> None:
    """kubectl's JSON copy of the applied object holds the same env values and annotations."""
    statements = build(NAMESPACES, ProxySettings(redaction=redaction))["processors"][
        "transform/redact"
    ]["log_statements"]
    applied = '["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]'
    obj = 'log.body["metadata"]'  # the object itself: config.py unwraps watch events
    assert f'set({obj}{applied}, "{REDACTED}") where {obj}{applied} != nil' in statements


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('["(?=x)"]', "not RE2"),
        ('["a(?!b)"]', "not RE2"),
        ('["(a)\\\\1"]', "not RE2"),
        ('["(?>a)"]', "not RE2"),
        ('["("]', "invalid annotation pattern '\\('"),
        ('[""]', "non-empty"),
        ("[1]", "non-empty regular expression"),
        ('"secret"', "expected a JSON list"),
        ("[secret", "not JSON"),
    ],
)
def test_patterns_the_collector_would_refuse_are_refused_with_a_clear_message(
    text: str, message: str
) -> None:
    with pytest.raises(InvalidRedactionError, match=message):
        parse_patterns(text)


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    add_run_flags(parser)
    default = run_options(parser.parse_args([]))
    assert default.telemetry_redact_env_values is False
    assert default.telemetry_redact_annotations == ()
    on = run_options(
        parser.parse_args(
            ["--telemetry-redact-env-values", '--telemetry-redact-annotations=["secret/.*"]']
        )
    )
    assert on.telemetry_redact_env_values is True
    assert on.telemetry_redact_annotations == ("secret/.*",)
    with pytest.raises(SystemExit):
        parser.parse_args(['--telemetry-redact-annotations=["(?=x)"]'])


def test_a_redacting_configuration_is_valid_yaml_of_the_same_shape() -> None:
    text = render(NAMESPACES, ProxySettings(redaction=Redaction(True, ("secret/.*",))))
    config = yaml.safe_load(text)
    assert "transform/redact" in config["processors"]
