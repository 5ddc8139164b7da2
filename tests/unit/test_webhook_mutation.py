"""The pod-template mutation: the reference's rules exactly, our fixes, and its algebra."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import api
from api import constants
from api.lumigo import load_spec
from kube import objects
from kube.jsonpatch import apply, diff, equal
from webhook import pod_injection
from webhook.pod_injection import (
    CHAINED_LD_PRELOAD,
    InitContainerResources,
    InjectionSettings,
    InvalidObjectError,
    OptedOutError,
    inject,
    remove,
)

from .webhook_samples import (
    realistic_template,
    simple_template,
    template_of,
    workload,
    workloads,
)

JSON = dict[str, Any]
SETTINGS = InjectionSettings(
    operator_version="1.2.3",
    injector_image="registry.example.com/lumigo-autotrace:1.2.3",
    telemetry_proxy_endpoint="http://proxy.lumigo-system.svc.cluster.local",
    token_secret_name="lumigo-credentials",
    token_secret_key="token",
)
LABEL = "lumigo-operator.v1.2.3"
OURS = constants.LD_PRELOAD_VALUE


def env_of(container: JSON) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def expected_env(container: str, logs: str = "false", traces: str = "true") -> list[JSON]:
    return [
        {"name": "LD_PRELOAD", "value": OURS},
        {
            "name": "LUMIGO_TRACER_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": "lumigo-credentials", "key": "token", "optional": True}
            },
        },
        {
            "name": "LUMIGO_ENDPOINT",
            "value": "http://proxy.lumigo-system.svc.cluster.local/v1/traces",
        },
        {
            "name": "LUMIGO_LOGS_ENDPOINT",
            "value": "http://proxy.lumigo-system.svc.cluster.local/v1/logs",
        },
        {"name": "LUMIGO_ENABLE_LOGS", "value": logs},
        {"name": "LUMIGO_ENABLE_TRACES", "value": traces},
        {"name": "LUMIGO_CONTAINER_NAME", "value": container},
    ]


# --- the reference's rules -----------------------------------------------------------------


def test_a_plain_deployment_gets_exactly_the_reference_instrumentation() -> None:
    obj = workload("Deployment", simple_template())
    out = inject(obj, SETTINGS)
    spec = template_of(out)["spec"]
    assert spec["volumes"] == [{"name": "lumigo-injector", "emptyDir": {"sizeLimit": "200M"}}]
    (init,) = spec["initContainers"]
    assert init["name"] == "lumigo-injector"
    assert init["image"] == "registry.example.com/lumigo-autotrace:1.2.3"
    assert init["env"] == [{"name": "TARGET_DIRECTORY", "value": "/target"}]
    assert init["volumeMounts"] == [{"name": "lumigo-injector", "mountPath": "/target"}]
    assert "command" not in init
    assert init["imagePullPolicy"] == "IfNotPresent"  # explicit: a pinned tag, pulled once
    (app,) = spec["containers"]
    assert app["env"] == expected_env("app")
    assert app["volumeMounts"] == [
        {"name": "lumigo-injector", "readOnly": True, "mountPath": "/opt/lumigo"}
    ]
    assert out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == LABEL
    assert template_of(out)["metadata"]["labels"] == {constants.LABEL_AUTO_TRACE: LABEL}


def test_every_regular_container_is_instrumented_with_its_own_name() -> None:
    out = inject(workload("StatefulSet", realistic_template()), SETTINGS)
    spec = template_of(out)["spec"]
    for container in spec["containers"]:
        assert env_of(container)["LUMIGO_CONTAINER_NAME"] == container["name"]
        assert env_of(container)["LD_PRELOAD"] == OURS
        assert container["volumeMounts"][-1]["mountPath"] == "/opt/lumigo"
    migrate = spec["initContainers"][0]
    assert migrate["env"] == [{"name": "DB_URL", "value": "postgres://db/shop"}]
    assert [c["name"] for c in spec["initContainers"]] == ["migrate", "lumigo-injector"]


def test_the_settings_flags_and_token_reference_reach_the_env() -> None:
    spec = load_spec(
        {
            "lumigoToken": {"secretRef": {"name": "my-secret", "key": "my-key"}},
            "tracing": {"enabled": False},
            "logging": {"enabled": True},
        }
    )
    out = inject(workload("Deployment", simple_template()), SETTINGS.for_spec(spec))
    env = env_of(template_of(out)["spec"]["containers"][0])
    assert env["LUMIGO_TRACER_TOKEN"] == {
        "secretKeyRef": {"name": "my-secret", "key": "my-key", "optional": True}
    }
    assert env["LUMIGO_ENABLE_LOGS"] == "true"
    assert env["LUMIGO_ENABLE_TRACES"] == "false"


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment", "ReplicaSet", "StatefulSet", "Job"])
def test_the_pod_template_of_each_kind_is_instrumented(kind: str) -> None:
    out = inject(workload(kind, simple_template()), SETTINGS)
    assert template_of(out)["spec"]["initContainers"][0]["name"] == "lumigo-injector"
    assert pod_injection.pod_template_path(kind) == ("spec", "template")


def test_cronjobs_are_instrumented_in_their_job_template() -> None:
    obj = workload("CronJob", simple_template())
    out = inject(obj, SETTINGS)
    assert pod_injection.pod_template_path("CronJob") == ("spec", "jobTemplate", "spec", "template")
    template = out["spec"]["jobTemplate"]["spec"]["template"]
    assert template["spec"]["initContainers"][0]["name"] == "lumigo-injector"
    assert template["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == LABEL
    assert out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == LABEL
    assert "metadata" not in out["spec"]["jobTemplate"]


def test_replicasets_owned_by_a_deployment_are_left_to_their_deployment() -> None:
    obj = workload("ReplicaSet", simple_template())
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u", "controller": True}
    ]
    assert objects.is_deployment_owned(obj)
    assert pod_injection.skip_reason(obj) == "deployment-owned"
    assert inject(obj, SETTINGS) == obj
    owned_injected = inject(workload("ReplicaSet", simple_template()), SETTINGS)
    owned_injected["metadata"]["ownerReferences"] = obj["metadata"]["ownerReferences"]
    assert remove(owned_injected) == owned_injected  # the reference skips them both ways
    standalone = workload("ReplicaSet", simple_template())
    assert not objects.is_deployment_owned(standalone)
    assert inject(standalone, SETTINGS) != standalone


@pytest.mark.parametrize(
    ("pod_context", "expected"),
    [
        ({}, {"runAsUser": 1234, "runAsGroup": 1234}),
        ({"fsGroup": 3000}, {"runAsUser": 3000, "runAsGroup": 3000}),
        ({"runAsNonRoot": True}, {"runAsUser": 1234, "runAsGroup": 1234}),
        # Ours runs as a non-root UID whatever the pod says, and says so itself: the restricted
        # standard then admits it even when the pod sets runAsNonRoot per container only.
        ({"runAsNonRoot": False, "fsGroup": 42}, {"runAsUser": 42, "runAsGroup": 42}),
        # Fix: fsGroup 0 would run the copy as root, which runAsNonRoot refuses.
        ({"fsGroup": 0, "runAsNonRoot": True}, {"runAsUser": 1234, "runAsGroup": 1234}),
    ],
)
def test_init_container_security_context_follows_the_pod(pod_context: JSON, expected: JSON) -> None:
    out = inject(workload("Deployment", simple_template(securityContext=pod_context)), SETTINGS)
    context = template_of(out)["spec"]["initContainers"][0]["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        **expected,
    }


@pytest.mark.parametrize("pod_context", [{}, {"fsGroup": 1000680000}, {"runAsUser": 1000680000}])
def test_an_unset_init_container_user_names_no_user_for_the_platform_to_assign(
    pod_context: JSON,
) -> None:
    """OpenShift (--init-container-user=unset, what `auto` picks there): its SCCs give the whole
    pod a UID from the namespace's range and refuse any other, so ours names none, whatever the
    pod has; it stays non-root and restricted otherwise."""
    settings = InjectionSettings(init_container_user="unset")
    out = inject(workload("Deployment", simple_template(securityContext=pod_context)), settings)
    context = template_of(out)["spec"]["initContainers"][0]["securityContext"]
    assert "runAsUser" not in context
    assert "runAsGroup" not in context
    assert context["runAsNonRoot"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    # Back to the reference's user: the next injection changes only that.
    again = inject(out, SETTINGS)
    assert template_of(again)["spec"]["initContainers"][0]["securityContext"]["runAsUser"] in (
        1234,
        1000680000,
    )
    with pytest.raises(ValueError, match="invalid init container user 'auto'"):
        InjectionSettings(init_container_user="auto")


def test_existing_items_are_replaced_in_place_by_name() -> None:
    template = simple_template(
        volumes=[
            {"name": "lumigo-injector", "hostPath": {"path": "/tmp"}},
            {"name": "data", "emptyDir": {}},
        ],
        initContainers=[
            {"name": "lumigo-injector", "image": "old"},
            {"name": "other", "image": "busybox"},
        ],
    )
    template["spec"]["containers"][0]["env"] = [
        {"name": "A", "value": "1"},
        {"name": "LUMIGO_ENDPOINT", "value": "http://old"},
        {"name": "B", "value": "2"},
    ]
    template["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "something", "mountPath": "/opt/lumigo"},
        {"name": "data", "mountPath": "/data"},
    ]
    out = template_of(inject(workload("Deployment", template), SETTINGS))["spec"]
    assert [v["name"] for v in out["volumes"]] == ["lumigo-injector", "data"]
    assert out["volumes"][0] == {"name": "lumigo-injector", "emptyDir": {"sizeLimit": "200M"}}
    assert [c["name"] for c in out["initContainers"]] == ["lumigo-injector", "other"]
    assert out["initContainers"][0]["image"] == SETTINGS.injector_image
    app = out["containers"][0]
    assert [e["name"] for e in app["env"]] == [
        "A", "LUMIGO_ENDPOINT", "B", "LD_PRELOAD", "LUMIGO_TRACER_TOKEN",
        "LUMIGO_LOGS_ENDPOINT", "LUMIGO_ENABLE_LOGS", "LUMIGO_ENABLE_TRACES",
        "LUMIGO_CONTAINER_NAME",
    ]  # fmt: skip
    assert app["env"][1]["value"] == "http://proxy.lumigo-system.svc.cluster.local/v1/traces"
    assert app["volumeMounts"][0] == {
        "name": "lumigo-injector",
        "readOnly": True,
        "mountPath": "/opt/lumigo",
    }


def test_labels_change_only_when_the_pod_spec_changes() -> None:
    injected = inject(workload("Deployment", simple_template()), SETTINGS)
    older = copy.deepcopy(injected)
    older["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = "lumigo-operator.v0.9"
    template_of(older)["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = "lumigo-operator.v0.9"
    # Same pod spec from an older operator version: nothing to do, not even the label.
    assert inject(older, SETTINGS) == older


def test_opting_out_is_refused_case_insensitively() -> None:
    obj = workload("Deployment", simple_template())
    obj["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = "False"
    with pytest.raises(
        OptedOutError, match=_re("the resource has the 'lumigo.auto-trace' label set to 'false'")
    ):
        inject(obj, SETTINGS)
    assert pod_injection.is_opted_out(obj)


def test_removal_strips_everything_and_the_label() -> None:
    obj = workload("DaemonSet", realistic_template())
    injected = inject(obj, SETTINGS)
    assert pod_injection.is_instrumented(injected)
    cleaned = remove(injected)
    assert cleaned == obj
    assert not pod_injection.is_instrumented(cleaned)
    assert remove(obj) == obj


def test_removal_keeps_the_users_opt_out_label() -> None:
    """An instrumented workload labelled `false` is cleaned and stays opted out."""
    obj = workload("Deployment", realistic_template())
    injected = inject(obj, SETTINGS)
    injected["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = "False"
    assert pod_injection.is_instrumented(injected)
    cleaned = remove(injected)
    assert cleaned == {**obj, "metadata": injected["metadata"]}
    assert pod_injection.is_opted_out(cleaned)
    assert not pod_injection.is_instrumented(cleaned)


def test_removal_of_a_reference_injected_workload() -> None:
    """What the Go operator wrote (no resources, no seccomp, LD_PRELOAD overwritten) is removed."""
    obj = workload("Deployment", simple_template())
    spec = template_of(obj)["spec"]
    spec["volumes"] = [{"name": "lumigo-injector", "emptyDir": {"sizeLimit": "200M"}}]
    spec["initContainers"] = [
        {
            "name": "lumigo-injector",
            "image": "public.ecr.aws/lumigo/lumigo-autotrace:latest",
            "env": [{"name": "TARGET_DIRECTORY", "value": "/target"}],
            "volumeMounts": [{"name": "lumigo-injector", "mountPath": "/target"}],
            "securityContext": {"runAsUser": 1234, "runAsGroup": 1234, "privileged": False},
            "terminationMessagePath": "/dev/termination-log",
            "imagePullPolicy": "Always",
        }
    ]
    spec["containers"][0]["env"] = [{"name": "X", "value": "1"}, *expected_env("app")]
    spec["containers"][0]["volumeMounts"] = [
        {"name": "lumigo-injector", "readOnly": True, "mountPath": "/opt/lumigo"}
    ]
    obj["metadata"]["labels"][constants.LABEL_AUTO_TRACE] = "lumigo-operator.v69"
    cleaned = remove(obj)
    cleaned_spec = template_of(cleaned)["spec"]
    assert cleaned_spec == {
        "containers": [
            {"name": "app", "image": "python:3.12", "env": [{"name": "X", "value": "1"}]}
        ]
    }
    assert constants.LABEL_AUTO_TRACE not in cleaned["metadata"]["labels"]


def test_removal_keeps_the_tracer_env_of_a_container_we_did_not_instrument() -> None:
    """LUMIGO_* names are the tracer's: a container may set them itself. Only a container with
    our mount or our LD_PRELOAD loses them."""
    own = [
        {"name": "LUMIGO_TRACER_TOKEN", "value": "t_0123456789abcdef01234"},
        {"name": "LUMIGO_ENDPOINT", "value": "http://collector:4318"},
        {"name": "LUMIGO_ENABLE_LOGS", "value": "true"},
    ]
    obj = workload("Deployment", simple_template())
    template_of(obj)["spec"]["containers"][0]["env"] = own
    assert remove(obj) == obj
    # Instrumented, then a container of the user's own added: ours is cleaned, theirs kept.
    injected = inject(workload("Deployment", simple_template()), SETTINGS)
    template_of(injected)["spec"]["containers"].append(
        {"name": "manual", "image": "python:3.12", "env": own}
    )
    cleaned = template_of(remove(injected))["spec"]["containers"]
    assert "env" not in cleaned[0]
    assert cleaned[1] == {"name": "manual", "image": "python:3.12", "env": own}


def test_removal_keeps_a_volume_another_init_container_still_mounts() -> None:
    obj = inject(workload("Deployment", simple_template()), SETTINGS)
    template_of(obj)["spec"]["initContainers"].append(
        {
            "name": "peek",
            "image": "busybox",
            "volumeMounts": [{"name": "lumigo-injector", "mountPath": "/x"}],
        }
    )
    cleaned_spec = template_of(remove(obj))["spec"]
    assert [v["name"] for v in cleaned_spec["volumes"]] == ["lumigo-injector"]


# --- our fixes (each fails on the reference's behaviour) -----------------------------------


def test_fix_a_users_ld_preload_is_kept_and_restored() -> None:
    template = simple_template()
    user_env = [
        {"name": "A", "value": "1"},
        {"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so"},
    ]
    template["spec"]["containers"][0]["env"] = user_env
    obj = workload("Deployment", template)
    out = inject(obj, SETTINGS)
    env = template_of(out)["spec"]["containers"][0]["env"]
    assert env[:3] == [
        {"name": "A", "value": "1"},
        {"name": "LUMIGO_ORIGINAL_LD_PRELOAD", "value": "/usr/lib/libjemalloc.so"},
        {"name": "LD_PRELOAD", "value": f"{OURS}:$(LUMIGO_ORIGINAL_LD_PRELOAD)"},
    ]
    assert inject(out, SETTINGS) == out
    assert remove(out) == obj


def test_fix_an_ld_preload_from_a_config_map_is_chained_too() -> None:
    template = simple_template()
    source = {"configMapKeyRef": {"name": "preload", "key": "libs"}}
    template["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "valueFrom": source}]
    obj = workload("Deployment", template)
    out = inject(obj, SETTINGS)
    env = template_of(out)["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "LUMIGO_ORIGINAL_LD_PRELOAD", "valueFrom": source}
    assert env[1] == {"name": "LD_PRELOAD", "value": CHAINED_LD_PRELOAD}
    assert remove(out) == obj


def test_fix_a_user_changing_ld_preload_after_injection_is_respected() -> None:
    template = simple_template()
    template["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/a.so"}]
    injected = inject(workload("Deployment", template), SETTINGS)
    edited = copy.deepcopy(injected)
    env = template_of(edited)["spec"]["containers"][0]["env"]
    env[1] = {"name": "LD_PRELOAD", "value": "/b.so"}  # e.g. `kubectl set env LD_PRELOAD=/b.so`
    out_env = template_of(inject(edited, SETTINGS))["spec"]["containers"][0]["env"]
    assert out_env[0] == {"name": "LUMIGO_ORIGINAL_LD_PRELOAD", "value": "/b.so"}
    assert out_env[1] == {"name": "LD_PRELOAD", "value": CHAINED_LD_PRELOAD}
    assert [e["name"] for e in out_env].count("LUMIGO_ORIGINAL_LD_PRELOAD") == 1
    # ... and when they drop theirs, the remembered one is forgotten.
    dropped = copy.deepcopy(injected)
    del template_of(dropped)["spec"]["containers"][0]["env"][1]
    out_env = template_of(inject(dropped, SETTINGS))["spec"]["containers"][0]["env"]
    assert {"name": "LD_PRELOAD", "value": OURS} in out_env
    assert "LUMIGO_ORIGINAL_LD_PRELOAD" not in env_of({"env": out_env})


def test_fix_daemonsets_are_supported() -> None:
    assert "DaemonSet" in pod_injection.SUPPORTED_KINDS
    assert pod_injection.SUPPORTED_KINDS["DaemonSet"] == "apps/v1"


def test_fix_the_version_label_is_never_truncated() -> None:
    settings = InjectionSettings(operator_version="1.22.333-rc.4")
    out = inject(workload("Deployment", simple_template()), settings)
    assert out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == "lumigo-operator.v1.22.333-rc.4"


@pytest.mark.parametrize("version", ["1.0.0+build.5", "x" * 47, "1.0-", "v 1"])
def test_a_version_that_makes_an_invalid_label_is_refused_at_startup(version: str) -> None:
    with pytest.raises(ValueError, match="does not make a valid label value"):
        InjectionSettings(operator_version=version)


def test_fix_the_init_container_has_small_resources() -> None:
    out = inject(workload("Deployment", simple_template()), SETTINGS)
    assert template_of(out)["spec"]["initContainers"][0]["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"},
    }
    custom = InjectionSettings(init_resources=InitContainerResources("50m", "64Mi", "1", "256Mi"))
    out = inject(workload("Deployment", simple_template()), custom)
    assert template_of(out)["spec"]["initContainers"][0]["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }


def test_fix_a_guaranteed_pod_stays_guaranteed() -> None:
    template = simple_template()
    template["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    out = inject(workload("Deployment", template), SETTINGS)
    resources = template_of(out)["spec"]["initContainers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "500m", "memory": "128Mi"}


def test_fix_pod_level_resources_leave_the_init_container_unconstrained() -> None:
    template = simple_template(resources={"limits": {"cpu": "200m", "memory": "100Mi"}})
    out = inject(workload("Deployment", template), SETTINGS)
    assert template_of(out)["spec"]["initContainers"][0]["resources"] == {}


def test_fix_windows_pods_are_left_alone() -> None:
    obj = workload("Deployment", simple_template(os={"name": "windows"}))
    assert pod_injection.skip_reason(obj) == "windows-pod"
    assert inject(obj, SETTINGS) == obj


def test_fix_server_defaults_on_our_init_container_are_not_a_change() -> None:
    """A stored object has defaults filled in: re-injecting it must be a no-op (no patch, no
    event, no rollout on every update of the workload)."""
    stored = inject(workload("Deployment", simple_template()), SETTINGS)
    init = template_of(stored)["spec"]["initContainers"][0]
    init.update(
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="File",
        imagePullPolicy="IfNotPresent",
    )
    init["resources"]["limits"]["cpu"] = "0.5"  # same quantity, other spelling
    assert inject(stored, SETTINGS) == stored
    upgraded = inject(stored, InjectionSettings(operator_version="2.0", injector_image="new:2"))
    new_init = template_of(upgraded)["spec"]["initContainers"][0]
    assert new_init["image"] == "new:2"
    assert new_init["imagePullPolicy"] == "IfNotPresent"
    never = inject(stored, InjectionSettings(operator_version="2.0", injector_pull_policy="Never"))
    assert template_of(never)["spec"]["initContainers"][0]["imagePullPolicy"] == "Never"


def test_the_default_injector_image_is_our_own_pinned_one() -> None:
    """Never the reference's public `:latest` image (pull policy Always on every pod start)."""
    image = InjectionSettings().injector_image
    assert image == f"quay.io/lumigo/lumigo-autotrace:v{api.__version__}"
    assert not image.endswith(":latest")
    with pytest.raises(ValueError, match="invalid injector image pull policy 'Sometimes'"):
        InjectionSettings(injector_pull_policy="Sometimes")


