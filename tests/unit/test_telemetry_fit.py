"""The largest proxy configuration a Secret holds (issue 28, item 9): over the cap, namespaces
are left out in a deterministic order instead of the previous configuration being kept (which
kept exporting with the token of a namespace deleted since)."""

from __future__ import annotations

import pytest

from controller.telemetry.config import MonitoredNamespace, ProxySettings, render
from controller.telemetry.proxy_reconciler import MAX_CONFIG_BYTES, ConfigTooLargeError, fit

SETTINGS = ProxySettings()


def tenants(count: int) -> list[MonitoredNamespace]:
    return [MonitoredNamespace(f"ns-{i:04d}", "u", f"t_{i:021x}") for i in range(count)]


def size(namespaces: list[MonitoredNamespace]) -> int:
    return len(render(namespaces, SETTINGS).encode())


def by_name(ns: MonitoredNamespace) -> str:
    return ns.name


def test_everything_when_it_fits() -> None:
    namespaces = tenants(3)
    text, kept = fit(namespaces, SETTINGS, MAX_CONFIG_BYTES, by_name)
    assert kept == namespaces
    assert text == render(namespaces, SETTINGS)


@pytest.mark.parametrize("room", [0, 1, 2, 5])
def test_over_the_cap_the_most_senior_that_fit(room: int) -> None:
    namespaces = tenants(8)
    # Seniority: the reverse of the names, so the kept ones are not simply a prefix.
    seniority = {ns.name: -i for i, ns in enumerate(namespaces)}
    senior = sorted(namespaces, key=lambda ns: seniority[ns.name])[:room]
    limit = size([ns for ns in namespaces if ns in senior])
    text, kept = fit(namespaces, SETTINGS, limit, lambda ns: seniority[ns.name])
    assert kept == [ns for ns in namespaces if ns in senior]  # in the given order
    assert text == render(kept, SETTINGS)
    assert len(text.encode()) <= limit
    # Deterministic, and a removed namespace is never in it.
    assert fit(namespaces, SETTINGS, limit, lambda ns: seniority[ns.name]) == (text, kept)
    gone = namespaces[1:]
    text2, kept2 = fit(gone, SETTINGS, limit, lambda ns: seniority[ns.name])
    assert namespaces[0].token not in text2
    assert namespaces[0] not in kept2


def test_settings_alone_too_large_is_still_refused() -> None:
    with pytest.raises(ConfigTooLargeError):
        fit(tenants(2), SETTINGS, 100, by_name)
