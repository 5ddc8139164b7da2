"""Admission served by worker processes that share one listening socket.

Why processes: a Python process runs Python on one core at a time (the GIL), so a webhook in the
manager process serves what one core allows and waits whenever the controller works (informer
relists, 1,000 workloads to patch). Each worker here is a process of its own with its own Lumigo
cache fed by its own watch, its own certificate source and uvicorn server, all on the socket
the manager bound (the kernel hands each connection to one of them). The controller's work
never takes a worker's GIL; admissions use every core. Events are the exception: a worker
forwards them to the manager's recorder over its pipe (the manager's caches resolve objects
being created without an API call, and repeats from all workers aggregate together).

The manager's side (`AdmissionWorkers`): it starts `count` workers (default: the container's CPU
limit, rounded up), reports ready only when every worker is (each reports its readiness over a
pipe), restarts a worker that exits (backoff 1 s to 30 s), serves the workers' webhook metrics on
its own /metrics (prometheus_client's multiprocess mode, in a private directory), and on stop
lets each worker drain its requests. A worker exits when the manager goes away (its pipe closes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

from prometheus_client import REGISTRY, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from api import constants
from controller.options import RunOptions
from controller.runtime import events
from controller.runtime.process_metrics import ChildMetrics
from kube.http import memory
from kube.http.messages import MAX_BODY_BYTES
from kube.http.readiness import NotReady
from kube.http.server import ServerOptions, bind
from kube.http.server_metrics import LATENCY_SECONDS, REQUESTS_IN_FLIGHT, REQUESTS_TOTAL
from kube.objects import JSON
from webhook.inject_handler import INJECTIONS_TOTAL

log = logging.getLogger("lumigo.webhook.workers")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# What workers measure, shown on the manager's /metrics instead of its own (idle) copies.
WORKER_METRICS = (REQUESTS_TOTAL, LATENCY_SECONDS, REQUESTS_IN_FLIGHT, INJECTIONS_TOTAL)
WORKER_RESTARTS = Counter(
    "lumigo_webhook_worker_restarts_total",
    "Admission worker processes started again after they exited.",
)
_STATUS_INTERVAL = 0.25
DRAIN = "drain"  # manager -> worker: the pod is terminating (see AdmissionWorkers.drain)
_BACKOFF = (1.0, 30.0)
_STABLE_AFTER = 60.0  # a worker up this long starts the next restart's backoff over


def default_worker_count() -> int:
    """The container's CPU limit, rounded up (cgroup v2 or v1), within the CPUs we may run on,
    and no more workers than its memory limit holds (`kube.http.memory`)."""
    cpus = len(os.sched_getaffinity(0))
    limit = _cgroup_cpu_limit()
    wanted = max(1, min(cpus, math.ceil(limit))) if limit else max(1, cpus)
    return memory.workers_that_fit(wanted, memory.container_memory_limit(), MAX_BODY_BYTES)


def _cgroup_cpu_limit() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    for root in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"):
        with contextlib.suppress(OSError, ValueError):
            quota_us = int(Path(root, "cpu.cfs_quota_us").read_text())
            period_us = int(Path(root, "cpu.cfs_period_us").read_text())
            return None if quota_us <= 0 else quota_us / period_us
    return None


@dataclass
class _Worker:
    index: int
    process: BaseProcess
    conn: Connection
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    reason: str = "starting"


class AdmissionWorkers:
    """`count` admission worker processes on one socket, supervised by the manager process."""

    def __init__(self, opts: RunOptions, count: int, recorder: events.EventRecorder) -> None:
        self.opts = opts
        self.count = count
        self.recorder = recorder
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: dict[int, _Worker] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._metrics_dir: str | None = None
        self._metrics: _WorkerMetrics | None = None
        self._supervisor: threading.Thread | None = None
        self._restart_at: dict[int, float] = {}
        self._backoff: dict[int, float] = {}

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._listener = bind(self.opts.webhook_host, self.opts.webhook_port)
        _remove_stale_metrics_dirs()
        self._metrics_dir = tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{_process_identity()}-")
        self._metrics = _show_worker_metrics(self._metrics_dir)
        self._share_large_bodies(Path(self._metrics_dir) / "slots")  # removed with the directory
        for index in range(self.count):
            self._spawn(index)
        self._supervisor = threading.Thread(
            target=self._supervise, name="webhook-workers", daemon=True
        )
        self._supervisor.start()
        _yield_to_workers(keep=self._supervisor)
        port = self._listener.getsockname()[1]
        log.info("admission workers started", extra={"workers": self.count, "port": port})

    def _share_large_bodies(self, slots: Path) -> None:
        """The workers' body budgets and the slots they share to handle large bodies, so that
        together they stay within the container's memory limit whatever clients send; no more
        workers than fit it (an OOM-killed pod serves no admission at all)."""
        limit = memory.container_memory_limit()
        fit = memory.workers_that_fit(self.count, limit, MAX_BODY_BYTES)
        if fit < self.count:
            asked = memory.plan(self.count, limit, MAX_BODY_BYTES)
            log.warning(
                f"starting {fit} admission worker(s) of the {self.count} asked for: more would "
                f"not fit the container's memory limit; raise it to ~"
                f"{int(asked.needed_bytes / memory.HEADROOM) // memory.MiB} MiB for all",
                extra={"asked": asked.describe()},
            )
            self.count = fit
        plan = memory.plan(self.count, limit, MAX_BODY_BYTES)
        slots.mkdir()
        memory.LargeBodySlots.create(slots, plan.large_slots)
        self.opts = dataclasses.replace(
            self.opts,
            webhook_body_budget=plan.body_budget_bytes,
            webhook_large_body_slots=str(slots),
        )
        if plan.fits:
            log.info("admission memory plan", extra={"plan": plan.describe()})
        else:
            log.warning(
                "one admission worker may exceed the container's memory limit: raise it",
                extra={"plan": plan.describe()},
            )

    def drain(self) -> None:
        """Tell every worker that the pod is terminating: its server closes each connection
        after the next response (HTTPServer.drain) while still serving."""
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(DRAIN)

    def stop(self) -> None:
        """SIGTERM every worker (each drains its requests), then wait; kill what lingers."""
        if self._stopping.is_set() or self._listener is None:
            return
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(worker.process.pid or 0, signal.SIGTERM)
        deadline = time.monotonic() + ServerOptions.shutdown_timeout + 10.0
        for worker in workers:
            worker.process.join(max(0.1, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.warning(
                    "admission worker did not stop in time; killing it",
                    extra={"worker": worker.index},
                )
                worker.process.kill()
                worker.process.join(5)
            worker.conn.close()
        self._listener.close()
        if self._metrics_dir is not None:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)
        log.info("admission workers stopped")

    # -- probes ---------------------------------------------------------------------------------
    def ready(self) -> None:
        """For /readyz: every worker is up, listening, with a certificate and a synced cache."""
        if self._listener is None or self._stopping.is_set():
            raise NotReady("the admission workers are not running")
        with self._lock:
            workers = [self._workers.get(i) for i in range(self.count)]
        for index, worker in enumerate(workers):
            if worker is None or not worker.process.is_alive():
                raise NotReady(f"admission worker {index} is not running (restarting)")
            if not worker.ready:
                raise NotReady(f"admission worker {index}: {worker.reason}")

    def healthy(self) -> None:
        if self._supervisor is not None and not self._supervisor.is_alive():
            raise RuntimeError("the admission worker supervisor thread died")

    # -- supervision ------------------------------------------------------------------------------
    def _spawn(self, index: int) -> None:
        assert self._listener is not None
        assert self._metrics_dir is not None
        ours, theirs = self._ctx.Pipe()
        process = self._ctx.Process(
            target=serve_admissions,
            args=(self.opts, index, self._listener, theirs),
            name=f"webhook-worker-{index}",
        )
        # UV_TCP_SINGLE_ACCEPT: libuv accepts one connection per wake-up and yields, so a burst
        # of new connections is spread over the workers instead of taken by the first awake.
        with (
            _environment(MULTIPROC_ENV, self._metrics_dir),
            _environment("UV_TCP_SINGLE_ACCEPT", "1"),
        ):
            process.start()
        theirs.close()
        with self._lock:
            self._workers[index] = _Worker(index, process, ours)

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                workers = list(self._workers.values())
            waitables: list[object] = [w.conn for w in workers]
            waitables += [w.process.sentinel for w in workers]
            for ready in multiprocessing.connection.wait(waitables, timeout=0.5):  # type: ignore[arg-type]
                for worker in workers:
                    if ready is worker.conn:
                        self._receive(worker)
                    elif ready == worker.process.sentinel:
                        self._exited(worker)
            self._restart_due()

    def _receive(self, worker: _Worker) -> None:
        try:
            kind, payload = worker.conn.recv()
        except (EOFError, OSError):
            worker.ready, worker.reason = False, "exited"
            return
        if kind == "event" and isinstance(payload, events.PendingEvent):
            # About an object named by an admission request, which anyone reaching the webhook
            # port can forge: posted only once the object is found as the request names it.
            self.recorder.record(payload, verify=True)
        elif kind == "ready":
            worker.ready, worker.reason = bool(payload[0]), str(payload[1])

    def _exited(self, worker: _Worker) -> None:
        with self._lock:
            if self._workers.get(worker.index) is not worker:
                return
            del self._workers[worker.index]
        worker.process.join()
        worker.conn.close()
        if worker.process.pid is not None and self._metrics is not None:
            # Its files folded into the retired ones: restarts never pile files up.
            self._metrics.children.retire(worker.process.pid)
        if self._stopping.is_set():
            return
        up = time.monotonic() - worker.started
        backoff = _BACKOFF[0] if up > _STABLE_AFTER else self._backoff.get(worker.index, 0.0)
        backoff = min(max(backoff * 2, _BACKOFF[0]), _BACKOFF[1])
        self._backoff[worker.index] = backoff
        self._restart_at[worker.index] = time.monotonic() + backoff
        log.warning(
            "admission worker exited; restarting it",
            extra={
                "worker": worker.index,
                "exit_code": worker.process.exitcode,
                "restart_in_s": backoff,
            },
        )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for index, when in list(self._restart_at.items()):
            if when <= now and not self._stopping.is_set():
                del self._restart_at[index]
                WORKER_RESTARTS.inc()
                self._spawn(index)


MANAGER_NICENESS = 5  # the manager's threads, relative to the admission workers' (0)


def _yield_to_workers(keep: threading.Thread) -> None:
    """Lower the priority of this process's threads (informers, reconcilers, the event poster)
    below the workers', except `keep` (which starts workers: a child inherits its parent
    thread's niceness). In the pod's CPU share the scheduler then runs an admission before the
    controller's background work; threads started later inherit their creator's niceness.
    Raising one's own niceness needs no privilege."""
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        if tid == keep.native_id:
            continue
        with contextlib.suppress(OSError):
            current = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, max(current, MANAGER_NICENESS))


