"""`lumigo-operator webhook` (issue 28 item 7): what it refuses before it starts."""

from __future__ import annotations

import pytest

from controller.cli import main


def test_auto_injection_mode_without_the_managers_configmap_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Deciding `auto` needs Nodes and a Pod dry-run, which the webhook's identity may not do:
    it must be told where the manager publishes the mode."""
    code = main(["webhook", "--injection-mode=auto", "--kubeconfig=/nonexistent"])
    assert code == 1
    err = capsys.readouterr().err
    assert "--injection-mode=auto needs --injection-mode-configmap" in err


def test_the_webhook_takes_the_flags_of_its_manifests() -> None:
    """The webhook command parses the manager's flags too (one set of flags for both)."""
    from controller.cli import _parser

    args = _parser().parse_args(["webhook", "--injection-mode-configmap=x", "--no-serve-webhooks",
                                 "--serving-cert-secret=s"])  # fmt: skip
    assert (args.command, args.injection_mode_configmap, args.serving_cert_secret) == (
        "webhook",
        "x",
        "s",
    )
