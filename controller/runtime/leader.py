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
from typing import Any

from controller.runtime.kube import KubeClient
from controller.runtime.metrics import LEADER_STATUS
from controller.runtime.resources import LEASES, ApiError

log = logging.getLogger("lumigo.leader")

JSON = dict[str, Any]


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def _now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire, renew and release one Lease."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        *,
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None] = lambda: None,
        on_stopped_leading: Callable[[], None] = lambda: None,
        release_on_cancel: bool = True,
    ) -> None:
        if not lease_duration > renew_deadline > 1.2 * retry_period:
            raise ValueError("need lease_duration > renew_deadline > 1.2 * retry_period")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.release_on_cancel = release_on_cancel
        self._stop = threading.Event()
        self._leading = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: JSON | None = None  # the last Lease spec we saw
        self._observed_at = 0.0  # local monotonic time we saw it change
        LEADER_STATUS.labels(name).set(0)

    # -- public -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning/renewing and release the lease if we hold it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.renew_deadline + self.retry_period)
        if self.release_on_cancel and self._leading.is_set():
            self._release()
        self._set_leading(False)

    # -- loops ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if self._try_acquire_or_renew():
                break
            self._stop.wait(self.retry_period * (1 + 0.2 * random.random()))
        if self._stop.is_set():
            return
        self._set_leading(True)
        log.info("became leader", extra={"lease": self.name, "identity": self.identity})
        try:
            self.on_started_leading()
        except Exception:
            log.exception("on_started_leading failed")
        self._renew_loop()

    def _renew_loop(self) -> None:
        last_renew = time.monotonic()
        while not self._stop.wait(self.retry_period):
            if self._try_acquire_or_renew():
                last_renew = time.monotonic()
                continue
            if time.monotonic() - last_renew > self.renew_deadline:
                log.error("leader election lost", extra={"lease": self.name})
                self._set_leading(False)
                self.on_stopped_leading()
                return

    def _set_leading(self, leading: bool) -> None:
        if leading:
            self._leading.set()
        else:
            self._leading.clear()
        LEADER_STATUS.labels(self.name).set(1 if leading else 0)

    # -- one attempt (client-go tryAcquireOrRenew) -----------------------------------------------
    def _try_acquire_or_renew(self) -> bool:
        now = _now_micro()
        try:
            lease = self.client.get_or_none(LEASES, self.name, self.namespace)
        except ApiError as err:
            log.warning("cannot read lease", extra={"lease": self.name, "error": str(err)})
            return False
        if lease is None:
            body = {
                "apiVersion": LEASES.api_version,
                "kind": LEASES.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, acquire_time=now, transitions=0),
            }
            try:
                created = self.client.create(LEASES, body, self.namespace)
            except ApiError as err:
                log.info("cannot create lease", extra={"lease": self.name, "error": str(err)})
                return False
            self._observe(created)
            return True
        spec = lease.get("spec") or {}
        self._observe(lease)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        held_by_other = bool(holder) and holder != self.identity
        if held_by_other and self._observed_at + duration > time.monotonic():
            return False  # held by someone else and not expired by our own clock
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire_time = spec.get("acquireTime") or now
        else:
            acquire_time, transitions = now, transitions + 1
        lease["spec"] = self._spec(now, acquire_time=acquire_time, transitions=transitions)
        try:
            updated = self.client.replace(LEASES, lease, self.namespace)
        except ApiError as err:
            log.info("cannot update lease", extra={"lease": self.name, "error": str(err)})
            return False
        self._observe(updated)
        return True

    def _spec(self, now: str, *, acquire_time: str, transitions: int) -> JSON:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.lease_duration),
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
            lease = self.client.get(LEASES, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now_micro())
            self.client.replace(LEASES, lease, self.namespace)
            log.info("released lease", extra={"lease": self.name})
        except ApiError as err:
            log.warning("cannot release lease", extra={"lease": self.name, "error": str(err)})
