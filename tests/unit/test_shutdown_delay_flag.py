"""--shutdown-delay: 5 s by default (a pod behind a Service), a duration, or the environment."""

from __future__ import annotations

import pytest

from controller.cli import _parser
from controller.options import run_options


def parse(*args: str) -> float:
    return run_options(_parser().parse_args(["run", *args])).shutdown_delay


def test_the_delay_defaults_to_5_s_and_takes_a_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LUMIGO_SHUTDOWN_DELAY", raising=False)
    assert parse() == 5.0
    assert parse("--shutdown-delay=0") == 0.0
    assert parse("--shutdown-delay=1500ms") == 1.5
    monkeypatch.setenv("LUMIGO_SHUTDOWN_DELAY", "10s")
    assert parse() == 10.0


def test_a_bad_delay_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--shutdown-delay=soon")
    assert "--shutdown-delay" in capsys.readouterr().err
