"""Where the built-in Kubernetes kinds live in the REST API: one catalogue for the webhook's
certificate manager, the controller runtime and their users.

`Resource` and `ApiError` are `kube.rest`'s. Lumigo's kinds (the `Lumigo` and the six workload
kinds it instruments) are Lumigo code: `controller.lumigo.resources`.
"""

from __future__ import annotations

from kube.rest import Resource


def _group(api_version: str, *kinds: str, namespaced: bool = True) -> tuple[Resource, ...]:
    """One Resource per kind of an API group. The plural is the lower-cased kind plus "s", which
    holds for every kind listed here (not for all kinds: Ingress, NetworkPolicy, Endpoints)."""
    return tuple(Resource(api_version, kind, f"{kind.lower()}s", namespaced) for kind in kinds)


NAMESPACES, NODES = _group("v1", "Namespace", "Node", namespaced=False)
CONFIGMAPS, EVENTS, PODS, SECRETS, SERVICES = _group(
    "v1", "ConfigMap", "Event", "Pod", "Secret", "Service"
)
(LEASES,) = _group("coordination.k8s.io/v1", "Lease")
DAEMONSETS, DEPLOYMENTS, REPLICASETS, STATEFULSETS = _group(
    "apps/v1", "DaemonSet", "Deployment", "ReplicaSet", "StatefulSet"
)
CRONJOBS, JOBS = _group("batch/v1", "CronJob", "Job")
# What the certificate manager writes, besides the Secret.
MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS = _group(
    "admissionregistration.k8s.io/v1",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
