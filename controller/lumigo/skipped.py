"""Workloads the controller leaves uninstrumented because instrumenting them would harm them.

Today one case: in the init-container mode, a pod whose ephemeral-storage limit cannot hold the
payload copy would be evicted by the kubelet (`webhook.storage`, the one definition; `inject`
leaves such a pod without anything of ours). The workload caches keep only metadata, so the
cache's transform records the problem (`storage_state`) for the reconciler to list the workload
in `status.skippedResources` and to say why once with a Warning event.
"""

from __future__ import annotations

from typing import Final

from api import constants
from kube import objects
from kube.objects import JSON
from webhook import pod_injection, storage

# Key the workload caches add to the metadata projection of a workload whose pods the payload
# copy would get evicted (the problem's text).
STORAGE_PROBLEM: Final = "lumigoEphemeralStorageProblem"


def storage_state(obj: JSON) -> JSON:
    """The projection extra (`metadata_projection`): the storage problem of the workload's pod
    template in the init-container mode, if any."""
    if objects.is_deployment_owned(obj):
        return {}
    try:
        kind = str(obj.get("kind") or "")
        pod_spec = pod_injection.pod_spec_of(obj, kind)
    except pod_injection.MutationError:
        return {}
    problem = storage.problem(pod_spec) if pod_spec is not None else None
    return {STORAGE_PROBLEM: problem} if problem is not None else {}


def skip_reason(obj: JSON, injection_mode: str) -> str | None:
    """Why a cached workload is not instrumented in `injection_mode`, or None."""
    if injection_mode == constants.INJECTION_MODE_IMAGE_VOLUME:
        return None
    if pod_injection.is_opted_out(obj):
        return None  # the user's choice, not ours
    problem = obj.get(STORAGE_PROBLEM)
    return problem if isinstance(problem, str) else None
