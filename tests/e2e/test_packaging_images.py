"""Where every image comes from: `global.imageRegistry`, per-image `digest`, the pull secrets
(`global.imagePullSecrets`), a render that fails naming the value when an image could never be
pulled, kustomize's `images:` reaching the images passed in env, and on the full local cluster a
Helm install from a private registry whose injected autotrace image is pulled with the app
namespace's own secret (kwok runs the pods, so nothing is pulled: what is checked is what the
kubelet would be asked to pull, and with which credentials).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.cli import _parser
from controller.options import component_settings, run_options
from controller.runtime.kube import KubeClient
from controller.telemetry.agent import AgentTarget, agent_daemonset
from envtest.cluster import LocalCluster
from envtest.process import wait_until
from kube.kinds import DEPLOYMENTS, PODS, SECRETS
from tests.support.checks import is_active
from tests.support.packaging import (
    CHART,
    ROOT,
    HelmRelease,
    get_json,
    helm,
    helm_release,
    installed_operator,
    is_injected,
    load_docs,
    render_chart,
    run,
    tool,
)
from tests.support.workloads import workload

APP_VERSION = next(
    line.split(":", 1)[1].strip().strip('"')
    for line in (CHART / "Chart.yaml").read_text().splitlines()
    if line.startswith("appVersion:")
)
REGISTRY = "registry.test:5443/mirror"
DIGESTS = {
    "controllerManager.manager": "sha256:" + "1" * 64,
    "injectorWebhook.lumigoInjector": "sha256:" + "2" * 64,
    "telemetryProxy": "sha256:" + "3" * 64,
    "kubeStateMetrics": "sha256:" + "4" * 64,
    "prometheusNodeExporter": "sha256:" + "5" * 64,
}
SAMPLE = ROOT / "config" / "samples" / "operator_v1alpha1_lumigo.yaml"
TOKEN = "t_0123456789abcdef01234"  # well-formed, not a real token


def every_feature_on() -> dict[str, Any]:
    """Values that make the chart render every pod it can: cluster collection (kube-state-metrics,
    node-exporter), the quick start's hook Job, the uninstall hook."""
    return {
        "clusterCollection": {"logs": {"enabled": True}, "metrics": {"enabled": True}},
        "lumigoToken": {"value": TOKEN},
        "monitoredNamespaces": [{"namespace": "shop"}],
    }


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def with_digests() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path, digest in DIGESTS.items():
        node = values
        for key in path.split("."):
            node = node.setdefault(key, {})
        node["image"] = {"digest": digest}
    return values


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`<Kind>/<name>` -> pod spec of every workload rendered."""
    out = {}
    for doc in docs:
        spec = doc.get("spec") or {}
        template = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get(
            "template"
        )
        if template:
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = template["spec"]
    return out


def images(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Every image the render deploys or hands to the operator (env `*_IMAGE`), by where."""
    out = {}
    for where, spec in pod_specs(docs).items():
        for container in spec.get("initContainers", []) + spec["containers"]:
            out[f"{where}/{container['name']}"] = container["image"]
            for env in container.get("env", []):
                if env["name"].endswith("_IMAGE"):
                    out[f"{where}/{container['name']}/{env['name']}"] = env["value"]
    return out


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    return load_docs(render_chart("lumigo", "lumigo-system", values))


def test_global_image_registry_rewrites_every_image() -> None:
    """Operator, webhook, watchdog, hooks, proxy (and so the agent DaemonSet, which runs the
    proxy's image), kube-state-metrics, node-exporter and the injected autotrace image: each
    under the registry, the path after the original registry host kept."""
    default = images(render(every_feature_on()))
    rewritten = images(render(merged(every_feature_on(), {"global": {"imageRegistry": REGISTRY}})))
    assert set(rewritten) == set(default)
    assert len(set(default.values())) == 5, default  # every distinct image is covered below
    v = f"v{APP_VERSION}"
    expected = {
        f"quay.io/lumigo/lumigo-operator:{v}": f"{REGISTRY}/lumigo/lumigo-operator:{v}",
        f"quay.io/lumigo/lumigo-autotrace:{v}": f"{REGISTRY}/lumigo/lumigo-autotrace:{v}",
        f"quay.io/lumigo/lumigo-operator-telemetry-proxy:{v}":
            f"{REGISTRY}/lumigo/lumigo-operator-telemetry-proxy:{v}",
        "registry.k8s.io/kube-state-metrics/kube-state-metrics:v2.20.0":
            f"{REGISTRY}/kube-state-metrics/kube-state-metrics:v2.20.0",
        "quay.io/prometheus/node-exporter:v1.8.2": f"{REGISTRY}/prometheus/node-exporter:v1.8.2",
    }  # fmt: skip
    assert {where: expected[image] for where, image in default.items()} == rewritten
    injected = [w for w in rewritten if w.endswith("/LUMIGO_INJECTOR_IMAGE")]
    assert sorted(injected) == [
        "Deployment/lumigo-lumigo-operator-controller-manager/manager/LUMIGO_INJECTOR_IMAGE",
        "Deployment/lumigo-lumigo-operator-webhook/webhook/LUMIGO_INJECTOR_IMAGE",
    ]


