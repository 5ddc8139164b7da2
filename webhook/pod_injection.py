"""Pure pod-template mutation: the one definition of "instrumented by Lumigo".

The webhook calls it on admission and the controller calls it on stored workloads, so both agree
on what "injected" means. No I/O, no globals; the input is never modified.

Public interface:

    settings = InjectionSettings(operator_version="1.4.0", injector_image=..., ...)  # validated
    settings = settings.for_spec(load_spec(lumigo["spec"]))   # a namespace's token and flags
    injected = inject(workload, settings)   # a new dict; == workload when nothing had to change
    cleaned  = remove(workload)             # a new dict; everything of ours gone (a user's
                                            # `lumigo.auto-trace=false` stays: it is theirs)
    is_instrumented(workload), pod_template_path(kind),
    skip_reason(workload), auto_trace_label(workload), validate(workload)

Errors: `InvalidObjectError` (the dict is not a well-formed workload of its kind), `OptedOutError`
(label `lumigo.auto-trace=false`) — both subclasses of `MutationError`, whose messages are safe
to show in events (they never contain a token value).

What `inject` does (the reference's rules, then our fixes):
- volume `lumigo-injector` (emptyDir, sizeLimit 200M) and init container `lumigo-injector`
  (TARGET_DIRECTORY=/target, volume at /target) replaced in place by name, else appended; in
  the image-volume mode instead, volume `lumigo-injector` is the autotrace image itself
  (`image:`, mounted with subPath `payload`) and there is no init container (ours is dropped);
- in every regular container (never init or ephemeral ones): the volume read-only at
  /opt/lumigo (matched by path) and 7 env vars in order, each replaced in place or appended:
  LD_PRELOAD, LUMIGO_TRACER_TOKEN (secretKeyRef, optional), LUMIGO_ENDPOINT,
  LUMIGO_LOGS_ENDPOINT, LUMIGO_ENABLE_LOGS, LUMIGO_ENABLE_TRACES, LUMIGO_CONTAINER_NAME;
- only if the pod spec changed: label `lumigo.auto-trace=lumigo-operator.v<version>` on the
  object and on its pod template (the version is never truncated; it is validated instead);
- CronJobs: `.spec.jobTemplate.spec.template`; ReplicaSets owned by a Deployment: untouched.
- in the init-container mode, a pod whose ephemeral-storage limit cannot hold the payload copy
  gets nothing of ours (`webhook.storage`; the callers record why): never evict a user's pod.
Fixes: a user's own LD_PRELOAD is kept (see below); the init container gets small resource
requests/limits and a restricted securityContext; Windows pods are left alone (LD_PRELOAD means
nothing there and the Linux securityContext fields would make the API server reject the object).

LD_PRELOAD: the user's entry is renamed in place to LUMIGO_ORIGINAL_LD_PRELOAD (value or
valueFrom kept as is) and followed by `LD_PRELOAD=<ours>:$(LUMIGO_ORIGINAL_LD_PRELOAD)`; the kubelet
expands the reference, so ours is prepended whatever the source of theirs. An optional ConfigMap
or Secret key may be missing, and the kubelet then leaves the reference verbatim (ld.so would try
to load `$(LUMIGO_ORIGINAL_LD_PRELOAD)` in every process): for such a source LD_PRELOAD is ours
alone, and the injector chains the original at start-up when it is set. `remove` renames it
back, restoring the container exactly. An LD_PRELOAD equal to ours (the reference operator's
injection) counts as ours.

`remove(inject(t)) == t` for templates in the form the API server serialises (no empty lists or
maps) that do not already use our reserved names (volume/init container `lumigo-injector`, mount
path /opt/lumigo, the 7 env vars, LUMIGO_ORIGINAL_LD_PRELOAD, the `lumigo.auto-trace` label).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from api import constants, eligibility
from api.lumigo import LumigoSpec
from kube import objects
from kube.http.messages import quote
from kube.jsonpatch import copy_json, equal, same
from kube.objects import JSON, Container, EnvVar, PodSpec, Volume, VolumeMount
from kube.quantity import parse_quantity, same_quantity
from webhook import containers, storage

SUPPORTED_KINDS: Final = {r.kind: r.api_version for r in constants.WORKLOAD_KINDS}
_CRONJOB_TEMPLATE: Final = ("spec", "jobTemplate", "spec", "template")
_TEMPLATE: Final = ("spec", "template")

TARGET_DIRECTORY_ENV: Final = "TARGET_DIRECTORY"
CHAINED_LD_PRELOAD: Final = f"{constants.LD_PRELOAD_VALUE}:$({constants.ENV_ORIGINAL_LD_PRELOAD})"
T = TypeVar("T", bound=Mapping[str, Any])
_PLAIN_LD_PRELOAD: Final = EnvVar(name=constants.ENV_LD_PRELOAD, value=constants.LD_PRELOAD_VALUE)
_CHAINED_LD_PRELOAD: Final = EnvVar(name=constants.ENV_LD_PRELOAD, value=CHAINED_LD_PRELOAD)
_INIT_ENV: Final = [EnvVar(name=TARGET_DIRECTORY_ENV, value=constants.INJECTOR_TARGET_DIRECTORY)]
_INIT_MOUNTS: Final = [
    VolumeMount(name=constants.INJECTOR_VOLUME, mountPath=constants.INJECTOR_TARGET_DIRECTORY)
]
# Fields the API server fills in on a stored container. Keeping them on our init container makes
# `inject` a no-op on an already-injected stored object (no patch, no event on every update).
_ServerDefaulted = Literal["terminationMessagePath", "terminationMessagePolicy"]
_SERVER_DEFAULTED: Final[tuple[_ServerDefaulted, ...]] = (
    "terminationMessagePath",
    "terminationMessagePolicy",
)

_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


class MutationError(ValueError):
    """Why a workload cannot be (un)instrumented; the message is safe for events and logs."""


class InvalidObjectError(MutationError):
    """The object is not a well-formed workload of its kind (the message names the field)."""


class OptedOutError(MutationError):
    """The workload carries `lumigo.auto-trace=false`: the user asked us to keep away."""


# --- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitContainerResources:
    """Requests/limits of the `lumigo-injector` init container (Kubernetes quantities).

    The reference sets none, which breaks in namespaces whose ResourceQuota requires limits and
    lets a LimitRange default apply (sometimes whole CPUs). Defaults: 50m CPU / 64Mi memory
    requested, 500m / 128Mi limits, so the limit/request ratios are 10 (CPU, as the OpenTelemetry
    operator's copy containers) and 2 (memory), which common LimitRanges' `maxLimitRequestRatio`
    allow (the earlier 10m/500m, a ratio of 50, was refused by them). The request stays small
    because for a pod that requests nothing it is the pod's whole request: 125m made a 2-CPU
    node refuse pods it ran before. The CPU limit sets the copy's speed: on the real node the
    ~99 MB copy took 12 s at 500m and 26 s at 200m (bench/product_node.py), so the limit stays.
    The memory limit leaves headroom for the page cache of the copy, which OOM-killed
    other vendors' copy containers at 32-64Mi (OpenTelemetry operator #3479, Datadog's move to
    128Mi). An init container's request counts only against the pod's effective request (the
    max over init containers and the sum of the others). When every other container of the pod
    is Guaranteed, the limits are used as requests too, so the pod keeps its Guaranteed QoS.
    """

    requests_cpu: str = "50m"
    requests_memory: str = "64Mi"
    limits_cpu: str = "500m"
    limits_memory: str = "128Mi"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            try:
                amount = parse_quantity(value)
            except ValueError as err:
                raise ValueError(f"init container {f.name.replace('_', ' ')}: {err}") from None
            if amount <= 0:
                raise ValueError(f"init container {f.name.replace('_', ' ')} must be positive")
        for resource in ("cpu", "memory"):
            request = getattr(self, f"requests_{resource}")
            limit = getattr(self, f"limits_{resource}")
            if parse_quantity(request) > parse_quantity(limit):
                raise ValueError(
                    f"init container {resource} request {request} exceeds its limit {limit}"
                )

    @classmethod
    def parse(cls, text: str) -> InitContainerResources:
        """`requests.cpu=50m,limits.memory=256Mi`: any of the four, the others keep their
        defaults (the `--init-resources` flag, LUMIGO_INIT_RESOURCES)."""
        values: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            field_name = key.strip().replace(".", "_")
            if not sep or field_name not in _INIT_RESOURCE_FIELDS:
                raise ValueError(
                    f"init container resources: {item!r} is not one of "
                    "requests.cpu=, requests.memory=, limits.cpu=, limits.memory="
                )
            values[field_name] = value.strip()
        return cls(**values)

    def __str__(self) -> str:
        return ",".join(
            f"{f.name.replace('_', '.', 1)}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
        )

    def as_dict(self, guaranteed: bool) -> dict[str, dict[str, str]]:
        limits = {"cpu": self.limits_cpu, "memory": self.limits_memory}
        if guaranteed:
            return {"limits": limits, "requests": dict(limits)}
        return {
            "limits": limits,
            "requests": {"cpu": self.requests_cpu, "memory": self.requests_memory},
        }


_INIT_RESOURCE_FIELDS = frozenset(f.name for f in dataclasses.fields(InitContainerResources))


@dataclass(frozen=True)
class InjectionSettings:
    """Everything `inject` needs; validated on construction so that a bad flag or label fails
    here with a clear message instead of producing an object the API server rejects."""

    operator_version: str = "dev"
    injector_image: str = constants.DEFAULT_INJECTOR_IMAGE
    injector_pull_policy: str = constants.DEFAULT_INJECTOR_PULL_POLICY
    injection_mode: str = constants.INJECTION_MODE_INIT_CONTAINER
    # Base URL of the telemetry proxy (TELEMETRY_PROXY_OTLP_SERVICE); /v1/traces and /v1/logs
    # are appended.
    telemetry_proxy_endpoint: str = constants.DEFAULT_TELEMETRY_PROXY_SERVICE
    token_secret_name: str = constants.DEFAULT_TOKEN_SECRET
    token_secret_key: str = constants.DEFAULT_TOKEN_KEY
    enable_traces: bool = True
    enable_logs: bool = False
    init_resources: InitContainerResources = field(default_factory=InitContainerResources)
    init_container_user: str = constants.INIT_USER_FSGROUP

    def __post_init__(self) -> None:
        if self.init_container_user not in constants.INIT_USERS:
            raise ValueError(
                f"invalid init container user {self.init_container_user!r}: one of "
                + ", ".join(constants.INIT_USERS)
            )
        label = self.label_value
        if len(label) > constants.LABEL_VALUE_MAX_LENGTH or not _LABEL_VALUE.fullmatch(label):
            raise ValueError(
                f"operator version {self.operator_version!r} does not make a valid label value "
                f"{label!r} (at most 63 characters: letters, digits, '-', '_', '.')"
            )
        if not self.injector_image or self.injector_image != self.injector_image.strip():
            raise ValueError(f"invalid injector image {self.injector_image!r}")
        if self.injector_pull_policy not in constants.PULL_POLICIES:
            raise ValueError(
                f"invalid injector image pull policy {self.injector_pull_policy!r}: one of "
                + ", ".join(constants.PULL_POLICIES)
            )
        if self.injection_mode not in constants.INJECTION_MODES:
            raise ValueError(
                f"invalid injection mode {self.injection_mode!r}: one of "
                + ", ".join(constants.INJECTION_MODES)
            )
        if not self.telemetry_proxy_endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"telemetry proxy endpoint {self.telemetry_proxy_endpoint!r} must be an "
                "http:// or https:// URL"
            )
        name, key = self.token_secret_name, self.token_secret_key
        if len(name) > constants.SECRET_NAME_MAX_LENGTH or not _DNS_SUBDOMAIN.fullmatch(name):
            raise ValueError(
                f"invalid token secret name {name!r}: a Secret name is lower-case letters, "
                "digits, '-' and '.' (at most 253 characters)"
            )
        if len(key) > constants.SECRET_KEY_MAX_LENGTH or not _SECRET_KEY.fullmatch(key):
            raise ValueError(
                f"invalid token secret key {key!r}: a Secret key is letters, digits, '-', '_' "
                "and '.' (at most 253 characters)"
            )

    @property
    def label_value(self) -> str:
        """The `lumigo.auto-trace` value of an instrumented workload."""
        return f"{constants.AUTO_TRACE_VERSION_PREFIX}{self.operator_version}"

    @property
    def traces_endpoint(self) -> str:
        return f"{self.telemetry_proxy_endpoint.rstrip('/')}/v1/traces"

    @property
    def logs_endpoint(self) -> str:
        return f"{self.telemetry_proxy_endpoint.rstrip('/')}/v1/logs"

    def for_spec(self, spec: LumigoSpec) -> InjectionSettings:
        """These settings with a Lumigo resource's token reference and tracing/logging flags."""
        ref = spec.lumigo_token.secret_ref
        return dataclasses.replace(
            self,
            token_secret_name=ref.name,
            token_secret_key=ref.key,
            enable_traces=spec.tracing.enabled,
            enable_logs=spec.logging.enabled,
        )

    def lumigo_env(self, container_name: str) -> list[EnvVar]:
        """The env entries after LD_PRELOAD, in the reference's order."""
        return [
            {
                "name": constants.ENV_TRACER_TOKEN,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": self.token_secret_name,
                        "key": self.token_secret_key,
                        "optional": True,
                    }
                },
            },
            {"name": constants.ENV_ENDPOINT, "value": self.traces_endpoint},
            {"name": constants.ENV_LOGS_ENDPOINT, "value": self.logs_endpoint},
            {"name": constants.ENV_ENABLE_LOGS, "value": _bool(self.enable_logs)},
            {"name": constants.ENV_ENABLE_TRACES, "value": _bool(self.enable_traces)},
            {"name": constants.ENV_CONTAINER_NAME, "value": container_name},
        ]


