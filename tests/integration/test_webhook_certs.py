"""Self-mode certificates on a real API server: Secret, caBundle, readiness, concurrent writers
and a staged CA rotation (a deleted or corrupted Secret: test_webhook_cert_recovery.py)."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import threading
from typing import Any

from cryptography import x509
from prometheus_client import REGISTRY

from controller.runtime.informer import FuncHandler, Informer, Selection
from controller.runtime.kube import KubeClient
from envtest.process import wait_until
from kube import certs
from kube.cert_manager import CertWriter, ManagedCert
from kube.kinds import MUTATING_WEBHOOK_CONFIGURATIONS, SECRETS
from tests.support.webhook_cluster import (
    SECRET,
    SERVING,
    cert_stack,
    mutating_configuration,
    policy,
    registered,
    unique_name,
)

URL = "https://127.0.0.1:1/v1alpha1/inject"  # never called: these tests only look at certificates


def ca_bundles(kube: KubeClient, name: str) -> list[str]:
    config = kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, name)
    return [w["clientConfig"].get("caBundle", "") for w in config["webhooks"]]


def test_self_mode_bootstraps_the_secret_and_the_bundle_then_becomes_ready(
    kube: KubeClient, namespace: str
) -> None:
    name = unique_name("certs-bootstrap")
    with (
        registered(kube, mutating_configuration(name, namespace, URL)),
        cert_stack(kube, policy(namespace), [name]) as stack,
    ):
        stack.wait_ready()
        secret = kube.get(SECRETS, SECRET, namespace)
        assert secret["type"] == "kubernetes.io/tls"
        assert set(certs.SECRET_KEYS) <= set(secret["data"])
        state = certs.decode(secret["data"])
        assert ca_bundles(kube, name) == [base64.b64encode(state.bundle_pem).decode()]
        loaded = stack.tls.loaded
        assert loaded is not None
        assert loaded.certificate == state.serving.cert
        wait_until(
            lambda: (
                certs.parse_published(
                    kube.get(SECRETS, SECRET, namespace)["metadata"]
                    .get("annotations", {})
                    .get(certs.PUBLISHED_ANNOTATION),
                    state.bundle_id,
                )
                is not None
            ),
            30,
            "the bundle to be marked as published",
        )
        for kind, cert in (("ca", state.ca.cert), ("serving", state.serving.cert)):
            value = REGISTRY.get_sample_value(
                "lumigo_webhook_certificate_expiry_timestamp_seconds", {"kind": kind}
            )
            assert value == cert.not_valid_after_utc.timestamp()


def test_the_served_secret_holds_no_ca_key_and_replicas_serve_from_it(
    kube: KubeClient, namespace: str
) -> None:
    """Issue 28 item 7: the CA key stays in the writer's Secret; the Secret the webhook's
    identity may read holds the serving pair and the CA certificates only, follows the
    writer's state, and is rebuilt when deleted."""
    name = unique_name("certs-split")
    with (
        registered(kube, mutating_configuration(name, namespace, URL)),
        cert_stack(kube, policy(namespace), [name], serving_secret=SERVING) as stack,
    ):
        stack.wait_ready()
        state = stack.state()
        served = kube.get(SECRETS, SERVING, namespace)
        assert served["type"] == "kubernetes.io/tls"
        assert set(served["data"]) == {certs.TLS_CERT, certs.TLS_KEY, certs.CA_BUNDLE}
        assert base64.b64decode(served["data"][certs.TLS_CERT]) == state.serving.cert_pem
        assert base64.b64decode(served["data"][certs.CA_BUNDLE]) == state.bundle_pem
        loaded = stack.tls.loaded
        assert loaded is not None
        assert loaded.certificate == state.serving.cert

        kube.delete(SECRETS, SERVING, namespace)
        wait_until(
            lambda: (
                (kube.get_or_none(SECRETS, SERVING, namespace) or {}).get("data")
                == certs.encode_serving(state)
            ),
            30,
            "the served Secret rebuilt from the CA Secret",
        )
        stack.writer.rotate_ca()
        wait_until(
            lambda: len(certs.parse_bundle(base64.b64decode(
                kube.get(SECRETS, SERVING, namespace)["data"][certs.CA_BUNDLE]
            ))) == 2,
            30,
            "the new CA in the served bundle",
        )  # fmt: skip


def test_readiness_follows_the_bundles_in_the_webhook_configurations(
    kube: KubeClient, namespace: str
) -> None:
    name = unique_name("certs-ready")
    with (
        registered(kube, mutating_configuration(name, namespace, URL)),
        cert_stack(kube, policy(namespace), [name], writer=False) as stack,
    ):
        assert not stack.is_ready()
        assert "Secret has not been seen yet" in stack.why_not_ready()
        stack.start_writer()
        stack.wait_ready()
        # Someone (a Helm upgrade, a human) puts another bundle in: not ready until fixed.
        stack.stop_writer()
        other = certs.bootstrap(stack.policy, dt.datetime.now(dt.UTC))
        kube.json_patch(
            MUTATING_WEBHOOK_CONFIGURATIONS,
            name,
            [
                {
                    "op": "replace",
                    "path": "/webhooks/0/clientConfig/caBundle",
                    "value": base64.b64encode(other.bundle_pem).decode(),
                }
            ],
        )
        wait_until(lambda: not stack.is_ready(), 30, "readiness to notice the foreign bundle")
        assert "does not match" in stack.why_not_ready()
        stack.start_writer()  # the leader puts it back
        stack.wait_ready()


