"""A deleted or corrupted certificate Secret under steady admission traffic: the real API server
calls two of our servers (the leader, which rebuilds the Secret, and a replica that only reloads
it) with failurePolicy Fail, and not one admission may fail while the certificate recovers.

The API server keeps its TLS connections to a webhook alive, so a certificate it does not trust
fails only the connections it opens meanwhile (its pool growing under a burst, another API
server instance, a restart, an idle timeout). A second stream therefore admits every request on
a new connection that trusts exactly the caBundle the webhook configuration holds at that moment
(as a watch sees it, like the API server): what any new API server connection would get."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.runtime.kube import KubeClient
from envtest.process import wait_until
from kube import certs
from kube.http.server import AdmissionServer, ServerOptions
from kube.http.tls import ServingTLS
from kube.kinds import DEPLOYMENTS, MUTATING_WEBHOOK_CONFIGURATIONS, SECRETS
from kube.rest import ApiError
from tests.support import reviews, standin_handler, workloads
from tests.support.webhook_cluster import (
    SECRET,
    CertStack,
    cert_stack,
    mutating_configuration,
    policy,
    registered,
    unique_name,
)

INJECT = "/v1alpha1/inject"
MARK = "/v1alpha1/mark"
MARKED = "tests.lumigo.io/replica"
RATE = 100.0  # admissions per second, all threads together
THREADS = 4
GARBAGE = base64.b64encode(b"garbage").decode()


def mark(body: bytes, _content_type: str) -> dict[str, Any]:
    """The replica's webhook: admit with an annotation, so the test sees that it was called."""
    uid = json.loads(body)["request"]["uid"]
    patch = [{"op": "add", "path": "/metadata/annotations", "value": {MARKED: "b"}}]
    response = {
        "uid": uid,
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


@contextlib.contextmanager
def serving(route: str, handler: Any, tls: ServingTLS) -> Iterator[AdmissionServer]:
    server = AdmissionServer({route: handler}, tls, ServerOptions(host="127.0.0.1", port=0))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def admit_one(kube: KubeClient, namespace: str) -> str:
    """A dry-run create through the API server: "" when both webhooks mutated it (the leader's
    init container, the replica's annotation), else what went wrong."""
    name = f"d-{uuid.uuid4().hex[:10]}"
    body = workloads.workload(DEPLOYMENTS, name)
    try:
        created = kube.request(
            "POST", DEPLOYMENTS.path(namespace), params={"dryRun": "All"}, body=body, retry=False
        )
    except Exception as err:
        return f"{name}: {err}"
    annotations = created["metadata"].get("annotations") or {}
    if workloads.init_container_names(created) != ["lumigo-injector"]:
        return f"{name} was not mutated by the leader's webhook"
    if annotations.get(MARKED) != "b":
        return f"{name} was not mutated by the replica's webhook"
    return ""


def fresh_connection_admission(server: AdmissionServer, path: str, trusted_b64: str) -> str:
    """What a new API server connection sees right now: a TLS handshake trusting exactly the
    caBundle of the webhook configuration (as a watch sees it), then one AdmissionReview."""
    try:
        bundle = base64.b64decode(trusted_b64).decode()
        context = ssl.create_default_context(cadata=bundle)
        client = reviews.Client(server.port, context, timeout=10)
        try:
            status, body = client.post(path, reviews.body_of(reviews.review(reviews.deployment())))
        finally:
            client.close()
    except Exception as err:  # any failure counts; it must not end the thread
        return f"new connection to {path}: {err}"
    response = (json.loads(body).get("response") or {}) if status == 200 else {}
    if not response.get("allowed") or not response.get("patch"):
        return f"new connection to {path}: HTTP {status}, not admitted with a patch"
    return ""


class Paced:
    """`attempt` (returns "" or a problem) at a steady total rate from a few threads."""

    def __init__(self, attempt: Callable[[int], str], rate: float, threads: int) -> None:
        self.attempt = attempt
        self.period = threads / rate
        self.attempts = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]
        self._started = self._stopped = 0.0

    def __enter__(self) -> Paced:
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        self._stopped = time.monotonic()

    @property
    def rate(self) -> float:
        return self.attempts / max(self._stopped - self._started, 1e-9)

    def _run(self, index: int) -> None:
        next_at = time.monotonic() + index * self.period / len(self._threads)
        n = index
        while not self._stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            next_at = max(next_at + self.period, time.monotonic())
            problem = self.attempt(n)
            n += len(self._threads)
            with self._lock:
                self.attempts += 1
                if problem:
                    self.failures.append(problem)

    def wait_for_more(self, count: int, what: str) -> None:
        target = self.attempts + count
        wait_until(lambda: self.attempts >= target, 120, what)


def delete_secret(kube: KubeClient, namespace: str) -> None:
    kube.delete(SECRETS, SECRET, namespace)