def _bool(value: bool) -> str:
    return "true" if value else "false"


# --- object helpers ------------------------------------------------------------------------


def pod_template_path(kind: str) -> tuple[str, ...]:
    """Where the pod template of a workload kind lives; raises InvalidObjectError if unsupported."""
    if kind not in SUPPORTED_KINDS:
        raise InvalidObjectError(
            f"unsupported kind {quote(kind)}: expected one of {sorted(SUPPORTED_KINDS)}"
        )
    return _CRONJOB_TEMPLATE if kind == "CronJob" else _TEMPLATE


def auto_trace_label(obj: Mapping[str, Any]) -> str | None:
    """The top-level `lumigo.auto-trace` label, or None."""
    value: object = objects.labels_of(obj).get(constants.LABEL_AUTO_TRACE)
    return value if isinstance(value, str) else None


def is_opted_out(obj: Mapping[str, Any]) -> bool:
    return (auto_trace_label(obj) or "").lower() == constants.AUTO_TRACE_FALSE


def skip_reason(obj: Mapping[str, Any], kind: str | None = None) -> str | None:
    """Why `inject` leaves a (valid) workload untouched by design, as a short token, or None."""
    kind = _kind(obj, kind)
    if objects.is_deployment_owned(obj, kind):
        return eligibility.DEPLOYMENT_OWNED
    pod_spec = _get(obj, (*pod_template_path(kind), "spec"))
    os_spec = pod_spec.get("os") if isinstance(pod_spec, Mapping) else None
    if isinstance(os_spec, Mapping) and os_spec.get("name") == "windows":
        return "windows-pod"
    return None