# --- validation and settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda o: o.update(spec=[]), "spec must be an object"),
        (lambda o: o["spec"].update(template=None), "spec.template must be an object"),
        (lambda o: o["spec"]["template"].update(spec="x"), "spec.template.spec must be an object"),
        (
            lambda o: o["spec"]["template"]["spec"].update(containers={}),
            "spec.template.spec.containers must be an array",
        ),
        (
            lambda o: o["spec"]["template"]["spec"]["containers"].append(3),
            "spec.template.spec.containers[1] must be an object",
        ),
        (
            lambda o: o["spec"]["template"]["spec"]["containers"][0].update(env=[{"value": "x"}]),
            "spec.template.spec.containers[0].env[0].name is required",
        ),
        (
            lambda o: o["spec"]["template"]["spec"].update(securityContext={"fsGroup": "1"}),
            "spec.template.spec.securityContext.fsGroup must be an integer",
        ),
        (lambda o: o["metadata"].update(labels={"a": 1}), "metadata.labels['a'] must be a string"),
        (lambda o: o.update(kind="Pod"), "unsupported kind 'Pod'"),
    ],
)
def test_malformed_objects_are_refused_naming_the_field(mangle: Any, message: str) -> None:
    obj = workload("Deployment", simple_template())
    mangle(obj)
    with pytest.raises(InvalidObjectError, match=_re(message)):
        inject(obj, SETTINGS)
    with pytest.raises(InvalidObjectError, match=_re(message)):
        remove(obj)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token_secret_name": ""}, "invalid token secret name ''"),
        ({"token_secret_name": "My_Secret"}, "invalid token secret name 'My_Secret'"),
        ({"token_secret_key": "a key"}, "invalid token secret key 'a key'"),
        ({"telemetry_proxy_endpoint": "proxy:4318"}, "must be an http:// or https:// URL"),
        ({"injector_image": ""}, "invalid injector image"),
    ],
)
def test_invalid_settings_are_refused_with_a_clear_message(kwargs: JSON, message: str) -> None:
    with pytest.raises(ValueError, match=_re(message)):
        InjectionSettings(**kwargs)


