"""`lumigo-operator run`: assemble the manager process from its parts.

Every replica: informer caches, the HTTPS admission server (in worker processes, see
`controller.webhook_workers`; not with --no-serve-webhooks, where `lumigo-operator webhook`
serves them: `controller.webhook_command`), certificate (re)loading, the event recorder, probes
and metrics. The Lease holder only: the Lumigo controller, the certificate writer (self mode),
the published injection mode (--injection-mode-configmap) and the telemetry-proxy configuration.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from api import constants, marks
from api.lumigo import LumigoSpec
from controller.flag_table import pick
from controller.lumigo import platform, rollouts
from controller.lumigo.injection_mode import InjectionModePublisher
from controller.lumigo.instrumentation import OPTED_OUT_INSTRUMENTED, Instrumenter, opted_out_state
from controller.lumigo.lumigo_reconciler import LumigoReconciler
from controller.lumigo.resources import WORKLOADS, WORKLOADS_BY_KIND
from controller.lumigo.revert import PodReader, Reverter
from controller.lumigo.skipped import STORAGE_PROBLEM, storage_state
from controller.lumigo.workload_health import Thresholds
from controller.options import RunOptions, component_settings
from controller.runtime.events import EventRecorder
from controller.runtime.informer import Informer, Selection, metadata_projection
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Controller, Manager, ManagerOptions, Result, Runnable
from controller.runtime.ratelimit import ItemExponentialFailureRateLimiter
from controller.runtime.singlekey import single_key_controller, trigger
from controller.runtime.store import ObjectKey, key_of
from controller.telemetry.agent import AgentTarget, ClusterAgentReconciler
from controller.telemetry.agent_config import AgentSettings, MetricsSettings
from controller.telemetry.config import DEFAULT_UPSTREAM, Origin, ProxySettings
from controller.telemetry.provider_id import add_node_provider_ids
from controller.telemetry.proxy_reconciler import ProxyTarget, TelemetryProxyReconciler
from controller.telemetry.redaction import Redaction
from controller.webhook_serving import (
    add_admission,
    add_injection_mode,
    ca_secret_informer,
    certificate_informers,
    injection_settings,
    lumigo_informer,
    managed_cert,
)
from kube import objects
from kube.cert_manager import CertWriter
from kube.objects import JSON
from webhook import injection_events
from webhook.pod_injection import InjectionSettings

log = logging.getLogger("lumigo.operator")


def _workload_state(obj: JSON) -> JSON:
    """What the workload caches keep beyond metadata: the opt-out, rollout and storage states."""
    return {**opted_out_state(obj), **rollouts.state(obj), **storage_state(obj)}


def _labels_changed(old: JSON | None, new: JSON) -> bool:
    """Workload events that matter to the Lumigo controller: creation, deletion, label changes
    (instrumentation state lives in the `lumigo.auto-trace` label), an opted-out workload's
    pod template gaining or losing our instrumentation (the label stays `false`), and a change
    of our annotations or of whether its rollout is complete (a budget slot frees up)."""
    if old is None:
        return True
    return bool(
        objects.metadata(old).get("labels") != objects.metadata(new).get("labels")
        or old.get(OPTED_OUT_INSTRUMENTED) != new.get(OPTED_OUT_INSTRUMENTED)
        or old.get(STORAGE_PROBLEM) != new.get(STORAGE_PROBLEM)
        or old.get(marks.STATE) != new.get(marks.STATE)
    )


def build(client: KubeClient, opts: RunOptions) -> Manager:
    # The manager's namespace, probes, metrics, shutdown delay and lease id: same-named options.
    manager = Manager(client, pick(ManagerOptions, opts, leader_election=opts.leader_elect))
    lumigoes = lumigo_informer(manager)
    workloads = {
        r.kind: manager.informer(
            Selection(r),
            transform=metadata_projection(_workload_state),
            indexed_labels=(constants.LABEL_AUTO_TRACE,),
        )
        for r in WORKLOADS
    }
    recorder = EventRecorder(
        client,
        resources=WORKLOADS_BY_KIND,
        lookup=lambda kind, ns, name: workloads[kind].get(ns, name) if kind in workloads else None,
    )
    manager.add_runnable(
        Runnable("event-recorder", recorder.start, recorder.stop, healthy=recorder.healthy)
    )

    settings = injection_settings(opts)
    injection_mode = add_injection_mode(manager, client, opts)
    _add_webhook(
        manager, client, opts, lumigoes=lumigoes, recorder=recorder, injection_mode=injection_mode
    )

    component = injection_events.controller_component(opts.operator_version)
    thresholds = Thresholds(restarts=opts.revert_restarts, unready_after=opts.revert_unready_after)
    pods = PodReader(client)
    instrumenter = Instrumenter(
        client,
        recorder,
        component=component,
        concurrency=opts.inject_concurrency,
        pods_healthy=lambda obj: pods.healthy(obj, thresholds),
    )
    reverter = (
        Reverter(client, recorder, component, thresholds, window=opts.revert_window)
        if opts.revert
        else None
    )
    reconciler = LumigoReconciler(
        client=client,
        lumigoes=lumigoes,
        workloads=workloads,
        instrumenter=instrumenter,
        settings_for=_settings_for(settings, injection_mode),
        resync_period=opts.resync_period,
        error_requeue=opts.error_requeue,
        reverter=reverter,
        rollout_timeout=opts.rollout_timeout,
        operator_namespace=opts.namespace,
    )

    def every_lumigo_in_namespace(obj: JSON) -> list[ObjectKey]:
        namespace = key_of(obj).namespace
        return [key_of(o) for o in lumigoes.store.list(namespace)] or [key_of(obj)]

    def effective_lumigo(obj: JSON) -> list[ObjectKey]:
        found = reconciler.effective_lumigo(key_of(obj).namespace)
        return [key_of(found)] if found is not None else []

    controller = Controller("lumigo", reconciler.reconcile, workers=opts.workers)
    controller.watches(lumigoes, every_lumigo_in_namespace)
    for informer in workloads.values():
        controller.watches(informer, effective_lumigo, predicate=_labels_changed)
    manager.add_controller(controller)

    if opts.telemetry_proxy_deployment:
        _add_telemetry(manager, client, opts, lumigoes, workloads)
    return manager


def _settings_for(
    settings: InjectionSettings, injection_mode: Callable[[], str] | None
) -> Callable[[LumigoSpec], InjectionSettings]:
    """The controller's settings for a Lumigo spec, in the current injection mode."""
    if injection_mode is None:
        return settings.for_spec

    def for_spec(spec: LumigoSpec) -> InjectionSettings:
        return dataclasses.replace(settings.for_spec(spec), injection_mode=injection_mode())

    return for_spec