def is_instrumented(obj: Mapping[str, Any], kind: str | None = None) -> bool:
    """Whether the pod template carries anything of ours (volume, init container, mount, env)."""
    return not same(remove(obj, kind), obj)


def _kind(obj: Mapping[str, Any], kind: str | None) -> str:
    found = kind if kind is not None else obj.get("kind")
    if not isinstance(found, str):
        raise InvalidObjectError("the object has no 'kind'")
    return found


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


# --- validation ----------------------------------------------------------------------------


def validate(obj: Any, kind: str | None = None) -> None:
    """Raise InvalidObjectError unless every field `inject`/`remove` reads has the right type.
    (JSON objects are dicts; paths are only formatted when something is wrong: this runs on
    every admission.)"""
    if not isinstance(obj, dict):
        raise InvalidObjectError("the object must be a JSON object")
    kind = _kind(obj, kind)
    path = pod_template_path(kind)
    _check_metadata(obj.get("metadata"), "metadata")
    node: Any = obj
    for depth, key in enumerate(path):
        node = node.get(key)
        if not isinstance(node, dict):
            raise InvalidObjectError(f"{'.'.join(path[: depth + 1])} must be an object")
    where = ".".join(path)
    _check_metadata(node.get("metadata"), f"{where}.metadata")
    spec = node.get("spec")
    where = f"{where}.spec"
    if not isinstance(spec, dict):
        raise InvalidObjectError(f"{where} must be an object")
    for key in ("containers", "initContainers"):
        for i, container in enumerate(_objects(spec.get(key), f"{where}.{key}")):
            _check_container(container, f"{where}.{key}[{i}]")
    for i, volume in enumerate(_objects(spec.get("volumes"), f"{where}.volumes")):
        _check(volume, "name", str, f"{where}.volumes[{i}]", required=True)
    for key in ("securityContext", "resources", "os"):
        _check(spec, key, dict, where)
    context = spec.get("securityContext") or {}
    _check(context, "fsGroup", int, f"{where}.securityContext")
    _check(context, "runAsNonRoot", bool, f"{where}.securityContext")


