"""Automatic revert on the real node (issue 16, item 3): a Python app that crashes only when the
tracer loads is reverted and left alone, a healthy app in the same namespace stays traced, an app
that was crashing before is never reverted, and removing the mark retries once.

The conflicting app is the Flask test image with a start-up check, the way an app that pins its
own OpenTelemetry would refuse the one the tracer loads: real containers, a real CrashLoopBackOff
seen by a real kubelet, the operator's defaults (3 restarts, watched for 10 min).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api import constants
from envtest.operator import metrics_reader_token, scrape
from tests.node.conftest import NodeHolder
from tests.support.packaging import get_json
from tests.support.product import (
    OPERATOR_NS,
    Product,
    apply_readme,
    deployment,
    http_get,
    installed_product,
    rolled_out,
    wait_for,
)

JSON = dict[str, Any]
NS = "rollouts"
TOKEN = f"t_{uuid.uuid4().hex[:21]}"
# Refuses to start with an OpenTelemetry it did not pin (the tracer's), else runs the Flask app.
CONFLICT_APP = """
import runpy, sys
pinned = ("opentelemetry", "lumigo_opentelemetry")
theirs = sorted(m for m in sys.modules if m.split(".")[0] in pinned)
if theirs:
    sys.exit("dependency conflict: this app pins its own OpenTelemetry, found " + theirs[0])
