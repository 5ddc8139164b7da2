"""`make release` end to end: one release of the built images to a real registry on loopback
(envtest/registry.py: HTTPS from a private CA, basic auth), then what a user and a mirror see.

One registry and one `hack/release publish` for the module; the tests read what it pushed:
every image as an OCI index by tag and digest, the chart (static Helm repository and OCI) pinning
those digests, `helm template` naming images only by digest, the CSV's relatedImages, and
`hack/release verify` passing, then failing on a re-pushed tag (another image's content; the
same platforms under a re-written index) and on a missing SBOM.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import ssl
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import yaml

from envtest.registry import LocalRegistry
from tests.support.packaging import ROOT, helm, load_docs
from tests.support.product import built_images

pytestmark = pytest.mark.e2e

RELEASE = ROOT / "hack" / "release"
VERSION = "0.0.1-e2e"
PREFIX = "release"  # <registry>/release/lumigo/lumigo-operator, ...
IMAGES = {  # build-images name -> path under the registry prefix (the chart's repositories)
    "operator": "lumigo/lumigo-operator",
    "autotrace": "lumigo/lumigo-autotrace",
    "telemetry-proxy": "lumigo/lumigo-operator-telemetry-proxy",
    "kube-state-metrics": "kube-state-metrics/kube-state-metrics",
    "node-exporter": "prometheus/node-exporter",
}
BUNDLE = "lumigo/lumigo-operator-bundle"  # the OLM bundle image, released with them
INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def registry() -> Iterator[LocalRegistry]:
    with LocalRegistry() as started:
        yield started


@pytest.fixture(scope="module")
def release(registry: LocalRegistry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The record (release.json) of one `hack/release publish` to the registry."""
    built_images(tuple(IMAGES))
    subprocess.run([sys.executable, str(ROOT / "hack" / "install-tools"), "release"], check=True)
    out = tmp_path_factory.mktemp("release")
    proc = release_command("publish", registry, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    record: dict[str, Any] = json.loads((out / "release.json").read_text())
    return record


def release_command(
    command: str, registry: LocalRegistry, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RELEASE), command, "--registry", f"{registry.host}/{PREFIX}",
         "--version", VERSION, "--auth-file", str(registry.auth_file),
         "--ca-file", str(registry.ca_file), *args],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


def raw(registry: LocalRegistry, ref: str) -> bytes:
    return registry.skopeo(
        "inspect", "--raw", "--cert-dir", str(registry.cert_dir),
        "--authfile", str(registry.auth_file), f"docker://{ref}",
    ).encode()  # fmt: skip


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pinned_refs(registry: LocalRegistry, release: dict[str, Any]) -> set[str]:
    return {
        f"{registry.host}/{PREFIX}/{path}@{release['images'][name]['digest']}"
        for name, path in IMAGES.items()
    }


def test_every_image_is_an_oci_index_by_tag_and_by_digest(
    registry: LocalRegistry, release: dict[str, Any]
) -> None:
    assert set(release["images"]) == {*IMAGES, "bundle"}
    for name, path in {**IMAGES, "bundle": BUNDLE}.items():
        recorded = release["images"][name]
        by_tag = raw(registry, registry.ref(f"{PREFIX}/{path}", tag=VERSION))
        assert digest_of(by_tag) == recorded["digest"], name
        index = json.loads(
            raw(registry, registry.ref(f"{PREFIX}/{path}", digest=recorded["digest"]))
        )
        assert index["mediaType"] == INDEX, name
        platforms = {
            (m["platform"]["os"], m["platform"]["architecture"]): m for m in index["manifests"]
        }
        assert set(platforms) == {("linux", "amd64")}, name
        entry = platforms["linux", "amd64"]
        assert entry["digest"] == recorded["platforms"]["amd64"]["digest"], name
        manifest = json.loads(
            raw(registry, registry.ref(f"{PREFIX}/{path}", digest=entry["digest"]))
        )
        assert manifest["mediaType"] == OCI_MANIFEST, name
        assert manifest["layers"], name