def _check_metadata(meta: Any, where: str) -> None:
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise InvalidObjectError(f"{where} must be an object")
    labels = meta.get("labels")
    if labels is not None:
        if not isinstance(labels, dict):
            raise InvalidObjectError(f"{where}.labels must be an object")
        for key, value in labels.items():
            if not isinstance(value, str):
                raise InvalidObjectError(f"{where}.labels[{quote(key)}] must be a string")
    _objects(meta.get("ownerReferences"), f"{where}.ownerReferences")


def _check_container(container: JSON, where: str) -> None:
    _check(container, "name", str, where, required=True)
    env = container.get("env")
    if env is not None:
        for i, entry in enumerate(_objects(env, f"{where}.env")):
            if not isinstance(entry.get("name"), str):
                _check(entry, "name", str, f"{where}.env[{i}]", required=True)
    mounts = container.get("volumeMounts")
    if mounts is not None:
        for i, mount in enumerate(_objects(mounts, f"{where}.volumeMounts")):
            _check(mount, "name", str, f"{where}.volumeMounts[{i}]")
            _check(mount, "mountPath", str, f"{where}.volumeMounts[{i}]")
    _check(container, "resources", dict, where)


def _objects(items: Any, where: str) -> list[JSON]:
    """`items` if it is absent or an array of objects; raises naming `where` otherwise."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise InvalidObjectError(f"{where} must be an array")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidObjectError(f"{where}[{i}] must be an object")
    return items


_TYPE_NAMES: Final = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object"}


def _check(holder: JSON, key: str, expected: type, where: str, required: bool = False) -> None:
    value = holder.get(key)
    if value is None:
        if required:
            raise InvalidObjectError(f"{where}.{key} is required")
        return
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise InvalidObjectError(f"{where}.{key} must be {_TYPE_NAMES[expected]}")


# --- inject --------------------------------------------------------------------------------


def inject(obj: Mapping[str, Any], settings: InjectionSettings, kind: str | None = None) -> JSON:
    """A copy of the workload, instrumented. `kind` overrides `obj["kind"]` (admission requests
    carry it separately). Raises InvalidObjectError or OptedOutError."""
    kind = _kind(obj, kind)
    validate(obj, kind)
    if is_opted_out(obj):
        raise OptedOutError(
            f"the resource has the '{constants.LABEL_AUTO_TRACE}' label set to "
            f"'{constants.AUTO_TRACE_FALSE}'"
        )
    result: JSON = copy_json(obj)
    if skip_reason(result, kind) is not None:
        return result
    template = _get(result, pod_template_path(kind))
    pod_spec: PodSpec = template["spec"]
    traced = container_selection(result, kind).traced
    # Every container left out, or a copy that would get the pod evicted: nothing of ours in
    # the pod at all (removed if it was there).
    if not traced or storage_problem(result, settings, kind) is not None:
        if _remove_pod_spec(pod_spec):
            _drop_label(result)
            _drop_label(template)
        return result
    before = copy_json(pod_spec)
    _inject_pod_spec(pod_spec, settings, traced)
    if not same(before, pod_spec):
        _set_label(result, settings.label_value)
        _set_label(template, settings.label_value)
    return result


def storage_problem(
    obj: Mapping[str, Any], settings: InjectionSettings, kind: str | None = None
) -> str | None:
    """Why the init container's copy would get the (valid) workload's pods evicted for their
    ephemeral storage (`webhook.storage`), or None; never in the image-volume mode."""
    if settings.injection_mode == constants.INJECTION_MODE_IMAGE_VOLUME:
        return None
    pod_spec = pod_spec_of(obj, kind)
    return storage.problem(pod_spec) if pod_spec is not None else None


def pod_spec_of(obj: Mapping[str, Any], kind: str | None = None) -> Mapping[str, Any] | None:
    """The pod spec of a workload's pod template, or None when it has none."""
    pod_spec = _get(obj, (*pod_template_path(_kind(obj, kind)), "spec"))
    return pod_spec if isinstance(pod_spec, Mapping) else None


