"""The `lumigo-operator` command: `run`, `webhook`, `uninstall`, `wait-for-webhook`, `quickstart`,
`check`, `watchdog`, `version`.

Errors exit non-zero with one line that says what went wrong (no stack trace for expected
failures such as an unreachable API server or a missing kubeconfig).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from api import __version__, constants
from controller.flag_table import add_flags
from controller.options import (
    CheckOptions,
    QuickstartOptions,
    RunOptions,
    UninstallOptions,
    WaitOptions,
    WatchdogOptions,
    run_options,
)
from kube.rest import ApiError

log = logging.getLogger("lumigo.cli")


# Each subcommand: its name, the options its flags come from, and its help.
SUBCOMMANDS: tuple[tuple[str, type[object], str], ...] = (
    ("run", RunOptions, "run the manager (controller, webhooks, probes, metrics)"),
    (
        "webhook",
        RunOptions,
        "serve admissions only (workers, probes, metrics: no controller, no leader election, "
        "no certificate signing), under an identity of its own; the manager runs with "
        "--no-serve-webhooks. Takes the flags of `run`",
    ),
    (
        "uninstall",
        UninstallOptions,
        "delete every Lumigo resource and remove all instrumentation (Helm pre-delete hook)",
    ),
    (
        "wait-for-webhook",
        WaitOptions,
        "wait until the API server reaches the Lumigo defaulter webhook (Helm quick-start "
        "hook: a Lumigo created earlier would be refused)",
    ),
    (
        "quickstart",
        QuickstartOptions,
        "create or update the `lumigo` Lumigo of each monitoredNamespaces entry (Helm "
        "post-install/post-upgrade hook); a Lumigo the release did not create is left alone",
    ),
    (
        "check",
        CheckOptions,
        "check that the webhook and the telemetry proxy answer (the chart's `helm test`)",
    ),
    (
        "watchdog",
        WatchdogOptions,
        "report the installation's health (pods, restarts, metrics, events) upstream",
    ),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lumigo-operator",
        description="Lumigo Kubernetes operator: trace every Python, Node.js and Java workload "
        "of a namespace with one Lumigo resource.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, options, help_text in SUBCOMMANDS:
        add_flags(sub.add_parser(name, help=help_text), options)
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "version":
        print(f"lumigo-operator {__version__}")
        return 0
    from controller.runtime.logs import setup_logging  # noqa: PLC0415 - only for commands that log

    setup_logging(args.log_level)
    try:
        if args.command == "run":
            from controller.operator import run  # noqa: PLC0415 - heavy imports only for run

            return run(run_options(args))
        if args.command == "webhook":
            from controller.webhook_command import run_webhook  # noqa: PLC0415

            return run_webhook(run_options(args))
        if args.command == "wait-for-webhook":
            return _wait_for_webhook(args)
        if args.command == "quickstart":
            return _quickstart(args)
        if args.command == "check":
            return _check(args)
        if args.command == "watchdog":
            from controller.telemetry.watchdog_cli import run_watchdog  # noqa: PLC0415

            return run_watchdog(args)
        return _uninstall(args)
    except ApiError as err:
        print(f"lumigo-operator {args.command}: Kubernetes API error: {err}", file=sys.stderr)
    except (OSError, ValueError, TimeoutError) as err:
        print(f"lumigo-operator {args.command}: {err}", file=sys.stderr)
    return 1


def _wait_for_webhook(args: argparse.Namespace) -> int:
    from controller.lumigo.defaulter_probe import wait_until_admitted  # noqa: PLC0415
    from controller.runtime.kube import KubeClient  # noqa: PLC0415

    client = KubeClient.from_env(args.kubeconfig, user_agent=constants.USER_AGENT)
    took = wait_until_admitted(client, args.namespace, args.timeout)
    print(
        f"lumigo-operator wait-for-webhook: a Lumigo in {args.namespace} is admitted "
        f"(after {took:.1f} s)"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from controller.lumigo import install_check  # noqa: PLC0415
    from controller.lumigo.defaulter_probe import wait_until_admitted  # noqa: PLC0415
    from controller.runtime.kube import KubeClient  # noqa: PLC0415

    client = KubeClient.from_env(args.kubeconfig, user_agent=constants.USER_AGENT)

    def webhook() -> str:
        try:
            took = wait_until_admitted(client, args.namespace, args.timeout)
        except ApiError as err:
            raise ValueError(err.message) from None
        return f"the API server reaches the webhook (a dry-run Lumigo admitted in {took:.1f} s)"

    report = install_check.run(
        {
            "webhook": webhook,
            "telemetry proxy": lambda: install_check.proxy_refuses_the_unauthenticated(
                args.proxy_url, args.timeout
            ),
        }
    )
    for passed in report.passed:
        print(f"lumigo-operator check: ok: {passed}")
    for failed in report.failed:
        print(f"lumigo-operator check: failed: {failed}", file=sys.stderr)
    return 1 if report.failed else 0


def _quickstart(args: argparse.Namespace) -> int:
    from controller.lumigo import quickstart  # noqa: PLC0415
    from controller.lumigo.defaulter_probe import wait_until_admitted  # noqa: PLC0415
    from controller.runtime.kube import KubeClient  # noqa: PLC0415

    settings = quickstart.parse_settings(args.settings)
    client = KubeClient.from_env(args.kubeconfig, user_agent=constants.USER_AGENT)
    report = quickstart.apply(
        client,
        settings,
        release=args.release,
        secret_name=args.secret_name,
        secret_key=args.secret_key,
        before_first_write=lambda ns: wait_until_admitted(client, ns, args.timeout),
    )
    for verb, namespaces in (
        ("created", report.created),
        ("updated", report.updated),
        ("unchanged", report.unchanged),
    ):
        if namespaces:
            print(f"lumigo-operator quickstart: {verb} the Lumigo of {', '.join(namespaces)}")
    for what in report.left_alone:
        print(f"lumigo-operator quickstart: left alone {what}")
    for failure in report.failures:
        print(f"lumigo-operator quickstart: failed: {failure}", file=sys.stderr)
    return 1 if report.failures else 0


def _uninstall(args: argparse.Namespace) -> int:
    from controller.lumigo.instrumentation import Instrumenter  # noqa: PLC0415
    from controller.lumigo.resources import WORKLOADS_BY_KIND  # noqa: PLC0415
    from controller.lumigo.uninstall import uninstall  # noqa: PLC0415
    from controller.runtime.events import EventRecorder  # noqa: PLC0415
    from controller.runtime.kube import KubeClient  # noqa: PLC0415
    from controller.telemetry.provider_id import remove_annotations  # noqa: PLC0415
    from kube.rest import ApiError  # noqa: PLC0415
    from webhook.injection_events import UNINSTALL_COMPONENT  # noqa: PLC0415

    client = KubeClient.from_env(args.kubeconfig, user_agent=constants.USER_AGENT)
    recorder = EventRecorder(client, resources=WORKLOADS_BY_KIND)
    recorder.start()
    try:
        instrumenter = Instrumenter(client, recorder, component=UNINSTALL_COMPONENT)
        report = uninstall(client, instrumenter, args.timeout)
    finally:
        recorder.stop()
    nodes = 0
    try:  # what the operator added to Nodes (controller.telemetry.provider_id)
        nodes = remove_annotations(client)
    except ApiError as err:
        report.failures.append(f"Node provider-ID annotations: {err.message}")
    print(
        f"lumigo-operator uninstall: deleted {report.deleted_lumigoes} Lumigo resource(s), "
        f"finalized {report.finalized_here} here, removed instrumentation from "
        f"{report.uninstrumented} workload(s) and the provider-ID annotation from "
        f"{nodes} Node(s)"
    )
    for failure in report.failures:
        print(f"  failed: {failure}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
