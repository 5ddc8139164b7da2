"""The Lumigo controller as users see it: the real operator process, the seed README's YAML."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import (
    CRONJOBS,
    DAEMONSETS,
    DEPLOYMENTS,
    JOBS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    PODS,
    REPLICASETS,
    STATEFULSETS,
)
from tests.support.checks import (
    TOKEN,
    clean,
    condition,
    create,
    events_of,
    has_event,
    instrumented,
    is_active,
    lumigo_yaml,
    status,
)
from tests.support.lumigo import create_token_secret
from tests.support.workloads import workload

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "config" / "samples" / "operator_v1alpha1_lumigo.yaml"
PREFIX = "invalid Lumigo token secret reference: "
JSON = dict[str, Any]


def monitored(kube: KubeClient, namespace: str) -> bool:
    """The namespace carries the label the injector webhook's namespaceSelector requires."""
    labels = kube.get(NAMESPACES, namespace)["metadata"].get("labels") or {}
    return labels.get(constants.LABEL_MONITORED) == "true"


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: KubeClient, crd: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, kube).setup()
    op.start().wait_ready()
    yield op
    op.teardown()


def test_readme_quick_start_instruments_existing_workloads(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    existing = [(DAEMONSETS, "ds"), (DEPLOYMENTS, "deploy"), (REPLICASETS, "rs"),
                (STATEFULSETS, "sts"), (CRONJOBS, "cron")]  # fmt: skip
    for resource, name in existing:
        create(kube, ns, resource, name)
    create(kube, ns, JOBS, "job")
    create(kube, ns, DEPLOYMENTS, "opted-out", **{constants.LABEL_AUTO_TRACE: "false"})

    cluster.kubectl("apply", "-n", ns, "-f", str(SAMPLE))  # the seed README's YAML, verbatim

    wait_until(lambda: len(status(kube, ns).get("instrumentedResources", [])) == 5, 60,
               "5 instrumented resources in the status")  # fmt: skip
    listed = [(r["kind"], r["name"]) for r in status(kube, ns)["instrumentedResources"]]
    assert listed == [("DaemonSet", "ds"), ("Deployment", "deploy"), ("ReplicaSet", "rs"),
                      ("StatefulSet", "sts"), ("CronJob", "cron")]  # fmt: skip
    for ref in status(kube, ns)["instrumentedResources"]:
        assert set(ref) == {"apiVersion", "kind", "name", "namespace", "resourceVersion", "uid"}
    for resource, name in existing:
        obj = kube.get(resource, name, ns)
        assert instrumented(obj), name
        wait_until(
            lambda n=name: has_event(kube, ns, n, "LumigoAddedInstrumentation",
                                     f"controller, acting on behalf of the '{ns}/lumigo'"),
            30, f"the Added event on {name}",
        )  # fmt: skip
    assert clean(kube.get(DEPLOYMENTS, "opted-out", ns))
    assert clean(kube.get(JOBS, "job", ns))
    wait_until(
        lambda: has_event(
            kube, ns, "job", "LumigoCannotAddInstrumentation",
            "the PodSpec of batchv1.Job resources is immutable once the job has been created",
        ), 30, "the Job's immutability event",
    )  # fmt: skip
    assert not events_of(kube, ns, "opted-out")  # opting out is not worth a Warning

    lumigo = kube.get(LUMIGOES, "lumigo", ns)
    assert constants.FINALIZER in lumigo["metadata"]["finalizers"]
    active = condition(kube, ns, "Active")
    assert active is not None
    assert (active["status"], active["message"], active["reason"]) == (
        "True", "Lumigo is ready", "LumigoIsReady",
    )  # fmt: skip
    assert active["observedGeneration"] == lumigo["metadata"]["generation"]
    error = condition(kube, ns, "Error")
    assert error is None or error["status"] == "False"

    # Created afterwards: injected by the webhook, listed by the controller.
    after = create(kube, ns, DEPLOYMENTS, "after")
    assert instrumented(after)
    wait_until(lambda: len(status(kube, ns)["instrumentedResources"]) == 6, 30, "6 listed")
    table = cluster.kubectl("get", "lumigoes", "-n", ns)
    assert table.splitlines()[1].split()[:2] == ["lumigo", "True"]


def test_status_is_written_only_when_something_changed(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    before = kube.get(LUMIGOES, "lumigo", ns)["metadata"]["resourceVersion"]
    done_before = reconciles_done(operator, f"{ns}/lumigo")
    # An observation window of three more reconciles (one per 3 s resync), each with nothing
    # to change: a controller that stopped reconciling cannot pass.
    wait_until(lambda: reconciles_done(operator, f"{ns}/lumigo") >= done_before + 3, 60,
               "three more reconciles of the Lumigo")  # fmt: skip
    assert kube.get(LUMIGOES, "lumigo", ns)["metadata"]["resourceVersion"] == before


def reconciles_done(operator: OperatorProcess, key: str) -> int:
    """Reconciles of `key` that ended, from the operator's debug log (one line each)."""
    done = 0
    for line in operator.log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a start banner, or a line being written right now
        done += entry.get("msg") == "reconcile done" and entry.get("key") == key
    return done


def test_deleting_the_lumigo_removes_the_instrumentation(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create(kube, ns, DEPLOYMENTS, "old")
    create(kube, ns, CRONJOBS, "cron")
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", str(SAMPLE))
    wait_until(lambda: len(status(kube, ns).get("instrumentedResources", [])) == 2, 60, "2 listed")
    # Labelled before it was reported Active: the API server now calls the injector here.
    assert monitored(kube, ns)
    create(kube, ns, DEPLOYMENTS, "new")
    create(kube, ns, JOBS, "job")
    assert instrumented(kube.get(DEPLOYMENTS, "new", ns))
    assert instrumented(kube.get(JOBS, "job", ns))  # jobs are injected at creation

    cluster.kubectl("delete", "lumigo", "lumigo", "-n", ns, "--wait=false")
    wait_until(lambda: kube.get_or_none(LUMIGOES, "lumigo", ns) is None, 60, "the Lumigo to go")
    for resource, name in ((DEPLOYMENTS, "old"), (DEPLOYMENTS, "new"), (CRONJOBS, "cron")):
        obj = kube.get(resource, name, ns)
        assert clean(obj), name
        wait_until(lambda n=name: has_event(kube, ns, n, "LumigoRemovedInstrumentation"), 30,
                   f"the Removed event on {name}")  # fmt: skip
    wait_until(
        lambda: has_event(kube, ns, "job", "LumigoCannotRemoveInstrumentation", "immutable"), 30,
        "the Job's CannotRemove event",
    )  # fmt: skip
    # The webhook did not re-inject on the removal's own update (the skip-next-injector handshake)
    # and did not leave its handshake label behind.
    labels = kube.get(DEPLOYMENTS, "new", ns)["metadata"].get("labels") or {}
    assert constants.LABEL_AUTO_TRACE not in labels
    # Without a Lumigo, new workloads are left alone: the injector is not even called.
    assert not monitored(kube, ns)
    assert clean(create(kube, ns, DEPLOYMENTS, "later"))


def test_the_settings_flags_are_honoured(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create(kube, ns, DEPLOYMENTS, "existing")
    create_token_secret(kube, ns, TOKEN)
    spec = {"tracing": {"injection": {"injectLumigoIntoExistingResourcesOnCreation": False,
                                      "removeLumigoFromResourcesOnDeletion": False}}}  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml(**spec))
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    new = create(kube, ns, DEPLOYMENTS, "new")
    assert instrumented(new)
    wait_until(lambda: len(status(kube, ns)["instrumentedResources"]) == 1, 30, "1 listed")
    assert clean(kube.get(DEPLOYMENTS, "existing", ns))  # not touched on activation
    cluster.kubectl("delete", "lumigo", "lumigo", "-n", ns, "--wait=false")
    wait_until(lambda: kube.get_or_none(LUMIGOES, "lumigo", ns) is None, 60, "the Lumigo to go")
    assert instrumented(kube.get(DEPLOYMENTS, "new", ns))  # not removed on deletion


def test_injection_disabled_means_no_injection_at_all(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create(kube, ns, DEPLOYMENTS, "existing")
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-",
                    input=lumigo_yaml(tracing={"injection": {"enabled": False}}))  # fmt: skip
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    assert clean(create(kube, ns, DEPLOYMENTS, "new"))
    assert clean(kube.get(DEPLOYMENTS, "existing", ns))
    assert status(kube, ns)["instrumentedResources"] == []


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        (None, "cannot retrieve secret '{ns}/lumigo-credentials'"),
        ({"other": TOKEN}, "the secret '{ns}/lumigo-credentials' does not have the key 'token'"),
        ({"token": "not-a-token"}, "the value of the field 'token' of the secret "
         "'{ns}/lumigo-credentials' does not match the expected structure of Lumigo tokens"),
    ],
)  # fmt: skip
def test_a_bad_secret_is_an_error_until_it_is_fixed(
    operator: OperatorProcess,
    cluster: LocalCluster,
    kube: KubeClient,
    secret: dict[str, str] | None,
    message: str,
) -> None:
    ns = operator.new_namespace()
    create(kube, ns, DEPLOYMENTS, "waiting")
    if secret is not None:
        cluster.kubectl("create", "secret", "generic", "lumigo-credentials", "-n", ns,
                        *(f"--from-literal={k}={v}" for k, v in secret.items()))  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    expected = PREFIX + message.format(ns=ns)
    wait_until(lambda: (condition(kube, ns, "Error") or {}).get("status") == "True", 60, "Error")
    error = condition(kube, ns, "Error")
    assert error is not None
    assert error["message"].startswith(expected)
    assert error["reason"] == "InvalidTokenSecret"
    assert TOKEN not in json.dumps(status(kube, ns))
    assert condition(kube, ns, "Active") is None  # never active yet: no Active condition
    assert not monitored(kube, ns)  # the injector is not called for this namespace
    assert clean(kube.get(DEPLOYMENTS, "waiting", ns))
    table = cluster.kubectl("get", "lumigoes", "-n", ns)
    assert PREFIX.strip() in table  # the printer column says what to fix

    # Fixing the Secret activates the Lumigo and instruments what exists.
    cluster.kubectl("delete", "secret", "lumigo-credentials", "-n", ns, "--ignore-not-found")
    create_token_secret(kube, ns, TOKEN)
    wait_until(lambda: is_active(kube, ns), 60, "Active after the fix")
    assert monitored(kube, ns)
    wait_until(lambda: instrumented(kube.get(DEPLOYMENTS, "waiting", ns)), 30, "instrumented")
    assert (condition(kube, ns, "Error") or {}).get("status") == "False"


def test_a_second_lumigo_is_denied_or_flagged(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    second = lumigo_yaml().replace('"name": "lumigo"}', '"name": "second"}')
    out = cluster.kubectl("apply", "-n", ns, "-f", "-", input=second, check=False)
    assert (
        "There is already an instance of operator.lumigo.io/v1alpha1.Lumigo in the "
        f"'{ns}' namespace"
    ) in out

    # Created anyway while the defaulter is not registered: the controller flags it.
    config = kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, operator.config_name)
    names = [w["name"] for w in config["webhooks"]]
    path = f"/webhooks/{names.index(constants.DEFAULTER_WEBHOOK_NAME)}"
    kube.json_patch(MUTATING_WEBHOOK_CONFIGURATIONS, operator.config_name,
                    [{"op": "remove", "path": path}])  # fmt: skip
    try:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=second)
    finally:
        defaulter = config["webhooks"][names.index(constants.DEFAULTER_WEBHOOK_NAME)]
        restore = [{"op": "add", "path": path, "value": defaulter}]
        kube.json_patch(MUTATING_WEBHOOK_CONFIGURATIONS, operator.config_name, restore)
    wait_until(
        lambda: (condition(kube, ns, "Error", "second") or {}).get("message")
        == "other Lumigo instances in this namespace",
        60, "the second Lumigo's Error",
    )  # fmt: skip
    assert (condition(kube, ns, "Active", "second") or {}).get("status") != "True"
    assert is_active(kube, ns)  # the oldest stays active


