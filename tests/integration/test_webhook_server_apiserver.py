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
from prometheus_client import REGISTRY

from controller.lumigo.resources import LUMIGOES, WORKLOADS_BY_KIND
from controller.runtime.events import AdmissionEvents, EventRecorder
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from envtest.operator import wait_until_webhooks_admit
from envtest.process import wait_until
from kube import certs
from kube.http.routing import Route
from kube.http.server import AdmissionServer, ServerOptions
from kube.http.tls import ServingTLS
from kube.kinds import DEPLOYMENTS, EVENTS
from kube.rest import ApiError, Resource
from tests.support import standin_handler, workloads
from tests.support.webhook_cluster import (
    CertStack,
    cert_stack,
    mutating_configuration,
    operator_configuration,
    policy,
    registered,
    unique_name,
)
from webhook.inject_handler import InjectHandler
from webhook.lumigo_defaulter import MutateHandler
from webhook.pod_injection import InjectionSettings
from webhook.routes import admission_routes

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


# --- with the real handlers -------------------------------------------------------------------
SETTINGS = InjectionSettings(operator_version="0.1.0-test", injector_image="example/injector:1")
ALREADY = "There is already an instance of operator.lumigo.io/v1alpha1.Lumigo in the '{}' namespace"


class InformerLister:
    """The Lumigo lister the manager gives the handlers: a real informer's cache."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer

    def list(self, namespace: str) -> list[dict[str, Any]]:
        return self.informer.store.list(namespace=namespace)


def lumigo_body(name: str = "lumigo") -> dict[str, Any]:
    return {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": name},
        "spec": {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}},
    }


def make_active(kube: KubeClient, namespace: str, name: str) -> None:
    """What the (lead's) Lumigo controller would write: an Active condition."""
    condition = {
        "type": "Active",
        "status": "True",
        "reason": "Active",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "lastUpdateTime": "2026-01-01T00:00:00Z",
    }
    kube.merge_patch(
        LUMIGOES,
        name,
        {"status": {"conditions": [condition], "instrumentedResources": []}},
        namespace,
        subresource="status",
    )


@dataclass
class Operator:
    server: AdmissionServer
    lumigoes: Informer
    namespace: str


@pytest.fixture
def operator(kube: KubeClient, namespace: str, crd: Any) -> Iterator[Operator]:
    """Our server with the real inject and mutate handlers, a Lumigo informer, a real event
    recorder, self-mode certificates and both webhooks registered for the test namespace."""
    lumigoes = Informer(kube, Selection(LUMIGOES))
    lumigoes.start()
    recorder = EventRecorder(kube, resources=WORKLOADS_BY_KIND)
    recorder.start()
    lister = InformerLister(lumigoes)
    # Events verified before posting, as the operator wires them (they name request objects).
    handler = InjectHandler(lister, AdmissionEvents(recorder), SETTINGS)
    routes = admission_routes(handler, MutateHandler(lister))
    tls = ServingTLS()
    server = AdmissionServer(routes, tls, ServerOptions(host="127.0.0.1", port=0))
    server.start()
    try:
        assert lumigoes.wait_for_sync(30)
        name = unique_name("operator")
        config = operator_configuration(name, namespace, f"https://127.0.0.1:{server.port}")
        with (
            registered(kube, config),
            cert_stack(kube, policy(namespace), [name], tls=tls) as stack,
        ):
            stack.wait_ready()
            wait_until_webhooks_admit(kube, namespace)
            yield Operator(server, lumigoes, namespace)
    finally:
        server.stop()
        recorder.stop()
        lumigoes.stop()


def activate_lumigo(kube: KubeClient, op: Operator) -> None:
    kube.create(LUMIGOES, lumigo_body(), op.namespace)
    make_active(kube, op.namespace, "lumigo")

    def seen_active() -> bool:
        obj = op.lumigoes.get(op.namespace, "lumigo")
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)

    wait_until(seen_active, 30, "the informer to see the Active Lumigo")
    # The webhook configuration is new: wait until the API server calls it (dry run).
    probe = workloads.workload(DEPLOYMENTS, "probe")
    wait_until(
        lambda: (
            "lumigo-injector"
            in workloads.init_container_names(
                kube.request(
                    "POST", DEPLOYMENTS.path(op.namespace), params={"dryRun": "All"}, body=probe
                )
            )
        ),
        60,
        "the API server to call the inject webhook",
    )


