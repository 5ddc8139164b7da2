"""Whether the init container's copy of the tracer payload would get a pod evicted.

In the init-container mode the `lumigo-injector` init container copies the payload into an
emptyDir (sizeLimit 200M). The kubelet counts emptyDir usage in the pod's ephemeral storage, and
evicts the pod when that exceeds the pod's ephemeral-storage limit: the sum of its containers'
limits, or a regular init container's when larger (`resourcehelper.PodLimits`, used by the
eviction manager). A pod whose containers set a small limit would be evicted by our copy, so it
is never instrumented that way: the caller records a Warning event and the Lumigo status lists
it. The image-volume mode copies nothing and is not concerned.

The copy may write up to the emptyDir's sizeLimit; the limit must hold that and leave as much
again to the containers' own files and logs. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, Final

from api import constants
from kube.quantity import parse_quantity

RESOURCE: Final = "ephemeral-storage"
# What the copy may write: the emptyDir's sizeLimit.
PAYLOAD_BOUND: Final = parse_quantity(constants.INJECTOR_VOLUME_SIZE_LIMIT)
NEEDED: Final = 2 * PAYLOAD_BOUND


def _limit(container: Any) -> Decimal | None:
    resources = container.get("resources") if isinstance(container, Mapping) else None
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    value = limits.get(RESOURCE) if isinstance(limits, Mapping) else None
    if value is None:
        return None
    try:
        return parse_quantity(value if isinstance(value, str) else str(value))
    except ValueError:
        return None  # the API server refuses it; nothing to go by


def _containers(pod_spec: Mapping[str, Any], key: str) -> Iterable[Mapping[str, Any]]:
    items = pod_spec.get(key)
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def pod_limit(pod_spec: Mapping[str, Any]) -> Decimal | None:
    """The pod's ephemeral-storage limit as the kubelet's eviction manager computes it, or None
    when no container of the user's sets one (our own init container sets none)."""
    found = False
    sidecars = Decimal(0)  # restartable init containers started so far: they keep running
    largest_init = Decimal(0)
    for container in _containers(pod_spec, "initContainers"):
        if container.get("name") == constants.INJECTOR_INIT_CONTAINER:
            continue
        limit = _limit(container)
        found = found or limit is not None
        if container.get("restartPolicy") == "Always":
            sidecars += limit or 0
        else:
            largest_init = max(largest_init, (limit or 0) + sidecars)
    total = sidecars
    for container in _containers(pod_spec, "containers"):
        limit = _limit(container)
        found = found or limit is not None
        total += limit or 0
    return max(total, largest_init) if found else None


def _shown(amount: Decimal) -> str:
    for unit, size in (("Mi", 1 << 20), ("M", 10**6)):
        if amount >= size and (amount / size) == (amount / size).to_integral_value():
            return f"{amount / size:.0f}{unit}"
    return f"{amount:.0f} bytes"


def problem(pod_spec: Mapping[str, Any]) -> str | None:
    """Why copying the payload into this pod would get it evicted, or None."""
    limit = pod_limit(pod_spec)
    if limit is None or limit >= NEEDED:
        return None
    return (
        f"the pod's ephemeral-storage limit ({_shown(limit)}) cannot hold the tracer payload "
        f"copied by the init container (up to {constants.INJECTOR_VOLUME_SIZE_LIMIT}) and as "
        "much again for the containers: the kubelet would evict the pod; allow at least "
        f"{NEEDED / 10**6:.0f}M, or use the image-volume injection mode"
    )
