"""Keeping the webhook's certificate right on a live cluster, in two modes.

`self` mode (Helm, kubectl): the certificate lives in a Secret (the CA Secret: CA key included),
and what a replica serves in a second one (the serving Secret: the serving pair and the CA
certificates, never a CA key), so whoever serves admissions never holds the key that signs.
- `CertWriter` runs on the leader only. It keeps the CA Secret valid (certs.plan: bootstrap,
  renewal, staged CA rotation) and every named webhook configuration's caBundle equal to the
  Secret's bundle. It runs on Secret / webhook-configuration events and at least every `resync`, and
  sleeps exactly until the next step is due. It has no loop of its own: its `sync` is the
  reconcile of a single-key controller of the controller runtime (work queue, backoff,
  metrics), which this generic toolkit cannot import; `wake` is how its events reach that loop.
  The Secret is written with PUT + resourceVersion; a conflict means someone else wrote: re-read
  and decide again. A deleted or corrupted Secret is rebuilt by certs.recover from what is
  intact, the CAs the configurations trust and the last good state seen (every replica's writer
  remembers it from events, so a new leader has it too): the same staged overlap as a CA
  rotation, never a hard CA cutover. The serving Secret is always rewritten from the CA
  Secret's state (`certs.encode_serving`), never read for it.
- `SelfSignedCerts` runs on every replica. It hot-swaps the served certificate from the serving
  Secret's events and is ready only when the served certificate is trusted by the Secret's
  bundle and every named webhook configuration carries that bundle. It never swaps a served
  certificate that the webhook configurations trust for one they do not trust (yet): that one
  waits until they do, and a corrupted Secret is not loaded at all.

`files` mode (OLM): OLM owns the certificate and the webhook configurations. `FileCerts` serves
tls.crt/tls.key from the mounted directory, polls them for changes, and never writes anything.

Wiring (what the manager does):
    tls = ServingTLS()
    cert = ManagedCert(policy, secret, mutating=[...])
    certs = SelfSignedCerts(tls, cert)                  # every replica
    writer = CertWriter(kube, cert)                     # leader only
    for informer in (secrets_in_own_namespace, mutating_configs, validating_configs):
        informer.add_handler(certs); informer.add_handler(writer)
    manager.add_controller(cert_writer_controller(writer))    # controller.operator
    Runnable("webhook-certs", certs.start, certs.stop); readyz["webhook-certs"] = certs.ready
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime as dt
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from functools import cached_property
from pathlib import Path

from cryptography import x509
from cryptography.x509.verification import VerificationError

from kube import certs, objects
from kube.background import BackgroundThread
from kube.http.readiness import NotReady
from kube.http.server_metrics import CERTIFICATE_EXPIRY
from kube.http.tls import InvalidKeyPair, ServingTLS
from kube.kinds import MUTATING_WEBHOOK_CONFIGURATIONS, SECRETS, VALIDATING_WEBHOOK_CONFIGURATIONS
from kube.objects import JSON
from kube.rest import ApiError, KubeAPI, Resource

log = logging.getLogger("lumigo.webhook.certs")

Clock = Callable[[], dt.datetime]
DEFAULT_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # noqa: S108 - OLM's mount point
MANAGED_BY = {"app.kubernetes.io/managed-by": "lumigo-operator"}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _identity(obj: JSON) -> tuple[str, str, str]:
    meta = objects.metadata(obj)
    return str(obj.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", ""))


def _bundle_mismatches(config: JSON, bundle_b64: str) -> list[str]:
    """Names of the webhooks in `config` whose caBundle is not `bundle_b64`."""
    return [
        str(webhook.get("name", f"#{i}"))
        for i, webhook in enumerate(config.get("webhooks") or [])
        if (webhook.get("clientConfig") or {}).get("caBundle") != bundle_b64
    ]


def _trusted_by_all(configs: Iterable[JSON]) -> tuple[x509.Certificate, ...]:
    """The CAs that every webhook of every given configuration trusts (none: no configuration)."""
    common: list[x509.Certificate] | None = None
    for config in configs:
        for webhook in config.get("webhooks") or []:
            encoded = (webhook.get("clientConfig") or {}).get("caBundle") or ""
            try:
                bundle = certs.parse_bundle(base64.b64decode(encoded))
            except ValueError:
                bundle = ()
            common = list(bundle) if common is None else [c for c in common if c in bundle]
    return tuple(common or ())


def _not_after(cert: x509.Certificate) -> str:
    return cert.not_valid_after_utc.isoformat()


@dataclass(frozen=True)
class ManagedCert:
    """One webhook certificate: how it is made (`policy`), where it is kept (a Secret in the
    policy's namespace) and who must trust it (the webhook configurations whose caBundle we own).
    """

    policy: certs.CertPolicy
    secret_name: str  # the CA Secret: the whole state, the CA key included (the writer's)
    mutating: Sequence[str] = ()
    validating: Sequence[str] = ()
    serving_secret_name: str = ""  # what replicas serve (no CA key); "": the CA Secret itself

    @property
    def serving_secret(self) -> str:
        return self.serving_secret_name or self.secret_name

    @property
    def split(self) -> bool:
        """Whether replicas serve from a Secret of their own, without the CA key."""
        return self.serving_secret != self.secret_name

    @cached_property
    def configs(self) -> tuple[tuple[Resource, str], ...]:
        """The webhook configurations, as (resource, name)."""
        return tuple((MUTATING_WEBHOOK_CONFIGURATIONS, n) for n in self.mutating) + tuple(
            (VALIDATING_WEBHOOK_CONFIGURATIONS, n) for n in self.validating
        )

    @cached_property
    def _ours(self) -> frozenset[tuple[str, str, str]]:
        ns = self.policy.namespace
        secrets = {("Secret", ns, self.secret_name), ("Secret", ns, self.serving_secret)}
        return frozenset(secrets | {(r.kind, "", name) for r, name in self.configs})

    def is_ours(self, obj: JSON) -> bool:
        """Whether an event is about our Secrets or one of our webhook configurations."""
        return _identity(obj) in self._ours

    def is_ca_secret(self, obj: JSON) -> bool:
        return _identity(obj) == ("Secret", self.policy.namespace, self.secret_name)

    def is_serving_secret(self, obj: JSON) -> bool:
        return _identity(obj) == ("Secret", self.policy.namespace, self.serving_secret)


class CertWriter:
    """Leader-only: keeps the certificate Secret and the webhook configurations' caBundle right."""

    def __init__(
        self, kube: KubeAPI, cert: ManagedCert, *, resync: float = 3600.0, clock: Clock = utcnow
    ) -> None:
        self.kube = kube
        self.cert = cert
        self._resync = resync
        self._clock = clock
        # Asks the loop for a pass; set by whoever runs `sync` (the controller's wiring).
        self.wake: Callable[[], None] = lambda: None
        self._rotate_ca = threading.Event()
        self._missing_logged: set[str] = set()
        # The last valid Secret seen (events on every replica, reads on the leader): what the
        # replicas serve, kept to recover from a deleted or corrupted Secret without a cutover.
        self._last_good: certs.CertState | None = None
        self.passes = 0

    # -- events (EventHandler) ----------------------------------------------------------------
    def on_add(self, obj: JSON) -> None:
        if not self.cert.is_ours(obj):
            return
        if self.cert.is_ca_secret(obj):
            with contextlib.suppress(certs.CorruptSecret):
                self._last_good = certs.decode(obj.get("data"))
        self.trigger()

    def on_update(self, old: JSON, new: JSON) -> None:
        self.on_add(new)

    def on_delete(self, obj: JSON) -> None:
        if self.cert.is_ours(obj):
            self.trigger()

    def trigger(self) -> None:
        self.wake()

    def rotate_ca(self) -> None:
        """Start a (staged, hitless) CA rotation now instead of when the CA nears its end."""
        self._rotate_ca.set()
        self.wake()

    # -- the loop (a single-key controller of the runtime calls these) -------------------------
    def sync(self) -> float:
        """One reconcile; seconds until the next one is due (the certificates' next step, at
        least 0.2 s, at most `resync`). Raises on API trouble: the caller backs off."""
        next_check = self.reconcile()
        delay = (next_check - self._clock()).total_seconds()
        return min(max(delay, 0.2), self._resync)

    # -- one reconcile ------------------------------------------------------------------------
    def reconcile(self) -> dt.datetime:
        """Bring the Secret and the webhook configurations in line; returns when to look again."""
        for _ in range(10):
            self.passes += 1
            next_check = self._pass()
            if next_check is not None:
                return next_check
        raise RuntimeError("the webhook certificate state did not settle (concurrent writers?)")

    def _pass(self) -> dt.datetime | None:
        """One read-decide-write step. None: something was written (or lost a race), look again."""
        now = self._clock()
        ns = self.cert.policy.namespace
        secret = self.kube.get_or_none(SECRETS, self.cert.secret_name, ns)
        configs = [(r, n, self.kube.get_or_none(r, n)) for r, n in self.cert.configs]
        try:
            if secret is None:
                raise certs.CorruptSecret("it does not exist")
            current = certs.decode(secret.get("data"))
        except certs.CorruptSecret as err:
            self._recover(secret, configs, str(err), now)
            return None
        self._last_good = current
        annotations = objects.annotations_of(secret)
        marker = annotations.get(certs.PUBLISHED_ANNOTATION)
        published_at = certs.parse_published(marker, current.bundle_id)
        newly_published = False
        bundle_b64 = base64.b64encode(current.bundle_pem).decode()
        everywhere = all(
            obj is not None and not _bundle_mismatches(obj, bundle_b64) for _, _, obj in configs
        )
        if published_at is None and everywhere:
            published_at, newly_published = now, True
        rotate = self._rotate_ca.is_set()
        plan = certs.plan(current, published_at, self.cert.policy, now, rotate_ca=rotate)
        if plan.changes or newly_published:
            same_bundle = plan.state.bundle_id == current.bundle_id
            if not self._write_secret(secret, plan.state, published_at if same_bundle else None):
                return None
            if rotate:
                self._rotate_ca.clear()
            self._written(plan)
            return None
        if self._write_serving_secret(plan.state):
            return None
        bundle_b64 = base64.b64encode(plan.state.bundle_pem).decode()
        return None if self._patch_bundles(configs, bundle_b64) else plan.next_check

    def _patch_bundles(
        self, configs: Sequence[tuple[Resource, str, JSON | None]], bundle_b64: str
    ) -> bool:
        """Set `bundle_b64` as the caBundle of every webhook configuration that exists (a missing
        one is logged once); whether any was patched."""
        patched = False
        for resource, name, obj in configs:
            if obj is None:
                if name not in self._missing_logged:
                    self._missing_logged.add(name)
                    log.warning(
                        "webhook configuration not found; its caBundle will be set when it appears",
                        extra={"kind": resource.kind, "object": name},
                    )
                continue
            self._missing_logged.discard(name)
            patched |= self._patch_bundle(resource, name, obj, bundle_b64)
        return patched

    def _recover(
        self,
        secret: JSON | None,
        configs: Sequence[tuple[Resource, str, JSON | None]],
        problem: str,
        now: dt.datetime,
    ) -> None:
        """Rebuild a deleted or unusable Secret so that what is served stays trusted."""
        trusted = _trusted_by_all(obj for _, _, obj in configs if obj is not None)
        salvaged = certs.salvage((secret or {}).get("data"))
        plan = certs.recover(salvaged, self._last_good, trusted, self.cert.policy, now)
        if plan.changes != ("bootstrap",):
            log.warning(
                "the webhook certificate Secret is unusable; rebuilding it without a CA cutover",
                extra={
                    "secret": f"{self.cert.policy.namespace}/{self.cert.secret_name}",
                    "reason": problem,
                },
            )
        if self._write_secret(secret, plan.state, None):
            self._written(plan)

    def _written(self, plan: certs.Plan) -> None:
        self._last_good = plan.state
        if plan.changes:
            log.info(
                "webhook certificates updated",
                extra={
                    "changes": list(plan.changes),
                    "bundle_id": plan.state.bundle_id,
                    "bundle_size": len(plan.state.bundle),
                    "serving_not_after": _not_after(plan.state.serving.cert),
                    "ca_not_after": _not_after(plan.state.ca.cert),
                },
            )

    def _write_secret(
        self, secret: JSON | None, state: certs.CertState, published_at: dt.datetime | None
    ) -> bool:
        """PUT (or create) the Secret; False when another writer got there first."""
        ns = self.cert.policy.namespace
        marker = certs.format_published(state.bundle_id, published_at) if published_at else None
        try:
            if secret is None:
                metadata: JSON = {
                    "name": self.cert.secret_name,
                    "namespace": ns,
                    "labels": MANAGED_BY,
                }
                if marker:
                    metadata["annotations"] = {certs.PUBLISHED_ANNOTATION: marker}
                body: JSON = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": metadata,
                    "type": "kubernetes.io/tls",
                    "data": certs.encode(state),
                }
                self.kube.create(SECRETS, body, ns)
            else:
                body = copy.deepcopy(secret)
                body["data"] = {**(secret.get("data") or {}), **certs.encode(state)}
                annotations = body["metadata"].setdefault("annotations", {}) or {}
                body["metadata"]["annotations"] = annotations
                if marker:
                    annotations[certs.PUBLISHED_ANNOTATION] = marker
                else:
                    annotations.pop(certs.PUBLISHED_ANNOTATION, None)
                self.kube.replace(SECRETS, body, ns)
        except ApiError as err:
            if err.conflict:  # 409: a concurrent write (or AlreadyExists): read again
                log.info("webhook certificate Secret changed under us; re-reading")
                return False
            raise
        return True

    def _write_serving_secret(self, state: certs.CertState) -> bool:
        """Make the serving Secret hold exactly `state`'s serving pair and bundle (the CA
        Secret's projection); True when it was written (or lost a race): look again."""
        if not self.cert.split:
            return False
        ns, name = self.cert.policy.namespace, self.cert.serving_secret
        data = certs.encode_serving(state)
        secret = self.kube.get_or_none(SECRETS, name, ns)
        if secret is not None and secret.get("data") == data:
            return False
        try:
            if secret is None:
                body: JSON = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "namespace": ns, "labels": MANAGED_BY},
                    "type": "kubernetes.io/tls",
                    "data": data,
                }
                self.kube.create(SECRETS, body, ns)
            else:
                body = copy.deepcopy(secret)
                body["data"] = data  # exactly these keys: a CA key put here is removed
                self.kube.replace(SECRETS, body, ns)
        except ApiError as err:
            if not err.conflict:
                raise
            return True  # a concurrent write: read again
        log.info("webhook serving certificate Secret updated", extra={"secret": f"{ns}/{name}"})
        return True

    def _patch_bundle(self, resource: Resource, name: str, config: JSON, bundle_b64: str) -> bool:
        ops: list[JSON] = []
        for i, webhook in enumerate(config.get("webhooks") or []):
            if (webhook.get("clientConfig") or {}).get("caBundle") == bundle_b64:
                continue
            # The test op pins index -> name: a concurrent reorder fails the patch (retried).
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": webhook.get("name")})
            ops.append(
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle_b64}
            )
        if not ops:
            return False
        self.kube.json_patch(resource, name, ops)
        log.info(
            "webhook configuration caBundle updated",
            extra={"kind": resource.kind, "object": name, "webhooks": len(ops) // 2},
        )
        return True


@dataclass
class _Pending:
    """The Secret's serving pair and bundle, not yet served."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    bundle_pem: bytes
    bundle: tuple[x509.Certificate, ...]
    held: bool = False  # logged as waiting for the webhook configurations to trust it


@dataclass(eq=False)
class SelfSignedCerts:
    """Every replica: serve the Secret's certificate (hot-swapped) and report readiness."""

    tls: ServingTLS
    cert: ManagedCert
    _: KW_ONLY
    kube: KubeAPI | None = None
    clock: Clock = utcnow
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # (kind, name) -> webhook configuration
    _seen: dict[tuple[str, str], JSON] = field(default_factory=dict, init=False)
    _bundle: tuple[x509.Certificate, ...] = field(default=(), init=False)
    _bundle_b64: str = field(default="", init=False)
    _secret_problem: str = field(default="the certificate Secret has not been seen yet", init=False)
    # informer threads: Secret vs webhook configurations
    _load_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _pending: _Pending | None = field(default=None, init=False)  # the pair, until it is served

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Read the current state once (events keep it fresh afterwards), if given a client."""
        if self.kube is None:
            return
        try:
            secret = self.kube.get_or_none(
                SECRETS, self.cert.serving_secret, self.cert.policy.namespace
            )
            if secret is not None:
                self.on_add(secret)
            for resource, name in self.cert.configs:
                config = self.kube.get_or_none(resource, name)
                if config is not None:
                    self.on_add(config)
        except ApiError as err:
            log.warning("initial read of webhook certificates failed", extra={"error": str(err)})

    def stop(self) -> None:
        return

    # -- events (EventHandler) ----------------------------------------------------------------
    def on_add(self, obj: JSON) -> None:
        if not self.cert.is_ours(obj) or (self.cert.split and self.cert.is_ca_secret(obj)):
            return  # a replica serves from the serving Secret only
        kind, _, name = _identity(obj)
        if kind == "Secret":
            self._load_secret(obj)
        else:
            with self._lock:
                self._seen[(kind, name)] = obj
            self._load_pending()  # the configurations may trust a held-back certificate now

    def on_update(self, old: JSON, new: JSON) -> None:
        self.on_add(new)

    def on_delete(self, obj: JSON) -> None:
        if not self.cert.is_ours(obj):
            return
        kind, _, name = _identity(obj)
        if kind == "Secret":
            # Keep serving what we have: the leader rebuilds the Secret (certs.recover).
            log.warning("the webhook certificate Secret was deleted; still serving the last one")
            return
        with self._lock:
            self._seen.pop((kind, name), None)
        self._load_pending()

    def _load_secret(self, secret: JSON) -> None:
        data = secret.get("data")
        try:
            bundle_pem = certs.decode_field(data, certs.CA_BUNDLE)
            pending = _Pending(
                certs.decode_field(data, certs.TLS_CERT),
                certs.decode_field(data, certs.TLS_KEY),
                bundle_pem,
                certs.parse_bundle(bundle_pem),
            )
            if not pending.bundle:
                raise certs.CorruptSecret(f"{certs.CA_BUNDLE} holds no valid certificate")
        except certs.CorruptSecret as err:
            self._not_loaded(err)
            return
        with self._load_lock:
            self._pending = pending
        self._load_pending()

    def _not_loaded(self, err: Exception) -> None:
        self._secret_problem = f"the certificate Secret cannot be served: {err}"
        log.warning(
            "not loading the webhook certificate Secret; still serving the last good one",
            extra={"reason": str(err)},
        )

    def _load_pending(self) -> None:
        """Serve the Secret's latest pair unless it would swap a trusted certificate for one the
        webhook configurations do not trust (yet): then it waits for their next change."""
        with self._load_lock:
            pending = self._pending
            if pending is None:
                return
            if self._untrusted_switch(pending.cert_pem):
                if not pending.held:
                    pending.held = True
                    log.info(
                        "holding a new serving certificate until the webhook configurations "
                        "trust it; still serving the last good one"
                    )
                return
            self._pending = None
            try:
                self.tls.load_pem(pending.cert_pem, pending.key_pem)
            except InvalidKeyPair as err:
                self._not_loaded(err)
                return
            bundle = pending.bundle
            with self._lock:
                self._bundle = bundle
                self._bundle_b64 = base64.b64encode(pending.bundle_pem).decode()
                self._secret_problem = ""
        loaded = self.tls.loaded
        issuer = next(
            (c for c in bundle if loaded and certs.issued_by(loaded.certificate, c)), None
        )
        if issuer is not None:
            CERTIFICATE_EXPIRY.labels("ca").set(issuer.not_valid_after_utc.timestamp())

    def _untrusted_switch(self, cert_pem: bytes) -> bool:
        """Whether serving `cert_pem` would replace a certificate the webhook configurations
        trust with one they do not (nothing served, none seen, or bad PEM: no reason to wait)."""
        loaded = self.tls.loaded
        with self._lock:
            seen = [self._seen.get((r.kind, n)) for r, n in self.cert.configs]
        configs = [c for c in seen if c is not None]
        if loaded is None or not configs:
            return False
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError:
            return False  # load_pem reports it
        if cert == loaded.certificate:
            return False
        trusted, now = _trusted_by_all(configs), self.clock()
        return certs.trusted_for(
            loaded.certificate, trusted, self.cert.policy, now
        ) and not certs.trusted_for(cert, trusted, self.cert.policy, now)

    # -- readiness ----------------------------------------------------------------------------
    def ready(self) -> None:
        """Raises NotReady until the served certificate is trusted where the API server looks."""
        # A held-back pair is re-judged here too, not only on the next configuration event: if
        # that event was handled before the Secret's (two informers, no order between them),
        # no further event would ever come to release it.
        self._load_pending()
        loaded = self.tls.loaded
        with self._lock:
            problem, bundle, bundle_b64 = self._secret_problem, self._bundle, self._bundle_b64
            seen = dict(self._seen)
        if loaded is None:
            raise NotReady(f"no serving certificate loaded: {problem or 'not yet'}")
        if not bundle:
            raise NotReady(problem)
        try:
            certs.verify_serving(
                loaded.certificate, bundle, self.cert.policy.subject_alt_names, self.clock()
            )
        except VerificationError as err:
            raise NotReady(
                f"the served certificate is not valid under the CA bundle: {err}"
            ) from None
        for resource, name in self.cert.configs:
            config = seen.get((resource.kind, name))
            if config is None:
                raise NotReady(f"{resource.kind} {name} not found")
            stale = _bundle_mismatches(config, bundle_b64)
            if stale:
                raise NotReady(
                    f"{resource.kind} {name}: the caBundle of {', '.join(stale)} does not match "
                    "the certificate Secret yet"
                )


class FileCerts:
    """files mode: serve tls.crt/tls.key from a directory (OLM's mount) and follow changes."""

    def __init__(
        self,
        tls: ServingTLS,
        directory: Path = DEFAULT_CERT_DIR,
        *,
        poll_interval: float = 5.0,
        cert_name: str = "tls.crt",
        key_name: str = "tls.key",
    ) -> None:
        self.tls = tls
        self.cert_path = Path(directory) / cert_name
        self.key_path = Path(directory) / key_name
        self.poll_interval = poll_interval
        self._poller = BackgroundThread("webhook-cert-files", self._run)
        self._last_digest = b""
        self.problem = f"waiting for {self.cert_path} and {self.key_path}"

    def start(self) -> None:
        self.check()
        self._poller.start()

    def stop(self) -> None:
        self._poller.stop()

    def _run(self) -> None:
        while not self._poller.stopping.wait(self.poll_interval):
            try:
                self.check()
            except Exception:
                log.exception("checking the certificate files failed")

    def check(self) -> bool:
        """Load the files if they changed and form a valid pair. True when a new pair is served.

        Kubernetes swaps the two files atomically, but a reader can still catch one old and one
        new file: that pair fails to load, the previous one stays served, the next poll fixes it.
        """
        try:
            cert_pem = self.cert_path.read_bytes()
            key_pem = self.key_path.read_bytes()
        except OSError as err:
            self.problem = f"cannot read the serving certificate files: {err.strerror}"
            return False
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).digest()
        if digest == self._last_digest:
            return False
        self._last_digest = digest
        try:
            changed = self.tls.load_pem(cert_pem, key_pem)
        except InvalidKeyPair as err:
            self.problem = str(err)
            log.warning(
                "not loading the certificate files; still serving the last good pair",
                extra={"cert": str(self.cert_path), "reason": str(err)},
            )
            return False
        self.problem = ""
        return changed

    def ready(self) -> None:
        if self.tls.loaded is None:
            raise NotReady(f"no serving certificate loaded: {self.problem}")