def test_deleted_lumigo_rolls_pods_back(
    operator: OperatorProcess, full_cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    body = workload(DEPLOYMENTS, "web")
    body["spec"]["replicas"] = 1
    kube.create(DEPLOYMENTS, body, ns)

    def pods() -> list[JSON]:
        items, _ = kube.list(PODS, ns)
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def running(injected: bool) -> bool:
        current = pods()
        return (
            len(current) == 1
            and current[0]["status"].get("phase") == "Running"
            and (
                "lumigo-injector"
                in [c["name"] for c in current[0]["spec"].get("initContainers", [])]
            )
            == injected
        )

    wait_until(lambda: running(injected=True), 90, "an injected Running pod")
    env = {e["name"]: e for e in pods()[0]["spec"]["containers"][0]["env"]}
    assert env["LD_PRELOAD"]["value"] == "/opt/lumigo/injector/lumigo_injector.so"
    assert env["LUMIGO_TRACER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "lumigo-credentials", "key": "token", "optional": True,
    }  # fmt: skip
    full_cluster.kubectl("delete", "lumigo", "lumigo", "-n", ns)
    wait_until(lambda: running(injected=False), 90, "the pod rolled back to un-injected")
    assert clean(kube.get(DEPLOYMENTS, "web", ns))


# --- lumigo.auto-trace=false on an instrumented workload (issue 16, item 1) --------------------

USER_LD_PRELOAD = {"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so.2"}


def _opt_out_namespace(operator: OperatorProcess, kube: KubeClient) -> str:
    """An Active namespace with a Deployment `web` (its own LD_PRELOAD) the webhook injected."""
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    kube.create(LUMIGOES, json.loads(lumigo_yaml()), ns)
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    body = workload(DEPLOYMENTS, "web")
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [USER_LD_PRELOAD]
    assert instrumented(kube.create(DEPLOYMENTS, body, ns))
    wait_until(lambda: listed(kube, ns) == ["web"], 30, "web listed as instrumented")
    return ns


def listed(kube: KubeClient, ns: str) -> list[str]:
    return [r["name"] for r in status(kube, ns).get("instrumentedResources", [])]


def set_auto_trace(kube: KubeClient, ns: str, value: str | None) -> JSON:
    patch = {"metadata": {"labels": {constants.LABEL_AUTO_TRACE: value}}}
    return kube.merge_patch(DEPLOYMENTS, "web", patch, ns)


def user_env(obj: JSON) -> list[JSON]:
    env: list[JSON] = obj["spec"]["template"]["spec"]["containers"][0].get("env", [])
    return env


def test_labelling_an_instrumented_workload_false_removes_it_through_the_webhook(
    operator: OperatorProcess, kube: KubeClient
) -> None:
    ns = _opt_out_namespace(operator, kube)

    stored = set_auto_trace(kube, ns, "false")  # the API server called the webhook on UPDATE

    assert clean(stored)
    assert stored["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == "false"
    assert user_env(stored) == [USER_LD_PRELOAD]
    assert "volumes" not in stored["spec"]["template"]["spec"]
    wait_until(
        lambda: has_event(kube, ns, "web", "LumigoRemovedInstrumentation",
                          f"injector webhook, acting on behalf of the '{ns}/lumigo'"),
        30, "the webhook's Removed event",
    )  # fmt: skip
    wait_until(lambda: listed(kube, ns) == [], 30, "web no longer listed")
    assert not any(e["type"] == "Warning" for e in events_of(kube, ns, "web"))

    stored = set_auto_trace(kube, ns, None)  # removing the label: instrumented again

    assert instrumented(stored)
    wait_until(lambda: listed(kube, ns) == ["web"], 30, "web listed again")


def test_the_controller_removes_it_when_the_webhook_was_not_consulted(
    operator: OperatorProcess, kube: KubeClient
) -> None:
    """Labelled `false` while the webhook did not see the update (down, or not selecting the
    namespace): the controller cleans the workload; removing the label re-instruments it."""
    ns = _opt_out_namespace(operator, kube)
    unselect = {"metadata": {"labels": {operator.selector_label: None}}}
    kube.merge_patch(NAMESPACES, ns, unselect)
    try:
        wait_until(lambda: not webhook_injects(kube, ns), 30, "the webhook no longer consulted")

        stored = set_auto_trace(kube, ns, "false")
        assert "lumigo-injector" in json.dumps(stored["spec"])  # the webhook did not act

        wait_until(lambda: clean(kube.get(DEPLOYMENTS, "web", ns)), 60, "the controller cleans it")
        stored = kube.get(DEPLOYMENTS, "web", ns)
        assert stored["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == "false"
        assert user_env(stored) == [USER_LD_PRELOAD]
        wait_until(
            lambda: has_event(kube, ns, "web", "LumigoRemovedInstrumentation",
                              f"controller, acting on behalf of the '{ns}/lumigo'"),
            30, "the controller's Removed event",
        )  # fmt: skip
        wait_until(lambda: listed(kube, ns) == [], 30, "web no longer listed")

        set_auto_trace(kube, ns, None)

        wait_until(lambda: instrumented(kube.get(DEPLOYMENTS, "web", ns)), 60, "re-instrumented")
        wait_until(
            lambda: has_event(kube, ns, "web", "LumigoAddedInstrumentation",
                              f"controller, acting on behalf of the '{ns}/lumigo'"),
            30, "the controller's Added event",
        )  # fmt: skip
        wait_until(lambda: listed(kube, ns) == ["web"], 30, "web listed again")
    finally:
        kube.merge_patch(
            NAMESPACES, ns, {"metadata": {"labels": {operator.selector_label: "true"}}}
        )


def webhook_injects(kube: KubeClient, ns: str) -> bool:
    """Whether a dry-run create in `ns` comes back injected (the API server calls the webhook)."""
    body = workload(DEPLOYMENTS, "probe")
    created = kube.request("POST", DEPLOYMENTS.path(ns), params={"dryRun": "All"}, body=body)
    return "lumigo-injector" in json.dumps(created)


# --- per-container control (issue 19, item 3) ----------------------------------------------


def test_the_controller_leaves_the_excluded_containers_of_existing_workloads_untraced(
    operator: OperatorProcess, full_cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    body = workload(DEPLOYMENTS, "web")
    body["metadata"]["annotations"] = {constants.ANNOTATION_EXCLUDE_CONTAINERS: "web, sidecar"}
    kube.create(DEPLOYMENTS, body, ns)
    create_token_secret(kube, ns, TOKEN)
    full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())

    def labelled() -> bool:
        labels = kube.get(DEPLOYMENTS, "web", ns)["metadata"].get("labels") or {}
        return constants.LABEL_AUTO_TRACE in labels

    wait_until(labelled, 60, "web instrumented")
    containers = kube.get(DEPLOYMENTS, "web", ns)["spec"]["template"]["spec"]["containers"]
    envs = {c["name"]: {e["name"] for e in c.get("env") or []} for c in containers}
    assert "LD_PRELOAD" in envs["app"]
    assert envs["web"] == set()
    # `sidecar` is no container of this workload: a Warning says so.
    wait_until(
        lambda: has_event(kube, ns, "web", constants.REASON_INVALID_CONTAINERS, "'sidecar'"),
        30,
        "the Warning about the unknown container",
    )


def admissions(operator: OperatorProcess, namespace: str) -> float:
    """Workload admissions the injector handled for `namespace` (lumigo_injections_total counts
    each, dry runs included), whatever other namespaces' workloads do meanwhile."""
    code, text = operator.probe("/metrics")
    assert code == 200, text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("lumigo_injections_total{") and f'namespace="{namespace}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def dry_run_create(kube: KubeClient, namespace: str, name: str, **labels: str) -> JSON:
    """A Deployment created with dryRun=All: admitted (webhooks called) but never stored, so no
    ReplicaSet follows and the injector's request count moves by this request only."""
    created: JSON = kube.request(
        "POST",
        DEPLOYMENTS.path(namespace),
        params={"dryRun": "All"},
        body=workload(DEPLOYMENTS, name, labels or None),
    )
    return created


def test_the_api_server_calls_the_injector_only_where_a_lumigo_is_active_or_a_workload_opted_in(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    """The injector's namespaceSelector needs the label the operator keeps on namespaces with an
    active Lumigo; its second entry takes workloads labelled lumigo.auto-trace=true elsewhere."""
    plain = operator.new_namespace()
    dry_run_create(kube, plain, "unmonitored")
    assert admissions(operator, plain) == 0  # no call at all
    dry_run_create(kube, plain, "opted-in", **{constants.LABEL_AUTO_TRACE: "true"})
    assert admissions(operator, plain) == 1  # the opted-in entry, once

    monitored_ns = operator.new_namespace()
    create_token_secret(kube, monitored_ns, TOKEN)
    cluster.kubectl("apply", "-n", monitored_ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: is_active(kube, monitored_ns), 60, "Active")
    assert monitored(kube, monitored_ns)
    assert instrumented(dry_run_create(kube, monitored_ns, "new"))
    assert admissions(operator, monitored_ns) == 1  # once, not once per entry


def test_the_opted_in_entry_sees_labelled_workloads_until_they_opt_out(
    operator: OperatorProcess, full_cluster: LocalCluster, kube: KubeClient
) -> None:
    """Where no Lumigo is active, the injector is called for workloads carrying the
    lumigo.auto-trace label whatever its value (injection rewrites `true` to the version, so a
    later `false` must still reach it), and not for those that stay opted out or are unlabelled.
    Each PATCH waits for the Deployment controller's status write (it always runs: full mode):
    a PATCH that races it conflicts, and the API server's retry calls the webhook again (CI once
    counted 3 calls for 2)."""
    label = constants.LABEL_AUTO_TRACE
    ns = operator.new_namespace()

    def touch(name: str, labels: dict[str, str] | None = None) -> JSON:
        def observed() -> bool:
            meta_status = kube.get(DEPLOYMENTS, name, ns)
            seen = meta_status.get("status", {}).get("observedGeneration")
            return bool(seen == meta_status["metadata"]["generation"])

        wait_until(observed, 60, f"the Deployment controller observed {name}")
        patch: JSON = {"metadata": {"annotations": {"touched": name}}}
        if labels:
            patch["metadata"]["labels"] = labels
        updated: JSON = kube.merge_patch(DEPLOYMENTS, name, patch, ns)
        return updated

    create(kube, ns, DEPLOYMENTS, "plain")
    touch("plain")
    create(kube, ns, DEPLOYMENTS, "out", **{label: "false"})
    touch("out")
    assert admissions(operator, ns) == 0  # unlabelled, or opted out and staying so: no call

    assert instrumented(create(kube, ns, DEPLOYMENTS, "app", **{label: "true"}))
    assert admissions(operator, ns) == 1
    assert instrumented(touch("app"))  # labelled with the version: the handler decides
    assert admissions(operator, ns) == 2
    assert clean(touch("app", {label: "false"}))  # the opt-out: instrumentation removed
    assert admissions(operator, ns) == 3
    touch("app")
    assert admissions(operator, ns) == 3  # opted out and staying so: no call
    assert instrumented(touch("app", {label: "true"}))
    assert admissions(operator, ns) == 4


def test_the_api_server_spares_the_injector_the_operators_own_writes_and_deployments_replicasets(
    operator: OperatorProcess, cluster: LocalCluster, kube: KubeClient
) -> None:
    """The injector's matchConditions: the operator instrumenting an existing Deployment (its
    write carries the instrumentation already) and a ReplicaSet a Deployment owns (the
    Deployment is instrumented instead) cause no call; a user's update and a bare ReplicaSet do."""
    ns = operator.new_namespace()
    kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, "existing"), ns)
    create_token_secret(kube, ns, TOKEN)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    wait_until(lambda: instrumented(kube.get(DEPLOYMENTS, "existing", ns)), 60, "instrumented")
    assert admissions(operator, ns) == 0  # the operator's own update: no call

    # Someone else's update is reviewed, and keeps the instrumentation.
    existing = kube.get(DEPLOYMENTS, "existing", ns)
    existing["spec"]["template"]["metadata"].setdefault("annotations", {})["rev"] = "2"
    assert instrumented(kube.replace(DEPLOYMENTS, existing, ns))
    assert admissions(operator, ns) == 1

    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "existing",
             "uid": existing["metadata"]["uid"], "controller": True}  # fmt: skip
    owned = workload(REPLICASETS, "existing-5d4f8")
    owned["metadata"]["ownerReferences"] = [owner]
    kube.request("POST", REPLICASETS.path(ns), params={"dryRun": "All"}, body=owned)
    assert admissions(operator, ns) == 1  # a Deployment's ReplicaSet: no call
    bare = kube.request("POST", REPLICASETS.path(ns), params={"dryRun": "All"},
                        body=workload(REPLICASETS, "bare"))  # fmt: skip
    assert instrumented(bare)
    assert admissions(operator, ns) == 2
