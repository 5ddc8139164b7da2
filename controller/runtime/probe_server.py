"""Probe and metrics endpoints: /healthz, /readyz (plain HTTP), /metrics (HTTPS or plain).

Checks are named callables returning None when fine or raising (any exception = failing, its
message is shown). `/healthz?verbose` and `/readyz?verbose` list every check like the API server.

Served by the webhook's HTTP server (`kube.http.server.HTTPServer`: uvicorn): idle
connections are closed after a while, a request must arrive within a deadline, and the number of
open connections is capped (the longest idle closed first), so idle or slow clients can neither
pile up threads nor keep the kubelet's probes from being answered.

Probes are plain HTTP for the kubelet. /metrics names namespaces and workloads, so by default it
is served as controller-runtime's scaffold serves it (`SecureServing`): over TLS, and only to a
caller whose bearer token the API server accepts (TokenReview) and who may `get` the
non-resource URL /metrics (SubjectAccessReview): `kube.delegated_auth`. The
certificate comes from a directory (tls.crt, tls.key; followed while serving) or, without one,
is generated in memory at start-up, as controller-runtime does. Plain /metrics is an option for
scrapers inside a trusted network.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from kube import certs
from kube.cert_manager import FileCerts
from kube.delegated_auth import CacheSettings, DelegatedAuth, ReviewAPI
from kube.http.server import HTTPServer, Request, Response, ServerOptions
from kube.http.tls import ServingTLS

log = logging.getLogger("lumigo.health")

Check = Callable[[], None]

# Probes and scrapes are small GETs from a few clients (kubelet, Prometheus).
PROBE_OPTIONS = ServerOptions(
    max_connections=256,
    workers=2,
    max_body_bytes=64 * 1024,
    body_budget_bytes=1024 * 1024,
    handler_budget_bytes=1024 * 1024,
    shutdown_timeout=5.0,
)


class CheckFailed(Exception):
    pass


def parse_bind_address(address: str) -> tuple[str, int]:
    """':8080' -> ('0.0.0.0', 8080); '127.0.0.1:0' -> ('127.0.0.1', 0)."""
    host, _, port = address.rpartition(":")
    return (host or "0.0.0.0", int(port))  # noqa: S104 - probes must be reachable by kubelet


@dataclass(frozen=True)
class SecureServing:
    """/metrics over TLS, to callers the API server authenticates and authorizes.

    `api` sends the TokenReviews and SubjectAccessReviews (its identity needs `create` on both).
    `cert_dir` holds tls.crt and tls.key (followed while serving); None: a self-signed pair for
    `host_names` (plus the host name, localhost and 127.0.0.1) is generated in memory at start.
    """

    api: ReviewAPI
    cert_dir: Path | None = None
    host_names: tuple[str, ...] = ()
    cache: CacheSettings = field(default_factory=CacheSettings)


def self_signed_pair(host_names: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """A certificate and key (PEM) for this host, made in memory; never written anywhere."""
    hostname = socket.gethostname() or "localhost"
    names = tuple(dict.fromkeys((*host_names, "localhost")))
    policy = certs.CertPolicy(
        service=hostname,
        namespace="local",
        extra_dns_names=names,
        extra_ip_addresses=("127.0.0.1", "::1"),
    )
    pair = certs.bootstrap(policy, dt.datetime.now(dt.UTC)).serving
    return pair.cert_pem, pair.key_pem


class ProbeServer:
    """One HTTP server; serves probes, metrics, or both depending on flags. With `secure`,
    over TLS, and /metrics only to callers the API server says may get it (probes are never
    served securely: the kubelet probes plain HTTP)."""

    def __init__(
        self,
        address: str,
        *,
        probes: bool = True,
        metrics: bool = True,
        options: ServerOptions = PROBE_OPTIONS,
        secure: SecureServing | None = None,
    ) -> None:
        if secure is not None and probes:
            raise ValueError(
                "probes are served over plain HTTP for the kubelet: serve secure metrics on "
                "an address of their own"
            )
        self.healthz: dict[str, Check] = {}
        self.readyz: dict[str, Check] = {}
        self._serve_probes = probes
        self._serve_metrics = metrics
        self.secure = secure
        self.auth = DelegatedAuth(secure.api, secure.cache) if secure is not None else None
        self.tls = ServingTLS(expiry_metric=False) if secure is not None else None
        self._files: FileCerts | None = None
        host, port = parse_bind_address(address)
        self._server = HTTPServer(
            self._handle,
            dataclasses.replace(options, host=host, port=port),
            tls=self.tls,
            name=f"{'metrics' if secure else 'probe'}-server-{port}",
        )

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        if self.secure is not None and self.tls is not None and self.tls.loaded is None:
            if self.secure.cert_dir is None:
                self.tls.load_pem(*self_signed_pair(self.secure.host_names))
            else:
                self._files = FileCerts(self.tls, self.secure.cert_dir)
                self._files.start()
                if self.tls.loaded is None:
                    self._files.stop()
                    raise RuntimeError(f"cannot serve metrics over TLS: {self._files.problem}")
        self._server.start()

    def stop(self) -> None:
        self._server.stop()
        if self._files is not None:
            self._files.stop()

    def _handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", "text/plain", {"Allow": "GET, HEAD"})
        path, _, query = request.target.partition("?")
        if path == "/metrics" and self._serve_metrics:
            denied = self.auth.check(request) if self.auth is not None else None
            return denied or Response(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        if path in ("/healthz", "/livez") and self._serve_probes:
            return self._checks(self.healthz, "verbose" in query)
        if path == "/readyz" and self._serve_probes:
            return self._checks(self.readyz, "verbose" in query)
        return Response(404, b"not found\n", "text/plain")

    @staticmethod
    def _checks(checks: dict[str, Check], verbose: bool) -> Response:
        lines, ok = [], True
        for name, check in sorted(checks.items()):
            try:
                check()
                lines.append(f"[+]{name} ok")
            except Exception as err:
                ok = False
                lines.append(f"[-]{name} failed: {err}")
        if ok and not verbose:
            return Response(200, b"ok", "text/plain")
        text = "\n".join(lines) + ("\nok\n" if ok else "\nfailed\n")
        return Response(200 if ok else 500, text.encode(), "text/plain")
