"""Runs the cluster agent: a DaemonSet that sends every node's container log files and kubelet
metrics upstream.

The operator, not the installer, creates the DaemonSet: an OLM bundle cannot carry one, and this
way Helm, kustomize and OLM installations get the same agent from the same flags
(`--cluster-logs*`, `--cluster-metrics*`). It only does so once the token Secret exists (the
pods could not start without it). It borrows from the
telemetry proxy's Deployment what an installation already chose there: the collector image and
pull policy, image pull secrets, the ServiceAccount (whose ClusterRole already lets it read pods
and their owners), tolerations and node affinity; tolerations and a nodeSelector of the agent's
own replace the proxy's when the Deployment's annotation `AGENT_SCHEDULING_ANNOTATION` names
them (the chart's `tolerations.clusterAgent`, as in the reference chart). Both the DaemonSet and
its configuration Secret are owned by that Deployment, so uninstalling removes them; turning the
flag off deletes them.

A level-triggered single-key loop: each pass renders the configuration
(`controller.telemetry.agent_config`) and server-side applies both objects (a no-op on the API
server when nothing changed); the configuration's hash on the pod template rolls the agents when
it changes. A failed call raises, and the controller retries with backoff.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import KW_ONLY, dataclass, field, replace

from controller.runtime.kube import KubeClient
from controller.runtime.logs import WarnWhileMissing
from controller.runtime.manager import Controller, Result
from controller.runtime.ratelimit import ItemExponentialFailureRateLimiter
from controller.runtime.singlekey import single_key_controller
from controller.telemetry.agent_config import (
    HOST_ROOT_MOUNT,
    NODE_EXPORTER_PORT,
    NODE_IP_ENV,
    NODE_NAME_ENV,
    POD_LOGS_MOUNT,
    STATE_MOUNT,
    TOKEN_ENV,
    AgentSettings,
    render_agent,
)
from controller.telemetry.config import HEALTH_PORT, METRICS_PORT
from controller.telemetry.proxy_reconciler import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_KEY,
    MANAGED_BY,
    ClusterIdentity,
    config_hash,
    owner_reference,
)
from kube.kinds import DAEMONSETS, DEPLOYMENTS, SECRETS
from kube.objects import JSON

log = logging.getLogger("lumigo.telemetry")

FIELD_MANAGER = "lumigo-operator"
COMPONENT = "cluster-agent"
BASE_BACKOFF, MAX_BACKOFF = 1.0, 60.0
# The collector's soft memory limit, about 80% of the container's limit.
RESOURCES: JSON = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}
GOMEMLIMIT = "200MiB"
# node-exporter's, as the reference's chart sets them.
NODE_EXPORTER_RESOURCES: JSON = {
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "128Mi"},
}


@dataclass(frozen=True)
class AgentTarget:
    """Where the agent runs and what it reads on each node."""

    namespace: str
    daemonset_name: str
    proxy_deployment: str  # the image, ServiceAccount and owner come from it
    token_secret: str  # in `namespace`: the cluster-collection token
    token_key: str = "token"
    pod_logs_dir: str = "/var/log/pods"  # the kubelet's podLogsDir on the nodes
    state_dir: str = "/var/lib/lumigo-operator/cluster-agent"  # offsets, on each node
    # node-exporter, run next to the collector when it sends node metrics ('' = none).
    node_exporter_image: str = ""

    @property
    def secret_name(self) -> str:
        return f"{self.daemonset_name}-config"


@dataclass(eq=False)
class ClusterAgentReconciler:
    """Applies (or, disabled, removes) the agent's Secret and DaemonSet; leader only. Waits,
    warning once, while the token Secret or the proxy Deployment is missing: the agent's pods
    take their token from the one and their image and owner from the other."""

    client: KubeClient
    target: AgentTarget
    settings: AgentSettings
    enabled: bool
    _: KW_ONLY
    resync_period: float = 60.0
    _identity: ClusterIdentity = field(init=False)
    _proxy_wait: WarnWhileMissing = field(init=False)
    _removed: bool = field(default=False, init=False)
    _token_wait: WarnWhileMissing = field(init=False)

    def __post_init__(self) -> None:
        self._identity = ClusterIdentity(self.client)
        self._token_wait = WarnWhileMissing(log, "cluster collection waits for its token Secret")
        self._proxy_wait = WarnWhileMissing(
            log, "telemetry proxy Deployment not found; the cluster agent waits for it"
        )

    def controller(self) -> Controller:
        return single_key_controller(
            COMPONENT,
            self.reconcile,
            rate_limiter=ItemExponentialFailureRateLimiter(BASE_BACKOFF, MAX_BACKOFF),
        )

    def reconcile(self) -> Result:
        self.sync()
        return Result(requeue_after=self.resync_period)

    def sync(self) -> None:
        t = self.target
        if not self.enabled:
            self._remove()
            return
        # Without the Secret the agent's pods could not start (CreateContainerConfigError): wait.
        token = self.client.get_or_none(SECRETS, t.token_secret, t.namespace)
        secret = f"{t.namespace}/{t.token_secret}"
        if not self._token_wait.present(token is not None, secret=secret, key=t.token_key):
            return
        proxy = self.client.get_or_none(DEPLOYMENTS, t.proxy_deployment, t.namespace)
        self._proxy_wait.present(
            proxy is not None, deployment=f"{t.namespace}/{t.proxy_deployment}"
        )
        if proxy is None:
            return
        origin = self.settings.proxy.origin
        if not origin.cluster_uid:
            origin = replace(origin, cluster_uid=self._identity.uid())
        settings = replace(self.settings, proxy=replace(self.settings.proxy, origin=origin))
        text = render_agent(settings)
        digest = config_hash(text)
        owner = owner_reference(proxy)
        self.client.apply(SECRETS, self._secret(text, digest, owner), FIELD_MANAGER, t.namespace)
        daemonset = agent_daemonset(
            t, proxy, digest, logs=self.settings.logs, metrics=self.settings.metrics.enabled
        )
        self.client.apply(DAEMONSETS, daemonset, FIELD_MANAGER, t.namespace)

    def _secret(self, text: str, digest: str, owner: JSON) -> JSON:
        t = self.target
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": t.secret_name,
                "namespace": t.namespace,
                "labels": dict(MANAGED_BY),
                "annotations": {CONFIG_HASH_ANNOTATION: digest},
                "ownerReferences": [owner],
            },
            "data": {CONFIG_KEY: base64.b64encode(text.encode()).decode()},
        }

    def _remove(self) -> None:
        """Delete what an earlier, enabled run created (once per start: nothing recreates it).
        The names are the operator's own, so no read first (and no `get` permission)."""
        if self._removed:
            return
        t = self.target
        for resource, name in ((DAEMONSETS, t.daemonset_name), (SECRETS, t.secret_name)):
            if self.client.delete(resource, name, t.namespace) is not None:
                log.info("cluster agent removed", extra={"object": f"{resource.kind}/{name}"})
        self._removed = True