def test_concurrent_writers_settle_on_one_state(kube: KubeClient, namespace: str) -> None:
    """Two leaders for a moment (a handover): 409s make one of them re-read, never clobber."""
    name = unique_name("certs-race")
    with registered(kube, mutating_configuration(name, namespace, URL)):
        writers = [
            CertWriter(kube, ManagedCert(policy(namespace), SECRET, mutating=[name]))
            for _ in range(2)
        ]
        errors: list[BaseException] = []

        def run(writer: CertWriter) -> None:
            try:
                writer.reconcile()
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=run, args=(w,)) for w in writers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        settled = kube.get(SECRETS, SECRET, namespace)
        state = certs.decode(settled["data"])
        assert ca_bundles(kube, name) == [base64.b64encode(state.bundle_pem).decode()]
        for writer in writers:  # both agree that nothing is left to do
            writer.reconcile()
        again = kube.get(SECRETS, SECRET, namespace)
        assert again["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"]


def test_forced_ca_rotation_is_staged_on_the_cluster(kube: KubeClient, namespace: str) -> None:
    """The Secret goes through the four stages, and the webhook configuration trusted the new CA
    before the served certificate moved to it. resourceVersions are etcd revisions, so they order
    writes across objects: a test-only use of an otherwise opaque value."""
    name = unique_name("certs-rotate")
    secrets: list[tuple[int, certs.CertState]] = []
    bundles: list[tuple[int, tuple[x509.Certificate, ...]]] = []
    lock = threading.Lock()

    def revision(obj: dict[str, Any]) -> int:
        return int(obj["metadata"]["resourceVersion"])

    def record_secret(obj: dict[str, Any]) -> None:
        with contextlib.suppress(certs.CorruptSecret), lock:
            state = certs.decode(obj.get("data"))
            last = secrets[-1][1] if secrets else None
            if last is None or (last.serving.cert, last.bundle) != (
                state.serving.cert,
                state.bundle,
            ):
                secrets.append((revision(obj), state))

    def record_config(obj: dict[str, Any]) -> None:
        bundle = base64.b64decode(obj["webhooks"][0]["clientConfig"].get("caBundle") or "")
        with lock:
            bundles.append((revision(obj), certs.parse_bundle(bundle)))

    watchers = [
        Informer(
            kube, Selection(SECRETS, namespace=namespace, field_selector=f"metadata.name={SECRET}")
        ),
        Informer(
            kube, Selection(MUTATING_WEBHOOK_CONFIGURATIONS, field_selector=f"metadata.name={name}")
        ),
    ]
    for watcher, record in zip(watchers, (record_secret, record_config), strict=True):
        watcher.add_handler(FuncHandler(add=record, update=lambda _old, new, r=record: r(new)))
        watcher.start()
    try:
        with (
            registered(kube, mutating_configuration(name, namespace, URL)),
            cert_stack(kube, policy(namespace), [name]) as stack,
        ):
            stack.wait_ready()
            first = stack.state()
            stack.writer.rotate_ca()

            def rotated() -> bool:
                state = stack.state()
                return state.ca.cert != first.ca.cert and state.bundle == (state.ca.cert,)

            wait_until(rotated, 60, "the CA rotation to complete")
            final = stack.state()
            stack.wait_ready()
            loaded = stack.tls.loaded
            assert loaded is not None
            assert loaded.certificate == final.serving.cert
            wait_until(
                lambda: bool(bundles) and bundles[-1][1] == final.bundle, 30, "the last bundle"
            )
    finally:
        for watcher in watchers:
            watcher.stop()
    old_ca, new_ca = first.ca.cert, final.ca.cert
    with lock:
        stages = [
            (tuple(c == old_ca for c in s.bundle), certs.issued_by(s.serving.cert, new_ca))
            for _, s in secrets
            if s.bundle != (old_ca,) or not certs.issued_by(s.serving.cert, new_ca)
        ]
        moved_at = next(rv for rv, s in secrets if certs.issued_by(s.serving.cert, new_ca))
        trusted_at = next(rv for rv, bundle in bundles if new_ca in bundle)
    # [old] served by old -> [old, new] served by old -> [old, new] served by new -> [new].
    assert stages[-4:] == [
        ((True,), False),
        ((True, False), False),
        ((True, False), True),
        ((False,), True),
    ], stages
    assert trusted_at < moved_at, "the serving certificate moved before the bundle trusted it"
