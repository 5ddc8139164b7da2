"""Secure /metrics (issue 28 item 8) on a real API server: the manager serves /metrics over TLS,
only to a bearer token the API server accepts (TokenReview) whose user may `get` the non-resource
URL /metrics (SubjectAccessReview), as controller-runtime's WithAuthenticationAndAuthorization;
plain HTTP when asked. Probes stay plain HTTP either way. The tokens are real ServiceAccount
tokens (TokenRequest), the role is the shipped metrics-reader ClusterRole's rules."""

from __future__ import annotations

import socket
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from controller.runtime.kube import KubeClient
from controller.runtime.manager import Manager, ManagerOptions
from controller.runtime.probe_server import self_signed_pair
from envtest.cluster import LocalCluster
from envtest.operator import metrics_reader_token, release_metrics_reader, scrape
from tests.support.webhook_server import peer_fingerprint


def start_manager(
    kube: KubeClient, namespace: str, *, secure: bool, cert_dir: Path | None = None
) -> Manager:
    manager = Manager(
        kube,
        ManagerOptions(
            namespace=namespace,
            leader_election=False,
            health_probe_bind_address="127.0.0.1:0",
            metrics_bind_address="localhost:0",  # another address: a server of its own
            metrics_secure=secure,
            metrics_cert_dir=str(cert_dir) if cert_dir else None,
            graceful_shutdown_timeout=5,
        ),
    )
    manager.start()
    return manager


@pytest.fixture
def reader(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    """A token of a ServiceAccount bound to the metrics-reader rules."""
    name = f"metrics-reader-{uuid.uuid4().hex[:6]}"
    try:
        yield metrics_reader_token(cluster, namespace, name)
    finally:
        release_metrics_reader(cluster, name)


def probe_ok(manager: Manager) -> bool:
    url = f"http://127.0.0.1:{manager.probes.port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bool(resp.status == 200)


def test_secure_metrics_need_a_token_allowed_to_get_them(
    cluster: LocalCluster, kube: KubeClient, namespace: str, reader: str
) -> None:
    stranger = metrics_reader_token(cluster, namespace, "stranger", bound=False)
    manager = start_manager(kube, namespace, secure=True)
    try:
        assert manager.metrics_server is not None
        port = manager.metrics_server.port

        # No token, or one the API server does not know: 401.
        status, body = scrape(port, secure=True)
        assert status == 401, body
        assert "bearer token is required" in body
        status, body = scrape(port, secure=True, token="not-a-real-token")
        assert status == 401, body
        assert "not accepted" in body

        # A real ServiceAccount that may not get /metrics: 403, naming who and what.
        status, body = scrape(port, secure=True, token=stranger)
        assert status == 403, body
        assert f"system:serviceaccount:{namespace}:stranger" in body
        assert "'/metrics'" in body

        # Bound to the metrics-reader rules: the metrics.
        status, body = scrape(port, secure=True, token=reader)
        assert status == 200, body
        assert "\nrest_client_requests_total" in body
        assert "# TYPE workqueue_depth gauge" in body

        # The decision is cached: a second scrape sends no review.
        auth = manager.metrics_server.auth
        assert auth is not None
        sent = auth.reviews
        assert scrape(port, secure=True, token=reader)[0] == 200
        assert auth.reviews == sent

        # Never over plain HTTP on the secure port; probes stay plain HTTP.
        assert scrape(port, secure=False)[0] != 200
        assert probe_ok(manager)
    finally:
        manager.stop()


def test_plain_metrics_are_served_without_a_token(kube: KubeClient, namespace: str) -> None:
    manager = start_manager(kube, namespace, secure=False)
    try:
        assert manager.metrics_server is not None
        status, body = scrape(manager.metrics_server.port, secure=False)
        assert status == 200, body
        assert "\nrest_client_requests_total" in body
        assert probe_ok(manager)
    finally:
        manager.stop()


def test_secure_metrics_cannot_share_the_probes_address(kube: KubeClient, namespace: str) -> None:
    with pytest.raises(ValueError, match="address of their own"):
        Manager(
            kube,
            ManagerOptions(namespace=namespace, health_probe_bind_address=":8081",
                           metrics_bind_address=":8081", metrics_secure=True),
        )  # fmt: skip


def test_secure_metrics_serve_the_certificate_of_the_cert_dir(
    kube: KubeClient, namespace: str, reader: str, tmp_path: Path
) -> None:
    """--metrics-cert-dir: tls.crt and tls.key from a directory (e.g. cert-manager's) instead
    of the self-signed pair made in memory."""
    cert_pem, key_pem = self_signed_pair(("metrics.example",))
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(key_pem)
    manager = start_manager(kube, namespace, secure=True, cert_dir=tmp_path)
    try:
        assert manager.metrics_server is not None
        port = manager.metrics_server.port
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            served = peer_fingerprint(tls)
        assert served == x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256())
        assert scrape(port, secure=True, token=reader)[0] == 200
    finally:
        manager.stop()
