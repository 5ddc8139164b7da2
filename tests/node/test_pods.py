"""Pods on the real node behave as on any cluster: what the operator's users rely on (logs, exec,
Services and DNS, init containers, emptyDir limits, image volumes, optional Secrets, users and
groups, read-only roots, the restricted Pod Security Standard) works here, with real containers."""

from __future__ import annotations

import json
import time

import pytest

from envtest.cluster import KubectlError, LocalCluster
from envtest.node import LocalNode
from tests.support.pods import (
    BUSYBOX_IMAGE,
    RESTRICTED_SECURITY,
    apply,
    container,
    get,
    logs,
    pod,
    wait_pod,
)


def test_pod_runs_on_the_real_node_and_kubectl_logs_and_exec_work(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    apply(
        node_cluster,
        node_namespace,
        pod("hello", [container("app", "echo hello from a real container; exec sleep 3600")]),
    )
    status = wait_pod(node_cluster, node_namespace, "hello")
    assert status["spec"]["nodeName"] == node.name
    assert status["status"]["podIP"].startswith(node.pod_cidr.rsplit(".", 1)[0] + ".")

    assert "hello from a real container" in logs(node_cluster, node_namespace, "hello")
    out = node_cluster.kubectl(
        "exec", "-n", node_namespace, "hello", "--", "sh", "-c", "echo $((6*7)); hostname"
    )
    assert out.split() == ["42", "hello"]


def test_a_pod_reaches_another_through_a_service_name(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    server = pod(
        "web",
        [
            container(
                "httpd",
                "mkdir -p /tmp/www && echo served-by-web > /tmp/www/index.html && "
                "exec httpd -f -p 8080 -h /tmp/www",
                ports=[{"containerPort": 8080}],
            )
        ],
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    # The client resolves the short name through the search path and CoreDNS, and connects to
    # the Service IP, which kube-proxy forwards to the server pod.
    client = pod(
        "client",
        [
            container(
                "get",
                "until printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc web 80; "
                "do sleep 0.5; done; exec sleep 3600",
            )
        ],
    )
    for obj in (server, service, client):
        apply(node_cluster, node_namespace, obj)
    wait_pod(node_cluster, node_namespace, "client")
    deadline = time.monotonic() + 60
    while "served-by-web" not in (text := logs(node_cluster, node_namespace, "client")):
        assert time.monotonic() < deadline, f"the client never got the page:\n{text}"
        time.sleep(0.5)
    cluster_ip = get(node_cluster, node_namespace, "service", "web")["spec"]["clusterIP"]
    lookup = node_cluster.kubectl(
        "exec",
        "-n",
        node_namespace,
        "client",
        "--",
        "nslookup",
        f"web.{node_namespace}.svc.cluster.local",
    )
    assert cluster_ip in lookup


def test_an_init_container_fills_an_emptydir_that_the_app_reads_as_another_user(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    """The shape of an injected pod: a root init container copies into a size-limited emptyDir,
    the app runs as UID 1500 with fsGroup 2000 and a read-only root file system."""
    spec = pod(
        "injected",
        [
            container(
                "app",
                "id; ls -ln /payload; cat /payload/tracer.txt; "
                "touch /payload/written-by-app && echo emptydir-writable; "
                "touch /root-fs-file 2>&1 || echo root-fs-read-only; exec sleep 3600",
                securityContext={"runAsUser": 1500, "readOnlyRootFilesystem": True},
                volumeMounts=[{"name": "payload", "mountPath": "/payload"}],
            )
        ],
        initContainers=[
            container(
                "copy",
                "echo tracer-bytes > /target/tracer.txt && chmod 0644 /target/tracer.txt",
                securityContext={"runAsUser": 0},
                volumeMounts=[{"name": "payload", "mountPath": "/target"}],
            )
        ],
        volumes=[{"name": "payload", "emptyDir": {"sizeLimit": "10Mi"}}],
        securityContext={"fsGroup": 2000},
    )
    apply(node_cluster, node_namespace, spec)
    status = wait_pod(node_cluster, node_namespace, "injected")
    init = status["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert init["exitCode"] == 0
    assert init["reason"] == "Completed"

    deadline = time.monotonic() + 30
    while "root-fs-read-only" not in (out := logs(node_cluster, node_namespace, "injected")):
        assert time.monotonic() < deadline, out
        time.sleep(0.3)
    assert "uid=1500" in out
    assert "2000" in out.split("\n")[0]
    assert "tracer-bytes" in out
    assert "emptydir-writable" in out  # the kubelet gave the volume to the fsGroup
    assert "Read-only file system" in out


def test_environment_from_an_optional_secret(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    """A missing optional Secret leaves the variable unset and the pod runs; a present one
    sets it (the operator's injected LUMIGO_TRACER_TOKEN reference is optional)."""
    node_cluster.kubectl(
        "create", "secret", "generic", "present", "-n", node_namespace, "--from-literal=token=t0ken"
    )
    env = [
        {
            "name": "MISSING",
            "valueFrom": {"secretKeyRef": {"name": "absent", "key": "token", "optional": True}},
        },
        {
            "name": "PRESENT",
            "valueFrom": {"secretKeyRef": {"name": "present", "key": "token", "optional": True}},
        },
    ]
    apply(
        node_cluster,
        node_namespace,
        pod(
            "env",
            [
                container(
                    "app",
                    'echo "missing=${MISSING-unset} present=$PRESENT"; exec sleep 3600',
                    env=env,
                )
            ],
        ),
    )
    wait_pod(node_cluster, node_namespace, "env")
    deadline = time.monotonic() + 30
    while "missing=" not in (out := logs(node_cluster, node_namespace, "env")):
        assert time.monotonic() < deadline, out
        time.sleep(0.3)
    assert "missing=unset present=t0ken" in out


def test_writing_past_an_emptydir_size_limit_evicts_the_pod(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    """The kubelet enforces emptyDir.sizeLimit (the injector's volume has 200M) on this node."""
    apply(
        node_cluster,
        node_namespace,
        pod(
            "filler",
            [
                container(
                    "fill",
                    "dd if=/dev/zero of=/scratch/blob bs=1M count=8; exec sleep 3600",
                    volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
                )
            ],
            volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "2Mi"}}],
            restartPolicy="Never",
        ),
    )
    status = wait_pod(node_cluster, node_namespace, "filler", phases=("Failed",), timeout=120)
    assert status["status"].get("reason") == "Evicted", status["status"]
    message = status["status"].get("message", "")
    assert 'EmptyDir volume "scratch" exceeds the limit "2Mi"' in message, status["status"]


def test_a_restricted_namespace_runs_a_compliant_pod_confined_by_the_runtime(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    """Pod Security `restricted` is enforced by the API server, and what it demands (seccomp
    RuntimeDefault, no capabilities, no privilege escalation, non-root) is done by the runtime."""
    node_cluster.kubectl(
        "label", "namespace", node_namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    loose = pod("loose", [container("app", "sleep 3600")])
    with pytest.raises(KubectlError, match="violates PodSecurity"):
        apply(node_cluster, node_namespace, loose)

    confined = pod(
        "confined",
        [
            container(
                "app",
                "grep -E '^(Seccomp|NoNewPrivs|CapEff|Uid):' /proc/self/status; exec sleep 3600",
                securityContext=RESTRICTED_SECURITY,
            )
        ],
    )
    apply(node_cluster, node_namespace, confined)
    wait_pod(node_cluster, node_namespace, "confined")
    deadline = time.monotonic() + 30
    while "Seccomp" not in (out := logs(node_cluster, node_namespace, "confined")):
        assert time.monotonic() < deadline, out
        time.sleep(0.3)
    fields = {k: v.split() for k, v in (line.split(":", 1) for line in out.strip().splitlines())}
    assert fields["Seccomp"] == ["2"], out  # SECCOMP_MODE_FILTER: the runtime's default profile
    assert fields["NoNewPrivs"] == ["1"], out
    assert int(fields["CapEff"][0], 16) == 0, out
    assert fields["Uid"][0] == "1500", out
    assert (
        json.loads(
            node_cluster.kubectl("get", "pod", "-n", node_namespace, "confined", "-o", "json")
        )["spec"]["nodeName"]
        == node.name
    )


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    """An operator pod talks to the API server at kubernetes.default.svc:443, although the
    local API server listens on loopback only (the node relays the Service IP to it)."""
    script = (
        "printf 'GET /version HTTP/1.0\\r\\n\\r\\n' | "
        "nc -w 5 kubernetes.default.svc.cluster.local 443; exec sleep 3600"
    )
    apply(node_cluster, node_namespace, pod("client", [container("c", script)]))
    wait_pod(node_cluster, node_namespace, "client")
    deadline = time.monotonic() + 30
    # Go's TLS server answers a plain HTTP request with this: it is the API server speaking.
    while "Client sent an HTTP request to an HTTPS server" not in (
        out := logs(node_cluster, node_namespace, "client")
    ):
        assert time.monotonic() < deadline, out
        time.sleep(0.3)


def test_an_image_volume_mounts_an_imported_image_read_only_with_a_subpath(
    node: LocalNode, node_cluster: LocalCluster, node_namespace: str
) -> None:
    """Kubernetes' `image` volume (KEP-4639) on this node's containerd 2: the image's files,
    read-only, without a copy, for a non-root user with every capability dropped; with a subPath
    (containerd >= 2.2) only that directory."""
    image = {"reference": BUSYBOX_IMAGE, "pullPolicy": "Never"}
    spec = pod(
        "image-volume",
        [
            container(
                "app",
                "id; ls /whole | head -3; ls /bin-only/busybox && echo subpath-ok; "
                "touch /whole/x 2>&1 || echo volume-read-only; exec sleep 3600",
                securityContext=RESTRICTED_SECURITY,
                volumeMounts=[
                    {"name": "img", "mountPath": "/whole"},
                    {"name": "img", "mountPath": "/bin-only", "subPath": "bin"},
                ],
            )
        ],
        volumes=[{"name": "img", "image": image}],
    )
    apply(node_cluster, node_namespace, spec)
    wait_pod(node_cluster, node_namespace, "image-volume")
    deadline = time.monotonic() + 30
    while "volume-read-only" not in (out := logs(node_cluster, node_namespace, "image-volume")):
        assert time.monotonic() < deadline, out
        time.sleep(0.3)
    assert "uid=1500" in out
    assert "subpath-ok" in out
    assert "bin" in out.split("\n")[1:4]
    assert "Read-only file system" in out
