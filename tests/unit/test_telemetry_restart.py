"""Which proxy pods run an outdated configuration (the restart under OLM)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from controller.telemetry.restart import is_olm_managed, last_write, stale_pods

T0 = dt.datetime(2026, 11, 25, 10, 0, 0, tzinfo=dt.UTC)


def at(seconds: int) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, created: int, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": at(created)}
    if terminating:
        meta["deletionTimestamp"] = at(created + 100)
    return {"metadata": meta}


def test_the_last_write_is_the_latest_managed_fields_time() -> None:
    secret = {
        "metadata": {
            "creationTimestamp": at(0),
            "managedFields": [{"manager": "a", "time": at(30)}, {"manager": "b", "time": at(7)}],
        }
    }
    assert last_write(secret) == T0 + dt.timedelta(seconds=30)
    assert last_write({"metadata": {"creationTimestamp": at(3)}}) == T0 + dt.timedelta(seconds=3)
    assert last_write({"metadata": {}}) is None


def test_pods_created_up_to_the_write_second_are_stale_oldest_first() -> None:
    written = T0 + dt.timedelta(seconds=10)
    pods = [pod("same-second", 10), pod("after", 11), pod("old", 2), pod("going", 1, True)]
    assert [p["metadata"]["name"] for p in stale_pods(pods, written)] == ["old", "same-second"]


def test_only_deployments_olm_installed_are_olm_managed() -> None:
    assert is_olm_managed({"metadata": {"labels": {"olm.managed": "true"}}})
    assert not is_olm_managed({"metadata": {"labels": {"olm.managed": "false"}}})
    assert not is_olm_managed({"metadata": {}})
