"""A user's LD_PRELOAD from an optional source (issue 28, item 9): when the ConfigMap or Secret
(or its key) is missing, the kubelet leaves the variable unset and a `$(VAR)` reference to it
verbatim, so `LD_PRELOAD=<ours>:$(LUMIGO_ORIGINAL_LD_PRELOAD)` made ld.so print an error in every
process. Such a source is never referenced with `$(...)`: LD_PRELOAD is ours alone and the
injector chains the user's value when it is there (tests/e2e/test_injector_ld_preload.py runs
real processes)."""

from __future__ import annotations

from typing import Any

import pytest

from api import constants
from webhook.pod_injection import CHAINED_LD_PRELOAD, InjectionSettings, inject, remove

from .webhook_samples import simple_template, template_of, workload

SETTINGS = InjectionSettings(operator_version="1.2.3")
OURS = constants.LD_PRELOAD_VALUE
JSON = dict[str, Any]

OPTIONAL = [
    {"configMapKeyRef": {"name": "preload", "key": "libs", "optional": True}},
    {"secretKeyRef": {"name": "preload", "key": "libs", "optional": True}},
]
ALWAYS_THERE = [
    {"configMapKeyRef": {"name": "preload", "key": "libs"}},
    {"configMapKeyRef": {"name": "preload", "key": "libs", "optional": False}},
    {"secretKeyRef": {"name": "preload", "key": "libs"}},
    {"fieldRef": {"fieldPath": "metadata.annotations['preload']"}},
]


def with_user_preload(source: JSON) -> JSON:
    template = simple_template()
    template["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "valueFrom": source}]
    return workload("Deployment", template)


def env_of(obj: JSON) -> list[JSON]:
    env: list[JSON] = template_of(obj)["spec"]["containers"][0]["env"]
    return env


@pytest.mark.parametrize("source", OPTIONAL)
def test_an_optional_source_is_never_referenced_with_a_dollar_paren(source: JSON) -> None:
    obj = with_user_preload(source)
    out = inject(obj, SETTINGS)
    env = env_of(out)
    preload = next(e for e in env if e["name"] == "LD_PRELOAD")
    assert preload == {"name": "LD_PRELOAD", "value": OURS}
    assert "$(" not in str(env)
    # Kept for the injector (and for removal), under our name.
    assert {"name": constants.ENV_ORIGINAL_LD_PRELOAD, "valueFrom": source} in env
    assert inject(out, SETTINGS) == out
    assert remove(out) == obj


@pytest.mark.parametrize("source", OPTIONAL)
def test_a_workload_chained_by_an_earlier_version_is_repaired(source: JSON) -> None:
    obj = with_user_preload(source)
    earlier = inject(obj, SETTINGS)
    env_of(earlier)[1:2] = [{"name": "LD_PRELOAD", "value": CHAINED_LD_PRELOAD}]
    env_of(earlier)[0] = {"name": constants.ENV_ORIGINAL_LD_PRELOAD, "valueFrom": source}
    out = inject(earlier, SETTINGS)
    assert {"name": "LD_PRELOAD", "value": OURS} in env_of(out)
    assert "$(" not in str(env_of(out))
    assert remove(out) == obj


@pytest.mark.parametrize("source", ALWAYS_THERE)
def test_a_source_that_is_always_set_stays_chained(source: JSON) -> None:
    obj = with_user_preload(source)
    out = inject(obj, SETTINGS)
    env = env_of(out)
    assert env[0] == {"name": constants.ENV_ORIGINAL_LD_PRELOAD, "valueFrom": source}
    assert env[1] == {"name": "LD_PRELOAD", "value": CHAINED_LD_PRELOAD}
    assert remove(out) == obj


def test_a_literal_value_stays_chained() -> None:
    template = simple_template()
    template["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/a.so"}]
    out = inject(workload("Deployment", template), SETTINGS)
    assert {"name": "LD_PRELOAD", "value": CHAINED_LD_PRELOAD} in env_of(out)
