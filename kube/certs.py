"""Webhook certificates as pure functions of (what we have, the time, the policy). No I/O.

The API server trusts the webhook through the caBundle in the webhook configurations, and the
only way to change a CA without failed calls is in stages (docs/operations.md, "Certificate
rotation"):

1. bootstrap: a CA, a serving certificate for `<svc>.<ns>.svc`, bundle = [CA];
2. the CA nears its end (invalid at now + ca_lookahead): a new CA becomes the *active* one and
   joins the bundle, [old, new], while the serving certificate stays under the old CA;
3. only once that bundle has been in every webhook configuration for `grace` (API-server
   informers and every replica catch up) is the serving certificate re-issued by the new CA;
4. the old CA leaves the bundle `grace` after the serving certificate left it (every replica
   has reloaded by then), or when it expires, whichever comes first.
A serving certificate nearing its end (invalid at now + serving_lookahead) is re-issued under
the same CA: the bundle does not change, so that renewal is hitless by construction.

A deleted or corrupted Secret is recovered through the same stages (`recover()`): an intact CA
is reused (only the serving pair is re-issued: hitless), otherwise a new CA joins the CAs the
webhook configurations trust now while the last good serving pair stays, exactly stage 2.

`plan()` decides which step is due; the caller (cert_manager) writes the result and tells it when
the current bundle was published. The clock is a parameter, so tests run years in milliseconds.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

# Keys of the certificate Secret (the tls.* pair makes it a valid kubernetes.io/tls Secret).
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CA_BUNDLE = "ca-bundle.crt"
SECRET_KEYS = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, CA_BUNDLE)
# "<bundle id>@<RFC 3339 time>": when the current bundle was first seen in every webhook config.
PUBLISHED_ANNOTATION = "operator.lumigo.io/ca-bundle-published"

CA_COMMON_NAME = "lumigo-operator-webhook-ca"


class CorruptSecret(ValueError):
    """The Secret cannot be used as it is (the message names what is wrong, never key bytes)."""


@dataclass(frozen=True)
class CertPolicy:
    """Who the certificate is for and how long things live. Tests use seconds."""

    service: str
    namespace: str
    ca_validity: dt.timedelta = dt.timedelta(days=3650)
    serving_validity: dt.timedelta = dt.timedelta(days=365)
    ca_lookahead: dt.timedelta = dt.timedelta(days=90)
    serving_lookahead: dt.timedelta = dt.timedelta(days=30)
    grace: dt.timedelta = dt.timedelta(minutes=5)
    backdate: dt.timedelta = dt.timedelta(hours=1)  # notBefore in the past: clock skew
    extra_dns_names: tuple[str, ...] = ()
    extra_ip_addresses: tuple[str, ...] = ()  # for `url:` client configs (tests: 127.0.0.1)

    def __post_init__(self) -> None:
        if not self.service or not self.namespace:
            raise ValueError("the webhook service name and namespace are required")
        if self.serving_validity <= self.serving_lookahead:
            raise ValueError(
                "the serving certificate validity must be longer than its renewal lookahead "
                f"({self.serving_validity} <= {self.serving_lookahead})"
            )
        if self.ca_lookahead <= self.serving_lookahead + self.grace:
            raise ValueError(
                "the CA lookahead must exceed the serving lookahead plus the grace period, so the "
                "serving certificate can move to a new CA before the old one runs out "
                f"({self.ca_lookahead} <= {self.serving_lookahead} + {self.grace})"
            )
        if self.ca_validity <= self.ca_lookahead:
            raise ValueError(
                "the CA validity must be longer than its rotation lookahead "
                f"({self.ca_validity} <= {self.ca_lookahead})"
            )

    @property
    def dns_names(self) -> tuple[str, ...]:
        svc, ns = self.service, self.namespace
        names = (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local")
        return names + tuple(n for n in self.extra_dns_names if n not in names)

    @property
    def subject_alt_names(self) -> tuple[x509.GeneralName, ...]:
        ips = tuple(x509.IPAddress(ipaddress.ip_address(a)) for a in self.extra_ip_addresses)
        return tuple(x509.DNSName(n) for n in self.dns_names) + ips


@dataclass(frozen=True)
class KeyPair:
    cert: x509.Certificate
    key: PrivateKey = field(repr=False)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class CertState:
    """What the Secret holds. Invariant: `bundle` contains `ca` and the serving cert's issuer."""

    ca: KeyPair  # the active CA: it signs every new serving certificate
    serving: KeyPair
    bundle: tuple[x509.Certificate, ...]  # what clients trust, oldest first

    @property
    def bundle_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.bundle)

    @property
    def bundle_id(self) -> str:
        return hashlib.sha256(self.bundle_pem).hexdigest()[:32]

    @property
    def serving_issuer(self) -> x509.Certificate | None:
        return next((c for c in self.bundle if issued_by(self.serving.cert, c)), None)