def test_invalid_quantities_are_refused() -> None:
    with pytest.raises(
        ValueError, match="init container limits memory: '12 MB' is not a Kubernetes quantity"
    ):
        InitContainerResources(limits_memory="12 MB")
    with pytest.raises(ValueError, match="init container cpu request 2 exceeds its limit 500m"):
        InitContainerResources(requests_cpu="2")
    with pytest.raises(ValueError, match="must be positive"):
        InitContainerResources(requests_cpu="0")


def _re(text: str) -> str:
    import re

    return re.escape(text)


# --- properties ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_inject_is_idempotent(obj: JSON) -> None:
    once = inject(obj, SETTINGS)
    assert equal(inject(once, SETTINGS), once)


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_remove_undoes_inject(obj: JSON) -> None:
    assert equal(remove(inject(obj, SETTINGS)), obj)
    assert equal(remove(obj), obj)


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_inject_never_touches_other_init_or_ephemeral_containers(obj: JSON) -> None:
    spec_before = template_of(obj)["spec"]
    spec_after = template_of(inject(obj, SETTINGS))["spec"]
    ours = constants.INJECTOR_INIT_CONTAINER
    before = [c for c in spec_before.get("initContainers", [])]
    after = [c for c in spec_after.get("initContainers", []) if c["name"] != ours]
    assert equal(after, before)
    assert equal(spec_after.get("ephemeralContainers"), spec_before.get("ephemeralContainers"))


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_inject_does_not_modify_its_input(obj: JSON) -> None:
    snapshot = json.dumps(obj, sort_keys=True)
    remove(inject(obj, SETTINGS))
    assert json.dumps(obj, sort_keys=True) == snapshot


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_the_patch_between_before_and_after_applies_cleanly(obj: JSON) -> None:
    injected = inject(obj, SETTINGS)
    for before, after in ((obj, injected), (injected, remove(injected))):
        ops = json.loads(json.dumps(diff(before, after)))  # exactly what goes over the wire
        assert equal(apply(before, ops), after)


