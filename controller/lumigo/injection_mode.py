"""`--injection-mode=auto`: the autotrace image mounted as an `image` volume (no copy, no init
container) where the whole cluster can mount one, the init container's copy everywhere else.

An image volume is safe only when both hold:
- the API server keeps the field: the ImageVolume feature is on (beta, on by default since
  Kubernetes 1.35). An API server with it off drops the field and then refuses the pod, and the
  workload with it, for a volume with no source. Asked once per process with a server-side
  dry-run create of a Pod in the operator's namespace (nothing is stored); an answer other than
  "kept" or "refused" (no response, 5xx, throttled) is asked again with backoff.
- every Node can mount it: kubelet >= 1.35 and containerd >= 2.2 or CRI-O >= 1.33 (the subPath
  mount). Followed through the Node cache, so a Node with an older runtime joining switches new
  admissions back to the init container; pods already running keep what they have.
Until both are known, the init container, which works everywhere.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field

from api import constants
from controller.lumigo.nodes import node_info
from controller.runtime.informer import FuncHandler, Informer
from controller.runtime.kube import KubeClient
from kube import objects
from kube.background import BackgroundThread
from kube.http.readiness import NotReady
from kube.kinds import CONFIGMAPS, PODS
from kube.objects import JSON
from kube.rest import ApiError

log = logging.getLogger("lumigo.injection")

MIN_KUBELET = (1, 35)
MIN_RUNTIME = {"containerd": (2, 2), "cri-o": (1, 33)}
_VERSION = re.compile(r"v?(\d+)\.(\d+)")
PROBE_POD = "lumigo-image-volume-probe"
READY_WAIT = 30.0  # then ready anyway, injecting with the init container until it answers


def _version(text: str) -> tuple[int, int] | None:
    match = _VERSION.match(text)
    return (int(match[1]), int(match[2])) if match else None


def node_problem(node: JSON) -> str | None:
    """Why this Node cannot mount an image volume with a subPath; None if it can."""
    info = node_info(node)
    name = objects.metadata(node).get("name", "?")
    kubelet = str(info.get("kubeletVersion") or "")
    kubelet_version = _version(kubelet)
    if kubelet_version is None or kubelet_version < MIN_KUBELET:
        return f"node {name}: kubelet {kubelet or 'unknown'} (image volumes need >= 1.35)"
    runtime, _, version = str(info.get("containerRuntimeVersion") or "").partition("://")
    needed = MIN_RUNTIME.get(runtime)
    runtime_version = _version(version)
    if needed is None or runtime_version is None or runtime_version < needed:
        wanted = " or ".join(f"{r} >= {v[0]}.{v[1]}" for r, v in MIN_RUNTIME.items())
        return f"node {name}: runtime {runtime or 'unknown'} {version} (needs {wanted})"
    return None


def nodes_problem(nodes: Iterable[JSON]) -> str | None:
    """The first Node that cannot mount image volumes, or None. No Node at all is a problem:
    nothing says what the first one will run."""
    seen = False
    for node in nodes:
        seen = True
        problem = node_problem(node)
        if problem is not None:
            return problem
    return None if seen else "no nodes"


def probe_pod(image: str, pull_policy: str) -> JSON:
    """A Pod mounting `image` as a volume, compliant with the restricted Pod Security Standard
    (the operator's namespace may enforce it). Only ever created with dryRun=All."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PROBE_POD},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": pull_policy,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {
                            "name": "payload",
                            "mountPath": "/payload",
                            "subPath": constants.PAYLOAD_IMAGE_PATH,
                        }
                    ],
                }
            ],
            "volumes": [
                {"name": "payload", "image": {"reference": image, "pullPolicy": pull_policy}}
            ],
        },
    }