@pytest.mark.parametrize(
    ("repository", "registry", "image"),
    [
        # A Docker Hub name has no registry host: its whole path is kept.
        ("otel/opentelemetry-collector-contrib", "reg.test",
         "reg.test/otel/opentelemetry-collector-contrib"),
        ("localhost/lumigo/proxy", "reg.test:5000/", "reg.test:5000/lumigo/proxy"),
        ("mirror.example.com:5000/a/b/proxy", "10.0.0.1:5000", "10.0.0.1:5000/a/b/proxy"),
    ],
)  # fmt: skip
def test_the_registry_replaces_only_a_registry_host(
    repository: str, registry: str, image: str
) -> None:
    values = {
        "global": {"imageRegistry": registry},
        "telemetryProxy": {"image": {"repository": repository, "tag": "1"}, "enricher": False},
    }
    proxy = [i for w, i in images(render(values)).items() if "telemetry-proxy/otelcol" in w]
    assert proxy == [f"{image}:1"]


def test_a_digest_pins_each_image_by_digest() -> None:
    """`<repository>@<digest>`, the tag ignored (skopeo and others refuse tag@digest), with and
    without the registry."""
    for extra, prefix in (({}, ""), ({"global": {"imageRegistry": REGISTRY}}, REGISTRY)):
        rendered = images(render(merged(every_feature_on(), with_digests(), extra)))
        names = {
            "lumigo-operator:": DIGESTS["controllerManager.manager"],
            "lumigo-autotrace:": DIGESTS["injectorWebhook.lumigoInjector"],
            "telemetry-proxy:": DIGESTS["telemetryProxy"],
            "kube-state-metrics:": DIGESTS["kubeStateMetrics"],
            "node-exporter:": DIGESTS["prometheusNodeExporter"],
        }
        for where, image in rendered.items():
            assert "@sha256:" in image, (where, image)
            assert ":v" not in image, (where, image)
            assert image.startswith(prefix), (where, image)
            repository, digest = image.split("@")
            assert digest == next(d for n, d in names.items() if f"{repository}:".endswith(n))


def test_global_pull_secrets_are_on_every_pod_of_the_chart() -> None:
    """Names or {name: …}, merged with the top-level `imagePullSecrets` without repeats, on every
    pod the chart renders (hooks included)."""
    values = merged(
        every_feature_on(),
        {
            "global": {"imagePullSecrets": ["mirror-pull", {"name": "regcred"}]},
            "imagePullSecrets": [{"name": "regcred"}, {"name": "legacy"}],
        },
    )
    specs = pod_specs(render(values))
    assert {w.split("/")[0] for w in specs} == {"Deployment", "StatefulSet", "Job"}
    assert len(specs) == 7, sorted(specs)  # manager, webhook, proxy, watchdog, ksm, two hooks
    want = [{"name": "mirror-pull"}, {"name": "regcred"}, {"name": "legacy"}]
    assert {w: s.get("imagePullSecrets") for w, s in specs.items()} == dict.fromkeys(specs, want)
    assert all("imagePullSecrets" not in s for s in pod_specs(render(every_feature_on())).values())