@settings(max_examples=200, deadline=None)
@given(workloads(), st.booleans(), st.booleans())
def test_every_regular_container_ends_up_with_the_seven_variables(
    obj: JSON, traces: bool, logs: bool
) -> None:
    settings_ = InjectionSettings(enable_traces=traces, enable_logs=logs)
    out = inject(obj, settings_)
    if pod_injection.skip_reason(obj) is not None:
        assert out == obj
        return
    for container in template_of(out)["spec"]["containers"]:
        env = env_of(container)
        assert set(constants.INJECTED_ENV_NAMES) <= env.keys()
        assert env["LD_PRELOAD"] in (OURS, CHAINED_LD_PRELOAD)
        assert env["LUMIGO_ENABLE_TRACES"] == ("true" if traces else "false")
        assert env["LUMIGO_ENABLE_LOGS"] == ("true" if logs else "false")
        assert env["LUMIGO_CONTAINER_NAME"] == container["name"]
        names = [e["name"] for e in container["env"]]
        assert len(names) == len(set(names))
        if env["LD_PRELOAD"] == CHAINED_LD_PRELOAD:  # $(VAR) only sees earlier variables
            assert names.index("LUMIGO_ORIGINAL_LD_PRELOAD") < names.index("LD_PRELOAD")
    assert out["metadata"]["labels"][constants.LABEL_AUTO_TRACE] == settings_.label_value


