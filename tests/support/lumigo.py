"""Lumigo objects for tests: create one with its token Secret, and make it Active.

Activation is the Lumigo controller's job; tests that only need an active Lumigo write the
condition themselves through the status subresource, exactly as the controller does.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from kube.kinds import SECRETS

JSON = dict[str, Any]


def random_token() -> str:
    import secrets

    return "t_" + secrets.token_hex(11)[:21]


def create_token_secret(
    kube: KubeClient, namespace: str, token: str, name: str = "lumigo-credentials"
) -> None:
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"token": base64.b64encode(token.encode()).decode()},
        },
        namespace,
    )


def create_lumigo(
    kube: KubeClient,
    namespace: str,
    *,
    name: str = "lumigo",
    kube_events: bool = True,
    finalizers: list[str] | None = None,
) -> JSON:
    body: JSON = {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": name, "namespace": namespace, "finalizers": finalizers or []},
        "spec": {
            "lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}},
            "infrastructure": {"enabled": True, "kubeEvents": {"enabled": kube_events}},
        },
    }
    return kube.create(LUMIGOES, body, namespace)


def set_active(kube: KubeClient, namespace: str, name: str = "lumigo", active: bool = True) -> JSON:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Active",
        "status": "True" if active else "False",
        "lastUpdateTime": now,
        "lastTransitionTime": now,
        "message": "Lumigo is ready" if active else "not ready",
    }
    status = {"conditions": [condition], "instrumentedResources": []}
    return kube.merge_patch(LUMIGOES, name, {"status": status}, namespace, subresource="status")