def test_the_operator_deploys_the_agent_from_the_registry_with_the_pull_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The manager's rendered args and env, parsed by the operator's own flags, and the rendered
    proxy Deployment give the cluster agent DaemonSet the operator creates: the proxy's image and
    pull secrets, node-exporter from the registry."""
    values = merged(
        every_feature_on(),
        {"global": {"imageRegistry": REGISTRY, "imagePullSecrets": ["mirror-pull"]}},
    )
    docs = render(values)
    manager = next(d for d in docs if d["metadata"]["name"].endswith("-controller-manager")
                   and d["kind"] == "Deployment")  # fmt: skip
    container = manager["spec"]["template"]["spec"]["containers"][0]
    for env in container["env"]:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    opts = run_options(_parser().parse_args(["run", *container["args"]]))
    target = component_settings(AgentTarget, opts)
    proxy = next(d for d in docs if d["kind"] == "Deployment"
                 and d["metadata"]["name"] == target.proxy_deployment)  # fmt: skip
    pod = agent_daemonset(target, proxy, "digest", metrics=True)["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == [
        f"{REGISTRY}/lumigo/lumigo-operator-telemetry-proxy:v{APP_VERSION}",
        f"{REGISTRY}/prometheus/node-exporter:v1.8.2",
    ]
    assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}]


def helm_template_error(*sets: str) -> str:
    result = helm("template", "lumigo", str(CHART), *sets, check=False)
    assert result.returncode != 0, "the render should have failed"
    return result.stderr


def value_path(setting: str) -> str:
    """`a.b[0]=x` -> `a.b[0]`, the value a message must name."""
    return setting.split("=", 1)[0]


@pytest.mark.parametrize(
    "setting",
    [
        "controllerManager.manager.image.repository=",
        "telemetryProxy.image.repository=Quay.io/Lumigo/Proxy",
        "injectorWebhook.lumigoInjector.image.tag=v1 2",
        "kubeStateMetrics.image.tag=bad:tag",
        "prometheusNodeExporter.image.digest=sha256:abc",
        "injectorWebhook.lumigoInjector.image.digest=md5:" + "0" * 32,
        "global.imageRegistry=https://registry.test",
        "global.imagePullSecrets[0]=Not_A_Secret",
    ],
)
def test_the_schema_refuses_an_image_that_cannot_be_pulled(setting: str) -> None:
    stderr = helm_template_error("--set", setting)
    assert "values don't meet the specifications of the schema" in stderr, stderr
    pointer = "/" + value_path(setting).replace(".", "/").replace("[0]", "/0")
    assert f"at '{pointer}'" in stderr, stderr


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        # No tag and no digest: nothing to pull (the schema allows "" for the chart's own
        # images, whose tag defaults to v<appVersion>).
        ("kubeStateMetrics.image.tag=", 'kubeStateMetrics.image.tag "" is not an image tag'),
        ("prometheusNodeExporter.image.tag=", 'prometheusNodeExporter.image.tag "" is not'),
        # The same checks hold when the schema is skipped.
        ("controllerManager.manager.image.repository=", "is not an image repository"),
        ("injectorWebhook.lumigoInjector.image.digest=sha256:x", "is not a digest"),
        ("global.imageRegistry=https://registry.test", "is not a registry"),
        ("imagePullSecrets[0].name=Not_A_Secret", '"Not_A_Secret" is not a Secret name'),
    ],
)
def test_the_render_fails_naming_the_value(setting: str, words: str) -> None:
    sets = ["--set", setting, "--set", "clusterCollection.metrics.enabled=true"]
    stderr = helm_template_error(*sets, "--skip-schema-validation")
    assert words in stderr, stderr
    if "[0]" not in setting:
        assert value_path(setting) in stderr, stderr
    assert "schema" not in stderr, stderr


# --- kustomize -------------------------------------------------------------------------------


def test_kustomize_images_reach_the_images_passed_in_env(tmp_path: Path) -> None:
    """An overlay's `images:` (as `kustomize edit set image` writes it) rewrites the injected
    autotrace image and node-exporter's, which the manager and the webhook get as env values, as
    well as every container image."""
    (tmp_path / "config").symlink_to(ROOT / "config")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    autotrace = "sha256:" + "a" * 64
    (overlay / "kustomization.yaml").write_text(
        "resources:\n- ../config/default\n"
        "images:\n"
        "- name: quay.io/lumigo/lumigo-autotrace\n"
        f"  newName: {REGISTRY}/lumigo/lumigo-autotrace\n"
        f"  digest: {autotrace}\n"
        "- name: quay.io/prometheus/node-exporter\n"
        f"  newName: {REGISTRY}/prometheus/node-exporter\n"
        "- name: quay.io/lumigo/lumigo-operator\n"
        f"  newName: {REGISTRY}/lumigo/lumigo-operator\n"
        "- name: quay.io/lumigo/lumigo-operator-telemetry-proxy\n"
        f"  newName: {REGISTRY}/lumigo/lumigo-operator-telemetry-proxy\n"
    )
    out = run([tool("kubectl"), "kustomize", str(overlay)]).stdout
    rendered = images(load_docs(out))
    v = f"v{APP_VERSION}"
    manager = "Deployment/lumigo-lumigo-operator-controller-manager/manager"
    webhook = "Deployment/lumigo-lumigo-operator-webhook/webhook"
    assert rendered[f"{manager}/LUMIGO_INJECTOR_IMAGE"] == (
        f"{REGISTRY}/lumigo/lumigo-autotrace@{autotrace}"
    )
    assert rendered[f"{webhook}/LUMIGO_INJECTOR_IMAGE"] == (
        f"{REGISTRY}/lumigo/lumigo-autotrace@{autotrace}"
    )
    assert rendered[f"{manager}/LUMIGO_NODE_EXPORTER_IMAGE"] == (
        f"{REGISTRY}/prometheus/node-exporter:v1.8.2"
    )
    assert all(image.startswith(f"{REGISTRY}/") for image in rendered.values()), rendered
    assert rendered[manager] == f"{REGISTRY}/lumigo/lumigo-operator:{v}"
    # Other env values are left alone.
    docs = load_docs(out)
    (deployment,) = [
        d for d in docs if d["metadata"]["name"] == "lumigo-lumigo-operator-controller-manager"
    ]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"][
        "containers"][0]["env"]}  # fmt: skip
    assert env["LUMIGO_INJECTION_MODE"] == "auto"


# --- a Helm install from a private registry on the full local cluster ------------------------


@pytest.fixture
def release(full_cluster: LocalCluster) -> Iterator[HelmRelease]:
    with helm_release(full_cluster, "t-images") as rel:
        yield rel


def dockerconfigjson(registry: str) -> dict[str, Any]:
    auth = base64.b64encode(b"app-team:app-team-password").decode()
    config = json.dumps({"auths": {registry: {"auth": auth}}})
    return {"data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()}}


def test_private_registry_install_and_the_app_namespace_pulls_with_its_own_secret(
    full_cluster: LocalCluster, kube: KubeClient, release: HelmRelease, tmp_path: Path
) -> None:
    """`helm install --set global.imageRegistry=… --set global.imagePullSecrets={…}` and a
    digest for the autotrace image: every pod of the release asks for the registry's images with
    the release's secret. An instrumented pod in an app namespace asks for the autotrace image by
    digest from the registry with the app's own pull secret (the answer the docs give); the
    operator copies no Secret there."""
    cluster, ns, fullname = full_cluster, release.namespace, release.fullname
    digest = DIGESTS["injectorWebhook.lumigoInjector"]
    out = release.install(
        "--set", f"global.imageRegistry={REGISTRY}",
        "--set", "global.imagePullSecrets[0]=mirror-pull",
        "--set", f"injectorWebhook.lumigoInjector.image.digest={digest}",
        "--set", "injectorWebhook.lumigoInjector.mode=init-container",
    )  # fmt: skip
    # NOTES.txt tells the platform engineer which credentials the app namespaces need.
    notes = " ".join(out.split("NOTES:", 1)[1].split())
    assert f"Traced pods pull {REGISTRY}/lumigo/lumigo-autotrace@{digest} with their own" in notes
    assert "kubectl patch serviceaccount default -n <namespace>" in notes
    pods = get_json(cluster, "pods", "-n", ns)["items"]
    assert len(pods) >= 4, [p["metadata"]["name"] for p in pods]  # manager, webhook, proxy, dog
    for pod in pods:
        name = pod["metadata"]["name"]
        assert pod["spec"]["imagePullSecrets"] == [{"name": "mirror-pull"}], name
        assert all(c["image"].startswith(f"{REGISTRY}/") for c in pod["spec"]["containers"]), name

    deployment = f"{fullname}-controller-manager"
    with installed_operator(cluster, kube, ns, deployment, tmp_path) as operator:
        app = operator.new_namespace()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "app-pull"},
            **dockerconfigjson("registry.test:5443"),
        }
        kube.create(SECRETS, secret, app)
        cluster.kubectl("apply", "-n", app, "-f", str(SAMPLE))
        wait_until(lambda: is_active(kube, app), 60, "the Lumigo Active")
        # The app's own pull secret, named in its pod template (this cluster runs without the
        # ServiceAccount admission plugin, which copies a ServiceAccount's imagePullSecrets
        # into each pod the same way: the node tier's cluster runs with it).
        shop = workload(DEPLOYMENTS, "shop")
        shop["spec"]["replicas"] = 1
        shop["spec"]["template"]["spec"]["imagePullSecrets"] = [{"name": "app-pull"}]
        stored = kube.create(DEPLOYMENTS, shop, app)
        assert is_injected(stored)
        assert stored["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "app-pull"}]

        def shop_pod() -> dict[str, Any] | None:
            items = kube.list(PODS, app, label_selector="app=shop")[0]
            return items[0] if items else None

        wait_until(lambda: shop_pod() is not None, 60, "the shop pod created")
        pod = shop_pod()
        assert pod is not None
        (init,) = pod["spec"]["initContainers"]
        assert init["image"] == f"{REGISTRY}/lumigo/lumigo-autotrace@{digest}"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "app-pull"}]
        secrets = {s["metadata"]["name"] for s in kube.list(SECRETS, app)[0]}
        assert "mirror-pull" not in secrets, "the release's pull secret stays in its namespace"