def test_the_helm_repository_and_the_oci_chart_pin_every_image_by_digest(
    registry: LocalRegistry, release: dict[str, Any], tmp_path: Path
) -> None:
    wanted = pinned_refs(registry, release)
    repository = Path(release["chart"]["repository"])
    index = yaml.safe_load((repository / "index.yaml").read_text())
    (entry,) = index["entries"]["lumigo-operator"]
    assert entry["version"] == VERSION
    listed = {i["image"] for i in yaml.safe_load(entry["annotations"]["artifacthub.io/images"])}
    assert listed == wanted
    with static_server(repository) as url:  # what `helm repo add <url>` reads
        from_repo = helm("show", "values", "lumigo-operator", "--repo", url,
                         "--version", VERSION).stdout  # fmt: skip
    from_oci = helm(
        "show", "values", f"oci://{registry.host}/{PREFIX}/charts/lumigo-operator",
        "--version", VERSION, "--ca-file", str(registry.ca_file),
        "--registry-config", str(registry.auth_file),
    ).stdout  # fmt: skip
    for values in (yaml.safe_load(from_repo), yaml.safe_load(from_oci)):
        assert image_refs_in_values(values) == wanted


def test_the_released_chart_renders_images_only_by_digest(
    registry: LocalRegistry, release: dict[str, Any]
) -> None:
    rendered = helm(
        "template", "lumigo", release["chart"]["package"], "--namespace", "lumigo-system"
    ).stdout  # fmt: skip
    refs = set(image_refs(load_docs(rendered)))
    assert refs, "no image in the rendered chart"
    assert all("@sha256:" in ref for ref in refs), sorted(refs)
    assert refs <= pinned_refs(registry, release), sorted(refs - pinned_refs(registry, release))
    # the operator, the autotrace (manager env) and the proxy at least are there
    assert len(refs) >= 3


def test_the_bundle_csv_relates_every_image_by_digest(
    registry: LocalRegistry, release: dict[str, Any]
) -> None:
    csv_file = Path(release["bundle"]) / "manifests" / "lumigo-operator.clusterserviceversion.yaml"
    csv = yaml.safe_load(csv_file.read_text())
    assert csv["spec"]["version"] == VERSION
    related = {i["image"] for i in csv["spec"]["relatedImages"]}
    assert related <= pinned_refs(registry, release)
    assert all("@sha256:" in ref for ref in image_refs([csv])), sorted(image_refs([csv]))
    # the bundle image: the same CSV, labelled as a registry+v1 bundle
    manifest = release["images"]["bundle"]["platforms"]["amd64"]["digest"]
    bundle_image = registry.ref(f"{PREFIX}/{BUNDLE}", digest=manifest)
    labels = json.loads(
        registry.skopeo(
            "inspect", "--cert-dir", str(registry.cert_dir), "--authfile",
            str(registry.auth_file), f"docker://{bundle_image}",
        )
    )["Labels"]  # fmt: skip
    assert labels["operators.operatorframework.io.bundle.mediatype.v1"] == "registry+v1"