# On the telemetry proxy's Deployment: {"tolerations": [...], "nodeSelector": {...}} for the agent.
AGENT_SCHEDULING_ANNOTATION = "operator.lumigo.io/cluster-agent-scheduling"


def agent_scheduling(proxy: JSON) -> JSON:
    """The agent's own tolerations and nodeSelector from the proxy Deployment's annotation, the
    keys that are well formed only; an unreadable annotation is logged and leaves the proxy's."""
    annotations = (proxy.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(AGENT_SCHEDULING_ANNOTATION)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        log.warning("ignoring the annotation %s: not JSON (%s)", AGENT_SCHEDULING_ANNOTATION, err)
        return {}
    if not isinstance(value, dict):
        value = {}
    scheduling: JSON = {}
    tolerations = value.get("tolerations")
    if isinstance(tolerations, list) and all(isinstance(t, dict) for t in tolerations):
        scheduling["tolerations"] = tolerations
    selector = value.get("nodeSelector")
    if isinstance(selector, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        scheduling["nodeSelector"] = selector
    if set(value) - set(scheduling):
        log.warning(
            "ignoring %s in the annotation %s: tolerations must be a list of objects and "
            "nodeSelector a map of strings",
            ", ".join(sorted(set(value) - set(scheduling))),
            AGENT_SCHEDULING_ANNOTATION,
        )
    return scheduling


def agent_daemonset(
    t: AgentTarget, proxy: JSON, config_digest: str, *, logs: bool = True, metrics: bool = False
) -> JSON:
    """The DaemonSet, with the image, pull secrets, ServiceAccount and scheduling of `proxy`;
    the node's log directory is mounted only when it reads log files, the node's /proc and /sys
    (read-only) only when it sends node metrics."""
    pod = ((proxy.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or [{}]
    collector = next((c for c in containers if c.get("name") == "otelcol"), containers[0])
    labels = {
        "app.kubernetes.io/name": "lumigo-operator",
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/instance": t.daemonset_name,
    }
    pod_spec: JSON = {
        "serviceAccountName": pod.get("serviceAccountName", "default"),
        "automountServiceAccountToken": True,
        "terminationGracePeriodSeconds": 30,
        # Root, but no capability: the kubelet's log files are root's and mode 0640, so the
        # owner's read bit is what lets the agent read them.
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "otelcol",
                "image": collector.get("image", ""),
                "imagePullPolicy": collector.get("imagePullPolicy", "IfNotPresent"),
                "args": ["--config=/etc/otelcol/config.yaml"],
                "env": [
                    {
                        "name": NODE_NAME_ENV,
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    },
                    {
                        "name": NODE_IP_ENV,
                        "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                    },
                    {
                        "name": TOKEN_ENV,
                        "valueFrom": {"secretKeyRef": {"name": t.token_secret, "key": t.token_key}},
                    },
                    {"name": "GOMEMLIMIT", "value": GOMEMLIMIT},
                ],
                "ports": [
                    {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
                    {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
                ],
                "readinessProbe": {
                    "httpGet": {"path": "/", "port": "health"},
                    "periodSeconds": 5,
                },
                "livenessProbe": {
                    "httpGet": {"path": "/", "port": "health"},
                    "initialDelaySeconds": 15,
                    "periodSeconds": 20,
                },
                "resources": RESOURCES,
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/otelcol", "readOnly": True},
                    {"name": "pod-logs", "mountPath": POD_LOGS_MOUNT, "readOnly": True},
                    {"name": "state", "mountPath": STATE_MOUNT},
                ],
            }
        ],
        "volumes": [
            {
                "name": "config",
                "secret": {"secretName": t.secret_name, "defaultMode": 0o440},
            },
            {"name": "pod-logs", "hostPath": {"path": t.pod_logs_dir, "type": "Directory"}},
            {"name": "state", "hostPath": {"path": t.state_dir, "type": "DirectoryOrCreate"}},
        ],
    }
    if not logs:
        container = pod_spec["containers"][0]
        container["volumeMounts"] = [
            m for m in container["volumeMounts"] if m["name"] != "pod-logs"
        ]
        pod_spec["volumes"] = [v for v in pod_spec["volumes"] if v["name"] != "pod-logs"]
    if metrics and t.node_exporter_image:
        pull = collector.get("imagePullPolicy", "IfNotPresent")
        pod_spec["containers"].append(node_exporter(t.node_exporter_image, pull))
        pod_spec["volumes"] += [
            {"name": f"host-{name}", "hostPath": {"path": path, "type": "Directory"}}
            for name, path in (("proc", "/proc"), ("sys", "/sys"), ("root", "/"))
        ]
    for key in ("imagePullSecrets", "tolerations", "affinity", "priorityClassName"):
        if pod.get(key):
            pod_spec[key] = pod[key]
    _copy_egress(pod, collector, pod_spec)
    pod_spec.update({k: v for k, v in agent_scheduling(proxy).items() if v})
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": t.daemonset_name,
            "namespace": t.namespace,
            "labels": {**labels, **MANAGED_BY, "lumigo.auto-trace": "false"},
            "ownerReferences": [owner_reference(proxy)],
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": {**labels, "lumigo.auto-trace": "false"},
                    "annotations": {CONFIG_HASH_ANNOTATION: config_digest},
                },
                "spec": pod_spec,
            },
        },
    }


