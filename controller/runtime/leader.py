"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

Only the leader runs controllers and writes certificates; every replica serves webhooks. Expiry
of another holder is judged by the LOCAL time at which we last saw its record change, never by
the timestamps inside the Lease, so clock skew between nodes cannot cause two leaders.
Losing the lease (no successful renewal within the renew deadline) calls `on_stopped_leading`,
which in the manager exits the process: a fresh start is the only safe way to stop every
in-flight write of a former leader.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.runtime.kube import KubeClient
from controller.runtime.metrics import LEADER_STATUS
from kube.kinds import LEASES
from kube.objects import JSON
from kube.rest import ApiError

log = logging.getLogger("lumigo.leader")


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def _now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseSettings:
    """Which Lease to hold, as whom, and client-go's LeaderElectionConfig durations."""

    namespace: str
    name: str
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > 1.2 * self.retry_period:
            raise ValueError("need lease_duration > renew_deadline > 1.2 * retry_period")


class LeaderElector:
    """Acquire, renew and release (on stop) one Lease."""

    def __init__(
        self,
        client: KubeClient,
        settings: LeaseSettings,
        *,
        on_started_leading: Callable[[], None] = lambda: None,
        on_stopped_leading: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self._stop = threading.Event()
        self._leading = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: JSON | None = None  # the last Lease spec we saw
        self._observed_at = 0.0  # local monotonic time we saw it change
        LEADER_STATUS.labels(settings.name).set(0)

    # -- public -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning/renewing and release the lease if we hold it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.renew_deadline + self.settings.retry_period)
        if self._leading.is_set():
            self._release()
        self._set_leading(False)

    # -- loops ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if self._try_acquire_or_renew():
                break
            self._stop.wait(self.settings.retry_period * (1 + 0.2 * random.random()))
        if self._stop.is_set():
            return
        self._set_leading(True)
        log.info(
            "became leader", extra={"lease": self.settings.name, "identity": self.settings.identity}
        )
        try:
            self.on_started_leading()
        except Exception:
            log.exception("on_started_leading failed")
        self._renew_loop()

    def _renew_loop(self) -> None:
        last_renew = time.monotonic()
        while not self._stop.wait(self.settings.retry_period):
            if self._try_acquire_or_renew():
                last_renew = time.monotonic()
                continue
            if time.monotonic() - last_renew > self.settings.renew_deadline:
                log.error("leader election lost", extra={"lease": self.settings.name})
                self._set_leading(False)
                self.on_stopped_leading()
                return

    def _set_leading(self, leading: bool) -> None:
        if leading:
            self._leading.set()
        else:
            self._leading.clear()
        LEADER_STATUS.labels(self.settings.name).set(1 if leading else 0)

    # -- one attempt (client-go tryAcquireOrRenew) -----------------------------------------------
    def _try_acquire_or_renew(self) -> bool:
        now = _now_micro()
        lease_name, namespace = self.settings.name, self.settings.namespace
        try:
            lease = self.client.get_or_none(LEASES, lease_name, namespace)
        except ApiError as err:
            log.warning("cannot read lease", extra={"lease": lease_name, "error": str(err)})
            return False
        if lease is None:
            lease = {
                "apiVersion": LEASES.api_version,
                "kind": LEASES.kind,
                "metadata": {"name": lease_name, "namespace": namespace},
                "spec": self._spec(now, acquire_time=now, transitions=0),
            }
            return self._write("create", lease)
        spec = lease.get("spec") or {}
        self._observe(lease)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration)
        held_by_other = bool(holder) and holder != self.settings.identity
        if held_by_other and self._observed_at + duration > time.monotonic():
            return False  # held by someone else and not expired by our own clock
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.settings.identity:
            acquire_time = spec.get("acquireTime") or now
        else:
            acquire_time, transitions = now, transitions + 1
        lease["spec"] = self._spec(now, acquire_time=acquire_time, transitions=transitions)
        return self._write("update", lease)

    def _write(self, verb: str, lease: JSON) -> bool:
        """Create or replace the Lease; a refusal (e.g. a 409 from a rival) is just a miss."""
        write = self.client.create if verb == "create" else self.client.replace
        try:
            written = write(LEASES, lease, self.settings.namespace)
        except ApiError as err:
            log.info(f"cannot {verb} lease", extra={"lease": self.settings.name, "error": str(err)})
            return False
        self._observe(written)
        return True

    def _spec(self, now: str, *, acquire_time: str, transitions: int) -> JSON:
        return {
            "holderIdentity": self.settings.identity,
            "leaseDurationSeconds": round(self.settings.lease_duration),
            "acquireTime": acquire_time,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _observe(self, lease: JSON) -> None:
        spec = lease.get("spec") or {}
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = time.monotonic()

    def _release(self) -> None:
        """Hand the lease over at once: empty holder, 1 s duration (client-go ReleaseOnCancel)."""
        try:
            lease = self.client.get(LEASES, self.settings.name, self.settings.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.settings.identity:
                return
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now_micro())
            self.client.replace(LEASES, lease, self.settings.namespace)
            log.info("released lease", extra={"lease": self.settings.name})
        except ApiError as err:
            log.warning(
                "cannot release lease", extra={"lease": self.settings.name, "error": str(err)}
            )
