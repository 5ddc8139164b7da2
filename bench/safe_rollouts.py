"""Safe rollouts on the real node: how long instrumenting 20 existing Deployments takes under a
rollout budget, and how long a crash-looping instrumented workload takes to be reverted.
Printed, never asserted.

Installs the chart with the images built here (tests/support/product.py), then:

1. budgets: for each budget (1, 3 and 0 = no limit), N Flask Deployments run untraced in a fresh
   namespace; `kubectl apply` of a Lumigo with that `maxConcurrentRollouts`; time until every
   Deployment has rolled out with the instrumentation (its one pod instrumented and Ready, no old
   pod left), and the most Deployments seen rolling at once (the API sampled every 0.5 s);
2. revert: R times, a fresh namespace with a Flask app that refuses to start when the tracer is
   loaded (tests/node/test_safe_rollouts.py); time from the Lumigo's apply to the revert
   annotation on the Deployment (p50, min, max), with the operator's defaults (3 restarts).

    .venv/bin/python bench/safe_rollouts.py [--deployments 20] [--budgets 1,3,0] [--reverts 5]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from typing import Any

from api import constants
from bench import benchkit
from tests.node.test_safe_rollouts import CONFLICT_APP
from tests.support.packaging import get_json
from tests.support.product import (
    Product,
    deployment,
    installed_product,
    rolled_out,
    wait_defaulter,
)

ROOT = benchkit.ROOT

JSON = dict[str, Any]
ROLLOUT_TIMEOUT = 1800.0  # seconds for every Deployment to roll out instrumented
REVERT_TIMEOUT = 600.0  # seconds for the failing Deployment to be reverted


def apply_lumigo(product: Product, ns: str, budget: int | None = None) -> None:
    token = f"t_{uuid.uuid4().hex[:21]}"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lumigo-credentials"},
              "stringData": {"token": token}}  # fmt: skip
    spec: JSON = {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}}
    if budget is not None:
        spec["tracing"] = {"injection": {"maxConcurrentRollouts": budget}}
    lumigo = {"apiVersion": "operator.lumigo.io/v1alpha1", "kind": "Lumigo",
              "metadata": {"name": "lumigo"}, "spec": spec}  # fmt: skip
    for obj in (secret, lumigo):
        product.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))


def has_injection(obj: JSON) -> bool:
    inits = obj["spec"]["template"]["spec"].get("initContainers") or []
    return any(c["name"] == constants.INJECTOR_INIT_CONTAINER for c in inits)


def rolled(obj: JSON) -> bool:
    st = obj.get("status") or {}
    return (
        st.get("observedGeneration", 0) >= obj["metadata"]["generation"]
        and st.get("updatedReplicas", 0) == 1
        and st.get("availableReplicas", 0) == 1
        and st.get("replicas", 0) == 1
    )


def budget_run(product: Product, count: int, budget: int) -> JSON:
    ns = product.new_namespace(f"budget-{budget}-{uuid.uuid4().hex[:4]}")
    names = [f"app-{i:02d}" for i in range(count)]
    for name in names:
        obj = deployment(name, product.images["python-app"])
        product.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))
    for name in names:
        rolled_out(product, ns, name, timeout=600)
    start = time.monotonic()
    apply_lumigo(product, ns, budget)
    most = 0
    while time.monotonic() - start < ROLLOUT_TIMEOUT:
        items = get_json(product.cluster, "deployments", "-n", ns)["items"]
        rolling = [d for d in items if has_injection(d) and not rolled(d)]
        most = max(most, len(rolling))
        if len(items) == count and all(has_injection(d) and rolled(d) for d in items):
            break
        time.sleep(0.5)
    total = time.monotonic() - start
    product.kubectl("delete", "namespace", ns, "--wait=false")
    return {"budget": budget, "deployments": count, "total_s": round(total, 1),
            "most_rolling_at_once": most}  # fmt: skip


def revert_run(product: Product) -> float:
    ns = product.new_namespace(f"revert-{uuid.uuid4().hex[:6]}")
    body = deployment("conflict", product.images["python-app"])
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python3", "-c", CONFLICT_APP]
    product.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
    rolled_out(product, ns, "conflict")
    start = time.monotonic()
    apply_lumigo(product, ns)
    while time.monotonic() - start < REVERT_TIMEOUT:
        obj = get_json(product.cluster, "deployment", "conflict", "-n", ns)
        if constants.ANNOTATION_REVERTED in (obj["metadata"].get("annotations") or {}):
            break
        time.sleep(0.5)
    took = time.monotonic() - start
    product.kubectl("delete", "namespace", ns, "--wait=false")
    return took


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--deployments", type=int, default=20)
    parser.add_argument("--budgets", default="1,3,0")
    parser.add_argument("--reverts", type=int, default=5)
    args = parser.parse_args()
    results: JSON = {"budgets": [], "reverts_s": []}
    for product in installed_product(None):
        wait_defaulter(product, "default")
        for budget in [int(b) for b in args.budgets.split(",") if b]:
            run = budget_run(product, args.deployments, budget)
            print(json.dumps(run), flush=True)
            results["budgets"].append(run)
        for i in range(args.reverts):
            took = revert_run(product)
            print(f"revert run {i + 1}: {took:.1f} s", flush=True)
            results["reverts_s"].append(round(took, 1))
    if results["reverts_s"]:
        values = results["reverts_s"]
        results["revert_p50_s"] = statistics.median(values)
        print(f"detect + revert: p50 {statistics.median(values):.1f} s, "
              f"min {min(values):.1f} s, max {max(values):.1f} s")  # fmt: skip
    out = benchkit.results_file("safe_rollouts")
    out.parent.mkdir(exist_ok=True)
    benchkit.save(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
