"""The cluster's Nodes as the operator caches them: one informer of small projections, shared by
what reads Nodes (the provider-ID annotations, the image-volume check of `--injection-mode=auto`).

A projection keeps the name, the provider-ID annotation, `spec.providerID` and the kubelet and
container runtime versions: a few hundred bytes per Node, however large the cluster.
"""

from __future__ import annotations

from api.constants import ANNOTATION_PROVIDER_ID
from controller.runtime.informer import Informer, Selection, metadata_projection
from controller.runtime.manager import Manager
from kube import objects
from kube.kinds import NODES
from kube.objects import JSON


def provider_id(node: JSON | None) -> str | None:
    return ((node or {}).get("spec") or {}).get("providerID") or None


def annotated(node: JSON | None) -> str | None:
    annotations = objects.annotations_of(node or {})
    value = annotations.get(ANNOTATION_PROVIDER_ID)
    return str(value) if value is not None else None


def node_info(node: JSON | None) -> JSON:
    """`status.nodeInfo` (kubeletVersion, containerRuntimeVersion); {} when not reported yet."""
    return dict(((node or {}).get("status") or {}).get("nodeInfo") or {})


def _project(node: JSON) -> JSON:
    """What the operator reads of a Node beyond its metadata projection (which drops
    annotations, so the one we need is kept here)."""
    info = node_info(node)
    out: JSON = {
        "spec": {"providerID": provider_id(node)},
        "status": {
            "nodeInfo": {
                key: str(info[key])
                for key in ("kubeletVersion", "containerRuntimeVersion")
                if key in info
            }
        },
    }
    value = annotated(node)
    if value is not None:
        out["annotations"] = {ANNOTATION_PROVIDER_ID: value}
    return out


_TRANSFORM = metadata_projection(_project)


def view(node: JSON | None) -> JSON | None:
    """A cached projection as a Node-shaped object (annotations back under metadata)."""
    if node is None:
        return None
    meta = {**objects.metadata(node), "annotations": node.get("annotations") or {}}
    return {"metadata": meta, "spec": node.get("spec") or {}, "status": node.get("status") or {}}


def node_informer(manager: Manager) -> Informer:
    """The manager's one Node informer (every caller shares its cache)."""
    return manager.informer(Selection(NODES), transform=_TRANSFORM)
