"""The namespace label that scopes the injector webhook to namespaces with an active Lumigo.

The webhook's namespaceSelector requires `operator.lumigo.io/monitored=true`, so the API server
calls it for no workload of any other namespace (no latency, no dependency on the operator
there). The Lumigo reconciler sets the label before it reports the Lumigo Active and removes it
when the Lumigo becomes unusable; finalizing the namespace's last Lumigo removes it too (also
on uninstall). A late label only means the webhook misses a workload that the controller's
repair path then instruments.
"""

from __future__ import annotations

from api import constants
from controller.runtime.kube import KubeClient
from kube import objects
from kube.kinds import NAMESPACES
from kube.objects import JSON
from kube.rest import ApiError

VALUE = "true"


def is_marked(namespace: JSON | None) -> bool:
    labels = objects.labels_of(namespace or {})
    return labels.get(constants.LABEL_MONITORED) == VALUE


def mark(client: KubeClient, name: str) -> bool:
    """Label the namespace; True if this changed it."""
    if is_marked(client.get_or_none(NAMESPACES, name)):
        return False
    client.merge_patch(
        NAMESPACES, name, {"metadata": {"labels": {constants.LABEL_MONITORED: VALUE}}}
    )
    return True


def unmark(client: KubeClient, name: str) -> bool:
    """Remove the label (a namespace already gone is fine); True if this changed it."""
    namespace = client.get_or_none(NAMESPACES, name)
    labels = objects.labels_of(namespace or {})
    if constants.LABEL_MONITORED not in labels:
        return False
    try:
        client.merge_patch(
            NAMESPACES, name, {"metadata": {"labels": {constants.LABEL_MONITORED: None}}}
        )
    except ApiError as err:
        if err.not_found:
            return False
        raise
    return True
