"""The real API server calls our HTTPS server at https://127.0.0.1:<port>, trusting the caBundle
that our certificate manager (self mode) wrote: admissions, failure policies, CA rotation."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from api.resources import DEPLOYMENTS, Resource
from controller.kube import KubeClient
from localcluster import wait_until
from tests.support import standin_handler, workloads
from tests.support.webhook_cluster import (
    CertStack,
    cert_stack,
    mutating_configuration,
    policy,
    registered,
    unique_name,
)
from webhook import certs
from webhook.routing import Route
from webhook.server import AdmissionServer, ServerOptions
from webhook.tls import ServingTLS

INJECT = "/v1alpha1/inject"


@dataclass
class Webhook:
    server: AdmissionServer
    certs: CertStack
    configuration: str
    namespace: str


@contextlib.contextmanager
def webhook_in(
    kube: KubeClient,
    namespace: str,
    routes: dict[str, Route],
    *,
    failure_policy: str = "Fail",
) -> Iterator[Webhook]:
    """Our server + self-mode certificates + a MutatingWebhookConfiguration on the test namespace,
    active (the API server has seen the bundle) when this yields."""
    tls = ServingTLS()
    server = AdmissionServer(routes, tls, ServerOptions(host="127.0.0.1", port=0))
    server.start()
    try:
        name = unique_name("webhook")
        url = f"https://127.0.0.1:{server.port}{INJECT}"
        configuration = mutating_configuration(name, namespace, url, failure_policy=failure_policy)
        with (
            registered(kube, configuration),
            cert_stack(kube, policy(namespace), [name], tls=tls) as stack,
        ):
            stack.wait_ready()
            webhook = Webhook(server, stack, name, namespace)
            wait_until(
                lambda: _admitted_by_webhook(kube, namespace), 60, "the webhook to be called"
            )
            yield webhook
    finally:
        server.stop()


def _admitted_by_webhook(kube: KubeClient, namespace: str) -> bool:
    """A dry-run create comes back mutated once the API server uses our webhook and bundle."""
    probe = workloads.workload(DEPLOYMENTS, f"probe-{uuid.uuid4().hex[:6]}")
    try:
        created = kube.request(
            "POST", DEPLOYMENTS.path(namespace), params={"dryRun": "All"}, body=probe, retry=False
        )
    except Exception:
        return False
    return "lumigo-injector" in workloads.init_container_names(created)


def create(kube: KubeClient, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
    return kube.create(resource, workloads.workload(resource, name), namespace)


@pytest.mark.parametrize("resource", workloads.KINDS, ids=lambda r: r.kind)
def test_each_workload_kind_is_stored_as_the_webhook_returned_it(
    kube: KubeClient, namespace: str, resource: Resource
) -> None:
    with webhook_in(kube, namespace, {INJECT: standin_handler.handle}):
        create(kube, resource, namespace, "w")
        stored = kube.get(resource, "w", namespace)
        assert workloads.init_container_names(stored) == ["lumigo-injector"]
        env = {e["name"] for e in workloads.pod_spec(stored)["containers"][0]["env"]}
        assert "LD_PRELOAD" in env


def test_with_the_server_down_and_failure_policy_ignore_creation_still_succeeds(
    kube: KubeClient, namespace: str
) -> None:
    with webhook_in(
        kube, namespace, {INJECT: standin_handler.handle}, failure_policy="Ignore"
    ) as hook:
        hook.server.stop()
        created = create(kube, DEPLOYMENTS, namespace, "while-down")
        assert workloads.init_container_names(created) == []
        assert workloads.init_container_names(kube.get(DEPLOYMENTS, "while-down", namespace)) == []


def test_ca_rotation_while_deployments_are_created_fails_no_admission(
    kube: KubeClient, namespace: str
) -> None:
    """failurePolicy Fail: any TLS failure during the rotation would fail a create."""
    with webhook_in(kube, namespace, {INJECT: standin_handler.handle}) as hook:
        first = hook.certs.state()
        served_by: list[str] = []  # per created Deployment: which CA served at that moment
        failures: list[str] = []
        stop = threading.Event()

        def stage() -> str:
            loaded = hook.certs.tls.loaded
            assert loaded is not None
            return "old" if certs.issued_by(loaded.certificate, first.ca.cert) else "new"

        def creator() -> None:
            client = KubeClient(kube.config, retry_attempts=1)  # a failure must surface, not retry
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    created = client.create(
                        DEPLOYMENTS, workloads.workload(DEPLOYMENTS, f"d-{n}"), namespace
                    )
                    if workloads.init_container_names(created) != ["lumigo-injector"]:
                        failures.append(f"d-{n} was not mutated")
                    served_by.append(stage())
                except Exception as err:
                    failures.append(f"d-{n}: {err}")

        thread = threading.Thread(target=creator)
        thread.start()
        try:
            wait_until(lambda: len(served_by) >= 20, 60, "creations before the rotation")
            hook.certs.writer.rotate_ca()

            def rotated() -> bool:
                state = hook.certs.state()
                return state.ca.cert != first.ca.cert and state.bundle == (state.ca.cert,)

            wait_until(rotated, 120, "the CA rotation to complete")
            done = len(served_by)
            wait_until(lambda: len(served_by) >= done + 20, 60, "creations after the rotation")
        finally:
            stop.set()
            thread.join(60)
        assert failures == []
        assert "old" in served_by
        assert served_by[-1] == "new"
        assert hook.certs.tls.loaded is not None
        final = hook.certs.state()
        assert hook.certs.tls.loaded.certificate == final.serving.cert
