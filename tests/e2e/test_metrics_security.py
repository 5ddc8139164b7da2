"""The operator's /metrics (issue 28 item 8), scraped from the real operator process: by default
HTTPS, refused without a token (401) and to a ServiceAccount that may not `get` /metrics (403),
served to one bound to the metrics-reader ClusterRole's rules; `--metrics-secure=false` serves it
over plain HTTP without a token. Probes are plain HTTP in both modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.runtime.kube import KubeClient
from controller.telemetry import watchdog
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess, metrics_reader_token, scrape


def test_secure_by_default_and_plain_when_asked(
    cluster: LocalCluster,
    kube: KubeClient,
    crd: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op = OperatorProcess(cluster, kube).setup()
    try:
        op.start().wait_ready()  # /readyz answered over plain HTTP
        assert op.metrics_secure
        stranger = metrics_reader_token(cluster, op.namespace, "stranger", bound=False)
        assert scrape(op.metrics_port, secure=True)[0] == 401
        status, body = scrape(op.metrics_port, secure=True, token=stranger)
        assert status == 403, body
        status, body = scrape(op.metrics_port, secure=True, token=op.metrics_token())
        assert status == 200, body
        assert "controller_runtime_reconcile_total" in body
        assert scrape(op.metrics_port, secure=False)[0] != 200
        # The watchdog scrapes it with its own token (HTTPS first, then plain HTTP).
        token_file = tmp_path / "token"
        token_file.write_text(op.metrics_token())
        monkeypatch.setattr(watchdog, "SERVICE_ACCOUNT_TOKEN", token_file)
        url = f"http://127.0.0.1:{op.metrics_port}/metrics"
        assert "controller_runtime_reconcile_total" in watchdog.http_get(url)
    finally:
        op.teardown()

    plain = OperatorProcess(cluster, kube, extra_args=("--metrics-secure=false",)).setup()
    try:
        plain.start().wait_ready()
        assert not plain.metrics_secure
        status, body = scrape(plain.metrics_port, secure=False)
        assert status == 200, body
        assert "controller_runtime_reconcile_total" in body
        plain_url = f"http://127.0.0.1:{plain.metrics_port}/metrics"
        assert "controller_runtime_reconcile_total" in watchdog.http_get(plain_url)
    finally:
        plain.teardown()
