"""Running the admission server in tests: certificates, client contexts, raw TLS exchanges."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import socket
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

from webhook import certs
from webhook.routing import Route
from webhook.server import AdmissionServer, ServerOptions
from webhook.tls import ServingTLS

POLICY = certs.CertPolicy("webhook", "tests", extra_ip_addresses=("127.0.0.1",))


def new_pki() -> certs.CertState:
    return certs.bootstrap(POLICY, dt.datetime.now(dt.UTC))


def client_context(*states: certs.CertState) -> ssl.SSLContext:
    """A client trusting the bundles of `states` and checking the name (127.0.0.1)."""
    return ssl.create_default_context(cadata="".join(s.bundle_pem.decode() for s in states))


@contextlib.contextmanager
def running(
    routes: Mapping[str, Route], tls: ServingTLS, **options: Any
) -> Iterator[AdmissionServer]:
    server = AdmissionServer(routes, tls, ServerOptions(host="127.0.0.1", port=0, **options))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def tls_socket(
    port: int, context: ssl.SSLContext, timeout: float = 30.0
) -> Iterator[ssl.SSLSocket]:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        yield sock
    finally:
        sock.close()


def exchange(sock: ssl.SSLSocket, raw_request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read one HTTP response: (status, headers, body)."""
    sock.sendall(raw_request)
    resp = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    resp.begin()
    body = resp.read()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def post(path: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def message(body: bytes) -> str:
    return str(json.loads(body)["message"])


def peer_fingerprint(sock: ssl.SSLSocket) -> bytes:
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    return x509.load_der_x509_certificate(der).fingerprint(hashes.SHA256())
