"""The real `lumigo-operator run` process against a local control plane (`make run`, tests).

The operator runs exactly as in a cluster (leader election, self-managed certificates, webhook
server, controllers), except that the API server reaches its webhooks through `url:` client
configurations on 127.0.0.1 (the serving certificate gets 127.0.0.1 as an extra SAN) instead of a
Service. Tests give each operator a namespace label to select, so several test modules can share
one cluster without seeing each other's webhooks; `make run` selects every namespace but its own
and kube-system, as the Helm chart does.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from http import HTTPStatus
from pathlib import Path
from typing import Any

import yaml

from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import OPERATOR_USER, LocalCluster
from envtest.process import free_port, wait_until
from kube.kinds import MUTATING_WEBHOOK_CONFIGURATIONS, NAMESPACES
from kube.rest import ApiError

ROOT = Path(__file__).resolve().parent.parent
JSON = dict[str, Any]

WORKLOAD_RULES = [
    {
        "apiGroups": ["apps"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["daemonsets", "deployments", "replicasets", "statefulsets"],
        "scope": "Namespaced",
    },
    {
        "apiGroups": ["batch"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["cronjobs", "jobs"],
        "scope": "Namespaced",
    },
]
LUMIGO_RULES = [
    {
        "apiGroups": ["operator.lumigo.io"],
        "apiVersions": ["v1alpha1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["lumigoes"],
        "scope": "Namespaced",
    }
]

# The injector's matchConditions, as in config/webhook (a unit test compares them): no call for
# the operator's own writes (it runs as OPERATOR_USER here, as its ServiceAccount in a cluster)
# nor for ReplicaSets a Deployment owns.
INJECTOR_MATCH_CONDITIONS = [
    {
        "name": "not-the-operators-own-write",
        "expression": f"request.userInfo.username != '{OPERATOR_USER}'",
    },
    {
        "name": "not-a-deployments-replicaset",
        "expression": "!(request.kind.kind == 'ReplicaSet' && has(object.metadata.ownerReferences)"
        " && object.metadata.ownerReferences.exists(r, r.kind == 'Deployment'"
        " && r.apiVersion == 'apps/v1'))",
    },
]

# The opted-in entry (namespaces without an active Lumigo), as in config/webhook: workloads that
# carry the lumigo.auto-trace label with any value, before or after the change (injection rewrites
# `true` to `lumigo-operator.v<version>`, and the user's later `false` must still reach the
# handler, which decides what each value means), except those that are not and were not opted in
# (unlabelled or `false` on both sides: the handler leaves them alone where no Lumigo is active).
OPTED_IN_OBJECT_SELECTOR: JSON = {
    "matchExpressions": [{"key": "lumigo.auto-trace", "operator": "Exists"}]
}


def _not_opted_in(obj: str) -> str:
    label = f"{obj}.metadata.labels"
    return (
        f"(!has({label}) || !('lumigo.auto-trace' in {label})"
        f" || {label}['lumigo.auto-trace'].lowerAscii() == 'false')"
    )


OPTED_IN_MATCH_CONDITIONS = [
    *INJECTOR_MATCH_CONDITIONS,
    {
        "name": "not-opted-out-before-and-after",
        "expression": f"!({_not_opted_in('object')}"
        f" && (oldObject == null || {_not_opted_in('oldObject')}))",
    },
]


METRICS_READER_ROLE = ROOT / "config" / "rbac" / "metrics_reader_role.yaml"


def metrics_reader_token(
    cluster: LocalCluster, namespace: str, name: str, *, bound: bool = True
) -> str:
    """A token of a new ServiceAccount `name` in `namespace`; with `bound`, bound (through a
    ClusterRole and ClusterRoleBinding both called `name`) to the rules of the shipped
    metrics-reader ClusterRole. `release_metrics_reader` deletes the cluster-wide objects."""
    role = yaml.safe_load(METRICS_READER_ROLE.read_text())
    docs: list[JSON] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": name, "namespace": namespace}}]  # fmt: skip
    if bound:
        docs += [
            {**role, "metadata": {"name": name}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": docs}))  # fmt: skip
    return cluster.kubectl("create", "token", name, "-n", namespace, "--duration=1h").strip()


def release_metrics_reader(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found",
                    check=False)  # fmt: skip


def scrape(port: int, path: str = "/metrics", *, secure: bool, token: str | None = None,
           timeout: float = 5, host: str = "127.0.0.1") -> tuple[int, str]:  # fmt: skip
    """GET /metrics over HTTPS (the certificate is self-signed: not verified) with an optional
    bearer token, or over plain HTTP. (status, body); status 0 when no HTTP answer came."""
    context = None
    if secure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(f"{'https' if secure else 'http'}://{host}:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


def wait_until_webhooks_admit(kube: KubeClient, namespace: str, timeout: float = 60) -> None:
    """Wait until a Lumigo created in `namespace` passes the defaulting webhook.

    An operator is ready once the stored webhook configurations carry its CA bundle, but the API
    server applies configuration changes from its own informer a moment later; a request in that
    moment fails with "x509: certificate signed by unknown authority". A dry-run create goes
    through the defaulting webhook (failurePolicy Fail), so it succeeds only once the API server
    trusts the webhook's certificate.
    """
    body = {
        "apiVersion": "operator.lumigo.io/v1alpha1",
        "kind": "Lumigo",
        "metadata": {"name": "admission-probe"},
        "spec": {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}},
    }
    last_error = ""

    def admitted() -> bool:
        nonlocal last_error
        try:
            kube.request(
                "POST", LUMIGOES.path(namespace), params={"dryRun": "All"}, body=body, retry=False
            )
        except ApiError as err:
            if "failed calling webhook" not in err.message:
                raise
            last_error = err.message
            return False
        return True

    try:
        wait_until(admitted, timeout, "the API server to call the webhooks")
    except TimeoutError as err:
        raise TimeoutError(f"{err}: {last_error}") from None


class OperatorProcess:
    """One operator process (restartable on the same ports) plus its webhook registrations."""

    # Each keyword is one of the operator's own flags (--operator-version, --resync-period,
    # --log-level...), named as on its command line: what a test sets is read at the call.
    def __init__(  # noqa: PLR0913
        self,
        cluster: LocalCluster,
        kube: KubeClient,
        *,
        namespace: str | None = None,
        extra_args: tuple[str, ...] = (),
        select_all_namespaces: bool = False,
        operator_version: str = "0.1.0-test",
        resync_period: str = "3s",
        log_level: str = "debug",
    ) -> None:
        self.cluster = cluster
        self.kube = kube
        self.id = uuid.uuid4().hex[:6]
        self.namespace = namespace or f"lumigo-op-{self.id}"
        self.selector_label = f"lumigo-test-operator-{self.id}"
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.config_name = f"lumigo-test-{self.id}"
        self.extra_args = extra_args
        self.select_all_namespaces = select_all_namespaces
        self.operator_version = operator_version
        self.resync_period = resync_period
        self.log_level = log_level
        self.log_path = cluster.workdir / "logs" / f"operator-{self.id}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.namespaces: list[str] = []
        self._probe_namespace: str | None = None
        self._metrics_token: str | None = None
        self.metrics_reader = f"lumigo-test-metrics-{self.id}"

    # -- lifecycle ---------------------------------------------------------------------------------
    def setup(self) -> OperatorProcess:
        self.kube.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}},
        )
        self.kube.create(MUTATING_WEBHOOK_CONFIGURATIONS, self.webhook_configuration())
        return self

    def args(self) -> list[str]:
        return [
            str(ROOT / ".venv" / "bin" / "lumigo-operator"),
            "run",
            f"--kubeconfig={self.cluster.operator_kubeconfig}",
            f"--namespace={self.namespace}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            "--cert-mode=self",
            "--cert-secret=lumigo-webhook-certs",
            "--webhook-service=lumigo-webhooks-service",
            f"--webhook-configurations={self.config_name}",
            "--webhook-cert-extra-sans=127.0.0.1",
            "--telemetry-proxy-deployment=",
            f"--operator-version={self.operator_version}",
            f"--resync-period={self.resync_period}",
            f"--log-level={self.log_level}",
            "--shutdown-delay=0",  # a host process: no Service routes to it
            *self.extra_args,
        ]

    def start(self) -> OperatorProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start #{self.starts} ===\n".encode())
            self.proc = subprocess.Popen(
                self.args(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 60) -> OperatorProcess:
        def ready() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the operator exited:\n{self.log_tail()}")
            return self.probe("/readyz")[0] == HTTPStatus.OK

        try:
            wait_until(ready, timeout, "the operator to be ready")
        except TimeoutError:
            raise TimeoutError(f"{self.probe('/readyz?verbose')}\n{self.log_tail()}") from None
        self.wait_admitting(timeout)
        return self

    def wait_admitting(self, timeout: float) -> None:
        """Wait until the API server itself calls this operator's webhooks successfully."""
        if self._probe_namespace is None:
            # `make run` selects every namespace: nothing needs creating for a dry run there.
            selected = "default" if self.select_all_namespaces else None
            self._probe_namespace = selected or self.new_namespace()
        try:
            wait_until_webhooks_admit(self.kube, self._probe_namespace, timeout)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{self.log_tail()}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def teardown(self) -> None:
        """Stop, unregister the webhooks, and delete the namespaces this operator served.

        With the operator gone, our finalizer would keep those namespaces Terminating forever
        (and the namespace controller busy), so it is dropped first."""
        self.stop()
        self.kube.delete(MUTATING_WEBHOOK_CONFIGURATIONS, self.config_name)
        release_metrics_reader(self.cluster, self.metrics_reader)
        self.release_namespaces([*self.namespaces, self.namespace])

    def release_namespaces(self, namespaces: list[str]) -> None:
        """Drop the finalizers of the Lumigo resources left there, then delete the namespaces."""
        for namespace in namespaces:
            try:
                lumigoes, _ = self.kube.list(LUMIGOES, namespace)
                for lumigo in lumigoes:
                    name = lumigo["metadata"]["name"]
                    patch = {"metadata": {"finalizers": None}}
                    self.kube.merge_patch(LUMIGOES, name, patch, namespace)
                self.kube.delete(NAMESPACES, namespace)
            except ApiError:
                pass  # best effort: the session's cluster is thrown away at the end anyway

    # -- helpers -----------------------------------------------------------------------------------
    @property
    def metrics_secure(self) -> bool:
        """Whether this process serves /metrics securely, as it reads --metrics-secure (the
        last one wins; secure by default)."""
        secure = True
        for arg in self.args():
            if arg == "--metrics-secure" or arg.startswith("--metrics-secure="):
                secure = arg.partition("=")[2].lower() in ("", "true", "1", "yes", "on", "t")
        return secure

    def metrics_token(self) -> str:
        """A token allowed to scrape /metrics (a ServiceAccount made on first use)."""
        if self._metrics_token is None:
            self._metrics_token = metrics_reader_token(self.cluster, self.namespace,
                                                       self.metrics_reader)  # fmt: skip
        return self._metrics_token

    def probe(self, path: str) -> tuple[int, str]:
        if path.startswith("/metrics"):  # as Prometheus scrapes it, with its token if secure
            secure = self.metrics_secure
            token = self.metrics_token() if secure else None
            return scrape(self.metrics_port, path, secure=secure, token=token)
        port = self.health_port
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as err:
            return 0, str(err)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def new_namespace(self, name: str | None = None) -> str:
        """A namespace the operator's webhooks apply to."""
        name = name or f"t-{uuid.uuid4().hex[:8]}"
        self.kube.create(
            NAMESPACES,
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {self.selector_label: "true"}},
            },
        )
        self.namespaces.append(name)
        return name

    def webhook_configuration(self) -> JSON:
        base = f"https://127.0.0.1:{self.webhook_port}"
        selector: JSON = {"matchLabels": {self.selector_label: "true"}}
        if self.select_all_namespaces:
            selector = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": ["kube-system", self.namespace],
                    }
                ]
            }

        # As in config/webhook: the injector only where the operator labelled the namespace
        # (an active Lumigo), so tests see a late label exactly as a cluster would.
        injector_selector: JSON = {
            **selector,
            "matchExpressions": [
                *selector.get("matchExpressions", []),
                {"key": "operator.lumigo.io/monitored", "operator": "In", "values": ["true"]},
            ],
        }

        opted_in_selector: JSON = {
            **selector,
            "matchExpressions": [
                *selector.get("matchExpressions", []),
                {"key": "operator.lumigo.io/monitored", "operator": "NotIn", "values": ["true"]},
            ],
        }

        def hook(name: str, path: str, rules: list[JSON], policy: str, ns: JSON,
                 conditions: list[JSON]) -> JSON:  # fmt: skip
            return {
                "name": name,
                "clientConfig": {"url": f"{base}{path}"},  # caBundle: written by the operator
                "rules": rules,
                "failurePolicy": policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                "namespaceSelector": ns,
                "matchConditions": conditions,
            }

        # As in config/webhook: objects being deleted (finalizer removal) never need the
        # defaulter, so a stopped operator cannot block its own clean-up.
        not_being_deleted = [
            {"name": "not-being-deleted", "expression": "!has(object.metadata.deletionTimestamp)"}
        ]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.config_name},
            "webhooks": [
                hook(
                    "lumigoinjector.kb.io",
                    "/v1alpha1/inject",
                    WORKLOAD_RULES,
                    "Ignore",
                    injector_selector,
                    INJECTOR_MATCH_CONDITIONS,
                ),
                {
                    **hook(
                        "lumigoinjector-opted-in.kb.io",
                        "/v1alpha1/inject",
                        WORKLOAD_RULES,
                        "Ignore",
                        opted_in_selector,
                        OPTED_IN_MATCH_CONDITIONS,
                    ),
                    "objectSelector": OPTED_IN_OBJECT_SELECTOR,
                },
                hook(
                    "lumigodefaulter.kb.io",
                    "/v1alpha1/mutate",
                    LUMIGO_RULES,
                    "Fail",
                    selector,
                    not_being_deleted,
                ),
            ],
        }

    def uninstall(self, timeout: str = "60s") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ROOT / ".venv" / "bin" / "lumigo-operator"), "uninstall",
             f"--kubeconfig={self.cluster.kubeconfig}", f"--timeout={timeout}"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
