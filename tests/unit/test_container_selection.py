"""Per-container control (issue 19, item 3): the annotations that leave containers untraced or name
the only ones to trace, through the pure mutation and the webhook."""

from __future__ import annotations

import copy
from typing import Any

from api import constants
from webhook import pod_injection
from webhook.containers import select
from webhook.pod_injection import InjectionSettings

from .test_webhook_inject_handler import World, patched_object
from .webhook_samples import simple_template, template_of, workload

JSON = dict[str, Any]
SETTINGS = InjectionSettings(operator_version="1.2.3")
EXCLUDE = constants.ANNOTATION_EXCLUDE_CONTAINERS
INCLUDE = constants.ANNOTATION_INCLUDE_CONTAINERS


def three_containers(**annotations: str) -> JSON:
    template = simple_template()
    template["spec"]["containers"] = [
        {"name": name, "image": f"example/{name}:1", "env": [{"name": "KEEP", "value": name}]}
        for name in ("app", "istio-proxy", "fluent-bit")
    ]
    obj = workload("Deployment", template)
    obj["metadata"]["annotations"] = dict(annotations)
    return obj


def traced(obj: JSON) -> dict[str, bool]:
    """Container name -> whether it carries our LD_PRELOAD and mount."""
    out = {}
    for c in template_of(obj)["spec"]["containers"]:
        env = {e["name"] for e in c.get("env") or []}
        mounts = {m["name"] for m in c.get("volumeMounts") or []}
        out[c["name"]] = "LD_PRELOAD" in env and "lumigo-injector" in mounts
    return out


def test_excluded_containers_are_left_untraced() -> None:
    obj = three_containers(**{EXCLUDE: "istio-proxy, fluent-bit"})
    out = pod_injection.inject(obj, SETTINGS)
    assert traced(out) == {"app": True, "istio-proxy": False, "fluent-bit": False}
    assert template_of(out)["spec"]["initContainers"][0]["name"] == "lumigo-injector"
    untouched = template_of(out)["spec"]["containers"][1]
    assert untouched == template_of(obj)["spec"]["containers"][1]


def test_included_containers_are_the_only_ones_traced() -> None:
    out = pod_injection.inject(three_containers(**{INCLUDE: "app"}), SETTINGS)
    assert traced(out) == {"app": True, "istio-proxy": False, "fluent-bit": False}
    assert pod_injection.container_selection(out).problem is None


def test_excluding_a_traced_container_later_removes_our_env_from_it_only() -> None:
    injected = pod_injection.inject(three_containers(), SETTINGS)
    assert all(traced(injected).values())
    changed = copy.deepcopy(injected)
    changed["metadata"]["annotations"] = {EXCLUDE: "istio-proxy"}
    out = pod_injection.inject(changed, SETTINGS)
    assert traced(out) == {"app": True, "istio-proxy": False, "fluent-bit": True}
    sidecar = template_of(out)["spec"]["containers"][1]
    assert sidecar["env"] == [{"name": "KEEP", "value": "istio-proxy"}]
    assert not sidecar.get("volumeMounts")


def test_every_container_left_out_means_nothing_of_ours_in_the_pod() -> None:
    injected = pod_injection.inject(three_containers(), SETTINGS)
    injected["metadata"]["annotations"] = {EXCLUDE: "app,istio-proxy,fluent-bit"}
    out = pod_injection.inject(injected, SETTINGS)
    assert pod_injection.remove(out) == out  # nothing left to remove
    assert constants.LABEL_AUTO_TRACE not in out["metadata"]["labels"]


def test_bad_values_are_ignored_and_reported_never_raised() -> None:
    selection = select({EXCLUDE: "istio-proxy,Not_A_Name,ghost"}, ["app", "istio-proxy"])
    assert selection.traced == {"app"}
    assert selection.problem == (
        f"{EXCLUDE}: not container names, ignored: 'Not_A_Name'; "
        f"{EXCLUDE}: no such container, ignored: 'ghost' (containers: 'app', 'istio-proxy')"
    )
    both = select({EXCLUDE: "app", INCLUDE: "app"}, ["app", "sidecar"])
    assert both.traced == {"app"}
    assert both.problem is not None
    assert "only the first applies" in both.problem
    nothing = select({INCLUDE: "apps"}, ["app"])
    assert nothing.traced == frozenset()
    assert nothing.problem is not None
    assert "none is traced" in nothing.problem
    assert select({}, ["app"]).problem is None
    assert select({EXCLUDE: 42}, ["app"]).traced == {"app"}  # not a string: names nothing
    many = select({EXCLUDE: ",".join(f"x{i}" for i in range(50))}, ["app"]).problem
    assert many is not None
    assert "and 45 more" in many  # user input cannot flood the event


def test_the_webhook_honours_the_annotation_and_warns_about_a_bad_one() -> None:
    world = World()
    obj = three_containers(**{EXCLUDE: "istio-proxy,ghost"})
    out = patched_object(obj, world.admit(obj))
    assert traced(out) == {"app": True, "istio-proxy": False, "fluent-bit": True}
    assert world.reasons == [
        ("Warning", constants.REASON_INVALID_CONTAINERS),
        ("Normal", "LumigoAddedInstrumentation"),
    ]
    warning = world.recorder.events[0][3]
    assert "no such container, ignored: 'ghost'" in warning
    # A dry run records nothing.
    quiet = World()
    quiet.admit(obj, dry_run=True)
    assert quiet.recorder.events == []
