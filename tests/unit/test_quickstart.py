"""`lumigo-operator quickstart` (issue 29 item 5): the reference's defaults and upgrade rules,
which Lumigo is the release's, and bad input refused with a message naming the entry. The
create/update flow against the API server is in tests/e2e/test_packaging_helm.py."""

from __future__ import annotations

from typing import Any

import pytest

from controller.cli import main
from controller.lumigo.quickstart import (
    Setting,
    is_ours,
    new_lumigo,
    parse_settings,
    update_patch,
)


def lumigo(tracing: bool | None, logging: bool | None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if tracing is not None:
        spec["tracing"] = {"enabled": tracing}
    if logging is not None:
        spec["logging"] = {"enabled": logging}
    return {"metadata": {"name": "lumigo"}, "spec": spec}


def test_created_with_tracing_and_logging_on_unless_the_entry_says() -> None:
    (plain, off) = parse_settings(
        '[{"namespace": "a"}, {"namespace": "b", "tracingEnabled": false, "loggingEnabled": false}]'
    )
    body = new_lumigo(plain, "lumigo", "lumigo-credentials", "token")
    assert body["spec"] == {
        "lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}},
        "tracing": {"enabled": True},
        "logging": {"enabled": True},
    }
    assert is_ours(body, "lumigo")
    assert not is_ours(body, "other-release")
    body = new_lumigo(off, "lumigo", "s", "k")
    assert (body["spec"]["tracing"], body["spec"]["logging"]) == ({"enabled": False},) * 2


@pytest.mark.parametrize(
    ("existing", "entry", "patch"),
    [
        # Given flags are set; the others keep their value (a user's edit).
        ((True, False), {"tracingEnabled": False}, {"tracing": {"enabled": False}}),
        ((True, False), {"loggingEnabled": True}, {"logging": {"enabled": True}}),
        ((False, True), {}, {}),
        ((True, True), {"tracingEnabled": True, "loggingEnabled": True}, {}),
        # A Lumigo with no value: the operator's defaults (tracing on, logging off).
        ((None, None), {}, {"tracing": {"enabled": True}, "logging": {"enabled": False}}),
        ((None, None), {"loggingEnabled": True},
         {"tracing": {"enabled": True}, "logging": {"enabled": True}}),
    ],
)  # fmt: skip
def test_an_upgrade_sets_the_flags_the_entry_gives(
    existing: tuple[bool | None, bool | None], entry: dict[str, bool], patch: dict[str, Any]
) -> None:
    (setting,) = parse_settings(f'[{{"namespace": "a", {", ".join(_pairs(entry))}}}]'
                                if entry else '[{"namespace": "a"}]')  # fmt: skip
    assert update_patch(lumigo(*existing), setting) == ({"spec": patch} if patch else {})


def _pairs(entry: dict[str, bool]) -> list[str]:
    return [f'"{k}": {str(v).lower()}' for k, v in entry.items()]


def test_which_lumigo_is_the_releases() -> None:
    sample = {"metadata": {"labels": {"app.kubernetes.io/instance": "lumigo"}}}
    assert not is_ours(sample, "lumigo"), "the seed README's sample carries the same label"
    older_chart = {"metadata": {"labels": {"app.kubernetes.io/instance": "lumigo"},
                                "annotations": {"helm.sh/hook": "post-install"}}}  # fmt: skip
    assert is_ours(older_chart, "lumigo")
    assert not is_ours(older_chart, "other")
    assert not is_ours({"metadata": {}}, "lumigo")


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ("not json", "not JSON"),
        ('{"namespace": "a"}', "JSON list"),
        ('["a"]', "monitoredNamespaces[0] must be an object"),
        ('[{"namespace": "Not_A_Namespace"}]', '.namespace "Not_A_Namespace" is not'),
        ('[{"namespace": "a\\n"}]', "is not a namespace name"),
        ('[{"namespace": "' + "a" * 64 + '"}]', "is not a namespace name"),
        ('[{}]', "monitoredNamespaces[0].namespace null"),
        ('[{"namespace": "a", "tracingEnabled": "yes"}]', "tracingEnabled must be true or false"),
        ('[{"namespace": "a", "logging": true}]', "unknown field(s) logging"),
        ('[{"namespace": "a"}, {"namespace": "a"}]', "lists a more than once"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_naming_the_entry(settings: str, words: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_settings(settings)
    assert words in str(err.value)


def test_the_command_fails_on_bad_settings_before_reaching_the_api(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["quickstart", "--release=lumigo", '--settings=[{"namespace": "No"}]',
                 "--kubeconfig=/nonexistent"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("lumigo-operator quickstart: monitoredNamespaces[0].namespace")
    assert "Traceback" not in err


def test_setting_flags_are_none_when_not_given() -> None:
    assert parse_settings('[{"namespace": "a"}]') == [
        Setting("a", {"tracing": None, "logging": None})
    ]
