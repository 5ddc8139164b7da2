"""The node pulls as a user's cluster does: from an OCI registry over HTTPS that its containerd
verifies against the registry's private CA, with the credentials of the pod's `imagePullSecrets`
(a `kubernetes.io/dockerconfigjson` Secret) and nothing else. The images are pushed to the tier's
registry (envtest/registry.py) and are not in containerd before the pod asks for them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import tarfile
import time
from pathlib import Path
from typing import IO, Any

import pytest

from api import constants
from envtest import ociimage
from envtest.cluster import LocalCluster
from envtest.node import LocalNode, NodeError
from envtest.registry import LocalRegistry
from kube import certs
from tests.support.pods import apply, container, get, logs, pod, wait_pod
from tests.support.product import built_images
from webhook.pod_injection import InjectionSettings, inject

PULL_SECRET = "registry-credentials"
BUSYBOX_REPO = "lumigo/busybox-pulled"
AUTOTRACE_REPO = "lumigo/lumigo-autotrace"
LABEL = "io.lumigo.test.pulled-from-registry"


@pytest.fixture(scope="module")
def busybox_digest(registry: LocalRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    tar = relabeled(ociimage.busybox_image(), tmp_path_factory.mktemp("busybox"))
    return registry.push(tar, BUSYBOX_REPO, "1.35")


@pytest.fixture(scope="module")
def autotrace_digest(registry: LocalRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    tar = Path(built_images(("autotrace",))["autotrace"]["tar"])
    return registry.push(relabeled(tar, tmp_path_factory.mktemp("autotrace")), AUTOTRACE_REPO, "t")


def relabeled(archive: Path, workdir: Path) -> Path:
    """A copy of a docker-archive whose config has one more label: the same layers, another image
    ID. Why: once the kubelet (1.36, KubeletEnsureSecretPulledImages) has pulled an image ID with
    credentials, it no longer counts that ID as preloaded, and the tier's `Never` pods of the
    imported image with that ID would be refused (ErrImageNeverPull) for the rest of the node's
    life. Pulling a distinct ID keeps the shared node as the other tests expect it."""
    out = workdir / archive.name
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        manifest = json.load(_member(src, "manifest.json"))
        config = json.load(_member(src, manifest[0]["Config"]))
        config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), LABEL: "yes"}
        blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        name = hashlib.sha256(blob).hexdigest() + ".json"
        skip = {"manifest.json", manifest[0]["Config"]}
        manifest[0]["Config"] = name
        for path, data in (("manifest.json", json.dumps(manifest).encode()), (name, blob)):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
        for member in src:
            if member.name not in skip:
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    file = tar.extractfile(name)
    assert file is not None, name
    return file


def forget(node: LocalNode, registry: LocalRegistry, repository: str) -> None:
    """Remove every name of `repository` from containerd (and, synchronously, its content), so
    the next pod must pull it."""
    prefix = f"{registry.host}/{repository}"
    for name in node.ctr("images", "ls", "-q").split():
        if name.startswith((prefix + ":", prefix + "@")):
            with contextlib.suppress(NodeError):
                node.ctr("images", "rm", "--sync", name)
    assert not [n for n in node.ctr("images", "ls", "-q").split() if n.startswith(prefix)]


def pulled_pod(
    name: str, image: str, *, policy: str = "IfNotPresent", **spec: Any
) -> dict[str, Any]:
    script = "echo pulled-from-the-registry; exec sleep 3600"
    return pod(name, [container("app", script, image=image, imagePullPolicy=policy)], **spec)


def test_a_pod_pulls_an_image_that_is_only_in_the_registry_with_its_pull_secret(
    registry_node: LocalNode,
    node_cluster: LocalCluster,
    node_namespace: str,
    registry: LocalRegistry,
    busybox_digest: str,
) -> None:
    forget(registry_node, registry, BUSYBOX_REPO)
    apply(node_cluster, node_namespace, registry.pull_secret(PULL_SECRET))
    image = registry.ref(BUSYBOX_REPO, tag="1.35")
    spec = pulled_pod("pulled", image, imagePullSecrets=[{"name": PULL_SECRET}])
    apply(node_cluster, node_namespace, spec)

    status = wait_pod(node_cluster, node_namespace, "pulled")
    assert "pulled-from-the-registry" in logs(node_cluster, node_namespace, "pulled")
    # The kubelet reports the digest it pulled: the registry's manifest, not an imported tar.
    assert status["status"]["containerStatuses"][0]["imageID"] == registry.ref(
        BUSYBOX_REPO, digest=busybox_digest
    )


def test_without_valid_credentials_the_kubelet_reports_the_registrys_refusal(
    registry_node: LocalNode,
    node_cluster: LocalCluster,
    node_namespace: str,
    registry: LocalRegistry,
    busybox_digest: str,
) -> None:
    """No pull secret, or one with a wrong password: the registry refuses (401), so the pod
    waits in ErrImagePull/ImagePullBackOff. `Always` makes the kubelet ask the registry even if
    another test left the image on the node."""
    wrong = registry.pull_secret("wrong-password", password="not-the-password")
    apply(node_cluster, node_namespace, wrong)
    image = registry.ref(BUSYBOX_REPO, digest=busybox_digest)
    apply(node_cluster, node_namespace, pulled_pod("anonymous", image, policy="Always"))
    apply(
        node_cluster,
        node_namespace,
        pulled_pod("wrong", image, policy="Always", imagePullSecrets=[{"name": "wrong-password"}]),
    )
    # containerd's words: with no credentials it does not retry the registry's Basic challenge.
    expected = {"anonymous": "no basic auth credentials", "wrong": "401 Unauthorized"}
    for name, words in expected.items():
        reason, message = wait_image_error(node_cluster, node_namespace, name)
        assert reason in ("ErrImagePull", "ImagePullBackOff"), (name, reason, message)
        assert words in message, message


def test_the_node_verifies_the_registry_certificate_against_the_ca_it_was_given(
    registry_node: LocalNode,
    node_cluster: LocalCluster,
    node_namespace: str,
    registry: LocalRegistry,
    busybox_digest: str,
) -> None:
    """containerd skips TLS verification for a loopback registry it has no `hosts.toml` for (its
    localhost fallback); the node's `certs.d` entry names the CA, so with another CA there the
    pull fails: the tier's pulls are verified, as a user's node verifies its registry."""
    policy = certs.CertPolicy(service="other", namespace="local")
    other = certs.generate_ca(policy, dt.datetime.now(dt.UTC), common_name="another-ca")
    registry_node.trust_registry(registry.host, other.cert_pem)
    try:
        apply(node_cluster, node_namespace, registry.pull_secret(PULL_SECRET))
        image = registry.ref(BUSYBOX_REPO, digest=busybox_digest)
        spec = pulled_pod(
            "untrusted", image, policy="Always", imagePullSecrets=[{"name": PULL_SECRET}]
        )
        apply(node_cluster, node_namespace, spec)
        _, message = wait_image_error(node_cluster, node_namespace, "untrusted")
        assert "certificate signed by unknown authority" in message, message
    finally:
        registry_node.trust_registry(registry.host, registry.ca_pem)


def wait_image_error(cluster: LocalCluster, namespace: str, name: str) -> tuple[str, str]:
    deadline = time.monotonic() + 60
    while True:
        obj = get(cluster, namespace, "pod", name)
        for status in obj.get("status", {}).get("containerStatuses", []):
            waiting = status.get("state", {}).get("waiting", {})
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                return waiting["reason"], waiting.get("message", "")
            assert "running" not in status.get("state", {}), f"{name} started: {status}"
        assert time.monotonic() < deadline, f"{name}: no image pull error: {obj.get('status')}"
        time.sleep(0.3)


def instrumented(bare: dict[str, Any], settings: InjectionSettings) -> dict[str, Any]:
    """`bare` as the webhook would instrument it in a Deployment's template (bare Pods are not
    injected: they are the workloads' pods)."""
    template = {"metadata": bare["metadata"], "spec": bare["spec"]}
    labels = bare["metadata"]["labels"]
    workload = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": bare["metadata"]["name"]},
        "spec": {"selector": {"matchLabels": labels}, "template": template},
    }
    injected = inject(workload, settings)["spec"]["template"]
    return {**bare, "metadata": injected["metadata"], "spec": injected["spec"]}


