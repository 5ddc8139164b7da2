"""hack/release's pure parts, on the real chart and bundle: every released image can be pinned in
values.yaml (so a values.yaml change that would break `make release` fails here, in seconds), and
hack/gen-bundle's pinning reaches every image reference of the CSV."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.scripts import hack_script

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def test_every_released_image_is_pinned_in_the_chart_values_with_comments_kept() -> None:
    release = hack_script("release")
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
    release = hack_script("release")
    pins = {("telemetryProxy", "nothing"): ("r", "t", DIGEST)}
    with pytest.raises(release.ReleaseError, match=r"no telemetryProxy\.nothing"):
        release.pin_values("telemetryProxy:\n  image: {}\n", pins)


def test_the_bundle_pins_every_image_of_the_csv() -> None:
    release, bundle = hack_script("release"), hack_script("gen-bundle")
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