def container_selection(obj: Mapping[str, Any], kind: str | None = None) -> containers.Selection:
    """Which containers of the (valid) workload to trace, by its per-container annotations."""
    pod_spec = _get(obj, (*pod_template_path(_kind(obj, kind)), "spec"))
    names = [str(c.get("name")) for c in (pod_spec or {}).get("containers") or []]
    annotations = objects.annotations_of(obj)
    return containers.select(annotations, names)


def _inject_pod_spec(
    pod_spec: PodSpec, settings: InjectionSettings, traced: frozenset[str]
) -> None:
    mount = VolumeMount(
        name=constants.INJECTOR_VOLUME, readOnly=True, mountPath=constants.LUMIGO_MOUNT_PATH
    )
    if settings.injection_mode == constants.INJECTION_MODE_IMAGE_VOLUME:
        image = {"reference": settings.injector_image, "pullPolicy": settings.injector_pull_policy}
        volume = Volume(name=constants.INJECTOR_VOLUME, image=image)
        mount["subPath"] = constants.PAYLOAD_IMAGE_PATH
        _drop(pod_spec, "initContainers", _is_our_init_container)  # switched from the copy
    else:
        volume = Volume(
            name=constants.INJECTOR_VOLUME,
            emptyDir={"sizeLimit": constants.INJECTOR_VOLUME_SIZE_LIMIT},
        )
        init_containers = _init_containers(pod_spec)
        existing = _find(init_containers, "name", constants.INJECTOR_INIT_CONTAINER)
        _upsert(init_containers, "name", _init_container(pod_spec, settings, existing))
    _upsert(_volumes(pod_spec), "name", volume)
    for container in pod_spec.get("containers") or []:
        if container["name"] not in traced:  # left out (again, or since): nothing of ours
            _drop(container, "volumeMounts", _is_our_mount)
            _restore_env(container)
            continue
        _upsert(_mounts(container), "mountPath", mount)
        env = _env(container)
        _inject_ld_preload(env)
        for entry in settings.lumigo_env(container["name"]):
            _upsert(env, "name", entry)