def test_an_instrumented_pod_pulls_the_autotrace_image_by_digest(
    registry_node: LocalNode,
    node_cluster: LocalCluster,
    node_namespace: str,
    registry: LocalRegistry,
    autotrace_digest: str,
) -> None:
    """The product's own mutation (webhook.pod_injection.inject) with the injector image named by
    digest in the registry, in both injection modes: the init container's copy and the image
    volume, each pulled with the pod's pull secret."""
    forget(registry_node, registry, AUTOTRACE_REPO)
    apply(node_cluster, node_namespace, registry.pull_secret(PULL_SECRET))
    image = registry.ref(AUTOTRACE_REPO, digest=autotrace_digest)
    injector = f"{constants.LUMIGO_MOUNT_PATH}/injector/lumigo_injector.so"
    for mode in (constants.INJECTION_MODE_INIT_CONTAINER, constants.INJECTION_MODE_IMAGE_VOLUME):
        settings = InjectionSettings(
            injector_image=image, injector_pull_policy="IfNotPresent", injection_mode=mode
        )
        name = f"traced-{mode}"
        app = container("app", f"ls -l {injector} && echo payload-present; exec sleep 3600")
        apply(
            node_cluster,
            node_namespace,
            instrumented(pod(name, [app], imagePullSecrets=[{"name": PULL_SECRET}]), settings),
        )
    for mode in (constants.INJECTION_MODE_INIT_CONTAINER, constants.INJECTION_MODE_IMAGE_VOLUME):
        name = f"traced-{mode}"
        wait_pod(node_cluster, node_namespace, name, timeout=120)
        deadline = time.monotonic() + 30
        while "payload-present" not in (out := logs(node_cluster, node_namespace, name, "app")):
            assert time.monotonic() < deadline, out
            time.sleep(0.3)
    assert image in registry_node.ctr("images", "ls", "-q").split()
