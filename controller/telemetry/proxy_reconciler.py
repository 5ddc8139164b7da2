"""Keeps the telemetry proxy's collector configuration in step with the active Lumigoes.

A single-key, level-triggered runtime controller: any relevant change to a Lumigo (and a periodic
resync, for token rotations: the operator may GET Secrets but not watch them) recomputes the whole
set of monitored namespaces, renders the configuration (`controller.telemetry.config`), writes it
into a Secret (it holds tokens, so never a ConfigMap), and rolls the proxy Deployment by changing
a pod-template annotation to the configuration's hash — only when the rendered text changed, so
an unchanged set never restarts anything. Under OLM, which undoes template changes, the proxy's
outdated pods are deleted instead (`controller.telemetry.restart`).

Failures never propagate: an API error aborts the pass before anything is written (a transient
Secret read error must not drop a namespace's pipeline and restart the proxy) and the controller
retries with backoff. A namespace whose token is unusable is left out; the Lumigo controller
reports why in that Lumigo's status.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, cast

from prometheus_client import Counter, Gauge

from api.constants import (
    CONDITION_TELEMETRY_LEFT_OUT,
    DEFAULT_TOKEN_KEY,
    DEFAULT_TOKEN_SECRET,
    LABEL_AUTO_TRACE,
    LABEL_TOKEN_KEY,
    LABEL_TOKEN_SECRET,
)
from api.effective import effective, in_effect, is_active
from api.lumigo import InvalidSpecError, Lumigo, load_spec
from controller.lumigo.resources import LUMIGOES
from controller.lumigo.status import (
    ConditionUpdate,
    apply_conditions,
    condition,
    secret_token,
    token_secret_problem,
)
from controller.runtime.informer import Informer
from controller.runtime.kube import KubeClient
from controller.runtime.logs import WarnWhileMissing
from controller.runtime.manager import Controller, ReconcileError, Result
from controller.runtime.ratelimit import ItemExponentialFailureRateLimiter
from controller.runtime.singlekey import single_key_controller, to_key
from controller.telemetry.config import MonitoredNamespace, ProxySettings, render
from controller.telemetry.restart import PodRestarter, is_olm_managed
from kube import objects
from kube.kinds import DEPLOYMENTS, NAMESPACES, SECRETS
from kube.objects import JSON
from kube.rest import ApiError

log = logging.getLogger("lumigo.telemetry")

CONFIG_HASH_ANNOTATION = "operator.lumigo.io/telemetry-config-hash"
CONFIG_KEY = "config.yaml"
# A Secret holds at most 1 MiB; keep room for metadata. About 1.5 KB per monitored namespace.
MAX_CONFIG_BYTES = 1_000_000
MANAGED_BY = {"app.kubernetes.io/managed-by": "lumigo-operator"}
BASE_BACKOFF = 1.0  # seconds after a first failure, doubling up to MAX_BACKOFF
RESTART_POLL = 2.0  # seconds between steps of a pod-by-pod restart (OLM)
MAX_BACKOFF = 60.0

SYNCS = Counter(
    "lumigo_telemetry_proxy_config_syncs_total",
    "Passes of the telemetry proxy configuration loop, by outcome.",
    ["result"],
)
LEFT_OUT = Gauge(
    "lumigo_telemetry_proxy_left_out_namespaces",
    "Namespaces left out of the telemetry proxy configuration: it would not fit in a Secret.",
)
CONDITION_LEFT_OUT = CONDITION_TELEMETRY_LEFT_OUT
REASON_TOO_LARGE = "ProxyConfigurationTooLarge"
REASON_IN = "InProxyConfiguration"
LEFT_OUT_MESSAGE = (
    "the telemetry proxy configuration for all {total} namespaces with an active Lumigo would be "
    "larger than a Secret holds ({limit} bytes): this namespace, among those whose Lumigo is "
    "newest, is left out of it (its telemetry is not collected); disable "
    "spec.infrastructure.kubeEvents in some namespaces' Lumigo resources"
)
IN_MESSAGE = "this namespace is in the telemetry proxy configuration"
MONITORED = Gauge(
    "lumigo_telemetry_proxy_monitored_namespaces",
    "Namespaces whose Kubernetes events and objects the telemetry proxy collects.",
)


@dataclass(frozen=True)
class ProxyTarget:
    """Where the proxy runs: its namespace, its configuration Secret and its Deployment."""

    namespace: str
    secret_name: str
    deployment_name: str

    @classmethod
    def for_release(cls, namespace: str, fullname: str) -> ProxyTarget:
        """The names the manifests use: `<fullname>-telemetry-proxy[-config]`."""
        return cls(namespace, f"{fullname}-telemetry-proxy-config", f"{fullname}-telemetry-proxy")


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ConfigTooLargeError(ReconcileError):
    """The configuration cannot be stored: the proxy keeps running the previous one."""


def check_size(text: str, namespaces: int, limit: int = MAX_CONFIG_BYTES) -> None:
    size = len(text.encode())
    if size > limit:
        raise ConfigTooLargeError(
            f"the telemetry proxy configuration for {namespaces} monitored namespaces is "
            f"{size} bytes, more than a Secret can hold ({limit}); the proxy keeps "
            "its previous configuration. Disable spec.infrastructure.kubeEvents in some "
            "namespaces' Lumigo resources."
        )


def fit(
    namespaces: list[MonitoredNamespace],
    settings: ProxySettings,
    limit: int,
    seniority: Callable[[MonitoredNamespace], Any],
) -> tuple[str, list[MonitoredNamespace]]:
    """The configuration of every namespace when it fits in `limit` bytes; otherwise the largest
    that does, keeping the namespaces first in `seniority` order (deterministic: the same
    namespaces give the same text). Never the previous configuration: a namespace removed since
    is always dropped. Raises ConfigTooLargeError only if not even one without any namespace
    fits (the settings alone are too large)."""
    text = render(namespaces, settings)
    if len(text.encode()) <= limit:
        return text, namespaces
    ranked = sorted(range(len(namespaces)), key=lambda i: seniority(namespaces[i]))

    def attempt(count: int) -> tuple[str, list[MonitoredNamespace]]:
        keep = set(ranked[:count])
        kept = [ns for i, ns in enumerate(namespaces) if i in keep]  # in the given order
        return render(kept, settings), kept

    best = attempt(0)
    check_size(best[0], 0, limit)
    low, high = 0, len(namespaces) - 1  # the configuration grows with every namespace
    while low < high:
        middle = (low + high + 1) // 2
        candidate = attempt(middle)
        if len(candidate[0].encode()) <= limit:
            low, best = middle, candidate
        else:
            high = middle - 1
    return best


def _relevance(obj: Lumigo) -> tuple[Any, ...]:
    """What of a Lumigo the configuration depends on (status timestamps are not)."""
    meta = objects.metadata(obj)
    spec = obj.get("spec") or {}
    return (
        is_active(obj),
        bool(meta.get("deletionTimestamp")),
        repr((spec.get("lumigoToken"), spec.get("infrastructure"))),
    )


@dataclass(eq=False)
class TelemetryProxyReconciler:
    """Renders, stores and rolls out the proxy configuration; run it on the leader only.

    Wiring (the manager): `manager.add_controller(r.controller())` with the manager's shared
    Lumigo informer (controllers run on the leader only). `sync()` is one pass.
    """

    client: KubeClient
    lumigoes: Informer
    target: ProxyTarget
    settings: ProxySettings
    _: KW_ONLY
    resync_period: float = 60.0
    # What the configuration Secret may hold (`fit`).
    max_config_bytes: int = MAX_CONFIG_BYTES
    # Workload caches by kind (labels kept): workloads opted in by the `lumigo.auto-trace`
    # label in namespaces without a Lumigo send with the token their labels name, and the proxy
    # accepts only the tokens it knows.
    workloads: Mapping[str, Informer] = field(default_factory=dict)
    # The cluster token's Secret (name, key) in the proxy's namespace: while it holds a valid
    # token, the proxy sends its own metrics with it (read at each pass, so rotations count).
    cluster_token: tuple[str, str] | None = None
    # Namespace UIDs by the UID of the Lumigo that put the namespace in: a namespace deleted
    # and created again under the same name comes back with a new Lumigo, so a new entry.
    _namespace_uids: dict[str, str] = field(default_factory=dict, init=False)
    _identity: ClusterIdentity = field(init=False)
    # namespace -> last logged reason it is left out
    _reported: dict[str, str] = field(default_factory=dict, init=False)
    _deployment_wait: WarnWhileMissing = field(
        default_factory=lambda: WarnWhileMissing(
            log, "telemetry proxy Deployment not found; configuration stored, nothing to roll"
        ),
        init=False,
    )
    _left_out: list[str] = field(default_factory=list, init=False)
    _restart_pending: bool = field(default=False, init=False)
    # The proxy Deployment existed at some pass: once it is gone, the Secret is never written
    # again (see `sync`).
    _deployment_seen: bool = field(default=False, init=False)
    _deployment_gone: WarnWhileMissing = field(
        default_factory=lambda: WarnWhileMissing(
            log, "telemetry proxy Deployment deleted; its configuration goes with it"
        ),
        init=False,
    )

    def __post_init__(self) -> None:
        self._identity = ClusterIdentity(self.client)

    # -- loop -----------------------------------------------------------------------------------
    def controller(self) -> Controller:
        """A single-key runtime controller for this reconciler (one per start: a stopped
        controller does not start again). Any relevant Lumigo change asks for a pass."""
        controller = single_key_controller(
            "telemetry-proxy",
            self.reconcile,
            rate_limiter=ItemExponentialFailureRateLimiter(BASE_BACKOFF, MAX_BACKOFF),
        )
        controller.watches(self.lumigoes, to_key, predicate=_relevant_change)
        for informer in self.workloads.values():
            controller.watches(informer, to_key, predicate=_opt_in_change)
        return controller

    def reconcile(self) -> Result:
        """One pass, then the next one after `resync_period` (token rotations are not watched)."""
        if not all(i.has_synced() for i in (self.lumigoes, *self.workloads.values())):
            # An empty cache would render "no namespaces" and restart the proxy without them.
            return Result(requeue_after=1.0)
        try:
            self.sync()
        except Exception:
            SYNCS.labels("error").inc()
            raise  # the controller logs it and retries with backoff
        if self._restart_pending:
            return Result(requeue_after=min(RESTART_POLL, self.resync_period))
        return Result(requeue_after=self.resync_period)

    # -- one pass -------------------------------------------------------------------------------
    def sync(self) -> bool:
        """Render from the cache and apply; True when the configuration changed."""
        wanted = self.monitored_namespaces()
        t = self.target
        text, namespaces = fit(
            wanted, self.rendering_settings(), self.max_config_bytes, self._seniority()
        )
        self._report_left_out(wanted, namespaces)
        digest = config_hash(text)
        deployment = self.client.get_or_none(DEPLOYMENTS, t.deployment_name, t.namespace)
        if deployment is None and self._deployment_seen:
            # Deleted since (an uninstall: Helm deletes the proxy before the operator's RBAC).
            # The garbage collector takes the Secret with it; writing it again now would create
            # it with no owner, and the tenants' tokens would outlive the proxy.
            self._deployment_gone.present(False, deployment=f"{t.namespace}/{t.deployment_name}")
            return False
        self._deployment_gone.present(True)
        self._deployment_seen = deployment is not None
        changed, secret = self._apply_secret(text, digest, deployment)
        if deployment is not None and is_olm_managed(deployment):
            now = dt.datetime.now(dt.UTC)
            self._restart_pending = PodRestarter(self.client).restart(deployment, secret, now)
            rolled = changed
        else:
            self._restart_pending = False
            rolled = self._roll(deployment, digest)
        MONITORED.set(sum(ns.kube_events for ns in namespaces))
        SYNCS.labels("changed" if changed or rolled else "unchanged").inc()
        if changed or rolled:
            log.info(
                "telemetry proxy configuration applied",
                extra={
                    "hash": digest,
                    "namespaces": [ns.name for ns in namespaces],
                    "secret_updated": changed,
                    "rollout": rolled,
                },
            )
        return changed or rolled

    def monitored_namespaces(self) -> list[MonitoredNamespace]:
        """Namespaces whose Lumigo takes effect (`api.effective`) and has a usable token: the
        proxy's tenants (it refuses every other token), marked with whether the Lumigo wants
        events. A failed Secret read raises: it says nothing about the token."""
        by_namespace: dict[str, list[Lumigo]] = {}
        for obj in self._lumigoes():
            namespace = str(objects.metadata(obj).get("namespace", ""))
            by_namespace.setdefault(namespace, []).append(obj)

        out: list[MonitoredNamespace] = []
        reasons: dict[str, str] = {}
        uids: dict[str, str] = {}
        for namespace, lumigoes in sorted(by_namespace.items()):
            lumigo = effective(lumigoes)
            if lumigo is None:
                continue
            try:
                spec = load_spec(lumigo.get("spec"))
            except InvalidSpecError as err:
                reasons[namespace] = str(err)
                continue
            infra = spec.infrastructure
            kube_events = infra.enabled and infra.kube_events.enabled
            ref = spec.lumigo_token.secret_ref
            secret = self.client.get_or_none(SECRETS, ref.name, namespace) if ref.name else None
            problem = token_secret_problem(namespace, ref, secret)
            token = secret_token(secret, ref.key) if secret is not None else None
            if problem is not None or token is None:
                reasons[namespace] = problem or "no valid token"
                continue
            lumigo_uid = str(objects.metadata(lumigo).get("uid", ""))
            uid = self._namespace_uids.get(lumigo_uid) or self._read_namespace_uid(namespace)
            if uid and lumigo_uid:
                uids[lumigo_uid] = uid  # never "" (not there yet): read it again next time
            out.append(MonitoredNamespace(namespace, uid, token, kube_events=kube_events))
        covered = {ns.name for ns in out} | set(reasons)
        out += self._opted_in_tenants(covered, reasons)
        self._namespace_uids = uids  # only namespaces still monitored
        self._report(reasons)
        return out

    def _opted_in_tenants(
        self, covered: set[str], reasons: dict[str, str]
    ) -> list[MonitoredNamespace]:
        """Tenants of workloads opted in by label where no Lumigo is (`covered`: namespaces a
        Lumigo decides for): one per distinct (namespace, Secret, key) with a usable token."""
        wanted: set[tuple[str, str, str]] = set()
        for informer in self.workloads.values():
            for obj in informer.store.list():
                meta = objects.metadata(obj)
                namespace = str(meta.get("namespace", ""))
                labels = meta.get("labels") or {}
                if namespace in covered or labels.get(LABEL_AUTO_TRACE, "false") == "false":
                    continue
                name = labels.get(LABEL_TOKEN_SECRET) or DEFAULT_TOKEN_SECRET
                key = labels.get(LABEL_TOKEN_KEY) or DEFAULT_TOKEN_KEY
                wanted.add((namespace, str(name), str(key)))
        out = []
        for namespace, name, key in sorted(wanted):
            secret = self.client.get_or_none(SECRETS, name, namespace)
            token = secret_token(secret, key) if secret is not None else None
            if token is None:
                reasons[namespace] = f"the token of workloads opted in by label ({name}/{key})"
                continue
            out.append(MonitoredNamespace(namespace, "", token, kube_events=False))
        return out

    def rendering_settings(self) -> ProxySettings:
        """The settings `render` gets: the Lease next to the proxy, where its Role allows it,
        the cluster's UID and the cluster token."""
        t = self.target
        settings = replace(
            self.settings,
            lease_namespace=t.namespace,
            lease_name=f"{t.deployment_name}-k8s-objects",
        )
        if not settings.origin.cluster_uid:
            origin = replace(settings.origin, cluster_uid=self._identity.uid())
            settings = replace(settings, origin=origin)
        if self.cluster_token is not None:
            name, key = self.cluster_token
            secret = self.client.get_or_none(SECRETS, name, t.namespace)  # a failure raises
            token = secret_token(secret, key) if secret is not None else None
            settings = replace(settings, self_metrics_token=token or "")
        return settings

    # -- over the size cap -----------------------------------------------------------------------
    def _seniority(self) -> Callable[[MonitoredNamespace], tuple[str, str]]:
        """Which namespaces stay in first when the configuration must shrink: the oldest
        Lumigo first (a new one cannot push out those already collected), then by name; a
        tenant without a Lumigo (workloads opted in by label) last."""
        created: dict[str, str] = {}
        for obj in self._lumigoes():
            meta = objects.metadata(obj)
            namespace = str(meta.get("namespace", ""))
            stamp = str(meta.get("creationTimestamp", ""))
            if stamp and (namespace not in created or stamp < created[namespace]):
                created[namespace] = stamp
        return lambda ns: (created.get(ns.name, "~"), ns.name)

    def _report_left_out(
        self, wanted: list[MonitoredNamespace], kept: list[MonitoredNamespace]
    ) -> None:
        """The namespaces the configuration could not hold: a log line and a metric, and a
        TelemetryLeftOut condition on their Lumigo (False again once they are back in)."""
        left = sorted({ns.name for ns in wanted} - {ns.name for ns in kept})
        LEFT_OUT.set(len(left))
        if left != self._left_out and left:
            log.warning(
                "telemetry proxy configuration too large: namespaces left out",
                extra={"namespaces": left, "limit_bytes": self.max_config_bytes},
            )
        elif left != self._left_out:
            log.info("every monitored namespace is in the telemetry proxy configuration again")
        self._left_out = left
        message = LEFT_OUT_MESSAGE.format(total=len(wanted), limit=self.max_config_bytes)
        for obj in self._lumigoes():
            meta = objects.metadata(obj)
            out = str(meta.get("namespace", "")) in left and in_effect(obj)
            current = condition(obj.get("status"), CONDITION_LEFT_OUT)
            if out and (current is None or current.get("status") != "True"):
                self._set_left_out(
                    meta, ConditionUpdate(CONDITION_LEFT_OUT, True, message, REASON_TOO_LARGE)
                )
            elif not out and current is not None and current.get("status") == "True":
                self._set_left_out(
                    meta, ConditionUpdate(CONDITION_LEFT_OUT, False, IN_MESSAGE, REASON_IN)
                )

    def _set_left_out(self, meta: objects.ObjectMeta, update: ConditionUpdate) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def mutate(obj: JSON) -> JSON:
            status = obj.setdefault("status", {})
            generation = int(objects.metadata(obj).get("generation") or 0)
            status["conditions"] = apply_conditions(
                status.get("conditions") or [], [update], generation, now
            )
            return obj

        try:
            self.client.update_with_retry(
                LUMIGOES,
                str(meta.get("name")),
                str(meta.get("namespace")),
                mutate,
                subresource="status",
            )
        except ApiError as err:
            if not err.not_found:  # deleted meanwhile: nothing to say
                raise

    # -- helpers ----------------------------------------------------------------------------------
    def _lumigoes(self) -> list[Lumigo]:
        """Every cached Lumigo (the cache holds what the API server sent)."""
        return cast(list[Lumigo], self.lumigoes.store.list())

    def _report(self, reasons: dict[str, str]) -> None:
        """Log each namespace left out once per reason, not on every resync."""
        for namespace, reason in sorted(reasons.items()):
            if self._reported.get(namespace) != reason:
                log.info(
                    "namespace left out of the telemetry proxy",
                    extra={"namespace": namespace, "reason": reason},
                )
        self._reported = reasons

    def _read_namespace_uid(self, name: str) -> str:
        return namespace_uid(self.client, name)

    def _apply_secret(self, text: str, digest: str, deployment: JSON | None) -> tuple[bool, JSON]:
        """Create or update the Secret; owned by the proxy Deployment when it exists. Returns
        whether the configuration changed, and the Secret as stored.

        The owner reference lets the garbage collector delete the tokens together with the
        proxy (uninstall), although the Secret is the operator's and not the installer's.
        """
        t = self.target
        data = {CONFIG_KEY: base64.b64encode(text.encode()).decode()}
        owners = [owner_reference(deployment)] if deployment is not None else None
        current = self.client.get_or_none(SECRETS, t.secret_name, t.namespace)
        if current is None:
            meta: JSON = {
                "name": t.secret_name,
                "namespace": t.namespace,
                "labels": dict(MANAGED_BY),
                "annotations": {CONFIG_HASH_ANNOTATION: digest},
            }
            if owners:
                meta["ownerReferences"] = owners
            body: JSON = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta}
            return True, self.client.create(SECRETS, {**body, "data": data}, t.namespace)
        meta = current.setdefault("metadata", {})
        same_data = (current.get("data") or {}) == data
        same_owner = owners is None or meta.get("ownerReferences") == owners
        if same_data and same_owner:
            return False, current
        if owners:
            meta["ownerReferences"] = owners
        meta.setdefault("annotations", {})[CONFIG_HASH_ANNOTATION] = digest
        current["data"] = data
        current.pop("stringData", None)
        stored = self.client.replace(SECRETS, current, t.namespace)  # optimistic lock
        return not same_data, stored

    def _roll(self, deployment: JSON | None, digest: str) -> bool:
        """Set the hash on the pod template when it differs: a rolling restart, once."""
        t = self.target
        name = f"{t.namespace}/{t.deployment_name}"
        self._deployment_wait.present(deployment is not None, deployment=name)
        if deployment is None:
            return False
        template_meta = ((deployment.get("spec") or {}).get("template") or {}).get("metadata")
        current = ((template_meta or {}).get("annotations") or {}).get(CONFIG_HASH_ANNOTATION)
        if current == digest:
            return False
        patch = {
            "spec": {"template": {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: digest}}}}
        }
        self.client.merge_patch(DEPLOYMENTS, t.deployment_name, patch, t.namespace)
        return True


