"""Where the built-in Kubernetes kinds live in the REST API: one catalogue for the webhook's
certificate manager, the controller runtime and their users.

`Resource` and `ApiError` are `kube.rest`'s. Lumigo's kinds (the `Lumigo` and the six workload
kinds it instruments) are Lumigo code: `controller.lumigo.resources`.
"""

from __future__ import annotations

from kube.rest import Resource

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

# The kinds the certificate manager writes.
SECRETS = Resource("v1", "Secret", "secrets")
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
