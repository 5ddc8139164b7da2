"""Restarting the telemetry proxy when OLM owns its Deployment.

Elsewhere a new proxy configuration is rolled out by changing a pod-template annotation. Under OLM
that does not work: OLM sees the Deployment unready while it rolls, re-installs the CSV's
Deployments with a two-way patch that drops every template annotation the CSV does not have, and
the rollout is undone half-way, leaving the old pods on the old configuration. So, under OLM, the
operator never touches the template: it deletes, one at a time, the proxy pods created before the
configuration Secret's last write, and their ReplicaSet replaces each with a pod that mounts the
new Secret.

"Before" is decided on the API server's clock alone: a pod's creationTimestamp against the
Secret's last write (its managedFields times), both in whole seconds. A pod created in the same
second is counted as old, and the first deletion waits until the write is `SETTLE` old, so a
replacement is never mistaken for an old pod.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from api.marks import parse_time
from controller.runtime.kube import KubeClient
from controller.runtime.selectors import selector_string
from kube import objects
from kube.kinds import PODS
from kube.objects import JSON

log = logging.getLogger("lumigo.telemetry")

OLM_MANAGED_LABEL = "olm.managed"  # set by OLM on every Deployment it installs from a CSV
SETTLE = dt.timedelta(seconds=2)


def is_olm_managed(deployment: JSON) -> bool:
    labels = objects.labels_of(deployment)
    return labels.get(OLM_MANAGED_LABEL) == "true"


def last_write(obj: JSON) -> dt.datetime | None:
    """When the object last changed, by the API server's clock (managedFields times)."""
    meta = objects.metadata(obj)
    times = [parse_time(entry.get("time")) for entry in meta.get("managedFields") or []]
    times.append(parse_time(meta.get("creationTimestamp")))
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _created(pod: JSON) -> dt.datetime | None:
    return parse_time(objects.metadata(pod).get("creationTimestamp"))


def _terminating(pod: JSON) -> bool:
    return bool(objects.metadata(pod).get("deletionTimestamp"))


def _ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def stale_pods(pods: list[JSON], written: dt.datetime) -> list[JSON]:
    """Pods that may run a configuration older than the one written at `written`, oldest
    first."""
    old = [p for p in pods if not _terminating(p) and (_created(p) or written) <= written]
    return sorted(old, key=lambda p: _created(p) or written)


@dataclass
class PodRestarter:
    """Deletes the proxy's outdated pods one by one, each once its predecessor's replacement is
    ready (a broken new configuration stops the restart with the old pods still serving)."""

    client: KubeClient

    def restart(self, deployment: JSON, secret: JSON, now: dt.datetime) -> bool:
        """One step; True while pods still run an older configuration (call again soon)."""
        written = last_write(secret)
        selector = selector_string((deployment.get("spec") or {}).get("selector"))
        namespace = str(objects.metadata(deployment).get("namespace", ""))
        if written is None or selector is None:
            return False
        pods, _ = self.client.list(PODS, namespace, label_selector=selector)
        stale = stale_pods(pods, written)
        if not stale:
            return False
        stale_names = {p["metadata"]["name"] for p in stale}
        fresh = [p for p in pods if p["metadata"]["name"] not in stale_names]
        waiting = now - written < SETTLE or any(_terminating(p) or not _ready(p) for p in fresh)
        if waiting:
            return True
        name = stale[0]["metadata"]["name"]
        self.client.delete(PODS, name, namespace)
        log.info(
            "telemetry proxy pod restarted for the new configuration",
            extra={"pod": f"{namespace}/{name}", "outdated": len(stale)},
        )
        return True