def namespace_uid(client: KubeClient, name: str) -> str:
    namespace = client.get_or_none(NAMESPACES, name)
    return str(objects.metadata(namespace or {}).get("uid", ""))


@dataclass
class ClusterIdentity:
    """The cluster's UID: the kube-system namespace's, the usual identity, read once."""

    client: KubeClient
    _uid: str | None = None

    def uid(self) -> str:
        """ "" when not readable (no permission): the attribute is then left out."""
        if self._uid is None:
            try:
                self._uid = namespace_uid(self.client, "kube-system")
            except ApiError as err:
                if err.code not in (401, 403):
                    raise
                self._uid = ""
        return self._uid


def owner_reference(deployment: JSON) -> JSON:
    meta = objects.metadata(deployment)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
    }


def _opt_in_change(old: JSON | None, new: JSON) -> bool:
    """Workloads that come, go, or change the labels that opt them in and name their token."""
    if old is None:
        return LABEL_AUTO_TRACE in (objects.labels_of(new))

    def labels(obj: JSON) -> tuple[Any, ...]:
        values = objects.labels_of(obj)
        return tuple(values.get(k) for k in (LABEL_AUTO_TRACE, LABEL_TOKEN_SECRET, LABEL_TOKEN_KEY))

    return labels(old) != labels(new)


def _relevant_change(old: JSON | None, new: JSON) -> bool:
    """Additions and deletions, and updates that change what the configuration depends on."""
    # The informer hands out what the API server sent: Lumigo resources.
    return old is None or _relevance(cast(Lumigo, old)) != _relevance(cast(Lumigo, new))
