"""`lumigo-operator watchdog`: the watchdog process (controller.telemetry.watchdog)."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from api import constants
from controller.flag_table import pick
from controller.runtime.kube import KubeClient
from controller.telemetry.config import DEFAULT_UPSTREAM, logs_url, metrics_url
from controller.telemetry.watchdog import Watchdog, WatchdogSettings


def run_watchdog(args: argparse.Namespace) -> int:
    # Namespace, token Secret/key, intervals and cluster name: the same-named options.
    settings = pick(
        WatchdogSettings,
        args,
        logs_endpoint=logs_url(args.logs_endpoint or DEFAULT_UPSTREAM),
        metrics_endpoint=""
        if args.metrics_endpoint == "none"
        else metrics_url(args.metrics_endpoint or DEFAULT_UPSTREAM),
        own_pod=os.environ.get("POD_NAME", ""),
    )
    watchdog = Watchdog(
        KubeClient.from_env(args.kubeconfig, user_agent=constants.USER_AGENT),
        settings,
        args.operator_version,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watchdog.run(stop)
    return 0
