"""AdmissionReview bodies and a keep-alive HTTPS client for the webhook server's tests/bench."""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from typing import Any


def deployment(name: str = "shop", namespace: str = "default") -> dict[str, Any]:
    """A realistic 3-container Deployment (app, sidecar, metrics exporter)."""

    def container(cname: str, image: str, port: int) -> dict[str, Any]:
        return {
            "name": cname,
            "image": image,
            "ports": [{"containerPort": port, "protocol": "TCP"}],
            "env": [
                {"name": "LOG_LEVEL", "value": "info"},
                {"name": "DB_HOST", "value": "postgres.db.svc.cluster.local"},
                {
                    "name": "DB_PASSWORD",
                    "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}},
                },
            ],
            "resources": {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"cpu": "500m", "memory": "256Mi"},
            },
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 5},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
            "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
        }

    labels = {"app": name, "tier": "backend", "team": "payments"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        container("app", "registry.example.com/shop/app:1.4.2", 8080),
                        container("envoy", "envoyproxy/envoy:v1.31.0", 9901),
                        container("exporter", "prom/statsd-exporter:v0.27.1", 9102),
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}],
                    "serviceAccountName": name,
                },
            },
        },
    }


def review(
    obj: dict[str, Any], uid: str | None = None, operation: str = "CREATE"
) -> dict[str, Any]:
    kind = obj.get("kind", "Deployment")
    api_version = str(obj.get("apiVersion", "apps/v1"))
    group, _, version = api_version.rpartition("/")
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": f"{kind.lower()}s"},
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": "system:admin", "groups": ["system:masters"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


class Client:
    """One keep-alive HTTPS connection (http.client sends headers + body in one write)."""

    def __init__(self, port: int, context: ssl.SSLContext, timeout: float = 30.0) -> None:
        self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
        self.last_headers: http.client.HTTPMessage | None = None  # of the last response

    def post(
        self, path: str, body: bytes, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        self.conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        resp = self.conn.getresponse()
        self.last_headers = resp.headers
        return resp.status, resp.read()

    def close(self) -> None:
        self.conn.close()


def body_of(obj: Any) -> bytes:
    return json.dumps(obj).encode()