# --- image-volume mode -----------------------------------------------------------------------

IMAGE_VOLUME = dataclasses.replace(SETTINGS, injection_mode=constants.INJECTION_MODE_IMAGE_VOLUME)


def test_image_volume_mode_mounts_the_autotrace_image_and_adds_no_init_container() -> None:
    obj = workload("Deployment", simple_template())
    spec = template_of(inject(obj, IMAGE_VOLUME))["spec"]
    assert spec["volumes"] == [
        {
            "name": "lumigo-injector",
            "image": {
                "reference": "registry.example.com/lumigo-autotrace:1.2.3",
                "pullPolicy": "IfNotPresent",
            },
        }
    ]
    assert "initContainers" not in spec
    (app,) = spec["containers"]
    assert app["volumeMounts"] == [
        {"name": "lumigo-injector", "readOnly": True, "mountPath": "/opt/lumigo",
         "subPath": "payload"}
    ]  # fmt: skip
    assert app["env"] == expected_env("app")


def test_switching_modes_replaces_the_volume_the_mount_and_the_init_container_in_place() -> None:
    obj = workload("Deployment", realistic_template())
    copied = inject(obj, SETTINGS)
    mounted = inject(copied, IMAGE_VOLUME)
    assert equal(mounted, inject(obj, IMAGE_VOLUME))  # as if it had never been copied
    assert equal(inject(mounted, SETTINGS), copied)  # and back
    assert equal(remove(mounted), obj)


def test_an_unknown_injection_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid injection mode 'sidecar': one of init-container"):
        InjectionSettings(injection_mode="sidecar")


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_image_volume_mode_is_idempotent_and_removable(obj: JSON) -> None:
    once = inject(obj, IMAGE_VOLUME)
    assert equal(inject(once, IMAGE_VOLUME), once)
    assert equal(remove(once), obj)
