"""The chart's `telemetryProxy.redaction` values reach the operator's flags (issue 28 item 10):
`helm template` of the real chart, its manager args parsed by the operator's own flag parser."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from controller.options import RunOptions, add_run_flags, run_options
from tests.support.packaging import load_docs, render_chart

RELEASE, NAMESPACE = "lumigo", "lumigo-system"


def manager_options(values: dict[str, Any] | None) -> tuple[list[str], RunOptions]:
    docs = load_docs(render_chart(RELEASE, NAMESPACE, values))
    containers = [
        c
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "manager"
    ]
    assert len(containers) == 1
    args = containers[0]["args"]
    parser = argparse.ArgumentParser()
    add_run_flags(parser)
    return args, run_options(parser.parse_args(args))


def test_no_redaction_by_default() -> None:
    args, options = manager_options(None)
    assert not [a for a in args if "redact" in a]
    assert options.telemetry_redact_env_values is False
    assert options.telemetry_redact_annotations == ()


def test_redaction_values_become_the_operators_flags() -> None:
    patterns = [r"vault\.hashicorp\.com/.*", '.*"quoted".*', ".*password.*"]
    redaction = {"envValues": True, "annotations": patterns}
    args, options = manager_options({"telemetryProxy": {"redaction": redaction}})
    assert "--telemetry-redact-env-values" in args
    assert options.telemetry_redact_env_values is True
    assert options.telemetry_redact_annotations == tuple(patterns)


@pytest.mark.parametrize(
    "redaction",
    [{"annotations": [""]}, {"annotations": "secret"}, {"envValues": "yes"}, {"other": 1}],
)
def test_the_schema_refuses_what_the_operator_would(redaction: dict[str, Any]) -> None:
    with pytest.raises(AssertionError, match="/telemetryProxy/redaction"):
        render_chart(RELEASE, NAMESPACE, {"telemetryProxy": {"redaction": redaction}})


@pytest.mark.parametrize("enricher", [None, False, True])
def test_the_enricher_value_becomes_the_operators_flag(enricher: bool | None) -> None:
    """Issue 29: on by default (the default proxy image is this operator's collector build,
    with lumigo_k8s_enricher); `telemetryProxy.enricher: false` for an upstream image."""
    values = None if enricher is None else {"telemetryProxy": {"enricher": enricher}}
    args, options = manager_options(values)
    want = enricher is not False
    assert ("--telemetry-proxy-enricher" in args) is want
    assert options.telemetry_proxy_enricher is want
