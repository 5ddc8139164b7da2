"""Minimal valid objects of the six workload kinds the injector webhook handles."""

from __future__ import annotations

from typing import Any

from kube.kinds import CRONJOBS, DAEMONSETS, DEPLOYMENTS, JOBS, REPLICASETS, STATEFULSETS
from kube.rest import Resource

KINDS: tuple[Resource, ...] = (DEPLOYMENTS, DAEMONSETS, REPLICASETS, STATEFULSETS, CRONJOBS, JOBS)


def pod_template(app: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app, **(labels or {})}},
        "spec": {
            "containers": [
                {"name": "app", "image": "python:3.12-slim", "command": ["sleep", "3600"]},
                {"name": "web", "image": "node:22-slim", "command": ["sleep", "3600"]},
            ],
            "restartPolicy": "Always",
        },
    }


def workload(resource: Resource, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    template = pod_template(name)
    selector = {"matchLabels": {"app": name}}
    spec: dict[str, Any]
    if resource in (DEPLOYMENTS, DAEMONSETS, REPLICASETS):
        spec = {"selector": selector, "template": template}
        if resource is not DAEMONSETS:
            spec["replicas"] = 0
    elif resource is STATEFULSETS:
        spec = {"selector": selector, "template": template, "serviceName": name, "replicas": 0}
    else:
        template["spec"]["restartPolicy"] = "Never"
        job_spec = {"template": template, "suspend": True}
        spec = (
            {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {"spec": job_spec}}
            if resource is CRONJOBS
            else job_spec
        )
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": meta,
        "spec": spec,
    }


def one_container_deployment(name: str, image: str, container: str = "app") -> dict[str, Any]:
    """A one-replica Deployment running `image`, selected by app=<name>."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": container, "image": image}]},
            },
        },
    }


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: dict[str, Any] = spec["template"]["spec"]
    return result


def init_container_names(obj: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod_spec(obj).get("initContainers") or []]


def node_without_kubelet(name: str, provider_id: str | None = None) -> dict[str, Any]:
    """A Node object no kubelet runs: unschedulable and tainted, so nothing is placed on it."""
    spec: dict[str, Any] = {
        "unschedulable": True,
        "taints": [{"key": "lumigo-test", "value": "no-kubelet", "effect": "NoSchedule"}],
    }
    if provider_id:
        spec["providerID"] = provider_id
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}