def _add_webhook(
    manager: Manager,
    client: KubeClient,
    opts: RunOptions,
    *,
    lumigoes: Informer,
    recorder: EventRecorder,
    injection_mode: Callable[[], str] | None,
) -> None:
    """Admission served here unless --no-serve-webhooks; the certificates written by the Lease
    holder (self mode), and the `auto` injection mode published (--injection-mode-configmap)."""
    if opts.serve_webhooks:
        add_admission(
            manager,
            client,
            opts,
            lumigoes=lumigoes,
            recorder=recorder,
            injection_mode=injection_mode,
        )
    if injection_mode is not None and opts.injection_mode_configmap:
        decided = manager.probes.readyz.get("injection-mode", lambda: None)
        publisher = InjectionModePublisher(
            client, opts.namespace, opts.injection_mode_configmap, injection_mode, decided=decided
        )
        manager.add_controller(
            single_key_controller(
                "injection-mode-publisher",
                lambda: Result(requeue_after=publisher.sync()),
                rate_limiter=ItemExponentialFailureRateLimiter(0.5, 60.0),
            )
        )
    if opts.cert_mode == "files":  # someone else writes them
        return
    writer = CertWriter(client, managed_cert(opts), resync=opts.cert_check_interval)
    for informer in (ca_secret_informer(manager, opts), *certificate_informers(manager, opts)):
        # On every replica: the writer remembers the last good Secret (a new leader needs it)
        # and wakes its controller, which runs on the leader only.
        informer.add_handler(writer)
    manager.add_controller(cert_writer_controller(writer))


def cert_writer_controller(writer: CertWriter) -> Controller:
    """The certificate writer's loop: a single-key controller of the runtime. Its events and
    `rotate_ca` ask for a pass; it looks again when the next certificate step is due, and backs
    off from 0.5 s to 60 s while the API server fails."""
    controller = single_key_controller(
        "webhook-certificates",
        lambda: Result(requeue_after=writer.sync()),
        rate_limiter=ItemExponentialFailureRateLimiter(0.5, 60.0),
    )
    writer.wake = lambda: trigger(controller)
    return controller


def _add_telemetry(
    manager: Manager,
    client: KubeClient,
    opts: RunOptions,
    lumigoes: Informer,
    workloads: dict[str, Informer],
) -> None:
    # The proxy's and the agent's settings: the options of the same or the declared name
    # (controller.options.RENAMED).
    target = component_settings(ProxyTarget, opts)
    settings = component_settings(
        ProxySettings,
        opts,
        upstream_endpoint=opts.telemetry_upstream_endpoint or DEFAULT_UPSTREAM,
        origin=pick(Origin, opts),
        redaction=component_settings(Redaction, opts),
    )
    telemetry = TelemetryProxyReconciler(
        client,
        lumigoes,
        target,
        settings,
        workloads=workloads,
        cluster_token=(opts.cluster_token_secret, opts.cluster_token_key),
    )
    manager.add_controller(telemetry.controller())
    agent = ClusterAgentReconciler(
        client,
        component_settings(AgentTarget, opts),
        component_settings(
            AgentSettings, opts, metrics=component_settings(MetricsSettings, opts), proxy=settings
        ),
        enabled=opts.cluster_logs or opts.cluster_metrics,
    )
    manager.add_controller(agent.controller())
    if opts.node_provider_ids:
        add_node_provider_ids(manager, client)


def run(opts: RunOptions) -> int:
    return start(build, opts, "starting")


def start(builder: Callable[[KubeClient, RunOptions], Manager], opts: RunOptions, what: str) -> int:
    """Build a process's manager with a client from the environment (the platform's defaults
    decided first: every admission worker gets them), say so, run it."""
    client = KubeClient.from_env(opts.kubeconfig, user_agent=constants.USER_AGENT)
    user = platform.init_container_user(client, opts.init_container_user)
    manager = builder(client, dataclasses.replace(opts, init_container_user=user))
    log.info(
        what,
        extra={
            "version": opts.operator_version,
            "namespace": opts.namespace,
            "cert_mode": opts.cert_mode,
        },
    )
    return manager.run()