def garbage_serving_pair_without_ca(kube: KubeClient, namespace: str) -> None:
    secret = kube.get(SECRETS, SECRET, namespace)
    secret["data"] = {"tls.crt": GARBAGE, "tls.key": GARBAGE}
    kube.replace(SECRETS, secret, namespace)


def empty_serving_pair_ca_intact(kube: KubeClient, namespace: str) -> None:
    secret = kube.get(SECRETS, SECRET, namespace)
    secret["data"] = {**secret["data"], "tls.crt": "", "tls.key": ""}
    kube.replace(SECRETS, secret, namespace)


@pytest.mark.parametrize(
    ("break_secret", "ca_reused"),
    [
        (delete_secret, False),
        (garbage_serving_pair_without_ca, False),
        (empty_serving_pair_ca_intact, True),
    ],
    ids=["deleted", "garbage-without-ca", "serving-pair-emptied-ca-intact"],
)
def test_a_broken_certificate_secret_fails_no_admission(
    kube: KubeClient,
    namespace: str,
    break_secret: Callable[[KubeClient, str], None],
    ca_reused: bool,
) -> None:
    pol = policy(namespace)
    leader_tls, replica_tls = ServingTLS(), ServingTLS()
    name = unique_name("certs-recovery")
    with (
        serving(INJECT, standin_handler.handle, leader_tls) as leader_server,
        serving(MARK, mark, replica_tls) as replica_server,
    ):
        config = mutating_configuration(
            name, namespace, f"https://127.0.0.1:{leader_server.port}{INJECT}"
        )
        config["webhooks"] += mutating_configuration(
            name,
            namespace,
            f"https://127.0.0.1:{replica_server.port}{MARK}",
            webhook_name="replica.kb.io",
        )["webhooks"]
        with (
            registered(kube, config),
            cert_stack(kube, pol, [name], tls=leader_tls) as leader,
            cert_stack(kube, pol, [name], tls=replica_tls, writer=False) as replica,
        ):
            leader.wait_ready()
            replica.wait_ready()
            wait_until(
                lambda: not admit_one(kube, namespace), 60, "the API server to call both webhooks"
            )
            first = leader.state()
            client = kube.clone(retry_attempts=1)  # a failure must show, not be retried
            servers = [(leader_server, INJECT), (replica_server, MARK)]

            def through_the_api_server(_n: int) -> str:
                return admit_one(client, namespace)

            def on_a_new_connection(n: int) -> str:
                server, path = servers[n % 2]
                seen = leader.configs[0].get("", name) or {"webhooks": [{}, {}]}
                bundle = (seen["webhooks"][n % 2].get("clientConfig") or {}).get("caBundle", "")
                return fresh_connection_admission(server, path, bundle)

            with (
                Paced(through_the_api_server, RATE, THREADS) as api,
                Paced(on_a_new_connection, RATE, 2) as fresh,
            ):
                api.wait_for_more(200, "admissions before the Secret breaks")
                break_secret(kube, namespace)
                wait_until(
                    lambda: recovered(kube, name, first, ca_reused, [leader, replica]),
                    120,
                    "the certificate to recover",
                )
                leader.wait_ready()
                replica.wait_ready()
                api.wait_for_more(200, "admissions after the recovery")
    what = break_secret.__name__
    print(
        f"\nfailed admissions during certificate {what}: {len(api.failures)} of {api.attempts} "
        f"through the API server at {api.rate:.0f}/s; {len(fresh.failures)} of {fresh.attempts} "
        f"on new connections at {fresh.rate:.0f}/s"
    )
    assert api.failures == [], api.failures[:5]
    assert fresh.failures == [], fresh.failures[:5]


def recovered(
    kube: KubeClient,
    config: str,
    first: certs.CertState,
    ca_reused: bool,
    stacks: list[CertStack],
) -> bool:
    """A valid new pair in the Secret, a bundle of just its CA in the webhook configuration
    (any old CA retired), and every server serving that pair."""
    try:
        state = stacks[0].state()
    except (certs.CorruptSecret, ApiError):
        return False
    bundle = base64.b64encode(state.bundle_pem).decode()
    webhooks = kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, config)["webhooks"]
    served = [s.tls.loaded.certificate if s.tls.loaded else None for s in stacks]
    if (state.ca.cert == first.ca.cert) != ca_reused:
        return False
    if state.bundle != (state.ca.cert,) or state.serving.cert == first.serving.cert:
        return False
    if any(w["clientConfig"].get("caBundle") != bundle for w in webhooks):
        return False
    if served != [state.serving.cert] * len(stacks):
        return False
    certs.verify_serving(
        state.serving.cert,
        state.bundle,
        stacks[0].policy.subject_alt_names,
        dt.datetime.now(dt.UTC),
    )
    return True
