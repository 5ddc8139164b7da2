"""files mode (OLM): tls.crt/tls.key replaced on disk are served without a restart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from prometheus_client import REGISTRY

from envtest.process import wait_until
from kube.cert_manager import FileCerts
from kube.certs import CertState
from kube.http.readiness import NotReady
from kube.http.tls import ServingTLS
from tests.support import reviews, standin_handler
from tests.support.webhook_server import (
    client_context,
    exchange,
    new_pki,
    peer_fingerprint,
    post,
    running,
    tls_socket,
)

PATH = "/v1alpha1/inject"


def write_pair(directory: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """Like the kubelet: write a new directory, then swap a symlink atomically."""
    generation = directory / f"..gen-{os.urandom(4).hex()}"
    generation.mkdir()
    (generation / "tls.crt").write_bytes(cert_pem)
    (generation / "tls.key").write_bytes(key_pem)
    link = directory / "..data"
    tmp = directory / "..data_tmp"
    tmp.symlink_to(generation.name)
    tmp.replace(link)
    for name in ("tls.crt", "tls.key"):
        target = directory / name
        if not target.is_symlink():
            target.symlink_to(f"..data/{name}")


def fingerprint(state: CertState) -> bytes:
    return state.serving.cert.fingerprint(hashes.SHA256())


def body() -> bytes:
    return reviews.body_of(reviews.review(reviews.deployment()))


def test_files_are_served_and_replacements_picked_up_without_restart(tmp_path: Path) -> None:
    first, second = new_pki(), new_pki()
    tls = ServingTLS()
    files = FileCerts(tls, tmp_path, poll_interval=0.05)
    with pytest.raises(NotReady, match="no serving certificate"):
        files.ready()
    write_pair(tmp_path, first.serving.cert_pem, first.serving.key_pem)
    files.start()
    ctx = client_context(first, second)
    try:
        files.ready()
        with (
            running({PATH: standin_handler.handle}, tls) as server,
            tls_socket(server.port, ctx) as live,
        ):
            assert exchange(live, post(PATH, body()))[0] == 200
            assert peer_fingerprint(live) == fingerprint(first)

            write_pair(tmp_path, second.serving.cert_pem, second.serving.key_pem)

            def new_connections_see_the_new_certificate() -> bool:
                with tls_socket(server.port, ctx) as fresh:
                    return peer_fingerprint(fresh) == fingerprint(second)

            wait_until(new_connections_see_the_new_certificate, 30, "the new certificate")
            # The keep-alive connection opened before the swap keeps working.
            assert exchange(live, post(PATH, body()))[0] == 200
            assert peer_fingerprint(live) == fingerprint(first)
        expiry = REGISTRY.get_sample_value(
            "lumigo_webhook_certificate_expiry_timestamp_seconds", {"kind": "serving"}
        )
        assert expiry == second.serving.cert.not_valid_after_utc.timestamp()
    finally:
        files.stop()


def test_a_broken_or_half_written_pair_keeps_the_previous_one(tmp_path: Path) -> None:
    first, second = new_pki(), new_pki()
    tls = ServingTLS()
    files = FileCerts(tls, tmp_path, poll_interval=3600)  # driven by check() below
    write_pair(tmp_path, first.serving.cert_pem, first.serving.key_pem)
    files.start()
    try:
        loaded = tls.loaded
        assert loaded is not None
        assert loaded.fingerprint == fingerprint(first).hex()
        # A new certificate next to the old key: refused, the old pair stays served.
        write_pair(tmp_path, second.serving.cert_pem, first.serving.key_pem)
        assert not files.check()
        assert "cannot be loaded" in files.problem
        assert tls.loaded is loaded
        files.ready()  # still serving, so still ready
        write_pair(tmp_path, b"not a certificate", b"not a key")
        assert not files.check()
        assert tls.loaded is loaded
        # The matching key arrives: served from then on.
        write_pair(tmp_path, second.serving.cert_pem, second.serving.key_pem)
        assert files.check()
        loaded = tls.loaded
        assert loaded is not None
        assert loaded.fingerprint == fingerprint(second).hex()
        assert files.problem == ""
        assert not files.check()  # unchanged files: nothing to do
    finally:
        files.stop()


def test_missing_files_are_reported(tmp_path: Path) -> None:
    files = FileCerts(ServingTLS(), tmp_path / "nowhere", poll_interval=3600)
    files.start()
    try:
        with pytest.raises(NotReady, match="cannot read the serving certificate files"):
            files.ready()
    finally:
        files.stop()