@dataclass(frozen=True)
class Plan:
    state: CertState  # what the Secret should hold (the current state when nothing is due)
    changes: tuple[str, ...]  # why it differs from the current state; empty = nothing to write
    next_check: dt.datetime  # look again at the latest then


# --- generation ------------------------------------------------------------------------------
def _new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())  # fast handshakes; Go and OpenSSL support it


def generate_ca(policy: CertPolicy, now: dt.datetime, common_name: str = CA_COMMON_NAME) -> KeyPair:
    key = _new_key()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            # Unique per CA: two generations must never look like the same issuer.
            x509.NameAttribute(NameOID.SERIAL_NUMBER, f"{int(now.timestamp() * 1e6):x}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - policy.backdate)
        .not_valid_after(now + policy.ca_validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Digital signatures for both; a CA also signs certificates and CRLs."""
    off = (
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "encipher_only",
        "decipher_only",
    )
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=ca, crl_sign=ca, **dict.fromkeys(off, False)
    )


def issue_serving(ca: KeyPair, policy: CertPolicy, now: dt.datetime) -> KeyPair:
    """A serving certificate under `ca`; it never outlives the CA."""
    key = _new_key()
    not_after = min(now + policy.serving_validity, ca.cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        # The CN is informational (clients match SANs) and limited to 64 characters.
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, policy.service[:64])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - policy.backdate)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(list(policy.subject_alt_names)),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def bootstrap(policy: CertPolicy, now: dt.datetime) -> CertState:
    ca = generate_ca(policy, now)
    return CertState(ca, issue_serving(ca, policy, now), (ca.cert,))


# --- verification ----------------------------------------------------------------------------
def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def verify_serving(
    cert: x509.Certificate,
    trusted: Sequence[x509.Certificate],
    names: Iterable[x509.GeneralName],
    at: dt.datetime,
) -> None:
    """Raise VerificationError unless a TLS client trusting `trusted` accepts `cert` for every
    name at time `at` (the same path validation an API server does, done by cryptography)."""
    if not trusted:
        raise VerificationError("no trusted CA")
    for name in names:
        if not isinstance(name, x509.DNSName | x509.IPAddress):
            continue
        verifier = PolicyBuilder().store(Store(list(trusted))).time(at).build_server_verifier(name)
        verifier.verify(cert, [])


def serving_valid_at(
    state: CertState, policy: CertPolicy, at: dt.datetime, trusted: Sequence[x509.Certificate]
) -> bool:
    return trusted_for(state.serving.cert, trusted, policy, at)


def trusted_for(
    cert: x509.Certificate,
    trusted: Sequence[x509.Certificate],
    policy: CertPolicy,
    at: dt.datetime,
) -> bool:
    """Whether a client trusting `trusted` accepts `cert` for every name of the policy."""
    try:
        verify_serving(cert, trusted, policy.subject_alt_names, at)
    except VerificationError:
        return False
    return True


# --- the rotation decision -------------------------------------------------------------------
def serving_issued_at(state: CertState, policy: CertPolicy) -> dt.datetime:
    """When the serving certificate was issued (its notBefore is backdated by the policy)."""
    return state.serving.cert.not_valid_before_utc + policy.backdate


def plan(
    current: CertState | None,
    published_at: dt.datetime | None,
    policy: CertPolicy,
    now: dt.datetime,
    *,
    rotate_ca: bool = False,
) -> Plan:
    """The state the Secret should hold now, and when to look again.

    `published_at`: when the current bundle was first seen in every webhook configuration
    (None: not yet). The serving certificate only moves to a new CA `grace` after that, and an
    old CA leaves the bundle when it expires or `grace` after the serving certificate left it.
    `rotate_ca` starts a CA rotation now (e.g. a suspected key leak); it is staged all the same.
    """
    if current is None:
        state = bootstrap(policy, now)
        return Plan(state, ("bootstrap",), _next_check(state, None, policy, now))
    state, changes = current, []
    if rotate_ca or state.ca.cert.not_valid_after_utc <= now + policy.ca_lookahead:
        new_ca = generate_ca(policy, now)
        state = replace(state, ca=new_ca, bundle=(*state.bundle, new_ca.cert))
        published_at = None  # a new bundle: nobody trusts the new CA yet
        changes.append("ca-rotation-started")
    issuer = state.serving_issuer
    on_active = issued_by(state.serving.cert, state.ca.cert)
    if issuer is None or not serving_valid_at(state, policy, now, [issuer]):
        # Broken or already expired: serving nothing valid is worse than an early switch.
        state = replace(state, serving=issue_serving(state.ca, policy, now))
        changes.append("serving-certificate-reissued")
    elif not on_active:
        if published_at is not None and now >= published_at + policy.grace:
            state = replace(state, serving=issue_serving(state.ca, policy, now))
            changes.append("serving-certificate-moved-to-new-ca")
    elif not serving_valid_at(state, policy, now + policy.serving_lookahead, [state.ca.cert]):
        state = replace(state, serving=issue_serving(state.ca, policy, now))
        changes.append("serving-certificate-renewed")
    kept = tuple(c for c in state.bundle if not _retired(c, state, published_at, policy, now))
    if len(kept) != len(state.bundle):
        state = replace(state, bundle=kept)
        changes.append("old-ca-dropped")
    if state.bundle != current.bundle:
        published_at = None
    return Plan(state, tuple(changes), _next_check(state, published_at, policy, now))


def _retired(
    ca: x509.Certificate,
    state: CertState,
    published_at: dt.datetime | None,
    policy: CertPolicy,
    now: dt.datetime,
) -> bool:
    """An old CA nobody needs: expired, or no longer the issuer for `grace` and the bundle that
    trusts the new issuer published for `grace` (every replica and the API server have moved on;
    after a recovery without the last good pair, replicas move only once it is published)."""
    if ca == state.ca.cert or issued_by(state.serving.cert, ca):
        return False
    if ca.not_valid_after_utc <= now:
        return True
    return (
        issued_by(state.serving.cert, state.ca.cert)
        and now >= serving_issued_at(state, policy) + policy.grace
        and published_at is not None
        and now >= published_at + policy.grace
    )


def _next_check(
    state: CertState, published_at: dt.datetime | None, policy: CertPolicy, now: dt.datetime
) -> dt.datetime:
    due = [
        state.ca.cert.not_valid_after_utc - policy.ca_lookahead,
        state.serving.cert.not_valid_after_utc - policy.serving_lookahead,
    ]
    if not issued_by(state.serving.cert, state.ca.cert):
        due.append((published_at or now) + policy.grace)
    for ca in state.bundle:
        if ca != state.ca.cert:
            due += [
                ca.not_valid_after_utc,
                max(serving_issued_at(state, policy), published_at or now) + policy.grace,
            ]
    return max(now, min(due))


# --- recovery from a deleted or corrupted Secret ---------------------------------------------
@dataclass(frozen=True)
class Salvage:
    """What is still usable in a broken (or deleted: all empty) Secret."""

    ca: KeyPair | None = None
    serving: KeyPair | None = None


def salvage(data: Mapping[str, str] | None) -> Salvage:
    """The CA pair and the serving pair of a Secret that `decode` rejects, each if intact."""
    ca: KeyPair | None = None
    serving: KeyPair | None = None
    with contextlib.suppress(CorruptSecret):
        ca = _key_pair(data, CA_CERT, CA_KEY)
    with contextlib.suppress(CorruptSecret):
        serving = _key_pair(data, TLS_CERT, TLS_KEY)
    return Salvage(ca if ca is not None and _is_ca(ca.cert) else None, serving)


def recover(
    salvaged: Salvage,
    last_good: CertState | None,
    trusted: Sequence[x509.Certificate],
    policy: CertPolicy,
    now: dt.datetime,
) -> Plan:
    """What to write when the Secret is deleted or unusable, without a failed admission.

    `trusted`: the CAs every webhook configuration trusts now; `last_good`: the last state this
    process read from the Secret (what the replicas are serving). The CA is the Secret's own if
    intact, else a new one (never one only kept in memory: deleting the Secret is how an admin
    asks for new keys). The bundle keeps the trusted CAs next to it, and when the CA is not yet
    trusted the serving pair stays the last good one, so `plan` moves it to the new CA only once
    the new bundle is published, like a CA rotation. With no trusted pair at hand, a new one is
    issued (replicas keep serving their last good pair until the API server trusts it).
    """
    live = [c for c in trusted if c.not_valid_after_utc > now and _is_ca(c)]
    if salvaged.ca is None and last_good is None and not live:
        return plan(None, None, policy, now)
    changes = ["secret-recovered"]
    ca = salvaged.ca
    if ca is None or ca.cert.not_valid_after_utc <= now:
        ca, changes = generate_ca(policy, now), [*changes, "new-ca"]
    bundle = tuple(dict.fromkeys([*live, ca.cert]))
    candidates = [salvaged.serving]
    if ca.cert not in live:  # a fresh serving pair would not be trusted yet: keep the served one
        candidates.append(last_good.serving if last_good else None)
    anchor = live or bundle  # what the API server trusts (nothing: no configuration yet)
    serving = next(
        (p for p in candidates if p is not None and trusted_for(p.cert, anchor, policy, now)), None
    )
    if serving is None:
        serving = issue_serving(ca, policy, now)
        changes.append("serving-certificate-reissued")
    step = plan(CertState(ca, serving, bundle), None, policy, now)
    return replace(step, changes=(*changes, *step.changes))


# --- the Secret ------------------------------------------------------------------------------
def encode(state: CertState) -> dict[str, str]:
    """Secret `data` (base64 values)."""
    raw = {
        CA_CERT: state.ca.cert_pem,
        CA_KEY: state.ca.key_pem,
        TLS_CERT: state.serving.cert_pem,
        TLS_KEY: state.serving.key_pem,
        CA_BUNDLE: state.bundle_pem,
    }
    return {k: base64.b64encode(v).decode() for k, v in raw.items()}


# What the serving Secret holds: what a replica serves and the CAs clients trust; never a CA key.
SERVING_SECRET_KEYS = (TLS_CERT, TLS_KEY, CA_BUNDLE)


def encode_serving(state: CertState) -> dict[str, str]:
    """The serving Secret's `data` (base64 values): the keys of SERVING_SECRET_KEYS only."""
    full = encode(state)
    return {k: full[k] for k in SERVING_SECRET_KEYS}


def decode_field(data: Mapping[str, str] | None, key: str) -> bytes:
    value = (data or {}).get(key)
    if not value:
        raise CorruptSecret(f"{key} is missing or empty")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CorruptSecret(f"{key} is not valid base64") from None


def decode(data: Mapping[str, str] | None) -> CertState:
    """Parse and cross-check the Secret data; CorruptSecret says what is wrong."""
    ca = _key_pair(data, CA_CERT, CA_KEY)
    serving = _key_pair(data, TLS_CERT, TLS_KEY)
    try:
        bundle_certs = x509.load_pem_x509_certificates(decode_field(data, CA_BUNDLE))
    except ValueError:
        raise CorruptSecret(f"{CA_BUNDLE} holds no valid PEM certificate") from None
    bundle: list[x509.Certificate] = []
    for cert in bundle_certs:
        if cert not in bundle:
            bundle.append(cert)
    if not _is_ca(ca.cert):
        raise CorruptSecret(f"{CA_CERT} is not a CA certificate")
    if ca.cert not in bundle:
        raise CorruptSecret(f"{CA_BUNDLE} does not contain {CA_CERT}")
    state = CertState(ca, serving, tuple(bundle))
    if state.serving_issuer is None:
        raise CorruptSecret(f"{TLS_CERT} is not issued by any CA in {CA_BUNDLE}")
    return state


def _key_pair(data: Mapping[str, str] | None, cert_key: str, key_key: str) -> KeyPair:
    try:
        cert = x509.load_pem_x509_certificate(decode_field(data, cert_key))
    except ValueError as err:
        if isinstance(err, CorruptSecret):
            raise
        raise CorruptSecret(f"{cert_key} is not a valid PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(decode_field(data, key_key), password=None)
    except (ValueError, TypeError) as err:
        if isinstance(err, CorruptSecret):
            raise
        raise CorruptSecret(f"{key_key} is not a valid unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CorruptSecret(f"{key_key} must be an EC or RSA key")
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        raise CorruptSecret(f"{key_key} does not match {cert_key}")
    return KeyPair(cert, key)


def _public_bytes(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def parse_bundle(pem: bytes) -> tuple[x509.Certificate, ...]:
    try:
        return tuple(x509.load_pem_x509_certificates(pem))
    except ValueError:
        return ()


# --- the "bundle published" marker -----------------------------------------------------------
def format_published(bundle_id: str, at: dt.datetime) -> str:
    return f"{bundle_id}@{at.astimezone(dt.UTC).isoformat()}"


def parse_published(value: str | None, bundle_id: str) -> dt.datetime | None:
    """The time in the marker if it is about this bundle (else None: not published yet)."""
    if not value or "@" not in value:
        return None
    marked_id, _, when = value.partition("@")
    if marked_id != bundle_id:
        return None
    try:
        at = dt.datetime.fromisoformat(when)
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


# --- flags -----------------------------------------------------------------------------------
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> dt.timedelta:
    """'90d', '12h', '1h30m', '45s' (Go's units plus days) -> timedelta; ValueError if bad."""
    text = text.strip()
    if not text or _DURATION.sub("", text):
        raise ValueError(f"invalid duration {text!r}: use e.g. 90d, 12h, 1h30m, 45s")
    seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))
    return dt.timedelta(seconds=seconds)