_METRICS_PREFIX = "lumigo-webhook-metrics-"


def _process_identity(pid: int | None = None) -> str:
    """`<pid>.<start time>`: unique for a process's life, even across container restarts (where
    the manager is always pid 1 and /tmp, an emptyDir, survives)."""
    stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
    return f"{pid or os.getpid()}.{stat.rpartition(')')[2].split()[19]}"


def _remove_stale_metrics_dirs() -> None:
    """Metrics directories of managers that are gone (killed before they could clean up)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_METRICS_PREFIX}*"):
        identity = path.name.removeprefix(_METRICS_PREFIX).rpartition("-")[0]
        pid = identity.partition(".")[0]
        try:
            alive = pid.isdigit() and _process_identity(int(pid)) == identity
        except OSError:
            alive = False
        if not alive:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """`name=value` for a child started in this block (spawn copies the environment)."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


class _WorkerMetrics(Collector):
    """The workers' webhook series, summed over workers (a dead worker's counts stay, folded
    into the retired files)."""

    def __init__(self, directory: str) -> None:
        self.children = ChildMetrics(directory)
        self._names = frozenset(m._name for m in WORKER_METRICS)

    def collect(self) -> Iterable[Metric]:
        found = self.children.collect()
        metrics = [m for m in found if m.name in self._names]
        seen = {m.name for m in metrics}
        # A family no worker has a sample of yet is still listed (HELP and TYPE), as it is
        # without workers: dashboards and alerts can tell "none yet" from "not exported".
        for metric in WORKER_METRICS:
            if metric._name not in seen:
                metrics.append(Metric(metric._name, metric._documentation, metric._type))
        return metrics


