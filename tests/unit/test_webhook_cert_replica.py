"""A replica (SelfSignedCerts) fed Secret and webhook-configuration events: it never swaps the
certificate the API server trusts for one it does not trust yet, nor for a corrupted Secret."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from kube import certs
from kube.cert_manager import ManagedCert, SelfSignedCerts
from kube.http.tls import ServingTLS

NAMESPACE = "lumigo-system"
SECRET = "webhook-certs"
CONFIG = "lumigo-webhooks"
POLICY = certs.CertPolicy("lumigo-webhooks-service", NAMESPACE, extra_ip_addresses=("127.0.0.1",))


def secret(data: dict[str, str]) -> dict[str, Any]:
    meta = {"name": SECRET, "namespace": NAMESPACE}
    return {"kind": "Secret", "metadata": meta, "data": data}


def config(*trusted: certs.CertState) -> dict[str, Any]:
    bundle = b"".join(s.bundle_pem for s in trusted)
    client = {"url": "https://127.0.0.1:1/", "caBundle": base64.b64encode(bundle).decode()}
    return {
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [{"name": "lumigoinjector.kb.io", "clientConfig": client}],
    }


def replica() -> SelfSignedCerts:
    return SelfSignedCerts(ServingTLS(), ManagedCert(POLICY, SECRET, mutating=[CONFIG]))


def served(certs_: SelfSignedCerts) -> Any:
    loaded = certs_.tls.loaded
    assert loaded is not None
    return loaded.certificate


def test_a_corrupted_or_deleted_secret_keeps_the_last_good_pair_served() -> None:
    first = certs.bootstrap(POLICY, dt.datetime.now(dt.UTC))
    replica_ = replica()
    replica_.on_add(config(first))
    replica_.on_add(secret(certs.encode(first)))
    garbage = base64.b64encode(b"garbage").decode()
    for data in (
        {"tls.crt": garbage, "tls.key": garbage},
        {"tls.crt": "", "tls.key": ""},
        {
            **certs.encode(first),
            "tls.key": certs.encode(certs.bootstrap(POLICY, dt.datetime.now(dt.UTC)))["tls.key"],
        },
    ):
        replica_.on_update({}, secret(data))
        assert served(replica_) == first.serving.cert
    replica_.on_delete(secret(certs.encode(first)))
    assert served(replica_) == first.serving.cert
    replica_.ready()  # still trusted where the API server looks


def test_a_certificate_the_configurations_do_not_trust_yet_waits_for_them() -> None:
    """A new CA's certificate (a leader that had no last good pair to keep) is held until the
    webhook configurations carry the new CA, then served at once."""
    now = dt.datetime.now(dt.UTC)
    first = certs.bootstrap(POLICY, now)
    replica_ = replica()
    replica_.on_add(config(first))
    replica_.on_add(secret(certs.encode(first)))
    ca = certs.generate_ca(POLICY, now)
    rebuilt = certs.CertState(ca, certs.issue_serving(ca, POLICY, now), (first.ca.cert, ca.cert))
    replica_.on_update({}, secret(certs.encode(rebuilt)))
    assert served(replica_) == first.serving.cert
    replica_.on_update({}, config(rebuilt))  # the leader published [old, new]
    assert served(replica_) == rebuilt.serving.cert
    replica_.ready()


def test_a_renewal_under_a_trusted_ca_is_served_at_once() -> None:
    now = dt.datetime.now(dt.UTC)
    first = certs.bootstrap(POLICY, now)
    replica_ = replica()
    replica_.on_add(config(first))
    replica_.on_add(secret(certs.encode(first)))
    renewed = certs.CertState(first.ca, certs.issue_serving(first.ca, POLICY, now), first.bundle)
    replica_.on_update({}, secret(certs.encode(renewed)))
    assert served(replica_) == renewed.serving.cert


def test_the_first_certificate_is_served_whatever_the_configurations_hold() -> None:
    """Nothing served yet (start-up, a foreign or empty caBundle): nothing to protect."""
    now = dt.datetime.now(dt.UTC)
    stranger, first = certs.bootstrap(POLICY, now), certs.bootstrap(POLICY, now)
    replica_ = replica()
    replica_.on_add(config(stranger))
    replica_.on_add(secret(certs.encode(first)))
    assert served(replica_) == first.serving.cert
