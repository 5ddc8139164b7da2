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

from api import constants
from controller.lumigo.nodes import node_info
from controller.runtime.informer import FuncHandler, Informer
from controller.runtime.kube import KubeClient
from kube import objects
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


class AutoInjectionMode:
    """The injection mode for `auto`, current with the Nodes; cheap to ask on every admission."""

    def __init__(
        self, client: KubeClient, nodes: Informer, namespace: str, image: str, pull_policy: str
    ) -> None:
        self._client = client
        self._nodes = nodes
        self._namespace = namespace
        self._image = image
        self._pull_policy = pull_policy
        self._lock = threading.Lock()
        self._api_server: bool | None = None  # unknown until the dry-run answers
        self._nodes_dirty = True
        self._node_problem: str | None = "nodes not listed yet"
        self._mode = constants.INJECTION_MODE_INIT_CONTAINER
        self._decision: tuple[str, str] = (self._mode, "")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready_deadline = float("inf")
        nodes.add_handler(
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
        self._thread = threading.Thread(
            target=self._ask_api_server, name="image-volume-probe", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def mode(self) -> str:
        with self._lock:
            if self._nodes_dirty and self._nodes.has_synced():
                self._nodes_dirty = False
                problem = nodes_problem(self._nodes.store.list())
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
        while not self._stop.is_set():
            try:
                kept = self._dry_run()
            except ApiError as err:
                if err.retryable:
                    log.info("image-volume probe: retrying", extra={"error": str(err)})
                    self._stop.wait(delay)
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
        pod = probe_pod(self._image, self._pull_policy)
        try:
            reply = self._client.request(
                "POST", PODS.path(self._namespace), params={"dryRun": "All"}, body=pod
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


class InjectionModePublisher:
    """The Lease holder's side: keeps `data.mode` of the ConfigMap equal to `mode()`, once
    `decided` stops raising NotReady (the API server answered, or AutoInjectionMode gave up
    waiting): a webhook must not start admitting on a mode about to change."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        mode: Callable[[], str],
        *,
        decided: Callable[[], None] = lambda: None,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._name = name
        self._mode = mode
        self._decided = decided
        self._written: str | None = None
        self._checked = 0.0

    def sync(self) -> float:
        """One pass; seconds until the next. Raises on API trouble (the caller backs off)."""
        try:
            self._decided()
        except NotReady:
            return PUBLISH_POLL
        want = self._mode()
        if want == self._written and time.monotonic() - self._checked < PUBLISH_RESYNC:
            return PUBLISH_POLL
        current = self._client.get_or_none(CONFIGMAPS, self._name, self._namespace)
        if current is None:
            body: JSON = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self._name,
                    "namespace": self._namespace,
                    "labels": {"app.kubernetes.io/managed-by": "lumigo-operator"},
                },
                "data": {MODE_KEY: want},
            }
            self._client.create(CONFIGMAPS, body, self._namespace)
        elif (current.get("data") or {}).get(MODE_KEY) != want:
            current["data"] = {**(current.get("data") or {}), MODE_KEY: want}
            self._client.replace(CONFIGMAPS, current, self._namespace)
        if want != self._written:
            log.info("injection mode published", extra={"mode": want, "configmap": self._name})
        self._written, self._checked = want, time.monotonic()
        return PUBLISH_POLL


class PublishedInjectionMode:
    """The webhook's side: the mode in the manager's ConfigMap (init-container until it says
    otherwise, or when it says something unknown: that mode works on every node)."""

    def __init__(self, configmap: Informer, namespace: str, name: str) -> None:
        self._configmap = configmap
        self._namespace = namespace
        self._name = name
        self._ready_deadline = float("inf")

    def start(self) -> None:
        self._ready_deadline = time.monotonic() + READY_WAIT

    def stop(self) -> None:
        return

    def mode(self) -> str:
        found = self._configmap.get(self._namespace, self._name)
        value = ((found or {}).get("data") or {}).get(MODE_KEY)
        if value in constants.INJECTION_MODES:
            return str(value)
        return constants.INJECTION_MODE_INIT_CONTAINER

    def ready(self) -> None:
        """For /readyz: wait (a bounded while) for the manager's first decision."""
        if time.monotonic() >= self._ready_deadline:
            return
        if self._configmap.get(self._namespace, self._name) is None:
            raise NotReady(f"waiting for the manager's injection mode in ConfigMap {self._name}")
