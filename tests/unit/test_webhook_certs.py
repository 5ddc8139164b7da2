"""Certificate logic with an injected clock and validity periods in seconds."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import replace

import pytest
from cryptography import x509
from cryptography.x509.verification import VerificationError

from kube import certs

T0 = dt.datetime(2031, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
POLICY = certs.CertPolicy(
    "lumigo-webhooks-service",
    "lumigo-system",
    ca_validity=100 * S,
    serving_validity=30 * S,
    ca_lookahead=40 * S,
    serving_lookahead=10 * S,
    grace=5 * S,
    backdate=2 * S,
    extra_ip_addresses=("127.0.0.1",),
)


def names(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
        str(v) for v in san.get_values_for_type(x509.IPAddress)
    ]


def trusted(state: certs.CertState, at: dt.datetime, bundle: tuple[x509.Certificate, ...]) -> bool:
    try:
        certs.verify_serving(state.serving.cert, bundle, POLICY.subject_alt_names, at)
    except VerificationError:
        return False
    return True


def test_bootstrap_issues_a_ca_and_a_serving_certificate_for_the_service() -> None:
    step = certs.plan(None, None, POLICY, T0)
    state = step.state
    assert step.changes == ("bootstrap",)
    assert state.bundle == (state.ca.cert,)
    assert names(state.serving.cert) == [
        "lumigo-webhooks-service",
        "lumigo-webhooks-service.lumigo-system",
        "lumigo-webhooks-service.lumigo-system.svc",
        "lumigo-webhooks-service.lumigo-system.svc.cluster.local",
        "127.0.0.1",
    ]
    constraints = state.ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert state.serving.cert.not_valid_after_utc == (T0 + POLICY.serving_validity).replace(
        microsecond=0
    )
    assert trusted(state, T0, state.bundle)
    # The next step is the serving renewal, 30 s - 10 s lookahead from now.
    assert step.next_check == (T0 + 20 * S).replace(microsecond=0)


def test_long_service_and_namespace_names() -> None:
    long = replace(POLICY, service="s" * 63, namespace="n" * 63)
    state = certs.bootstrap(long, T0)
    assert f"{'s' * 63}.{'n' * 63}.svc.cluster.local" in names(state.serving.cert)
    certs.verify_serving(state.serving.cert, state.bundle, long.subject_alt_names, T0)


def test_secret_round_trip_and_nothing_due_means_nothing_written() -> None:
    state = certs.bootstrap(POLICY, T0)
    data = certs.encode(state)
    assert set(data) == set(certs.SECRET_KEYS)
    decoded = certs.decode(data)
    assert decoded.bundle_id == state.bundle_id
    assert decoded.serving.cert == state.serving.cert
    step = certs.plan(decoded, T0, POLICY, T0 + 5 * S)
    assert step.changes == ()
    assert step.state is decoded


def test_serving_renewal_keeps_the_ca_and_the_bundle() -> None:
    state = certs.bootstrap(POLICY, T0)
    before = T0 + 19 * S
    assert certs.plan(state, T0, POLICY, before).changes == ()
    at = T0 + 21 * S  # the serving cert would be invalid at now + lookahead
    assert not trusted(state, at + POLICY.serving_lookahead, state.bundle)
    step = certs.plan(state, T0, POLICY, at)
    assert step.changes == ("serving-certificate-renewed",)
    renewed = step.state
    assert renewed.ca == state.ca
    assert renewed.bundle_id == state.bundle_id  # hitless: no caBundle change at all
    assert renewed.serving.cert != state.serving.cert
    assert trusted(renewed, at + POLICY.serving_lookahead, renewed.bundle)


def test_ca_rotation_is_staged_with_overlap() -> None:
    state = certs.bootstrap(POLICY, T0)
    published = T0
    # Keep the serving cert fresh until the CA enters its lookahead (100 s - 40 s).
    now = T0
    while True:
        now += 3 * S
        step = certs.plan(state, published, POLICY, now)
        if "ca-rotation-started" in step.changes:
            break
        assert step.changes in ((), ("serving-certificate-renewed",))
        state = step.state
    assert now >= T0 + 60 * S - 3 * S
    old_ca, rotating = state.ca.cert, step.state
    # Stage 1: the new CA is in the bundle *behind* the old one; the served cert did not move.
    assert rotating.bundle == (old_ca, rotating.ca.cert)
    assert rotating.serving == state.serving
    assert certs.issued_by(rotating.serving.cert, old_ca)
    # Stage 2: nothing moves while the new bundle is not published, nor during the grace period.
    assert certs.plan(rotating, None, POLICY, now + 1 * S).changes == ()
    published = now + 1 * S
    assert certs.plan(rotating, published, POLICY, published + POLICY.grace - S).changes == ()
    # Stage 3: grace over -> the serving cert is issued by the new CA; the bundle keeps both.
    switch = certs.plan(rotating, published, POLICY, published + POLICY.grace)
    assert switch.changes == ("serving-certificate-moved-to-new-ca",)
    moved = switch.state
    assert certs.issued_by(moved.serving.cert, moved.ca.cert)
    assert moved.bundle == rotating.bundle
    # Stage 4: the old CA is dropped only `grace` after the switch (or at its expiry).
    issued = certs.serving_issued_at(moved, POLICY)
    assert certs.plan(moved, published, POLICY, issued + POLICY.grace - S).changes == ()
    drop = certs.plan(moved, published, POLICY, issued + POLICY.grace)
    assert drop.changes == ("old-ca-dropped",)
    assert drop.state.bundle == (moved.ca.cert,)
    assert old_ca.not_valid_after_utc > issued + POLICY.grace  # it was not about expiry


def test_clients_always_trust_what_is_served_across_many_rotations() -> None:
    """Simulate the writer and an API server that sees a bundle one step after it is written.

    At every step (2 s apart, over several CA lifetimes) the certificate being served must
    verify against the bundle the API server has: the property the stages exist for.
    """
    state = certs.bootstrap(POLICY, T0)
    apiserver_bundle = state.bundle  # bootstrap: the operator patches before taking traffic
    published: dt.datetime | None = T0
    now, rotations = T0, 0
    while now < T0 + 400 * S:
        now += 2 * S
        assert trusted(state, now, apiserver_bundle), f"served cert untrusted at {now}"
        if apiserver_bundle != state.bundle:  # the writer patches the webhook configurations
            apiserver_bundle, published = state.bundle, now
        step = certs.plan(state, published, POLICY, now)
        rotations += "ca-rotation-started" in step.changes
        if step.state.bundle != state.bundle:
            published = None
        state = step.state
        assert step.next_check >= now
    assert rotations >= 5


def test_a_new_ca_that_is_never_published_is_not_used_until_the_old_one_runs_out() -> None:
    state = certs.bootstrap(POLICY, T0)
    rotating = certs.plan(state, T0, POLICY, T0 + 5 * S, rotate_ca=True).state
    assert certs.issued_by(rotating.serving.cert, state.ca.cert)
    renewed = certs.plan(rotating, None, POLICY, T0 + 25 * S)
    # The serving cert is in its lookahead but the new CA is not trusted yet: wait.
    assert renewed.changes == ()
    # Once the old serving cert has expired there is nothing better to do than move.
    expired = certs.plan(rotating, None, POLICY, T0 + 31 * S)
    assert expired.changes == ("serving-certificate-reissued",)
    assert certs.issued_by(expired.state.serving.cert, rotating.ca.cert)


def test_forced_rotation_is_staged_like_a_scheduled_one() -> None:
    state = certs.bootstrap(POLICY, T0)
    step = certs.plan(state, T0, POLICY, T0 + 1 * S, rotate_ca=True)
    assert step.changes == ("ca-rotation-started",)
    assert step.state.serving == state.serving
    assert len(step.state.bundle) == 2


def test_expired_old_ca_is_dropped() -> None:
    state = certs.bootstrap(POLICY, T0)
    extra = certs.generate_ca(POLICY, T0 - 200 * S)  # long expired, still listed
    listed = replace(state, bundle=(extra.cert, *state.bundle))
    step = certs.plan(listed, T0, POLICY, T0 + S)
    assert step.changes == ("old-ca-dropped",)
    assert step.state.bundle == state.bundle


def test_verification_at_now_plus_lookahead() -> None:
    state = certs.bootstrap(POLICY, T0)
    not_after = state.serving.cert.not_valid_after_utc
    certs.verify_serving(state.serving.cert, state.bundle, POLICY.subject_alt_names, not_after)
    with pytest.raises(VerificationError):
        certs.verify_serving(
            state.serving.cert, state.bundle, POLICY.subject_alt_names, not_after + S
        )
    other = replace(POLICY, service="another")
    with pytest.raises(VerificationError):
        certs.verify_serving(state.serving.cert, state.bundle, other.subject_alt_names, T0)
    stranger = certs.bootstrap(POLICY, T0)
    with pytest.raises(VerificationError):
        certs.verify_serving(state.serving.cert, stranger.bundle, POLICY.subject_alt_names, T0)


def test_service_rename_reissues_the_serving_certificate() -> None:
    state = certs.bootstrap(POLICY, T0)
    renamed = replace(POLICY, service="renamed")
    step = certs.plan(state, T0, renamed, T0 + S)
    assert step.changes == ("serving-certificate-reissued",)
    assert "renamed.lumigo-system.svc" in names(step.state.serving.cert)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: {}, "ca.crt is missing or empty"),
        (lambda d: {**d, "tls.key": ""}, "tls.key is missing or empty"),
        (lambda d: {**d, "tls.crt": "%%%"}, "tls.crt is not valid base64"),
        (lambda d: {**d, "ca.crt": _b64(b"garbage")}, "ca.crt is not a valid PEM certificate"),
        (lambda d: {**d, "ca.key": _b64(b"garbage")}, "ca.key is not a valid unencrypted PEM"),
        (lambda d: {**d, "tls.key": d["ca.key"]}, "tls.key does not match tls.crt"),
        (lambda d: {**d, "ca-bundle.crt": _b64(b"junk")}, "ca-bundle.crt holds no valid PEM"),
        (lambda d: {**d, "ca-bundle.crt": d["tls.crt"]}, "ca-bundle.crt does not contain ca.crt"),
        (
            lambda d: {**d, "ca.crt": d["tls.crt"], "ca.key": d["tls.key"]},
            "ca.crt is not a CA certificate",
        ),
    ],
)
def test_corrupt_secret_is_reported_without_key_material(mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = certs.encode(certs.bootstrap(POLICY, T0))
    with pytest.raises(certs.CorruptSecret) as err:
        certs.decode(mutate(data))
    assert message in str(err.value)
    assert "PRIVATE KEY" not in str(err.value)
    for value in data.values():
        assert value not in str(err.value)


def test_serving_certificate_from_a_foreign_ca_is_corrupt() -> None:
    data = certs.encode(certs.bootstrap(POLICY, T0))
    foreign = certs.encode(certs.bootstrap(POLICY, T0))
    data.update({"tls.crt": foreign["tls.crt"], "tls.key": foreign["tls.key"]})
    with pytest.raises(certs.CorruptSecret, match="not issued by any CA"):
        certs.decode(data)


def test_published_marker() -> None:
    marker = certs.format_published("abc", T0)
    assert certs.parse_published(marker, "abc") == T0
    assert certs.parse_published(marker, "other") is None
    assert certs.parse_published("garbage", "abc") is None
    assert certs.parse_published(None, "abc") is None


def test_policy_rejects_periods_that_cannot_rotate_cleanly() -> None:
    with pytest.raises(ValueError, match="CA lookahead must exceed"):
        replace(POLICY, ca_lookahead=12 * S)
    with pytest.raises(ValueError, match="serving certificate validity must be longer"):
        replace(POLICY, serving_validity=10 * S)
    with pytest.raises(ValueError, match="CA validity must be longer"):
        replace(POLICY, ca_validity=40 * S)


def test_parse_duration() -> None:
    assert certs.parse_duration("90d") == dt.timedelta(days=90)
    assert certs.parse_duration("1h30m") == dt.timedelta(minutes=90)
    assert certs.parse_duration("45s") == dt.timedelta(seconds=45)
    assert certs.parse_duration("250ms") == dt.timedelta(milliseconds=250)
    for bad in ("", "10", "5x", "d"):
        with pytest.raises(ValueError, match="invalid duration"):
            certs.parse_duration(bad)


# --- recovery from a deleted or corrupted Secret -----------------------------------------------
GARBAGE = _b64(b"garbage")


def _deleted(data: dict[str, str]) -> dict[str, str] | None:
    return None


def _garbage_serving_pair(data: dict[str, str]) -> dict[str, str] | None:
    return {**data, "tls.crt": GARBAGE, "tls.key": GARBAGE}


def _serving_pair_only(data: dict[str, str]) -> dict[str, str] | None:
    return {"tls.crt": data["tls.crt"], "tls.key": data["tls.key"]}


def _garbage_ca_key(data: dict[str, str]) -> dict[str, str] | None:
    return {**data, "ca.key": GARBAGE}


def _emptied(data: dict[str, str]) -> dict[str, str] | None:
    return {"tls.crt": "", "tls.key": ""}


def test_recovery_reuses_an_intact_ca_without_a_bundle_change() -> None:
    state = certs.bootstrap(POLICY, T0)
    broken = _garbage_serving_pair(certs.encode(state))
    step = certs.recover(certs.salvage(broken), state, state.bundle, POLICY, T0 + S)
    assert step.changes == ("secret-recovered", "serving-certificate-reissued")
    assert step.state.ca.cert == state.ca.cert
    assert step.state.bundle_id == state.bundle_id  # hitless: the API server trusts it already
    assert step.state.serving != state.serving
    assert trusted(step.state, T0 + S, state.bundle)


def test_recovery_without_a_ca_stages_a_new_one_behind_the_trusted_one() -> None:
    state = certs.bootstrap(POLICY, T0)
    step = certs.recover(certs.salvage(None), state, state.bundle, POLICY, T0 + S)
    assert step.changes == ("secret-recovered", "new-ca")
    recovered = step.state
    assert recovered.ca.cert != state.ca.cert
    assert recovered.bundle == (state.ca.cert, recovered.ca.cert)
    assert recovered.serving == state.serving  # the last good pair stays until published
    # From here on it is a CA rotation's stage 2: nothing moves before publication + grace.
    assert certs.plan(recovered, None, POLICY, T0 + 10 * S).changes == ()
    moved = certs.plan(recovered, T0 + 2 * S, POLICY, T0 + 2 * S + POLICY.grace)
    assert moved.changes == ("serving-certificate-moved-to-new-ca",)


def test_recovery_without_a_last_good_pair_issues_under_the_new_ca_but_keeps_the_old_ca() -> None:
    """A leader that never saw a valid Secret: the replicas hold their pair until it is trusted."""
    state = certs.bootstrap(POLICY, T0)
    step = certs.recover(certs.salvage(None), None, state.bundle, POLICY, T0 + S)
    recovered = step.state
    assert recovered.bundle == (state.ca.cert, recovered.ca.cert)
    assert certs.issued_by(recovered.serving.cert, recovered.ca.cert)
    assert not trusted(recovered, T0 + S, state.bundle)
    # The old CA stays until [old, new] has been published for `grace`: replicas move only then.
    assert certs.plan(recovered, None, POLICY, T0 + 15 * S).changes == ()
    published = T0 + 3 * S
    assert certs.plan(recovered, published, POLICY, published + POLICY.grace - S).changes == ()
    dropped = certs.plan(recovered, published, POLICY, published + POLICY.grace)
    assert dropped.changes == ("old-ca-dropped",)


def test_recovery_with_nothing_to_keep_is_a_bootstrap() -> None:
    step = certs.recover(certs.salvage(None), None, (), POLICY, T0)
    assert step.changes == ("bootstrap",)


def test_recovery_ignores_an_expired_or_foreign_trusted_certificate() -> None:
    state = certs.bootstrap(POLICY, T0)
    expired = certs.generate_ca(POLICY, T0 - 200 * S).cert
    step = certs.recover(certs.salvage(None), state, (expired, *state.bundle), POLICY, T0 + S)
    assert expired not in step.state.bundle
    assert step.state.serving == state.serving


@pytest.mark.parametrize(
    "break_secret",
    [_deleted, _garbage_serving_pair, _serving_pair_only, _garbage_ca_key, _emptied],
)
def test_a_broken_secret_never_leaves_the_served_certificate_untrusted(break_secret) -> None:  # type: ignore[no-untyped-def]
    """The writer recovers, an API server sees each bundle one step late, and a replica switches
    only to a certificate that bundle trusts (SelfSignedCerts' rule). At every step the served
    certificate must be trusted, and it ends on a single new CA or the reused one."""
    state = certs.bootstrap(POLICY, T0)
    apiserver, served, now = state.bundle, state.serving.cert, T0 + S
    step = certs.recover(
        certs.salvage(break_secret(certs.encode(state))), state, apiserver, POLICY, now
    )
    state, published = step.state, None
    for _ in range(20):
        now += S
        if certs.trusted_for(state.serving.cert, apiserver, POLICY, now):
            served = state.serving.cert
        assert certs.trusted_for(served, apiserver, POLICY, now), f"untrusted at {now}"
        if apiserver != state.bundle:
            apiserver, published = state.bundle, now
        step = certs.plan(state, published, POLICY, now)
        if step.state.bundle != state.bundle:
            published = None
        state = step.state
    assert state.bundle == (state.ca.cert,)
    assert served == state.serving.cert