_shown: _WorkerMetrics | None = None


def _show_worker_metrics(directory: str) -> _WorkerMetrics:
    """Serve the workers' values of WORKER_METRICS on this process's /metrics (once)."""
    global _shown  # noqa: PLW0603 - one default registry per process
    if _shown is not None:
        REGISTRY.unregister(_shown)
    else:
        for metric in WORKER_METRICS:
            with contextlib.suppress(KeyError):
                REGISTRY.unregister(metric)
    _shown = _WorkerMetrics(directory)
    REGISTRY.register(_shown)
    return _shown


# --- the worker process ---------------------------------------------------------------------------


class _Channel:
    """The worker's end of its pipe, shared by the threads that write to it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[str, object]) -> bool:
        try:
            with self._lock:
                self.conn.send(message)
        except (OSError, EOFError, ValueError):
            return False  # the manager is gone: the status thread stops this worker
        return True


class ForwardedEvents:
    """A worker's event recorder: its events go to the manager's recorder, whose caches find
    the objects being created without an API call, and where repeats from every worker are
    aggregated (and rate-limited) together. Never blocks an admission: a full queue drops."""

    def __init__(self, channel: _Channel, max_queue: int = 2000) -> None:
        self._channel = channel
        # Repeats stop here, before they cost the pipe and the manager.
        self._spam = events.SpamFilter()
        self._queue: queue.Queue[events.PendingEvent | None] = queue.Queue(max_queue)
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def event(self, obj: JSON, type: str, reason: str, message: str, component: str) -> None:
        pending = events.pending_event(obj, type, reason, message, component, verify=True)
        if not self._spam.allow(pending):
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            self.dropped += 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-forwarder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while (pending := self._queue.get()) is not None:
            if not self._channel.send(("event", pending)):
                return


def freeze_startup_heap() -> None:
    """Take what is alive at start-up (modules, TLS contexts, the caches' first lists: about
    48,000 objects) out of the garbage collector's sight. A full collection walks every tracked
    object: 20-50 ms on a node whose cores are busy, an admission waiting behind it (measured:
    the 30 ms maximum of an idle worker). Afterwards it walks only what came later. The
    garbage of start-up is collected first, so nothing freed is kept."""
    gc.collect()
    gc.freeze()


class Readiness:
    """A worker's readiness, told to the manager when it changes. The first time the worker is
    ready (imports done, caches synced), before the manager hears of it, the start-up heap is
    frozen: admissions then arrive on a heap the collector no longer walks."""

    def __init__(self, check: Callable[[], None], channel: _Channel) -> None:
        self._check = check
        self._channel = channel
        self._last: tuple[bool, str] | None = None
        self._frozen = False

    def report(self) -> None:
        try:
            self._check()
            now = (True, "")
        except NotReady as err:
            now = (False, str(err))
        if now[0] and not self._frozen:
            freeze_startup_heap()
            self._frozen = True
        if now != self._last and self._channel.send(("ready", now)):
            self._last = now


def serve_admissions(
    opts: RunOptions, index: int, listener: socket.socket, conn: Connection
) -> None:
    """A worker's main: the admission side of the operator, on the manager's socket."""
    from controller.runtime.kube import KubeClient  # noqa: PLC0415
    from controller.runtime.logs import setup_logging  # noqa: PLC0415
    from controller.runtime.manager import Manager, ManagerOptions, Runnable  # noqa: PLC0415
    from controller.webhook_serving import (  # noqa: PLC0415 - the worker's own imports
        add_admission_server,
        add_certificates,
        add_injection_mode,
        check_ready,
        inject_handler,
        lumigo_informer,
    )

    setup_logging(opts.log_level)
    client = KubeClient.from_env(opts.kubeconfig, user_agent=constants.USER_AGENT)
    manager = Manager(
        client,
        ManagerOptions(
            namespace=opts.namespace,
            leader_election=False,
            health_probe_bind_address="127.0.0.1:0",  # read over the pipe, not by the kubelet
            metrics_bind_address="0",
        ),
    )
    lumigoes = lumigo_informer(manager)
    channel = _Channel(conn)
    recorder = ForwardedEvents(channel)
    manager.add_runnable(Runnable("event-forwarder", recorder.start, recorder.stop))
    certificates = add_certificates(manager, client, opts)
    mode = add_injection_mode(manager, client, opts, decide=False)
    inject = inject_handler(opts, lumigoes, recorder, mode)
    server = add_admission_server(
        manager, opts, inject=inject, tls=certificates.tls, listener=listener
    )

    readiness = Readiness(lambda: check_ready(manager), channel)

    def report() -> None:
        """Readiness to the manager when it changes; SIGTERM ourselves if the manager is gone."""
        while True:
            try:
                readiness.report()
                if conn.poll(_STATUS_INTERVAL) and conn.recv() == DRAIN:
                    server.drain()
            except (EOFError, OSError):
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=report, name="worker-status", daemon=True).start()
    log.info("admission worker starting", extra={"worker": index, "pid": os.getpid()})
    manager.run()