def _init_container(
    pod_spec: PodSpec, settings: InjectionSettings, existing: Container | None
) -> Container:
    # The restricted Pod Security Standard on its own, whatever the pod or its other containers
    # say: a namespace that enforces it checks every container, and a pod that sets
    # `runAsNonRoot` per container (not on the pod) would otherwise be refused because of ours.
    context: JSON = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }
    if settings.init_container_user == constants.INIT_USER_FSGROUP:
        # The reference runs as the pod's fsGroup so the copy is writable; fsGroup 0 would mean
        # root, which `runAsNonRoot: true` refuses and the restricted policy forbids: 1234 then.
        fs_group = (pod_spec.get("securityContext") or {}).get("fsGroup")
        user = fs_group if fs_group else constants.DEFAULT_INIT_CONTAINER_UID
        context |= {"runAsUser": user, "runAsGroup": user}
    # (unset: the pod's user, or the one the platform assigns; the image's is 1234.)
    context |= {"capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    container = Container(
        name=constants.INJECTOR_INIT_CONTAINER,
        image=settings.injector_image,
        imagePullPolicy=settings.injector_pull_policy,
        env=copy_json(_INIT_ENV),
        volumeMounts=copy_json(_INIT_MOUNTS),
        securityContext=context,
    )
    # Pod-level resources cap every container: ours must not exceed them, so leave ours unset
    # ({} is how the API server stores "unset": the field is not omitempty).
    if pod_spec.get("resources"):
        container["resources"] = {}
    else:
        container["resources"] = settings.init_resources.as_dict(_is_guaranteed(pod_spec))
    if existing is not None:
        for key in _SERVER_DEFAULTED:
            if key in existing:
                container[key] = existing[key]
        if _same_resources(existing.get("resources"), container["resources"]):
            container["resources"] = existing["resources"]
    return container


def _is_guaranteed(pod_spec: PodSpec) -> bool:
    """Guaranteed QoS: every container has cpu and memory limits equal to its requests."""
    containers = [
        *(pod_spec.get("containers") or []),
        *(
            c
            for c in pod_spec.get("initContainers") or []
            if c.get("name") != constants.INJECTOR_INIT_CONTAINER
        ),
    ]
    if not containers:
        return False
    for container in containers:
        resources = container.get("resources") or {}
        # From the wire, unchecked by `validate`: the sections may be anything.
        limits: object = resources.get("limits") or {}
        requests: object = resources.get("requests") or {}
        if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
            return False
        for resource in ("cpu", "memory"):
            if resource not in limits:
                return False
            if not same_quantity(requests.get(resource, limits[resource]), limits[resource]):
                return False
    return True


