"""`monitoredNamespaces: all` (issue 17, item 6) on the real node: `helm install` with a token
gives every eligible namespace the token Secret and an Active `lumigo` Lumigo; namespaces created
since get theirs at the next `helm upgrade`, while the existing ones, a namespace labelled
`lumigo.auto-trace=false` and a namespace with its own Lumigo and Secret are left as they are.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.node.conftest import NodeHolder
from tests.support.packaging import CHART, ROOT, HelmRelease, get_json
from tests.support.product import (
    OPERATOR_NS,
    RELEASE,
    Product,
    apply_readme,
    helm_values,
    node_cluster,
    node_sink,
    wait_defaulter,
    wait_for,
)

JSON = dict[str, Any]
TOKEN = f"t_{uuid.uuid4().hex[:21]}"
OWN_TOKEN = f"t_{uuid.uuid4().hex[:21]}"
SAMPLE = ROOT / "config" / "samples" / "operator_v1alpha1_lumigo.yaml"
SYSTEM = {"kube-system", "kube-public", "kube-node-lease", OPERATOR_NS}


def lumigoes(product: Product) -> dict[str, JSON]:
    """namespace -> its `lumigo` Lumigo."""
    items = get_json(product.cluster, "lumigoes", "-A")["items"]
    return {i["metadata"]["namespace"]: i for i in items if i["metadata"]["name"] == "lumigo"}


def active(lumigo: JSON) -> bool:
    conditions = (lumigo.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)


def namespaces(product: Product) -> set[str]:
    return {n["metadata"]["name"] for n in get_json(product.cluster, "namespaces")["items"]}


def test_all_namespaces_get_a_lumigo_on_install_and_new_ones_on_upgrade(
    node_holder: NodeHolder,
) -> None:
    with node_cluster(node_holder) as (cluster, node, built):
        images = {name: str(entry["ref"]) for name, entry in built.items()}
        sink = node_sink(node.node_ip)
        release = HelmRelease(cluster, RELEASE, OPERATOR_NS)
        product = Product(cluster, node, release, sink, images)
        try:
            for name in ("team-a", "team-b"):
                product.new_namespace(name)
            product.new_namespace("untraced", {"lumigo.auto-trace": "false"})
            quick_start = [
                "--set",
                "monitoredNamespaces=all",
                "--set",
                f"lumigoToken.value={TOKEN}",
            ]
            release.install("--create-namespace", *helm_values(images, product.sink_url),
                            *quick_start)  # fmt: skip
            wait_defaulter(product, "default")

            eligible = namespaces(product) - SYSTEM - {"untraced"}
            assert {"team-a", "team-b", "default"} <= eligible
            wait_for(lambda: set(lumigoes(product)) == eligible and all(
                active(lu) for lu in lumigoes(product).values()), 120,
                "an Active Lumigo in every eligible namespace")  # fmt: skip
            secret = get_json(cluster, "secret", "lumigo-credentials", "-n", "team-a")
            assert secret["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
            before = {ns: lu["metadata"]["uid"] for ns, lu in lumigoes(product).items()}

            # Since the install: a new namespace, and one with its own Secret and Lumigo.
            product.new_namespace("team-c")
            product.new_namespace("own")
            apply_readme(product, "own", OWN_TOKEN)
            # The seed README's sample, labelled app.kubernetes.io/instance=lumigo (the release's
            # name), with a Secret of another name: still the user's own.
            product.new_namespace("sample")
            sample = SAMPLE.read_text().replace("t_123456789012345678901", OWN_TOKEN)
            sample = sample.replace("lumigo-credentials", "my-token")
            product.kubectl("apply", "-n", "sample", "-f", "-", input=sample)
            own_uid = lumigoes(product)["own"]["metadata"]["uid"]
            release.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--wait",
                         "--timeout", "180s")  # fmt: skip

            wait_for(lambda: active(lumigoes(product).get("team-c", {})), 120,
                     "team-c's Lumigo Active after the upgrade")  # fmt: skip
            after = lumigoes(product)
            assert {ns: after[ns]["metadata"]["uid"] for ns in before} == before  # not recreated
            assert after["own"]["metadata"]["uid"] == own_uid
            own_secret = get_json(cluster, "secret", "lumigo-credentials", "-n", "own")
            assert "meta.helm.sh/release-name" not in (own_secret["metadata"].get("annotations")
                                                       or {})  # fmt: skip
            assert "untraced" not in after
            secrets = get_json(cluster, "secrets", "-n", "sample")["items"]
            assert [x["metadata"]["name"] for x in secrets] == ["my-token"]  # nothing of ours
            assert not SYSTEM & set(after)
            print(json.dumps(sorted(after)))
        finally:
            sink.stop()
