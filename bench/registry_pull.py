"""The autotrace image onto the real node: pulled from the local registry (cold) vs imported.

Starts a full local control plane, a real node (envtest/node) and the tier's registry
(envtest/registry: HTTPS from a private CA, basic auth), pushes the autotrace image's tar
(hack/build-images) and then, `--rounds` times each, alternately:
- pull: every name of the image removed from containerd (content and snapshots collected), a pod
  whose container is the image by digest, with a pull secret; the figure is the kubelet's own
  (its `Pulled` event: "Successfully pulled image ... in <duration>"), resolve + fetch + unpack;
- import: the same removal, then `ctr images import` of the tar (what the node tier does today),
  timed around the command, unpack included.
Needs the machine to itself: run it under `flock /tmp/node-tier.lock`.

    .venv/bin/python bench/registry_pull.py [--rounds 3]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import benchkit
from envtest.cluster import FAKE_NODE, LocalCluster
from envtest.node import LocalNode
from envtest.registry import LocalRegistry
from tests.support.product import built_images

NAMESPACE = "bench"
REPOSITORY = "lumigo/lumigo-autotrace"
PULLED = re.compile(r"Successfully pulled image \S+ in ([0-9.]+(?:ms|s|m[0-9.]*s?))")
DURATION = re.compile(r"([0-9.]+)(ms|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0}


def go_seconds(text: str) -> float:
    """A Go duration ("17.902s", "1m2.5s", "850ms") in seconds."""
    return sum(float(n) * _UNITS[unit] for n, unit in DURATION.findall(text))


def repository_of(ref: str) -> str:
    """`host:port/repo:tag` or `host/repo@digest` -> `host:port/repo`."""
    name = ref.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def forget(node: LocalNode, refs: tuple[str, ...], image_id: str, layers: list[str]) -> None:
    """Remove every name of `refs`' repositories (by tag and by digest), content and snapshots
    collected before returning: the next pull or import starts cold."""
    repositories = {repository_of(ref) for ref in refs}
    for name in node.ctr("images", "ls", "-q").split():
        # The CRI also names an image by its ID (`sha256:<config digest>`).
        if repository_of(name) in repositories or name == image_id:
            node.ctr("images", "rm", "--sync", name)
    left = set(node.ctr("content", "ls", "-q").split()) & set(layers)
    if left:
        raise SystemExit(f"not cold: containerd still holds {sorted(left)}")


def kubelet_pull_seconds(cluster: LocalCluster, image: str, name: str) -> float:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent"}],
            "imagePullSecrets": [{"name": "pull"}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        events = cluster.kubectl(
            "get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name}",
            "-o", "jsonpath={range .items[*]}{.message}{'\\n'}{end}",
        )  # fmt: skip
        match = PULLED.search(events)
        if match:  # gone with its containers, so that nothing holds the image's content
            cluster.kubectl("delete", "pod", "-n", NAMESPACE, name, "--timeout=120s")
            return go_seconds(match.group(1))
        time.sleep(0.2)
    raise SystemExit(f"pod {name}: no Pulled event after 300s:\n{events}")


def main() -> int:
    parser = benchkit.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    machine = benchkit.machine()
    entry = built_images(("autotrace",))["autotrace"]
    tar, local_ref = Path(entry["tar"]), entry["ref"]

    with (
        LocalCluster(full=True) as cluster,
        LocalRegistry() as registry,
        LocalNode(cluster) as node,
    ):
        cluster.kubectl("cordon", FAKE_NODE)
        started = time.monotonic()
        digest = registry.push(tar, REPOSITORY, "bench")
        push_s = time.monotonic() - started
        image = registry.ref(REPOSITORY, digest=digest)
        manifest = registry.skopeo(
            "inspect", "--raw", "--cert-dir", str(registry.cert_dir),
            "--authfile", str(registry.auth_file), f"docker://{image}",
        )  # fmt: skip
        layers = [layer["digest"] for layer in json.loads(manifest)["layers"]]
        image_id = json.loads(manifest)["config"]["digest"]
        node.trust_registry(registry.host, registry.ca_pem)
        cluster.kubectl("create", "namespace", NAMESPACE)
        secret = registry.pull_secret("pull", NAMESPACE)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))
        pulls, imports = [], []
        for i in range(args.rounds):
            forget(node, (image, local_ref), image_id, layers)
            pulls.append(kubelet_pull_seconds(cluster, image, f"pull-{i}"))
            forget(node, (image, local_ref), image_id, layers)
            began = time.monotonic()
            node.import_image(tar)
            imports.append(time.monotonic() - began)

    def summary(values: list[float]) -> dict[str, Any]:
        return {
            "median_s": round(statistics.median(values), 2),
            "all_s": [round(v, 2) for v in values],
        }

    result = {
        "image": local_ref,
        "tar_mib": round(tar.stat().st_size / 2**20, 1),
        "push_once_s": round(push_s, 2),
        "cold_pull_from_registry": summary(pulls),
        "ctr_import_of_tar": summary(imports),
        "machine": machine,
        "loadavg_after": list(os.getloadavg()),
    }
    print(json.dumps(result, indent=2))
    benchkit.save("registry_pull", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