def _same_resources(stored: object, wanted: Mapping[str, Mapping[str, str]]) -> bool:
    if not isinstance(stored, Mapping) or stored.keys() != wanted.keys():
        return False
    for section, amounts in wanted.items():
        have = stored[section]
        if not isinstance(have, Mapping) or have.keys() != amounts.keys():
            return False
        if not all(same_quantity(have[r], amounts[r]) for r in amounts):
            return False
    return True


def _env(container: Container) -> list[EnvVar]:
    """The container's env list (created when missing), as `validate` checked it."""
    return _list(container, "env")


def _mounts(container: Container) -> list[VolumeMount]:
    return _list(container, "volumeMounts")


def _volumes(pod_spec: PodSpec) -> list[Volume]:
    return _list(pod_spec, "volumes")


def _init_containers(pod_spec: PodSpec) -> list[Container]:
    return _list(pod_spec, "initContainers")


def _inject_ld_preload(env: list[EnvVar]) -> None:
    """Make LD_PRELOAD ours, keeping a user's own value as LUMIGO_ORIGINAL_LD_PRELOAD."""
    i = _index(env, constants.ENV_LD_PRELOAD)
    j = _index(env, constants.ENV_ORIGINAL_LD_PRELOAD)
    if i is None:
        if j is not None:
            del env[j]  # the user dropped their LD_PRELOAD: forget it
        env.append(EnvVar(**_PLAIN_LD_PRELOAD))
        return
    if not _is_our_ld_preload(env[i]):
        # The user's own (new or changed) LD_PRELOAD becomes the original; ours follows it.
        if j is not None:
            del env[j]
            i = i - 1 if j < i else i
        env[i] = {**env[i], "name": constants.ENV_ORIGINAL_LD_PRELOAD}
        env.insert(i + 1, _ours_after(env[i]))
        return
    if j is None:
        env[i] = EnvVar(**_PLAIN_LD_PRELOAD)
        return
    if j > i:  # $(VAR) only expands variables defined earlier in the list
        env.insert(i, env.pop(j))
        j, i = i, i + 1
    env[i] = _ours_after(env[j])


def _ours_after(original: EnvVar) -> EnvVar:
    """Our LD_PRELOAD entry after the user's (kept as LUMIGO_ORIGINAL_LD_PRELOAD): chained with a
    `$(...)` reference, unless the kubelet may leave the original unset (an optional ConfigMap or
    Secret key that is missing) and so the reference verbatim, which ld.so would then try to load
    in every process. Such an original is chained by the injector when it is set."""
    return EnvVar(**(_PLAIN_LD_PRELOAD if _may_be_unset(original) else _CHAINED_LD_PRELOAD))


def _may_be_unset(entry: EnvVar) -> bool:
    source = entry.get("valueFrom")
    if not isinstance(source, Mapping):
        return False
    refs = (source.get("configMapKeyRef"), source.get("secretKeyRef"))
    return any(isinstance(ref, Mapping) and ref.get("optional") is True for ref in refs)


def _is_our_ld_preload(entry: EnvVar) -> bool:
    return equal(entry, _PLAIN_LD_PRELOAD) or equal(entry, _CHAINED_LD_PRELOAD)


def _set_label(holder: JSON, value: str) -> None:
    if not isinstance(holder.get("metadata"), dict):
        holder["metadata"] = {}
    meta = holder["metadata"]
    if not isinstance(meta.get("labels"), dict):
        meta["labels"] = {}
    meta["labels"][constants.LABEL_AUTO_TRACE] = value


def _list(holder: Container | PodSpec, key: str) -> list[Any]:
    """`holder[key]`, a list (created when missing or null), as `validate` checked it: the typed
    wrappers above name which list."""
    fields: JSON = holder  # type: ignore[assignment]  # a TypedDict is a dict at run time
    if fields.get(key) is None:
        fields[key] = []
    items: list[Any] = fields[key]
    return items


def _index(items: Sequence[Mapping[str, Any]], name: str, key: str = "name") -> int | None:
    for i, item in enumerate(items):
        if item.get(key) == name:
            return i
    return None


def _find(items: list[T], key: str, value: str) -> T | None:
    i = _index(items, value, key)
    return None if i is None else items[i]


def _upsert(items: list[T], key: str, new: T) -> None:
    """Replace the first item whose `key` matches in place, else append."""
    i = _index(items, new[key], key)
    if i is None:
        items.append(new)
    else:
        items[i] = new


# --- remove --------------------------------------------------------------------------------


