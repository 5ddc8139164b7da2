"""Extra CAs for what leaves the cluster (controller/runtime/trust.py), against a real TLS server
on loopback whose certificate a private CA signed: trusted only with that CA's directory in
SSL_CERT_DIR, as the collectors (Go) read it; hidden entries of a mounted ConfigMap skipped."""

from __future__ import annotations

import http.server
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.runtime import trust
from tests.support.private_ca import PrivateCA, private_ca


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[str, PrivateCA]]:
    ca = private_ca(tmp_path / "pki", "127.0.0.1")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ca.server_context().wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", ca
    finally:
        server.shutdown()
        server.server_close()


def mounted_like_a_configmap(directory: Path, ca: PrivateCA) -> Path:
    """ca.crt -> ..data/ca.crt, ..data -> ..2026_11_28 (what the kubelet writes)."""
    versioned = directory / "..2026_11_28"
    versioned.mkdir(parents=True)
    (versioned / "ca.crt").write_bytes(ca.ca_pem.read_bytes())
    (directory / "..data").symlink_to(versioned.name)
    (directory / "ca.crt").symlink_to("..data/ca.crt")
    return directory


def test_without_the_extra_ca_the_private_upstream_is_refused(
    upstream: tuple[str, PrivateCA],
) -> None:
    url, _ = upstream
    assert trust.extra_ca_files({}) == []
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(url, context=trust.upstream_context({}), timeout=5)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


def test_the_ca_in_an_ssl_cert_dir_directory_is_trusted_besides_the_system_ones(
    upstream: tuple[str, PrivateCA], tmp_path: Path
) -> None:
    url, ca = upstream
    mounted = mounted_like_a_configmap(tmp_path / "egress-ca", ca)
    environ = {"SSL_CERT_DIR": f"{tmp_path / 'missing'}:{mounted}"}
    assert trust.extra_ca_files(environ) == [mounted / "ca.crt"]
    context = trust.upstream_context(environ)
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        assert response.status == 204
    # The system's CAs are still there (a public endpoint keeps working).
    assert len(context.get_ca_certs()) == len(ssl.create_default_context().get_ca_certs()) + 1


def test_a_file_without_a_certificate_is_skipped_not_fatal(
    upstream: tuple[str, PrivateCA], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, ca = upstream
    directory = tmp_path / "bundle"
    directory.mkdir()
    (directory / "ca.crt").write_bytes(ca.ca_pem.read_bytes())
    (directory / "notes.txt").write_text("not a certificate\n")
    context = trust.upstream_context({"SSL_CERT_DIR": str(directory)})
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        assert response.status == 204
    assert "not a CA certificate file, skipped" in caplog.text