EGRESS_ENV = ("HTTPS_PROXY", "NO_PROXY", "SSL_CERT_DIR")
EGRESS_CA_VOLUME = "egress-ca"


def _copy_egress(proxy_pod: JSON, collector: JSON, agent_pod: JSON) -> None:
    """The proxy's egress settings (the chart's `egress`: forward proxy, NO_PROXY, extra CAs)
    on the agent's collector, which exports upstream too. Its NO_PROXY also gets the node's IP:
    the agent scrapes that node's kubelet over HTTPS, which must never go through the proxy."""
    agent = agent_pod["containers"][0]
    for var in collector.get("env") or []:
        if var.get("name") not in EGRESS_ENV:
            continue
        copied = dict(var)
        if copied["name"] == "NO_PROXY" and "value" in copied:
            copied["value"] = f"{copied['value']},$({NODE_IP_ENV})"
        agent["env"].append(copied)
    mount = next(
        (m for m in collector.get("volumeMounts") or [] if m.get("name") == EGRESS_CA_VOLUME), None
    )
    volume = next(
        (v for v in proxy_pod.get("volumes") or [] if v.get("name") == EGRESS_CA_VOLUME), None
    )
    if mount is not None and volume is not None:
        agent["volumeMounts"].append(dict(mount))
        agent_pod["volumes"].append(dict(volume))


def node_exporter(image: str, pull_policy: str) -> JSON:
    """node-exporter in the agent's pod: the node's figures under Prometheus' names
    (`node_cpu_seconds_total`, `node_memory_Active_bytes`, ...), read from the host's /proc,
    /sys and root file system (read-only), served on the pod's loopback only: the collector next
    to it is its one client. No privilege: /proc and /sys are world-readable, and statfs needs no
    read access."""
    return {
        "name": "node-exporter",
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": [
            f"--path.procfs={HOST_ROOT_MOUNT}/proc",
            f"--path.sysfs={HOST_ROOT_MOUNT}/sys",
            f"--path.rootfs={HOST_ROOT_MOUNT}/root",
            f"--web.listen-address=127.0.0.1:{NODE_EXPORTER_PORT}",
            "--collector.filesystem.mount-points-exclude=^/(sys|proc|dev|host|etc)($|/)",
        ],
        "resources": NODE_EXPORTER_RESOURCES,
        "securityContext": {
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": f"host-{name}", "mountPath": f"{HOST_ROOT_MOUNT}/{name}", "readOnly": True}
            for name in ("proc", "sys", "root")
        ],
    }