def remove(obj: Mapping[str, Any], kind: str | None = None) -> JSON:
    """A copy of the workload with our volume, init container, mounts and env removed (a user's
    LD_PRELOAD restored) and, if anything was removed, the `lumigo.auto-trace` label dropped —
    unless it is the user's opt-out `false`, which is how an opted-out workload is cleaned and
    stays opted out."""
    kind = _kind(obj, kind)
    validate(obj, kind)
    result: JSON = copy_json(obj)
    if objects.is_deployment_owned(result, kind):
        return result
    template = _get(result, pod_template_path(kind))
    pod_spec: PodSpec = template["spec"]
    if _remove_pod_spec(pod_spec):
        _drop_label(result)
        _drop_label(template)
    return result


def _remove_pod_spec(pod_spec: PodSpec) -> bool:
    changed = _drop(pod_spec, "initContainers", _is_our_init_container)
    for container in pod_spec.get("containers") or []:
        # The env names we inject are the Lumigo tracer's own: a container we never instrumented
        # may set them itself (an app traced by hand, the operator's own pods configured through
        # them), so they are ours to remove only next to our mount or our LD_PRELOAD.
        instrumented = _carries_our_instrumentation(container)
        changed |= _drop(container, "volumeMounts", _is_our_mount)
        if instrumented:
            changed |= _restore_env(container)
    still_used = any(
        _is_our_mount(m)
        for c in pod_spec.get("initContainers") or []
        for m in c.get("volumeMounts") or []
    )
    if not still_used:  # dropping a volume something still mounts would make the object invalid
        changed |= _drop(pod_spec, "volumes", _is_our_volume)
    return changed


def _carries_our_instrumentation(container: Container) -> bool:
    """Our payload mount, our LD_PRELOAD, or the user's LD_PRELOAD we set aside."""
    if any(_is_our_mount(m) for m in container.get("volumeMounts") or []):
        return True
    env = container.get("env") or []
    i = _index(env, constants.ENV_LD_PRELOAD)
    return (i is not None and _is_our_ld_preload(env[i])) or _index(
        env, constants.ENV_ORIGINAL_LD_PRELOAD
    ) is not None


def _is_our_mount(mount: VolumeMount) -> bool:
    return mount.get("name") == constants.INJECTOR_VOLUME


def _is_our_volume(volume: Volume) -> bool:
    return volume.get("name") == constants.INJECTOR_VOLUME and (
        "emptyDir" in volume or "image" in volume
    )


def _is_our_init_container(container: Container) -> bool:
    return (
        container.get("name") == constants.INJECTOR_INIT_CONTAINER
        and equal(container.get("env"), _INIT_ENV)
        and equal(container.get("volumeMounts"), _INIT_MOUNTS)
    )


def _restore_env(container: Container) -> bool:
    env = container.get("env")
    if not env:
        return False
    before = len(env)
    i = _index(env, constants.ENV_LD_PRELOAD)
    j = _index(env, constants.ENV_ORIGINAL_LD_PRELOAD)
    renamed = False
    if i is not None and _is_our_ld_preload(env[i]):
        if j is not None:
            env[j] = {**env[j], "name": constants.ENV_LD_PRELOAD}
            renamed = True
        del env[i]
    elif j is not None:
        del env[j]
    ours = set(constants.INJECTED_ENV_NAMES) - {constants.ENV_LD_PRELOAD}
    env[:] = [e for e in env if e.get("name") not in ours]
    if not env:
        del container["env"]
    return renamed or len(env) != before


def _drop(holder: Container | PodSpec, key: str, is_ours: Callable[[T], bool]) -> bool:
    """Remove from the list `holder[key]` the items `is_ours` says are ours (and the list when
    nothing is left)."""
    fields: JSON = holder  # type: ignore[assignment]  # a TypedDict is a dict at run time
    items: list[T] | None = fields.get(key)
    if not items:
        return False
    kept = [item for item in items if not is_ours(item)]
    if len(kept) == len(items):
        return False
    if kept:
        fields[key] = kept
    else:
        del fields[key]
    return True


def _drop_label(holder: JSON) -> None:
    meta = holder.get("metadata")
    if not isinstance(meta, dict):
        return
    labels = meta.get("labels")
    if isinstance(labels, dict) and constants.LABEL_AUTO_TRACE in labels:
        if is_opted_out(holder):
            return  # the user's own opt-out, not our label
        del labels[constants.LABEL_AUTO_TRACE]
        if not labels:
            del meta["labels"]
        if not meta:
            del holder["metadata"]
