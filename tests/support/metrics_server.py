"""A real metrics-server (hack/install-tools metrics-server) serving metrics.k8s.io to a node
tier cluster, as a process on this machine behind the APIService `v1beta1.metrics.k8s.io`.

The API server's aggregation layer (envtest/cluster.py: --requestheader-*, --proxy-client-*)
reaches it through an ExternalName Service (`localhost`, no kube-proxy here) and names the caller
in X-Remote-User; metrics-server authenticates that through the cluster's
extension-apiserver-authentication ConfigMap and authorizes it with SubjectAccessReviews (the
admin kubeconfig: delegation, as in a cluster). It scrapes the real kubelet's /metrics/resource
every 10 s (its shortest resolution); a pod has PodMetrics once two scrapes saw it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from envtest.cluster import BIN, LocalCluster
from envtest.process import Process, free_port, wait_until

NAMESPACE, NAME = "kube-system", "metrics-server"
API_SERVICE = "v1beta1.metrics.k8s.io"


def _api_service(port: int) -> list[dict[str, Any]]:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    }  # fmt: skip
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": API_SERVICE},
        "spec": {
            "group": "metrics.k8s.io",
            "version": "v1beta1",
            "service": {"name": NAME, "namespace": NAMESPACE, "port": port},
            # metrics-server serves a self-signed certificate (--cert-dir), as its own manifests.
            "insecureSkipTLSVerify": True,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    return [service, api_service]


def _available(cluster: LocalCluster) -> bool:
    out = cluster.kubectl("get", "apiservice", API_SERVICE, "-o", "json", check=False)
    if not out.strip().startswith("{"):
        return False
    conditions = json.loads(out).get("status", {}).get("conditions") or []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


@contextlib.contextmanager
def running_metrics_server(cluster: LocalCluster) -> Iterator[Process]:
    """metrics-server serving metrics.k8s.io until the block ends (then the APIService and its
    Service are deleted: the API is not served any more)."""
    binary = BIN / "metrics-server"
    if not binary.exists():
        raise AssertionError(f"{binary} missing: run `hack/install-tools metrics-server`")
    port = free_port()
    workdir = cluster.workdir / "metrics-server"
    workdir.mkdir(exist_ok=True)
    kubeconfig = str(cluster.kubeconfig)
    proc = Process(
        NAME,
        [
            str(binary),
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={workdir}",
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--kubelet-insecure-tls",
            "--kubelet-preferred-address-types=InternalIP",
            "--kubelet-use-node-status-port",
            "--metric-resolution=10s",
            "--kubelet-request-timeout=5s",  # below the resolution, or it refuses to start
        ],
        cluster.workdir / "logs" / f"{NAME}.log",
    )
    proc.start()
    items = _api_service(port)
    try:
        for item in items:
            cluster.kubectl("apply", "-f", "-", input=json.dumps(item))

        def available() -> bool:
            if not proc.alive():
                raise AssertionError(f"metrics-server exited:\n{proc.log_tail()}")
            return _available(cluster)

        wait_until(available, 90, "the APIService v1beta1.metrics.k8s.io available")
        yield proc
    finally:
        for item in reversed(items):
            meta = item["metadata"]
            cluster.kubectl("delete", str(item["kind"]).lower(), str(meta["name"]),
                            *(["-n", str(meta["namespace"])] if "namespace" in meta else []),
                            "--ignore-not-found", check=False)  # fmt: skip
        proc.stop()
