"""A private CA and a server certificate it signs (for an IP address), written as PEM files: an
upstream that only clients trusting that CA can reach (the egress tests)."""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

from kube.certs import CertPolicy, generate_ca, issue_serving


@dataclass(frozen=True)
class PrivateCA:
    ca_pem: Path  # the CA certificate, what clients must trust
    cert_pem: Path  # the server's certificate
    key_pem: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_pem, self.key_pem)
        return context


def private_ca(directory: Path, ip: str, name: str = "Example Corp Private CA") -> PrivateCA:
    now = dt.datetime.now(dt.UTC)
    policy = CertPolicy(service="upstream", namespace="example", extra_ip_addresses=(ip,))
    ca = generate_ca(policy, now, name)
    serving = issue_serving(ca, policy, now)
    directory.mkdir(parents=True, exist_ok=True)
    paths = PrivateCA(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    paths.ca_pem.write_bytes(ca.cert_pem)
    paths.cert_pem.write_bytes(serving.cert_pem)
    paths.key_pem.write_bytes(serving.key_pem)
    paths.key_pem.chmod(0o600)
    return paths