runpy.run_path("/app/app.py", run_name="__main__")
"""
ALWAYS_FAILING_APP = "import sys; sys.exit('cannot reach my database')"


@pytest.fixture(scope="module")
def product(node_holder: NodeHolder) -> Iterator[Product]:
    yield from installed_product(node_holder)


def app(name: str, image: str, code: str | None = None) -> JSON:
    body = deployment(name, image)
    if code is not None:
        body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python3", "-c", code]
    return body


def workload(product: Product, name: str) -> JSON:
    return get_json(product.cluster, "deployment", name, "-n", NS)


def annotation(obj: JSON, key: str) -> str | None:
    value = (obj["metadata"].get("annotations") or {}).get(key)
    return None if value is None else str(value)


def has_injection(obj: JSON) -> bool:
    inits = obj["spec"]["template"]["spec"].get("initContainers") or []
    return any(c["name"] == "lumigo-injector" for c in inits)


def reverted(product: Product, name: str) -> JSON | None:
    obj = workload(product, name)
    return obj if annotation(obj, constants.ANNOTATION_REVERTED) else None


def revert_events(product: Product, name: str) -> list[JSON]:
    selector = f"involvedObject.name={name},reason={constants.REASON_REVERTED}"
    items = get_json(product.cluster, "events", "-n", NS, "--field-selector", selector)["items"]
    return list(items)


def injected_pod_restarts(product: Product, name: str) -> int:
    return max(
        (
            c.get("restartCount", 0)
            for p in product.pods(NS, f"app={name}")
            if any(i["name"] == "lumigo-injector" for i in p["spec"].get("initContainers") or [])
            for c in p["status"].get("containerStatuses") or []
        ),
        default=0,
    )


def reverts_metric(product: Product) -> float:
    """From the operator pod's secure /metrics, as Prometheus scrapes it: HTTPS with the token
    of a ServiceAccount bound to the metrics-reader rules."""
    (pod,) = product.pods(OPERATOR_NS, "control-plane=controller-manager")
    token = metrics_reader_token(product.cluster, NS, "revert-metrics-reader")
    status, text = scrape(8080, secure=True, token=token, timeout=10, host=pod["status"]["podIP"])
    assert status == 200, text
    wanted = f'lumigo_instrumentation_reverts_total{{kind="Deployment",namespace="{NS}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(wanted))  # fmt: skip


@pytest.fixture(scope="module")
def namespace(product: Product) -> str:
    """Three apps running before the Lumigo: healthy, crashing only when traced, always failing."""
    product.new_namespace(NS)
    image = product.images["python-app"]
    for body in (
        app("healthy", image),
        app("conflict", image, CONFLICT_APP),
        app("failing", image, ALWAYS_FAILING_APP),
    ):
        product.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(body))
    rolled_out(product, NS, "healthy")
    rolled_out(product, NS, "conflict")  # untraced, the conflicting app is fine
    wait_for(
        lambda: any(
            c.get("restartCount", 0) >= 1
            for p in product.pods(NS, "app=failing")
            for c in p["status"].get("containerStatuses") or []
        ),
        120,
        "the failing app crash-looping",
    )
    return NS


def test_an_app_crashing_only_when_traced_is_reverted_while_a_healthy_one_stays_traced(
    product: Product, namespace: str
) -> None:
    started = time.monotonic()
    apply_readme(product, namespace, TOKEN)
    obj = wait_for(lambda: reverted(product, "conflict"), 300, "the conflicting app reverted",
                   interval=1)  # fmt: skip
    print(f"crash-looping app reverted {time.monotonic() - started:.1f} s after the Lumigo")
    # Back to the spec it had, marked with what was observed, and running again.
    reason = annotation(obj, constants.ANNOTATION_REVERTED)
    assert reason is not None
    assert "restarted" in reason, reason
    assert "conflict" in reason, reason
    assert not has_injection(obj)
    assert constants.LABEL_AUTO_TRACE not in (obj["metadata"].get("labels") or {})
    for key in (constants.ANNOTATION_INSTRUMENTED_GENERATION, constants.ANNOTATION_HEALTHY_BEFORE):
        assert annotation(obj, key) is None
    pod = rolled_out(product, namespace, "conflict")
    assert not pod["spec"].get("initContainers")
    # Told: a Warning event, the status with the reason, the metric.
    (event,) = revert_events(product, "conflict")
    assert event["type"] == "Warning"
    assert "while the pods before instrumentation were healthy" in event["message"]
    assert constants.ANNOTATION_REVERTED in event["message"]
    status = get_json(product.cluster, "lumigo", "lumigo", "-n", namespace)["status"]
    (listed,) = status["revertedResources"]
    assert (listed["kind"], listed["name"], listed["reason"]) == ("Deployment", "conflict", reason)
    assert "conflict" not in [r["name"] for r in status["instrumentedResources"]]
    assert reverts_metric(product) == 1

    # The healthy app stays instrumented and traced.
    healthy = workload(product, "healthy")
    assert has_injection(healthy)
    assert annotation(healthy, constants.ANNOTATION_REVERTED) is None
    assert annotation(healthy, constants.ANNOTATION_HEALTHY_BEFORE) == "true"
    pod = rolled_out(product, namespace, "healthy")
    name = pod["metadata"]["name"]

    def traced() -> list[Any]:
        http_get(product, namespace, name, "/")
        return [s for s in product.sink.spans() if s.resource.get("k8s.pod.name") == name]

    wait_for(traced, 120, "the healthy app's spans", interval=2)

    # The app that was failing before was instrumented (it asked for nothing else), and its
    # instrumented pods crash-loop too: it is never reverted.
    failing = workload(product, "failing")
    assert has_injection(failing)
    assert annotation(failing, constants.ANNOTATION_HEALTHY_BEFORE) == "false"
    wait_for(lambda: injected_pod_restarts(product, "failing") >= 3, 180,
             "the failing app's instrumented pods to crash-loop")  # fmt: skip
    time.sleep(12)  # two of the controller's checks (every 5 s while watching)
    failing = workload(product, "failing")
    assert has_injection(failing)
    assert annotation(failing, constants.ANNOTATION_REVERTED) is None
    assert revert_events(product, "failing") == []

    # Left alone afterwards: the controller's checks and resyncs do not instrument it again.
    time.sleep(10)
    obj = workload(product, "conflict")
    assert not has_injection(obj)
    assert annotation(obj, constants.ANNOTATION_REVERTED) == reason


def test_removing_the_mark_retries_once_and_a_second_failure_reverts_again(
    product: Product, namespace: str
) -> None:
    product.kubectl("annotate", "deployment", "conflict", "-n", namespace,
                    f"{constants.ANNOTATION_REVERTED}-")  # fmt: skip
    # The webhook instrumented it on that very update, and marked the new revision as watched.
    obj = workload(product, "conflict")
    assert has_injection(obj)
    assert annotation(obj, constants.ANNOTATION_HEALTHY_BEFORE) == "true"
    assert annotation(obj, constants.ANNOTATION_INSTRUMENTED_GENERATION) == str(
        obj["metadata"]["generation"]
    )
    obj = wait_for(lambda: reverted(product, "conflict"), 300, "the retry reverted", interval=1)
    assert not has_injection(obj)
    # One Warning per revert (their messages name different pods).
    events = revert_events(product, "conflict")
    assert [e["type"] for e in events] == ["Warning", "Warning"]
    assert reverts_metric(product) == 2
    rolled_out(product, namespace, "conflict")
