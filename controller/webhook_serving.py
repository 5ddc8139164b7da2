"""The admission side of a process: its Lumigo cache, handlers, certificate source and server.

Assembled in the manager process (`--webhook-workers=0`) or in each admission worker process
(`controller.webhook_workers`), from the same parts either way; `add_admission` serves them
from `lumigo-operator run` (one Deployment) or `lumigo-operator webhook` (a Deployment of its
own, under an identity that may read Lumigo objects and the serving Secret, post Events and
get workloads, nothing else: see `controller.webhook_command`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from api import constants
from controller.flag_table import pick
from controller.lumigo.injection_mode import AutoInjectionMode, PublishedInjectionMode
from controller.lumigo.nodes import node_informer
from controller.lumigo.resources import LUMIGOES
from controller.options import RunOptions, serving_secret
from controller.runtime.events import AdmissionEvents, EventRecorder
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Manager, Runnable
from controller.webhook_workers import AdmissionWorkers, default_worker_count
from kube.cert_manager import FileCerts, ManagedCert, SelfSignedCerts
from kube.certs import CertPolicy
from kube.http.readiness import NotReady
from kube.http.server import AdmissionServer, ServerOptions
from kube.http.tls import ServingTLS
from kube.kinds import CONFIGMAPS, MUTATING_WEBHOOK_CONFIGURATIONS, SECRETS
from kube.objects import JSON
from kube.rest import Resource
from webhook import injection_events
from webhook.inject_handler import InjectHandler
from webhook.lumigo_defaulter import MutateHandler
from webhook.pod_injection import InjectionSettings
from webhook.routes import admission_routes


class CacheNotSynced(RuntimeError):
    pass


class SyncedLister:
    """The webhook's view of the Lumigo cache; refuses to answer before the first LIST, since
    an empty answer would mean "no Lumigo here" and let workloads through uninstrumented."""

    def __init__(self, informer: Informer) -> None:
        self._informer = informer

    def list(self, namespace: str) -> list[JSON]:
        if not self._informer.has_synced():
            raise CacheNotSynced("the Lumigo cache has not synced yet")
        return self._informer.store.list(namespace)


def injection_settings(opts: RunOptions) -> InjectionSettings:
    """The settings of every injection; with `auto`, in the init-container mode that
    `add_injection_mode` switches per admission."""
    auto = opts.injection_mode == constants.INJECTION_MODE_AUTO
    # The operator version, injector image and pull policy, proxy endpoint: same-named options.
    mode = constants.INJECTION_MODE_INIT_CONTAINER if auto else opts.injection_mode
    # An `auto` user not resolved at startup (controller.lumigo.platform): the reference's.
    user = opts.init_container_user
    if user == constants.INIT_USER_AUTO:
        user = constants.INIT_USER_FSGROUP
    return pick(InjectionSettings, opts, injection_mode=mode, init_container_user=user)


def add_injection_mode(
    manager: Manager, client: KubeClient, opts: RunOptions, *, decide: bool = True
) -> Callable[[], str] | None:
    """With `--injection-mode=auto`, what tells the current mode (from the Node cache and one
    dry-run); None when the mode is fixed. With `decide=False` (the admission side, when the
    manager publishes its decision in --injection-mode-configmap), the published mode: no Node
    cache and no `create pods` needed."""
    if opts.injection_mode != constants.INJECTION_MODE_AUTO:
        return None
    if not decide and opts.injection_mode_configmap:
        name = opts.injection_mode_configmap
        selection = Selection(CONFIGMAPS, opts.namespace, field_selector=f"metadata.name={name}")
        published = PublishedInjectionMode(manager.informer(selection), opts.namespace, name)
        manager.add_runnable(Runnable("injection-mode", published.start, published.stop))
        manager.probes.readyz["injection-mode"] = published.ready
        return published.mode
    auto = AutoInjectionMode(
        client,
        node_informer(manager),
        opts.namespace,
        opts.injector_image,
        opts.injector_pull_policy,
    )
    manager.add_runnable(Runnable("injection-mode", auto.start, auto.stop))
    manager.probes.readyz["injection-mode"] = auto.ready
    return auto.mode


def lumigo_informer(manager: Manager) -> Informer:
    return manager.informer(Selection(LUMIGOES))


@dataclass(frozen=True)
class Certificates:
    """Where the serving certificate comes from, and the caches that feed it (self mode)."""

    tls: ServingTLS
    watched: tuple[Informer, ...]  # the serving Secret and our webhook configurations
    cert: ManagedCert | None  # self mode only


def managed_cert(opts: RunOptions) -> ManagedCert:
    """Self mode's certificate: the CA Secret (--cert-secret, the manager's only) and the
    serving Secret replicas load (no CA key)."""
    return ManagedCert(
        certificate_policy(opts),
        opts.cert_secret,
        mutating=opts.webhook_configurations,
        serving_secret_name=serving_secret(opts),
    )


def _named(resource: Resource, name: str, namespace: str | None = None) -> Selection:
    # Field selectors keep these caches (and the RBAC they need) to exactly our objects.
    return Selection(resource, namespace, field_selector=f"metadata.name={name}")


def certificate_informers(manager: Manager, opts: RunOptions) -> tuple[Informer, ...]:
    """The serving Secret and our webhook configurations: what a replica follows."""
    selections = [
        _named(SECRETS, serving_secret(opts), opts.namespace),
        *(_named(MUTATING_WEBHOOK_CONFIGURATIONS, n) for n in opts.webhook_configurations),
    ]
    return tuple(manager.informer(selection) for selection in selections)


def ca_secret_informer(manager: Manager, opts: RunOptions) -> Informer:
    """The CA Secret: the certificate writer's (the manager's) only."""
    return manager.informer(_named(SECRETS, opts.cert_secret, opts.namespace))


def add_certificates(manager: Manager, client: KubeClient, opts: RunOptions) -> Certificates:
    """Load the serving certificate into a `ServingTLS` and keep it current: from --cert-dir
    (files mode), or from the serving Secret once our webhook configurations trust it
    (self mode; the Lease holder writes it, see `operator.cert_writer_controller`)."""
    tls = ServingTLS()
    if opts.cert_mode == "files":
        files = FileCerts(tls, opts.cert_dir)
        manager.add_runnable(Runnable("webhook-cert-files", files.start, files.stop))
        manager.probes.readyz["webhook-certificate"] = files.ready
        return Certificates(tls, (), None)
    cert = managed_cert(opts)
    replica = SelfSignedCerts(tls, cert, kube=client)
    watched = certificate_informers(manager, opts)
    for informer in watched:
        informer.add_handler(replica)
    manager.add_runnable(Runnable("webhook-certificates", replica.start, replica.stop))
    manager.probes.readyz["webhook-certificate"] = replica.ready
    return Certificates(tls, watched, cert)


def certificate_policy(opts: RunOptions) -> CertPolicy:
    names, ips = _split_sans(opts.webhook_cert_extra_sans)
    return CertPolicy(
        service=opts.webhook_service,
        namespace=opts.namespace,
        ca_validity=dt.timedelta(seconds=opts.ca_validity),
        serving_validity=dt.timedelta(seconds=opts.cert_validity),
        ca_lookahead=dt.timedelta(seconds=opts.ca_lookahead),
        serving_lookahead=dt.timedelta(seconds=opts.cert_lookahead),
        extra_dns_names=names,
        extra_ip_addresses=ips,
    )


def inject_handler(
    opts: RunOptions,
    lumigoes: Informer,
    recorder: injection_events.EventRecorder,
    injection_mode: Callable[[], str] | None,
) -> InjectHandler:
    """The injector route's handler, answering from `lumigoes` once it has synced.

    Its events name objects from requests anyone reaching the webhook port can forge: given this
    process's recorder, it records them to be verified before they are posted (a worker's, sent
    to the manager, are verified there: `AdmissionWorkers`)."""
    if isinstance(recorder, EventRecorder):
        recorder = AdmissionEvents(recorder)
    settings = injection_settings(opts)
    return InjectHandler(SyncedLister(lumigoes), recorder, settings, injection_mode=injection_mode)


def add_admission_server(
    manager: Manager,
    opts: RunOptions,
    *,
    inject: InjectHandler,
    tls: ServingTLS,
    listener: socket.socket | None = None,
) -> AdmissionServer:
    """The HTTPS server of the two admission routes, started and stopped by `manager`."""
    routes = admission_routes(inject, MutateHandler(inject.lumigoes))
    options = ServerOptions(
        host=opts.webhook_host,
        port=opts.webhook_port,
        body_budget_bytes=opts.webhook_body_budget,
        large_body_slots=opts.webhook_large_body_slots,
    )
    server = AdmissionServer(routes, tls, options, listener=listener)
    manager.add_runnable(Runnable("webhook-server", server.start, server.stop, drain=server.drain))
    manager.probes.readyz["webhook-server"] = server.ready
    return server


def add_admission(
    manager: Manager,
    client: KubeClient,
    opts: RunOptions,
    *,
    lumigoes: Informer | None,
    recorder: EventRecorder,
    injection_mode: Callable[[], str] | None,
) -> None:
    """Serve admissions: here (`--webhook-workers=0`) or in worker processes (their events
    come to `recorder`), with the serving certificate followed here either way (readiness).
    `lumigoes`: this process's Lumigo cache (None: made here if admissions are served here;
    worker processes have their own)."""
    certificates = add_certificates(manager, client, opts)
    workers = opts.webhook_workers if opts.webhook_workers >= 0 else default_worker_count()
    if workers == 0:
        lumigoes = lumigoes or lumigo_informer(manager)
        inject = inject_handler(opts, lumigoes, recorder, injection_mode)
        add_admission_server(manager, opts, inject=inject, tls=certificates.tls)
        return
    pool = AdmissionWorkers(opts, workers, recorder)
    manager.add_runnable(
        Runnable("webhook-workers", pool.start, pool.stop, healthy=pool.healthy, drain=pool.drain)
    )
    manager.probes.readyz["webhook-server"] = pool.ready


def check_ready(manager: Manager) -> None:
    """Every readiness check of `manager`, as one: raises NotReady naming the first failing."""
    for name, check in sorted(manager.probes.readyz.items()):
        try:
            check()
        except Exception as err:
            raise NotReady(f"{name}: {err}") from None


def _split_sans(sans: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names, ips = [], []
    for san in sans:
        try:
            ipaddress.ip_address(san)
            ips.append(san)
        except ValueError:
            names.append(san)
    return tuple(names), tuple(ips)