def test_verify_release_passes_then_fails_on_a_repushed_tag_or_a_missing_sbom(
    registry: LocalRegistry, release: dict[str, Any]
) -> None:
    key = ["--key", release["public_key"]]
    passed = release_command("verify", registry, *key)
    assert passed.returncode == 0, passed.stderr[-4000:]

    # Another image's content under kube-state-metrics' tag: its signature no longer applies.
    ksm = f"{PREFIX}/{IMAGES['kube-state-metrics']}"
    node_exporter = f"{PREFIX}/{IMAGES['node-exporter']}"
    registry.copy(f"docker://{registry.ref(node_exporter, tag=VERSION)}", ksm, VERSION,
                  all_images=True)  # fmt: skip
    tampered = release_command("verify", registry, *key)
    assert tampered.returncode != 0
    assert failed_images(tampered.stderr) == {ksm}, tampered.stderr[-4000:]
    signed = registry.ref(ksm, digest=release["images"]["kube-state-metrics"]["digest"])
    registry.copy(f"docker://{signed}", ksm, VERSION, all_images=True)
    assert release_command("verify", registry, *key).returncode == 0

    # The proxy's index re-written (same platform manifests, so their SBOMs still verify): only
    # the index's signature can tell.
    proxy = f"{PREFIX}/{IMAGES['telemetry-proxy']}"
    index = json.loads(raw(registry, registry.ref(proxy, tag=VERSION)))
    index["annotations"] = {"org.opencontainers.image.description": "not what was signed"}
    put_manifest(registry, proxy, VERSION, json.dumps(index).encode(), INDEX)
    rewritten = release_command("verify", registry, *key)
    assert rewritten.returncode != 0
    assert failed_images(rewritten.stderr) == {proxy}, rewritten.stderr[-4000:]
    signed = registry.ref(proxy, digest=release["images"]["telemetry-proxy"]["digest"])
    registry.copy(f"docker://{signed}", proxy, VERSION, all_images=True)

    # The SBOM attestation of the operator's amd64 manifest deleted.
    operator = f"{PREFIX}/{IMAGES['operator']}"
    manifest = release["images"]["operator"]["platforms"]["amd64"]["digest"]
    attestation = registry.ref(operator, tag=manifest.replace(":", "-") + ".att")
    registry.skopeo("delete", "--cert-dir", str(registry.cert_dir),
                    "--authfile", str(registry.auth_file), f"docker://{attestation}")  # fmt: skip
    no_sbom = release_command("verify", registry, *key)
    assert no_sbom.returncode != 0
    assert failed_images(no_sbom.stderr) == {operator}, no_sbom.stderr[-4000:]


def put_manifest(
    registry: LocalRegistry, repository: str, tag: str, body: bytes, media_type: str
) -> None:
    """PUT a manifest as any registry client can (basic auth, the registry's CA)."""
    request = urllib.request.Request(
        f"https://{registry.host}/v2/{repository}/manifests/{tag}",
        data=body,
        method="PUT",
        headers={"Content-Type": media_type, "Authorization": basic_auth(registry)},
    )
    context = ssl.create_default_context(cafile=str(registry.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        assert response.status == HTTPStatus.CREATED


def basic_auth(registry: LocalRegistry) -> str:
    token = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    return f"Basic {token}"


def failed_images(stderr: str) -> set[str]:
    """The repositories (registry host dropped) of the `FAILED <ref>: ...` lines of a verify."""
    failed = set()
    for line in stderr.splitlines():
        if line.startswith("[release] FAILED "):
            ref = line.removeprefix("[release] FAILED ").split(": ", 1)[0]
            repository = ref.split("/", 1)[1].split("@", 1)[0]
            failed.add(repository.rsplit(":", 1)[0] if ":" in repository else repository)
    return failed


def image_refs_in_values(values: dict[str, Any]) -> set[str]:
    """`repository@digest` of every image block (a dict with repository and digest) in values."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "repository" in node and node.get("digest"):
                found.add(f"{node['repository']}@{node['digest']}")
            for value in node.values():
                walk(value)

    walk(values)
    return found


def image_refs(docs: list[dict[str, Any]]) -> list[str]:
    """Every container image, image-valued env var and `--*-image=` argument in the objects."""
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("image"), str):
                refs.append(node["image"])
            if str(node.get("name", "")).endswith("_IMAGE") and isinstance(node.get("value"), str):
                refs.append(node["value"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and node.startswith("--") and "-image=" in node:
            refs.append(node.split("=", 1)[1])

    walk(docs)
    return refs


class static_server:
    """A plain static HTTP server on loopback for a directory: any web server a user has."""

    def __init__(self, directory: Path) -> None:
        handler = functools.partial(QuietHandler, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass
