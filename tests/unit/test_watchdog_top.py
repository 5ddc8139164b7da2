"""The watchdog's resource-usage gauges: Kubernetes quantities as the reference reads them
(`MilliValue()` for CPU, `Value()` for memory, both rounded up) and the OTLP request."""

from __future__ import annotations

import pytest

from controller.telemetry.top import (
    CPU_METRIC,
    MEMORY_METRIC,
    METER,
    ContainerUsage,
    container_usages,
    memory_bytes,
    millicores,
    otlp_metrics,
)


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("250m", 250.0), ("1", 1000.0), ("1.5", 1500.0), ("12345678n", 13.0), ("1500u", 2.0),
     ("0", 0.0), ("2k", 2_000_000.0), ("1e-3", 1.0)],
)  # fmt: skip
def test_cpu_in_millicores_rounded_up(quantity: str, expected: float) -> None:
    assert millicores(quantity) == expected


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("64Mi", 64 * 2**20), ("1Ki", 1024), ("1Gi", 2**30), ("12345", 12345), ("1k", 1000),
     ("2M", 2_000_000), ("1.5Ki", 1536), ("100m", 1), ("1e3", 1000)],
)  # fmt: skip
def test_memory_in_bytes(quantity: str, expected: int) -> None:
    assert memory_bytes(quantity) == expected


@pytest.mark.parametrize(
    "bad", ["", "abc", "12Qi", "-5Mi", "1e", "Mi", "1" * 100, "1 Mi", "1e999999", "9e99999999999",
            "99999999999999999999Ei"],
)  # fmt: skip
def test_a_bad_quantity_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"quantity|negative|impossible"):
        memory_bytes(bad)


def test_unreadable_containers_are_left_out_and_the_count_is_bounded() -> None:
    items = [
        {"metadata": {"name": f"p{i}"},
         "containers": [{"name": "a", "usage": {"cpu": "5m", "memory": "1Mi"}},
                        {"name": "b", "usage": {"cpu": "oops", "memory": "1Mi"}}]}
        for i in range(10)
    ]  # fmt: skip
    usages = container_usages({"items": items}, limit=4)
    assert usages == [ContainerUsage(f"p{i}", "a", 5.0, 2**20) for i in range(4)]


def test_the_request_has_the_references_names_units_and_attributes() -> None:
    body = otlp_metrics([ContainerUsage("p", "c", 3.0, 10)], "ns",
                        [{"key": "service.name", "value": {"stringValue": "x"}}], 7)  # fmt: skip
    (rm,) = body["resourceMetrics"]
    (sm,) = rm["scopeMetrics"]
    assert sm["scope"] == {"name": METER}
    cpu, memory = sm["metrics"]
    assert (cpu["name"], cpu["unit"], memory["name"], memory["unit"]) == (
        CPU_METRIC, "m", MEMORY_METRIC, "By"
    )  # fmt: skip
    (point,) = cpu["gauge"]["dataPoints"]
    assert point["asDouble"] == 3.0
    assert memory["gauge"]["dataPoints"][0]["asInt"] == "10"
    assert {a["key"]: a["value"]["stringValue"] for a in point["attributes"]} == {
        "namespace": "ns", "pod": "p", "container": "c"
    }  # fmt: skip
