#!/usr/bin/env python3
"""Memory of the manager and of the webhook, run apart as every install now runs them (issue 28
item 7): `lumigo-operator run --no-serve-webhooks` and `lumigo-operator webhook
--webhook-workers=N` against a local API server, an Active Lumigo so that admissions take the
full injection path. For each --workers count: each process tree's PSS at rest, and the
webhook's peak under --big concurrent maximum-size (7 MiB) admissions plus a normal one (the
manager's too, which no longer parses any). Prints the figures; writes
bench/results/webhook_split_memory.json.

    flock /tmp/node-tier.lock .venv/bin/python bench/webhook_split_memory.py \
        [--workers 1,2] [--big 20]
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
import sys
import tempfile
from http import HTTPStatus
from pathlib import Path
from typing import Any

from webhook_busy_controller import CRD, webhook_ca
from webhook_worker_memory import MiB, Target, peak_sampler, pss, workers_of

from bench import benchkit
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from tests.support.checks import TOKEN, is_active, lumigo_yaml
from tests.support.lumigo import create_token_secret
from tests.support.webhook_server import max_size_flood

ROOT = benchkit.ROOT

RESULTS = benchkit.results_file("webhook_split_memory")
MODE_CONFIGMAP = "--injection-mode-configmap=lumigo-injection-mode"


class WebhookProcess(OperatorProcess):
    """`lumigo-operator webhook` on the manager's webhook port and registration."""

    def __init__(self, manager: OperatorProcess, workers: int) -> None:
        super().__init__(manager.cluster, manager.kube, namespace=manager.namespace,
                         operator_version="0.1.0", log_level="info",
                         extra_args=(f"--webhook-workers={workers}", MODE_CONFIGMAP))  # fmt: skip
        self.webhook_port = manager.webhook_port
        self.config_name = manager.config_name

    def args(self) -> list[str]:
        args = super().args()
        assert args[1] == "run"
        return [args[0], "webhook", *args[2:]]


def one(cluster: LocalCluster, kube: KubeClient, tmp: Path, workers: int,
        big: int) -> dict[str, Any]:  # fmt: skip
    split = ("--no-serve-webhooks", MODE_CONFIGMAP)
    manager = OperatorProcess(cluster, kube, operator_version="0.1.0", log_level="info",
                              extra_args=split).setup()  # fmt: skip
    webhook = WebhookProcess(manager, workers)
    try:
        manager.start()
        webhook.start()
        wait_until(lambda: webhook.probe("/readyz")[0] == HTTPStatus.OK, 120, "the webhook ready")
        manager.wait_ready()  # and the API server admits through the webhook
        assert manager.proc is not None
        assert webhook.proc is not None
        hot = manager.new_namespace()
        create_token_secret(kube, hot, TOKEN)
        cluster.kubectl("apply", "-n", hot, "-f", "-", input=lumigo_yaml())
        wait_until(lambda: is_active(kube, hot), 120, "the Lumigo to be Active")
        ca = webhook_ca(kube, manager, tmp)
        target = Target(webhook.webhook_port, webhook.proc.pid,
                        ssl.create_default_context(cafile=str(ca)))  # fmt: skip
        started = workers_of(webhook.proc.pid)
        idle = {"manager": pss(manager.proc.pid), "webhook": pss(webhook.proc.pid)}
        with peak_sampler(webhook.proc.pid) as peak, peak_sampler(manager.proc.pid) as mpeak:
            flood = max_size_flood(target, big, namespace=hot)
    finally:
        webhook.stop()
        manager.teardown()
    return {
        "workers_asked": workers,
        "workers_started": started,
        "manager_idle_pss_mib": round(idle["manager"] / MiB, 1),
        "manager_peak_pss_mib": round(mpeak[0] / MiB, 1),
        "webhook_idle_pss_mib": round(idle["webhook"] / MiB, 1),
        "webhook_peak_pss_mib": round(peak[0] / MiB, 1),
        "normal_status": flood.normal_status,
        "normal_ms": round(flood.normal_seconds * 1000, 1),
        "outcomes": {o: flood.outcomes.count(o) for o in sorted(set(flood.outcomes))},
    }


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--big", type=int, default=20)
    args = parser.parse_args()
    info = benchkit.machine()
    rows = []
    with LocalCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD))
        cluster.kubectl("wait", "--for=condition=Established", "crd/lumigoes.operator.lumigo.io")
        kube = KubeClient.from_kubeconfig(cluster.kubeconfig)
        for workers in (int(c) for c in args.workers.split(",")):
            row = one(cluster, kube, Path(tmp), workers, args.big)
            rows.append(row)
            print(
                f"webhook --webhook-workers={workers} ({row['workers_started']} started): "
                f"webhook PSS {row['webhook_idle_pss_mib']} MiB at rest, peak "
                f"{row['webhook_peak_pss_mib']} MiB under {args.big} x 7 MiB; manager PSS "
                f"{row['manager_idle_pss_mib']} MiB at rest, peak {row['manager_peak_pss_mib']}"
                f" MiB meanwhile; normal {row['normal_status']} in {row['normal_ms']} ms; "
                f"large {row['outcomes']}",
                flush=True,
            )
    result = {
        "benchmark": "webhook_split_memory",
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {**info, "loadavg_after": os.getloadavg()},
        "rows": rows,
    }
    benchkit.save(RESULTS, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
