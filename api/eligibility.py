"""Whether a workload may be instrumented: one rule for the webhook and the controller, so that
they never disagree about a workload (as `api.effective` is for "which Lumigo wins").

Whoever would instrument it, a workload is left alone, in this order, when it is

- `being-deleted`: it carries a deletionTimestamp (its pods are going away);
- `reverted`: it carries the revert mark (`api.marks.is_reverted`): the controller reverted it
  because its instrumented pods failed, until the user removes the mark;
- `deployment-owned`: a ReplicaSet of an apps/v1 Deployment, whose Deployment is instrumented
  instead (its pod template follows the Deployment's);
- `job-immutable`: an existing Job (an UPDATE in the webhook, any Job in the controller): the pod
  template of a Job cannot change once created, so a patch would make the write fail.

The reasons are the webhook's metric reason tokens. The namespace's side (is there a Lumigo, is
it in effect, is injection enabled) is the caller's, and so is the workload's `lumigo.auto-trace`
label; each caller applies the answer at the step of its own order where it matters (the webhook
documents its steps in `webhook.inject_handler`, the controller's are `controller.lumigo.plan`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from api import marks
from kube import objects

Refusal = Literal["being-deleted", "reverted", "deployment-owned", "job-immutable"]

BEING_DELETED: Final = "being-deleted"
REVERTED: Final = "reverted"
DEPLOYMENT_OWNED: Final = "deployment-owned"
JOB_IMMUTABLE: Final = "job-immutable"

# Why an existing Job is not changed (the reference's text: events and admission messages).
JOB_IMMUTABLE_MESSAGE: Final = (
    "the PodSpec of batchv1.Job resources is immutable once the job has been created"
)


def refusal(obj: Mapping[str, Any], kind: str, *, exists: bool) -> Refusal | None:
    """Why `obj` (a full object or a cached projection of kind `kind`) is not to be instrumented,
    or None when it may be. `exists`: the object is already stored (an UPDATE, or the controller
    acting on what it lists), not being created."""
    if objects.is_being_deleted(obj):
        return "being-deleted"
    if marks.is_reverted(obj):
        return "reverted"
    if objects.is_deployment_owned(obj, kind):
        return "deployment-owned"
    if template_is_immutable(kind, exists=exists):
        return "job-immutable"
    return None


def template_is_immutable(kind: str, *, exists: bool) -> bool:
    """The pod template cannot change: an existing Job's (neither added nor removed)."""
    return kind == "Job" and exists
