"""The serving certificate, swappable while the server runs (no restart, no dropped connection).

Python's `ssl` can only load a key pair from a file path, and re-loading into a live context is
not safe. So every new pair gets a fresh `SSLContext`, and the listening context's `sni_callback`
(which OpenSSL runs on every handshake, SNI or not) points each new connection at the newest one.
Connections already established keep the context they started with, like Go's GetCertificate.
The PEM never touches a named file: it is loaded from an anonymous memfd.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
import threading
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from kube.http.server_metrics import CERTIFICATE_EXPIRY

log = logging.getLogger("lumigo.webhook.tls")


class InvalidKeyPair(ValueError):
    """The certificate/key pair cannot be served (the message never contains key material)."""


@dataclass(frozen=True)
class Loaded:
    """What is being served: the certificate, its SHA-256 fingerprint and its context."""

    certificate: x509.Certificate
    fingerprint: str
    context: ssl.SSLContext
    pair_digest: bytes  # of cert + key PEM, to tell "same pair again" without keeping the key


def _new_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """`load_cert_chain` from memory: an anonymous memfd (or a 0600 temp file, unlinked)."""
    data = key_pem.rstrip(b"\n") + b"\n" + cert_pem
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("webhook-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp()  # pragma: no cover - non-Linux: a 0600 file, unlinked at once
    try:  # pragma: no cover
        os.write(fd, data)
        os.close(fd)
        ctx.load_cert_chain(path)
    finally:  # pragma: no cover
        with contextlib.suppress(OSError):
            os.unlink(path)


class ServingTLS:
    """Holds the current serving certificate; `server_context()` is what sockets are wrapped in."""

    def __init__(self, *, expiry_metric: bool = True) -> None:
        """`expiry_metric`: export the serving certificate's expiry (the webhook's; not for
        another server's certificate in the same process)."""
        self._expiry_metric = expiry_metric
        self._loaded: Loaded | None = None
        self._lock = threading.Lock()
        self._base = _new_context()
        self._base.sni_callback = self._select

    def server_context(self) -> ssl.SSLContext:
        return self._base

    def _select(
        self, sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> int | None:
        loaded = self._loaded
        if loaded is None:
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR  # nothing to serve yet: fail fast
        sock.context = loaded.context
        return None

    @property
    def loaded(self) -> Loaded | None:
        return self._loaded

    def load_pem(self, cert_pem: bytes, key_pem: bytes) -> bool:
        """Serve this pair from the next handshake on. Returns False if it is already served.

        Raises InvalidKeyPair (and keeps serving the previous pair) when the PEM does not parse
        or the key does not match the certificate: a half-written update must not take the
        webhook down.
        """
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).digest()
        current = self._loaded
        if current is not None and current.pair_digest == digest:
            return False
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError as err:
            raise InvalidKeyPair(f"the serving certificate is not valid PEM: {err}") from None
        ctx = _new_context()
        try:
            _load_chain(ctx, cert_pem, key_pem)
        except (ssl.SSLError, OSError) as err:
            # The OpenSSL reason (e.g. KEY_VALUES_MISMATCH) names the problem, not the key.
            reason = getattr(err, "reason", None) or type(err).__name__
            raise InvalidKeyPair(
                f"the serving certificate and key cannot be loaded ({reason})"
            ) from None
        fingerprint = cert.fingerprint(hashes.SHA256()).hex()
        with self._lock:
            self._loaded = Loaded(cert, fingerprint, ctx, digest)
        if self._expiry_metric:
            CERTIFICATE_EXPIRY.labels("serving").set(cert.not_valid_after_utc.timestamp())
        log.info(
            "serving certificate loaded",
            extra={
                "fingerprint_sha256": fingerprint,
                "not_after": cert.not_valid_after_utc.isoformat(),
            },
        )
        return True