@dataclass(eq=False)
class AutoInjectionMode:
    """The injection mode for `auto`, current with the Nodes; cheap to ask on every admission."""

    client: KubeClient
    nodes: Informer
    namespace: str
    image: str
    pull_policy: str
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _api_server: bool | None = field(default=None, init=False)  # unknown until the dry-run answers
    _nodes_dirty: bool = field(default=True, init=False)
    _node_problem: str | None = field(default="nodes not listed yet", init=False)
    _mode: str = field(default=constants.INJECTION_MODE_INIT_CONTAINER, init=False)
    _decision: tuple[str, str] = field(
        default=(constants.INJECTION_MODE_INIT_CONTAINER, ""), init=False
    )
    _probe: BackgroundThread = field(init=False)
    _ready_deadline: float = field(default=float("inf"), init=False)

    def __post_init__(self) -> None:
        self._probe = BackgroundThread("image-volume-probe", self._ask_api_server)
        self.nodes.add_handler(
            FuncHandler(add=self._dirty, update=lambda _o, _n: self._dirty(_n), delete=self._dirty)
        )

    def ready(self) -> None:
        """For /readyz: admissions wait (a bounded while) until the API server has answered, so
        that a workload admitted right after start gets the mode the cluster supports."""
        with self._lock:
            if self._api_server is None and time.monotonic() < self._ready_deadline:
                raise NotReady("asking the API server whether it keeps image volumes")

    def start(self) -> None:
        self._ready_deadline = time.monotonic() + READY_WAIT
        self._probe.start()

    def stop(self) -> None:
        self._probe.stop()

    def mode(self) -> str:
        with self._lock:
            if self._nodes_dirty and self.nodes.has_synced():
                self._nodes_dirty = False
                problem = nodes_problem(self.nodes.store.list())
                if problem != self._node_problem:
                    self._node_problem = problem
                    self._update_locked()
            return self._mode

    # -- internals --------------------------------------------------------------------------------
    def _dirty(self, _node: JSON) -> None:
        with self._lock:
            self._nodes_dirty = True

    def _update_locked(self) -> None:
        """Decide, and say so whenever the mode or its reason changes."""
        mode = constants.INJECTION_MODE_INIT_CONTAINER
        if self._api_server is None:
            why = "the API server has not answered yet"
        elif not self._api_server:
            why = "the API server drops image volumes (the ImageVolume feature is off)"
        elif self._node_problem is not None:
            why = self._node_problem
        else:
            mode, why = constants.INJECTION_MODE_IMAGE_VOLUME, "every node can mount image volumes"
        if (mode, why) != self._decision:
            log.info("injection mode", extra={"mode": mode, "why": why})
            self._decision = (mode, why)
            self._mode = mode

    def _ask_api_server(self) -> None:
        delay = 1.0
        while not self._probe.stopping.is_set():
            try:
                kept = self._dry_run()
            except ApiError as err:
                if err.retryable:
                    log.info("image-volume probe: retrying", extra={"error": str(err)})
                    self._probe.stopping.wait(delay)
                    delay = min(delay * 2, 60.0)
                    continue
                log.warning(
                    "image-volume probe refused; using the init container",
                    extra={"error": str(err)},
                )
                kept = False
            log.info("image-volume probe answered", extra={"api_server_keeps_image_volumes": kept})
            with self._lock:
                self._api_server = kept
                self._update_locked()
            return

    def _dry_run(self) -> bool:
        """True when the API server keeps an image volume (a 422 for a volume with no source
        after it dropped the field, or a reply without it, means it does not)."""
        pod = probe_pod(self.image, self.pull_policy)
        try:
            reply = self.client.request(
                "POST", PODS.path(self.namespace), params={"dryRun": "All"}, body=pod
            )
        except ApiError as err:
            if err.code in (400, 422):
                return False
            raise
        volumes = ((reply or {}).get("spec") or {}).get("volumes") or []
        return any("image" in v for v in volumes if v.get("name") == "payload")


# --- a separate webhook Deployment: the manager decides, the webhook reads ------------------------
# Deciding needs the Node cache and a Pod dry-run (`create pods`): powers the webhook's identity
# must not hold. With `--injection-mode-configmap`, the manager's Lease holder publishes its
# decision in that ConfigMap and the webhook follows it through a one-object watch.

MODE_KEY = "mode"
PUBLISH_RESYNC = 300.0  # read the ConfigMap back at least this often (repairs an edit)
PUBLISH_POLL = 2.0  # how often the local decision is compared with what was written


@dataclass(eq=False)
class InjectionModePublisher:
    """The Lease holder's side: keeps `data.mode` of the ConfigMap equal to `mode()`, once
    `decided` stops raising NotReady (the API server answered, or AutoInjectionMode gave up
    waiting): a webhook must not start admitting on a mode about to change."""

    client: KubeClient
    namespace: str
    name: str
    mode: Callable[[], str]
    _: KW_ONLY
    decided: Callable[[], None] = lambda: None
    _written: str | None = field(default=None, init=False)
    _checked: float = field(default=0.0, init=False)

    def sync(self) -> float:
        """One pass; seconds until the next. Raises on API trouble (the caller backs off)."""
        try:
            self.decided()
        except NotReady:
            return PUBLISH_POLL
        want = self.mode()
        if want == self._written and time.monotonic() - self._checked < PUBLISH_RESYNC:
            return PUBLISH_POLL
        current = self.client.get_or_none(CONFIGMAPS, self.name, self.namespace)
        if current is None:
            body: JSON = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "lumigo-operator"},
                },
                "data": {MODE_KEY: want},
            }
            self.client.create(CONFIGMAPS, body, self.namespace)
        elif (current.get("data") or {}).get(MODE_KEY) != want:
            current["data"] = {**(current.get("data") or {}), MODE_KEY: want}
            self.client.replace(CONFIGMAPS, current, self.namespace)
        if want != self._written:
            log.info("injection mode published", extra={"mode": want, "configmap": self.name})
        self._written, self._checked = want, time.monotonic()
        return PUBLISH_POLL


@dataclass(eq=False)
class PublishedInjectionMode:
    """The webhook's side: the mode in the manager's ConfigMap (init-container until it says
    otherwise, or when it says something unknown: that mode works on every node)."""

    configmap: Informer
    namespace: str
    name: str
    _ready_deadline: float = field(default=float("inf"), init=False)

    def start(self) -> None:
        self._ready_deadline = time.monotonic() + READY_WAIT

    def stop(self) -> None:
        return

    def mode(self) -> str:
        found = self.configmap.get(self.namespace, self.name)
        value = ((found or {}).get("data") or {}).get(MODE_KEY)
        if value in constants.INJECTION_MODES:
            return str(value)
        return constants.INJECTION_MODE_INIT_CONTAINER

    def ready(self) -> None:
        """For /readyz: wait (a bounded while) for the manager's first decision."""
        if time.monotonic() >= self._ready_deadline:
            return
        if self.configmap.get(self.namespace, self.name) is None:
            raise NotReady(f"waiting for the manager's injection mode in ConfigMap {self.name}")
