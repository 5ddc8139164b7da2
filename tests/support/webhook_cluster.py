"""Self-mode certificates and webhook registrations on the session's real API server.

`CertStack` wires what the manager will wire: informers on the certificate Secret and on the
webhook configurations feed a leader `CertWriter` and a replica `SelfSignedCerts`, which
hot-swaps a `ServingTLS`. Webhook configurations get a unique name per test, are scoped to the
test namespace and are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

from controller.operator import cert_writer_controller
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Controller
from envtest.process import wait_until
from kube import certs
from kube.cert_manager import CertWriter, ManagedCert, SelfSignedCerts
from kube.http.readiness import NotReady
from kube.http.tls import ServingTLS
from kube.kinds import MUTATING_WEBHOOK_CONFIGURATIONS, SECRETS

SECRET = "lumigo-webhook-certs"
SERVING = "lumigo-webhook-certs-serving"  # what replicas read: no CA key
WORKLOAD_RULES = [
    {
        "apiGroups": ["apps"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["daemonsets", "deployments", "replicasets", "statefulsets"],
    },
    {
        "apiGroups": ["batch"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["cronjobs", "jobs"],
    },
]


def policy(namespace: str, **overrides: Any) -> certs.CertPolicy:
    values: dict[str, Any] = {
        "service": "lumigo-webhooks-service",
        "namespace": namespace,
        "extra_ip_addresses": ("127.0.0.1",),
        "grace": dt.timedelta(seconds=1),
    }
    values.update(overrides)
    return certs.CertPolicy(**values)


def mutating_configuration(
    name: str,
    namespace: str,
    url: str,
    *,
    failure_policy: str = "Fail",
    rules: list[dict[str, Any]] | None = None,
    webhook_name: str = "lumigoinjector.kb.io",
    ca_bundle: str | None = None,
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    client_config: dict[str, Any] = {"url": url}
    if ca_bundle is not None:
        client_config["caBundle"] = ca_bundle
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": webhook_name,
                "clientConfig": client_config,
                "rules": rules or WORKLOAD_RULES,
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": timeout_seconds,
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace},
                },
            }
        ],
    }


LUMIGO_RULES = [
    {
        "apiGroups": ["operator.lumigo.io"],
        "apiVersions": ["v1alpha1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["lumigoes"],
    }
]


def operator_configuration(
    name: str, namespace: str, base_url: str, *, inject_failure_policy: str = "Ignore"
) -> dict[str, Any]:
    """Both operator webhooks, as the chart registers them, scoped to one namespace."""
    inject = mutating_configuration(
        name, namespace, f"{base_url}/v1alpha1/inject", failure_policy=inject_failure_policy
    )
    mutate = mutating_configuration(
        name,
        namespace,
        f"{base_url}/v1alpha1/mutate",
        rules=LUMIGO_RULES,
        webhook_name="lumigodefaulter.kb.io",
    )
    inject["webhooks"] += mutate["webhooks"]
    return inject


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def registered(kube: KubeClient, configuration: dict[str, Any]) -> Iterator[str]:
    name = configuration["metadata"]["name"]
    kube.create(MUTATING_WEBHOOK_CONFIGURATIONS, configuration)
    try:
        yield name
    finally:
        kube.delete(MUTATING_WEBHOOK_CONFIGURATIONS, name)


class CertStack:
    """Informers + leader writer + replica reloader for one namespace's certificate Secret (and,
    with `serving_secret`, the Secret the replicas serve from, without the CA key)."""

    def __init__(
        self,
        kube: KubeClient,
        policy: certs.CertPolicy,
        mutating: list[str],
        *,
        tls: ServingTLS | None = None,
        secret: str = SECRET,
        serving_secret: str = "",
    ) -> None:
        self.kube = kube
        self.policy = policy
        self.secret = secret
        self.tls = tls or ServingTLS()
        cert = ManagedCert(policy, secret, mutating=mutating, serving_secret_name=serving_secret)
        self.writer = CertWriter(kube, cert)
        self.replica = SelfSignedCerts(self.tls, cert, kube=kube)
        self.secrets = Informer(
            kube,
            Selection(
                SECRETS, namespace=policy.namespace, field_selector=f"metadata.name={secret}"
            ),
        )
        self.serving_secrets = (
            [
                Informer(
                    kube,
                    Selection(
                        SECRETS,
                        namespace=policy.namespace,
                        field_selector=f"metadata.name={serving_secret}",
                    ),
                )
            ]
            if serving_secret
            else []
        )
        self.configs = [
            Informer(
                kube,
                Selection(MUTATING_WEBHOOK_CONFIGURATIONS, field_selector=f"metadata.name={n}"),
            )
            for n in mutating
        ]
        self._informers = [self.secrets, *self.serving_secrets, *self.configs]
        self._writer_loop: Controller | None = None

    def start(self, *, writer: bool = True) -> CertStack:
        for informer in self._informers:
            informer.add_handler(self.replica)
            informer.add_handler(self.writer)
            informer.start()
        for informer in self._informers:
            assert informer.wait_for_sync(30), informer.last_error
        self.replica.start()
        if writer:
            self.start_writer()
        return self

    def start_writer(self) -> None:
        """Become the leader: run the writer's controller (a new one: a stopped one is done)."""
        self.stop_writer()
        self._writer_loop = cert_writer_controller(self.writer)
        self._writer_loop.start()

    def stop_writer(self) -> None:
        if self._writer_loop is not None:
            self._writer_loop.stop()
            self._writer_loop = None

    def stop(self) -> None:
        self.stop_writer()
        self.replica.stop()
        for informer in self._informers:
            informer.stop()

    def is_ready(self) -> bool:
        try:
            self.replica.ready()
        except NotReady:
            return False
        return True

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until(self.is_ready, timeout, f"webhook certificates ready ({self.why_not_ready()})")

    def why_not_ready(self) -> str:
        try:
            self.replica.ready()
        except NotReady as err:
            return str(err)
        return "ready"

    def state(self) -> certs.CertState:
        secret = self.kube.get(SECRETS, self.secret, self.policy.namespace)
        return certs.decode(secret.get("data"))


@contextlib.contextmanager
def cert_stack(
    kube: KubeClient,
    policy: certs.CertPolicy,
    mutating: list[str],
    *,
    writer: bool = True,
    **kwargs: Any,
) -> Iterator[CertStack]:
    stack = CertStack(kube, policy, mutating, **kwargs)
    try:
        yield stack.start(writer=writer)
    finally:
        stack.stop()
