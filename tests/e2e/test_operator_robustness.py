"""SIGKILL the operator at random points while it instruments 200 workloads; users keep editing.

Every workload must end up instrumented exactly once, and every change a user made while the
operator was dying and restarting must survive.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from controller.runtime.kube import KubeClient
from envtest.cluster import LocalCluster
from envtest.operator import OperatorProcess
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS
from kube.rest import ApiError
from tests.support.checks import TOKEN, instrumented, is_active, lumigo_yaml, status
from tests.support.lumigo import create_token_secret
from tests.support.workloads import pod_spec, workload

COUNT = 200
EDITED = range(0, COUNT, 5)  # every fifth workload gets a user change during the chaos


def test_random_kills_during_inject_existing_converge_without_losing_user_changes(
    cluster: LocalCluster, kube: KubeClient, crd: Path
) -> None:
    seed = int(os.environ.get("LUMIGO_CHAOS_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    print(f"chaos seed {seed} (set LUMIGO_CHAOS_SEED to replay)")
    op = OperatorProcess(cluster, kube, extra_args=("--inject-concurrency=4",)).setup()
    try:
        op.start().wait_ready()
        ns = op.new_namespace()
        names = [f"app-{i:03d}" for i in range(COUNT)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: kube.create(DEPLOYMENTS, workload(DEPLOYMENTS, n), ns), names))
        create_token_secret(kube, ns, TOKEN)
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=lumigo_yaml())

        edits_done = threading.Event()
        edit_errors: list[BaseException] = []

        def user_edits() -> None:
            try:
                for i in EDITED:

                    def edit(obj: dict[str, Any], i: int = i) -> dict[str, Any]:
                        obj["metadata"].setdefault("labels", {})["edited-by"] = "user"
                        container = pod_spec(obj)["containers"][0]
                        container.setdefault("env", []).append(
                            {"name": "USER_SETTING", "value": f"v{i}"}
                        )
                        return obj

                    kube.update_with_retry(DEPLOYMENTS, names[i], ns, edit)
                    time.sleep(rng.uniform(0, 0.05))
            except BaseException as err:  # reported by the main thread
                edit_errors.append(err)
            finally:
                edits_done.set()

        editor = threading.Thread(target=user_edits, daemon=True)
        editor.start()
        for _ in range(4):  # kill at random points of the inject-existing pass, then restart
            time.sleep(rng.uniform(0.2, 2.5))
            op.kill()
            op.start().wait_ready()
        wait_until(edits_done.is_set, 120, "the user's edits to finish")
        assert not edit_errors, edit_errors

        def converged() -> bool:
            try:
                items, _ = kube.list(DEPLOYMENTS, ns)
            except ApiError:
                return False
            return len(items) == COUNT and all(instrumented(o) for o in items)

        wait_until(converged, 180, "every workload instrumented")
        wait_until(lambda: is_active(kube, ns), 30, "the Lumigo to be Active")
        wait_until(lambda: len(status(kube, ns).get("instrumentedResources", [])) == COUNT, 60,
                   f"{COUNT} instrumented resources in the status")  # fmt: skip
        items, _ = kube.list(DEPLOYMENTS, ns)
        by_name = {o["metadata"]["name"]: o for o in items}
        for i, name in enumerate(names):
            obj = by_name[name]
            spec = pod_spec(obj)
            assert [v["name"] for v in spec["volumes"]].count("lumigo-injector") == 1, name
            for container in spec["containers"]:
                env = [e["name"] for e in container.get("env", [])]
                assert len(env) == len(set(env)), f"{name}: duplicated env {env}"
            if i in EDITED:
                assert obj["metadata"]["labels"]["edited-by"] == "user", name
                first = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
                assert first["USER_SETTING"] == f"v{i}", name
        assert op.starts == 5
    finally:
        op.teardown()
