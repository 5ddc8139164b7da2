"""hack/release's pure parts, on the real chart and bundle: every released image can be pinned in
values.yaml (so a values.yaml change that would break `make release` fails here, in seconds), and
hack/gen-bundle's pinning reaches every image reference of the CSV."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def script(name: str) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(f"_script_{name}", str(ROOT / "hack" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


def test_every_released_image_is_pinned_in_the_chart_values_with_comments_kept() -> None:
    release = script("release")
    text = (ROOT / "charts" / "lumigo-operator" / "values.yaml").read_text()
    pins = {p.values: (f"reg.test:5000/r/{p.path}", "1.2.3", DIGEST) for p in release.PRODUCTS}
    pinned = release.pin_values(text, pins)
    values = yaml.safe_load(pinned)
    for product in release.PRODUCTS:
        node = values
        for key in product.values:
            node = node[key]
        assert node["repository"] == f"reg.test:5000/r/{product.path}", product.name
        assert node["digest"] == DIGEST, product.name
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert [line for line in pinned.splitlines() if line.lstrip().startswith("#")] == comments


def test_a_values_path_that_is_missing_is_an_error() -> None:
    release = script("release")
    pins = {("telemetryProxy", "nothing"): ("r", "t", DIGEST)}
    with pytest.raises(release.ReleaseError, match=r"no telemetryProxy\.nothing"):
        release.pin_values("telemetryProxy:\n  image: {}\n", pins)


def test_the_bundle_pins_every_image_of_the_csv() -> None:
    release, bundle = script("release"), script("gen-bundle")
    pins = {p.path: f"reg.test/r/{p.path}@{DIGEST}" for p in release.PRODUCTS}
    csv = bundle.pin_images(bundle.csv("1.2.3"), pins)
    related = {i["image"] for i in csv["spec"]["relatedImages"]}
    assert related
    assert related <= set(pins.values())
    assert (
        f"reg.test/r/lumigo/lumigo-operator@{DIGEST}"
        == csv["metadata"]["annotations"]["containerImage"]
    )
    text = yaml.safe_dump(csv)
    assert "quay.io/" not in text.replace("quay.io/operator-framework", "")
