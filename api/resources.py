"""Kubernetes resource descriptors and the single API error type.

They live in `api/` (pure, no I/O) so that `webhook/` can talk about Secrets, webhook
configurations and workloads through a client it is handed, without importing `controller/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api import constants


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST API: `/api|apis/<apiVersion>/[namespaces/<ns>/]<plural>`."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        return base


NAMESPACES = Resource("v1", "Namespace", "namespaces", namespaced=False)
SECRETS = Resource("v1", "Secret", "secrets")
CONFIGMAPS = Resource("v1", "ConfigMap", "configmaps")
EVENTS = Resource("v1", "Event", "events")
PODS = Resource("v1", "Pod", "pods")
SERVICES = Resource("v1", "Service", "services")
LEASES = Resource("coordination.k8s.io/v1", "Lease", "leases")
MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io/v1",
    "MutatingWebhookConfiguration",
    "mutatingwebhookconfigurations",
    namespaced=False,
)
VALIDATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)
CUSTOM_RESOURCE_DEFINITIONS = Resource(
    "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False
)
LUMIGOES = Resource(constants.API_VERSION, constants.KIND, constants.PLURAL)

DAEMONSETS = Resource("apps/v1", "DaemonSet", "daemonsets")
DEPLOYMENTS = Resource("apps/v1", "Deployment", "deployments")
REPLICASETS = Resource("apps/v1", "ReplicaSet", "replicasets")
STATEFULSETS = Resource("apps/v1", "StatefulSet", "statefulsets")
CRONJOBS = Resource("batch/v1", "CronJob", "cronjobs")
JOBS = Resource("batch/v1", "Job", "jobs")
# The six workload kinds, in the reference's order (status listing, injection passes).
WORKLOADS = (DAEMONSETS, DEPLOYMENTS, REPLICASETS, STATEFULSETS, CRONJOBS, JOBS)
WORKLOADS_BY_KIND = {r.kind: r for r in WORKLOADS}


class ApiError(Exception):
    """A failed Kubernetes API call. `code` is the HTTP status (0 when no response arrived)."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str = "",
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.code = code
        self.reason = reason
        self.message = message
        self.body = body
        self.retry_after = retry_after
        super().__init__(f"{code} {reason}: {message}" if reason else f"{code}: {message}")

    @property
    def not_found(self) -> bool:
        return self.code == 404

    @property
    def conflict(self) -> bool:
        return self.code == 409

    @property
    def already_exists(self) -> bool:
        return self.code == 409 and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        return self.code == 410

    @property
    def retryable(self) -> bool:
        """Worth retrying with backoff: throttled, server-side trouble, or no response at all."""
        return self.code in (0, 429) or self.code >= 500
