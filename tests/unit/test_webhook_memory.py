"""Maximum-size admission requests cannot push the operator past its pod memory limit.

Issue 14 item 4: a JSON body expands ~24x into Python objects, so a few concurrent 7 MiB reviews
took the process past the 512 Mi limit of the chart. The real routes run in a server process of
their own (as in the pod); the kernel's high-water mark of its resident memory (VmHWM) is the
figure checked. Issue 28 item 3: with two admission worker processes each handling one, the pod
passed the limit again; the workers of a pod now share its large-body slots
(`kube.http.memory`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from kube.http import memory
from tests.support.webhook_server import max_size_flood, server_process, server_processes

ROOT = Path(__file__).resolve().parents[2]
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def pod_memory_limit() -> int:
    """The manager's memory limit in the Helm chart, in bytes."""
    values = yaml.safe_load((ROOT / "charts" / "lumigo-operator" / "values.yaml").read_text())
    limit = str(values["controllerManager"]["manager"]["resources"]["limits"]["memory"])
    return int(limit[:-2]) * UNITS[limit[-2:]]


def test_twenty_concurrent_maximum_size_requests_stay_under_the_pod_memory_limit() -> None:
    with server_process() as proc:
        flood = max_size_flood(proc, 20)
        peak = proc.peak_rss_bytes()

    assert flood.normal_status == 200  # sent while the large ones were being parsed
    assert b'"uid":"normal"' in flood.normal_reply
    assert len(flood.outcomes) == 20
    assert "200" in flood.outcomes  # the largest accepted size is served...
    assert "500" not in flood.outcomes  # ...the rest refused as busy (503/408), never a crash
    assert peak < pod_memory_limit(), f"peak RSS {peak / 2**20:.0f} MiB"


def test_two_worker_processes_under_twenty_maximum_size_requests_stay_under_the_limit() -> None:
    """Two processes on one socket, as two admission workers: the sum of their memory (PSS,
    sampled) plus the process that supervises them stays under the chart's limit."""
    limit = pod_memory_limit()
    with server_processes(2, limit) as group:
        flood = max_size_flood(group, 20)
        peak = group.peak_bytes

    assert flood.normal_status == 200
    assert len(flood.outcomes) == 20
    assert "200" in flood.outcomes
    assert "500" not in flood.outcomes
    assert peak + memory.SUPERVISOR_BYTES < limit, f"peak PSS {peak / 2**20:.0f} MiB"