def assert_injected(obj: dict[str, Any]) -> None:
    assert workloads.init_container_names(obj) == ["lumigo-injector"]
    for container in workloads.pod_spec(obj)["containers"]:
        env = {e["name"]: e.get("value") for e in container.get("env") or []}
        assert env["LD_PRELOAD"] == "/opt/lumigo/injector/lumigo_injector.so"
    assert obj["metadata"]["labels"]["lumigo.auto-trace"] == "lumigo-operator.v0.1.0-test"


@pytest.mark.parametrize("resource", workloads.KINDS, ids=lambda r: r.kind)
def test_workloads_in_a_namespace_with_an_active_lumigo_are_stored_injected(
    kube: KubeClient, operator: Operator, resource: Resource
) -> None:
    activate_lumigo(kube, operator)
    create(kube, resource, operator.namespace, "traced")
    stored = kube.get(resource, "traced", operator.namespace)
    assert_injected(stored)

    def added() -> list[dict[str, Any]]:
        """The admission's event: verified (the object exists), with the stored uid."""
        selector = "involvedObject.name=traced"
        items, _ = kube.list(EVENTS, operator.namespace, field_selector=selector)
        return [e for e in items if e.get("reason") == "LumigoAddedInstrumentation"]

    wait_until(added, 30, "the admission's event")
    assert [e["involvedObject"]["uid"] for e in added()] == [stored["metadata"]["uid"]]


def test_opted_out_workloads_are_stored_unchanged(kube: KubeClient, operator: Operator) -> None:
    activate_lumigo(kube, operator)
    body = workloads.workload(DEPLOYMENTS, "opted-out", labels={"lumigo.auto-trace": "false"})
    kube.create(DEPLOYMENTS, body, operator.namespace)
    stored = kube.get(DEPLOYMENTS, "opted-out", operator.namespace)
    assert workloads.init_container_names(stored) == []
    assert workloads.pod_spec(stored)["containers"][0].get("env") is None
    assert stored["metadata"]["labels"] == {"lumigo.auto-trace": "false"}


def test_an_opted_out_workload_keeps_its_own_lumigo_env_when_updated(
    kube: KubeClient, operator: Operator
) -> None:
    """An app traced by hand (or the operator's own pods, configured through LUMIGO_ENDPOINT)
    opts out and sets the tracer's variables itself; an update must not lose them."""
    activate_lumigo(kube, operator)
    body = workloads.workload(DEPLOYMENTS, "manual", labels={"lumigo.auto-trace": "false"})
    own = [
        {"name": "LUMIGO_TRACER_TOKEN", "value": "t_0123456789abcdef01234"},
        {"name": "LUMIGO_ENDPOINT", "value": "http://collector.example:4318"},
    ]
    workloads.pod_spec(body)["containers"][0]["env"] = own
    kube.create(DEPLOYMENTS, body, operator.namespace)
    patch = {"spec": {"template": {"metadata": {"annotations": {"restarted": "1"}}}}}
    kube.merge_patch(DEPLOYMENTS, "manual", patch, operator.namespace)  # an UPDATE admission
    stored = kube.get(DEPLOYMENTS, "manual", operator.namespace)
    assert workloads.pod_spec(stored)["containers"][0]["env"] == own
    assert stored["spec"]["template"]["metadata"]["annotations"] == {"restarted": "1"}
    assert workloads.init_container_names(stored) == []


def test_workloads_in_a_namespace_without_lumigo_are_stored_unchanged(
    kube: KubeClient, operator: Operator
) -> None:
    # The webhook is registered for this namespace, but no Lumigo exists: nothing to do.
    probe = workloads.workload(DEPLOYMENTS, "plain")
    kube.create(DEPLOYMENTS, probe, operator.namespace)
    stored = kube.get(DEPLOYMENTS, "plain", operator.namespace)
    assert workloads.init_container_names(stored) == []
    assert "lumigo.auto-trace" not in (stored["metadata"].get("labels") or {})
    served = REGISTRY.get_sample_value(
        "controller_runtime_webhook_requests_total", {"webhook": INJECT, "code": "200"}
    )
    assert served  # the webhook was called and said "nothing to do"


def test_a_second_lumigo_in_a_namespace_is_denied(kube: KubeClient, operator: Operator) -> None:
    kube.create(LUMIGOES, lumigo_body("first"), operator.namespace)
    wait_until(
        lambda: operator.lumigoes.get(operator.namespace, "first") is not None,
        30,
        "the informer to see the first Lumigo",
    )
    with pytest.raises(ApiError) as denied:
        kube.create(LUMIGOES, lumigo_body("second"), operator.namespace)
    assert denied.value.code == 403
    assert ALREADY.format(operator.namespace) in denied.value.message
    assert kube.get_or_none(LUMIGOES, "second", operator.namespace) is None
