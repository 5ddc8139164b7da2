"""Safe rollouts (issue 16, item 2): the rollout budget, on a cluster whose controller-manager rolls
Deployments for real (kwok runs the pods), and the revert of a workload whose new pods the API
server refuses (a ResourceQuota, a LimitRange: issue 34, item 4). The crash-loop revert needs real
containers: it is tested on the real node (tests/node/test_safe_rollouts.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api import constants
from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DAEMONSETS, DEPLOYMENTS, STATEFULSETS
from kube.rest import ApiError, Resource
from tests.support.checks import TOKEN, condition, has_event, is_active, lumigo_yaml, status
from tests.support.lumigo import create_token_secret
from tests.support.workloads import workload

JSON = dict[str, Any]
COUNT = 20


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster, kube: KubeClient, crd: Path) -> Iterator[OperatorProcess]:
    cluster.start_full()  # the controller-manager rolls the Deployments, kwok runs the pods
    op = OperatorProcess(cluster, kube).setup()
    op.start().wait_ready()
    yield op
    op.teardown()


def has_injection(obj: JSON) -> bool:
    inits = obj["spec"]["template"]["spec"].get("initContainers") or []
    return any(c["name"] == "lumigo-injector" for c in inits)


def rolling(obj: JSON) -> bool:
    """Instrumented and not yet fully rolled out and available, by the Deployment's status
    (written here, not taken from the operator: the test must not share its definition)."""
    st = obj.get("status") or {}
    want = obj["spec"].get("replicas", 1)
    done = (
        st.get("observedGeneration", 0) >= obj["metadata"]["generation"]
        and st.get("updatedReplicas", 0) == want
        and st.get("availableReplicas", 0) == want
        and st.get("replicas", 0) == want
    )
    return has_injection(obj) and not done


def available_deployments(kube: KubeClient, ns: str, count: int) -> None:
    for i in range(count):
        body = workload(DEPLOYMENTS, f"app-{i:02d}")
        body["spec"]["replicas"] = 1
        kube.create(DEPLOYMENTS, body, ns)

    def all_available() -> bool:
        items, _ = kube.list(DEPLOYMENTS, ns)
        return len(items) == count and all(
            (d.get("status") or {}).get("availableReplicas") == 1 for d in items
        )

    wait_until(all_available, 120, f"{count} Deployments available")


class Sampler:
    """Samples the API every 100 ms: the most Deployments seen rolling with our injection at
    once, and the Lumigo statuses seen."""

    def __init__(self, kube: KubeClient, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.most_rolling = 0
        self.statuses: list[JSON] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            items, _ = self.kube.list(DEPLOYMENTS, self.ns)
            self.most_rolling = max(self.most_rolling, sum(1 for d in items if rolling(d)))
            with contextlib.suppress(ApiError):  # the Lumigo is not there yet
                self.statuses.append(status(self.kube, self.ns))
            time.sleep(0.1)


def all_instrumented_and_rolled_out(kube: KubeClient, ns: str) -> bool:
    items, _ = kube.list(DEPLOYMENTS, ns)
    return all(has_injection(d) and not rolling(d) for d in items)


def test_twenty_deployments_with_a_budget_of_three_never_have_more_than_three_rolling(
    operator: OperatorProcess, full_cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    available_deployments(kube, ns, COUNT)
    spec = {"tracing": {"injection": {"maxConcurrentRollouts": 3}}}
    with Sampler(kube, ns) as sampler:
        full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml(**spec))
        wait_until(lambda: all_instrumented_and_rolled_out(kube, ns), 300, "all instrumented")
        wait_until(
            lambda: (status(kube, ns).get("rollouts") or {}) == {"rolling": 0, "pending": 0},
            60,
            "the status to show no rollout",
        )
    assert 1 <= sampler.most_rolling <= 3, sampler.most_rolling
    # While it worked, the status said so: some waiting, at most three rolling.
    seen = [s.get("rollouts") or {} for s in sampler.statuses]
    assert any(r.get("pending", 0) > 0 for r in seen), seen[:20]
    assert max(r.get("rolling", 0) for r in seen) <= 3
    progressing = [
        c for s in sampler.statuses for c in s.get("conditions", [])
        if c["type"] == "Progressing" and c["status"] == "True"
    ]  # fmt: skip
    assert progressing
    assert "(maxConcurrentRollouts: 3)" in progressing[0]["message"]
    done = condition(kube, ns, "Progressing")
    assert done is not None
    assert done["status"] == "False", done
    assert len(status(kube, ns)["instrumentedResources"]) == COUNT
    # The columns of `kubectl get lumigo`.
    table = full_cluster.kubectl("get", "lumigo", "-n", ns).splitlines()
    assert table[0].split()[:6] == ["NAME", "ACTIVE", "ERROR", "ROLLING", "PENDING", "AGE"]
    assert table[1].split()[:4] == ["lumigo", "True", "0", "0"]
    # Each instrumented Deployment carries the generation our change produced.
    items, _ = kube.list(DEPLOYMENTS, ns)
    for d in items:
        annotations = d["metadata"]["annotations"]
        assert annotations[constants.ANNOTATION_INSTRUMENTED_GENERATION] == str(
            d["metadata"]["generation"]
        )
        assert annotations[constants.ANNOTATION_HEALTHY_BEFORE] == "true"


def test_without_a_budget_every_deployment_rolls_at_once(
    operator: OperatorProcess, full_cluster: LocalCluster, kube: KubeClient
) -> None:
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    available_deployments(kube, ns, 8)
    spec = {"tracing": {"injection": {"maxConcurrentRollouts": 0}}}
    full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml(**spec))
    wait_until(lambda: is_active(kube, ns), 60, "Active")
    # One pass instruments all eight: none was left pending.
    wait_until(lambda: len(status(kube, ns).get("instrumentedResources", [])) == 8, 60, "8 listed")
    items, _ = kube.list(DEPLOYMENTS, ns)
    assert all(has_injection(d) for d in items)


def test_a_bad_budget_is_refused_with_what_to_fix(
    operator: OperatorProcess, full_cluster: LocalCluster
) -> None:
    ns = operator.new_namespace()
    for bad in (-1, "3", True):
        body = json.loads(lumigo_yaml(tracing={"injection": {"maxConcurrentRollouts": bad}}))
        out = full_cluster.kubectl(
            "apply", "-n", ns, "-f", "-", input=json.dumps(body), check=False
        )
        assert "maxConcurrentRollouts" in out, out
        assert "lumigo.operator.lumigo.io/lumigo created" not in out, out


# --- pods the API server refuses ------------------------------------------------------------------

ONE_CPU_TENTH = {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}


def running(kube: KubeClient, ns: str, resource: Resource, name: str) -> JSON:
    """A one-pod workload whose app container asks for 100m CPU (request = limit), available."""
    body = workload(resource, name)
    body["spec"]["template"]["spec"]["containers"] = [
        {"name": "app", "image": "python:3.12-slim", "resources": ONE_CPU_TENTH}
    ]
    if resource is not DAEMONSETS:
        body["spec"]["replicas"] = 1
    kube.create(resource, body, ns)

    def available() -> bool:
        st = kube.get(resource, name, ns).get("status") or {}
        return bool(st.get("availableReplicas") or st.get("numberAvailable"))

    wait_until(available, 120, f"{resource.kind} {name} available")
    return kube.get(resource, name, ns)


def reverted(kube: KubeClient, ns: str, resource: Resource, name: str) -> str:
    """Wait for the revert mark; the template is un-instrumented, the reason is returned."""

    def marked() -> bool:
        annotations = kube.get(resource, name, ns)["metadata"].get("annotations") or {}
        return constants.ANNOTATION_REVERTED in annotations

    wait_until(marked, 120, f"{resource.kind} {name} reverted")
    obj = kube.get(resource, name, ns)
    assert not has_injection(obj), obj["spec"]["template"]
    return str(obj["metadata"]["annotations"][constants.ANNOTATION_REVERTED])


def test_a_limit_range_that_refuses_the_instrumented_pods_reverts_each_kind_with_its_reason(
    operator: OperatorProcess, full_cluster: LocalCluster, kube: KubeClient
) -> None:
    """The init container's CPU limit/request ratio (4 by default) is over this LimitRange's 2:
    the ReplicaSet, the StatefulSet and the DaemonSet each fail to create their new pod. The
    controller hears it from the Deployment's ReplicaFailure condition and from the other two's
    FailedCreate events, and puts the old template back."""
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    kinds = {DEPLOYMENTS: "web", STATEFULSETS: "db", DAEMONSETS: "agent"}
    for resource, name in kinds.items():
        running(kube, ns, resource, name)
    ratio = {"type": "Container", "maxLimitRequestRatio": {"cpu": "2"}}
    limit_range = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "ratio"},
                   "spec": {"limits": [ratio]}}  # fmt: skip
    full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(limit_range))
    full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    refusal = "cpu max limit to request ratio per Container is 2"
    for resource, name in kinds.items():
        reason = reverted(kube, ns, resource, name)
        assert reason.startswith(f"the API server refused the new pods of {resource.kind} {name}: ")
        assert refusal in reason, reason
        wait_until(
            lambda n=name: has_event(kube, ns, n, constants.REASON_REVERTED, refusal),  # type: ignore[misc]
            30,
            f"the revert event of {name}",
        )
    wait_until(lambda: len(status(kube, ns).get("revertedResources") or []) == 3, 60, "3 listed")
    listed = {r["name"]: r["reason"] for r in status(kube, ns)["revertedResources"]}
    assert all(refusal in listed[name] for name in kinds.values()), listed
    # Back to the un-instrumented pods, which the LimitRange lets through.
    wait_until(lambda: running_again(kube, ns, kinds), 120, "every workload available again")


def running_again(kube: KubeClient, ns: str, kinds: dict[Resource, str]) -> bool:
    for resource, name in kinds.items():
        st = kube.get(resource, name, ns).get("status") or {}
        if not (st.get("availableReplicas") or st.get("numberAvailable")):
            return False
    return True


def test_a_quota_the_instrumented_pods_exceed_reverts_with_the_quota_in_the_reason(
    operator: OperatorProcess, full_cluster: LocalCluster, kube: KubeClient
) -> None:
    """Room for the running pod and an un-instrumented surge pod (2 x 100m), not for an
    instrumented one, whose init container's 500m limit is the pod's CPU limit."""
    ns = operator.new_namespace()
    create_token_secret(kube, ns, TOKEN)
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu"},
             "spec": {"hard": {"limits.cpu": "250m"}}}  # fmt: skip
    full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(quota))
    running(kube, ns, DEPLOYMENTS, "web")
    full_cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())
    reason = reverted(kube, ns, DEPLOYMENTS, "web")
    assert "exceeded quota: cpu" in reason, reason
    assert "limited: limits.cpu=250m" in reason, reason
    # An ordinary rollout still fits the quota: the refusal was the instrumentation's.
    kube.merge_patch(
        DEPLOYMENTS, "web", {"spec": {"template": {"metadata": {"annotations": {"x": "1"}}}}}, ns
    )

    def rolled_out_plain() -> bool:
        obj = kube.get(DEPLOYMENTS, "web", ns)
        st = obj.get("status") or {}
        done = st.get("observedGeneration") == obj["metadata"]["generation"]
        return done and st.get("updatedReplicas") == 1 and not has_injection(obj)

    wait_until(rolled_out_plain, 120, "an un-instrumented rollout within the quota")
