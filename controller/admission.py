"""The admission side of a process: its Lumigo cache, handlers, certificate source and server.

Assembled in the manager process (`--webhook-workers=0`) or in each admission worker process
(`controller.admission_workers`), from the same parts either way.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from api import constants
from controller.lumigo.injection_mode import AutoInjectionMode
from controller.lumigo.nodes import node_informer
from controller.lumigo.resources import LUMIGOES
from controller.options import RunOptions
from controller.runtime.events import AdmissionEvents, EventRecorder
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Manager, Runnable
from controller.runtime.resources import MUTATING_WEBHOOK_CONFIGURATIONS, SECRETS
from webhook import events
from webhook.admission.cert_manager import FileCerts, ManagedCert, SelfSignedCerts
from webhook.admission.certs import CertPolicy
from webhook.admission.readiness import NotReady
from webhook.admission.server import AdmissionServer, ServerOptions
from webhook.admission.tls import ServingTLS
from webhook.inject_handler import InjectHandler
from webhook.mutate_handler import MutateHandler
from webhook.mutation import InjectionSettings
from webhook.routes import admission_routes

JSON = dict[str, Any]


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
    return InjectionSettings(
        operator_version=opts.operator_version,
        injector_image=opts.injector_image,
        injector_pull_policy=opts.injector_pull_policy,
        injection_mode=constants.INJECTION_MODE_INIT_CONTAINER if auto else opts.injection_mode,
        telemetry_proxy_endpoint=opts.telemetry_proxy_endpoint,
    )


def add_injection_mode(
    manager: Manager, client: KubeClient, opts: RunOptions
) -> Callable[[], str] | None:
    """With `--injection-mode=auto`, what tells the current mode (from the Node cache and one
    dry-run); None when the mode is fixed."""
    if opts.injection_mode != constants.INJECTION_MODE_AUTO:
        return None
    auto = AutoInjectionMode(client, node_informer(manager), opts.namespace,
                             opts.injector_image, opts.injector_pull_policy)  # fmt: skip
    manager.add_runnable(Runnable("injection-mode", auto.start, auto.stop))
    manager.probes.readyz["injection-mode"] = auto.ready
    return auto.mode


def lumigo_informer(manager: Manager) -> Informer:
    return manager.informer(Selection(LUMIGOES))


@dataclass(frozen=True)
class Certificates:
    """Where the serving certificate comes from, and the caches that feed it (self mode)."""

    tls: ServingTLS
    watched: tuple[Informer, ...]  # the certificate Secret and our webhook configurations
    cert: ManagedCert | None  # self mode only


def add_certificates(manager: Manager, client: KubeClient, opts: RunOptions) -> Certificates:
    """Load the serving certificate into a `ServingTLS` and keep it current: from --cert-dir
    (files mode), or from the certificate Secret once our webhook configurations trust it
    (self mode; the Lease holder writes it, see `operator.cert_writer_controller`)."""
    tls = ServingTLS()
    if opts.cert_mode == "files":
        files = FileCerts(tls, opts.cert_dir)
        manager.add_runnable(Runnable("webhook-cert-files", files.start, files.stop))
        manager.probes.readyz["webhook-certificate"] = files.ready
        return Certificates(tls, (), None)
    cert = ManagedCert(certificate_policy(opts), opts.cert_secret,
                       mutating=opts.webhook_configurations)  # fmt: skip
    replica = SelfSignedCerts(tls, cert, kube=client)
    # Field selectors keep these caches (and the RBAC they need) to exactly our objects.
    selections = [
        Selection(SECRETS, opts.namespace, field_selector=f"metadata.name={opts.cert_secret}"),
        *(
            Selection(MUTATING_WEBHOOK_CONFIGURATIONS, field_selector=f"metadata.name={n}")
            for n in opts.webhook_configurations
        ),
    ]
    watched = tuple(manager.informer(selection) for selection in selections)
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
    recorder: events.EventRecorder,
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
    server = AdmissionServer(
        routes,
        tls,
        ServerOptions(host=opts.webhook_host, port=opts.webhook_port),
        listener=listener,
    )
    manager.add_runnable(Runnable("webhook-server", server.start, server.stop))
    manager.probes.readyz["webhook-server"] = server.ready
    return server


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
