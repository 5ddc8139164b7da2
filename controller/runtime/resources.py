"""Where the Kubernetes kinds the operator uses live in the REST API, and the API error type.

`Resource`, `ApiError` and the kinds the certificate manager writes are defined in
`kube.rest` (the admission toolkit needs them and `webhook/` never imports
`controller/`); they are re-exported here so the runtime and its users have one catalogue.
The `Lumigo` kind is Lumigo code: `controller.lumigo.resources`.
"""

from __future__ import annotations

from kube.rest import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    SECRETS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    ApiError,
    Resource,
)

__all__ = [
    "CONFIGMAPS",
    "CRONJOBS",
    "DAEMONSETS",
    "DEPLOYMENTS",
    "EVENTS",
    "JOBS",
    "LEASES",
    "MUTATING_WEBHOOK_CONFIGURATIONS",
    "NAMESPACES",
    "NODES",
    "PODS",
    "REPLICASETS",
    "SECRETS",
    "SERVICES",
    "STATEFULSETS",
    "VALIDATING_WEBHOOK_CONFIGURATIONS",
    "ApiError",
    "Resource",
]

NAMESPACES = Resource("v1", "Namespace", "namespaces", namespaced=False)
NODES = Resource("v1", "Node", "nodes", namespaced=False)
CONFIGMAPS = Resource("v1", "ConfigMap", "configmaps")
EVENTS = Resource("v1", "Event", "events")
PODS = Resource("v1", "Pod", "pods")
SERVICES = Resource("v1", "Service", "services")
LEASES = Resource("coordination.k8s.io/v1", "Lease", "leases")

DAEMONSETS = Resource("apps/v1", "DaemonSet", "daemonsets")
DEPLOYMENTS = Resource("apps/v1", "Deployment", "deployments")
REPLICASETS = Resource("apps/v1", "ReplicaSet", "replicasets")
STATEFULSETS = Resource("apps/v1", "StatefulSet", "statefulsets")
CRONJOBS = Resource("batch/v1", "CronJob", "cronjobs")
JOBS = Resource("batch/v1", "Job", "jobs")
