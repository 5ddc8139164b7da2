"""The Helm quick start (`monitoredNamespaces`): a `lumigo` Lumigo in each listed namespace.

The chart's post-install/post-upgrade hook Job runs `lumigo-operator quickstart` with the list
(namespace, and optionally tracingEnabled/loggingEnabled per entry) and the name and key of the
token Secret the chart keeps in each namespace; the token itself never reaches the Job.

As the reference operator does it:
- absent: created with `tracing.enabled` and `logging.enabled` from the entry, both `true` when
  the entry does not say;
- present (a later `helm upgrade`): each flag the entry gives is set; a flag it does not give is
  kept as it is (a user's edit included), or set to the operator's default (tracing on, logging
  off) when the Lumigo has none; nothing else of the Lumigo is touched;
- a namespace dropped from the list keeps its Lumigo.

Unlike the reference, a Lumigo this release did not create (no `operator.lumigo.io/quickstart`
annotation naming the release; or, from older charts that made it a Helm hook, the release's
`app.kubernetes.io/instance` label with a `helm.sh/hook` annotation) is left alone and reported,
and so is a namespace that already has a Lumigo under another name (one per namespace). A
namespace that does not exist is an error for that entry only: the others are still done.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from kube import objects
from kube.kinds import NAMESPACES
from kube.rest import ApiError

NAME: Final = "lumigo"
ANNOTATION_RELEASE: Final = "operator.lumigo.io/quickstart"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
ANNOTATION_HELM_HOOK: Final = "helm.sh/hook"
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# What the reference writes when neither the entry nor the existing Lumigo has a value.
_UPDATE_DEFAULTS: Final = {"tracing": True, "logging": False}
_CREATE_DEFAULTS: Final = {"tracing": True, "logging": True}


@dataclass(frozen=True)
class Setting:
    """One entry of `monitoredNamespaces`: None where the entry does not give the flag."""

    namespace: str
    flags: dict[str, bool | None]


@dataclass
class Report:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def parse_settings(text: str) -> list[Setting]:
    """The JSON list the chart passes; ValueError naming the entry and what is wrong with it."""
    try:
        entries = json.loads(text)
    except ValueError as err:
        raise ValueError(f"--settings is not JSON: {err}") from None
    if not isinstance(entries, list):
        raise ValueError(
            "--settings must be a JSON list of {namespace, tracingEnabled, loggingEnabled} objects"
        )
    settings: list[Setting] = []
    for i, entry in enumerate(entries):
        settings.append(_setting(i, entry))
    names = [s.namespace for s in settings]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"monitoredNamespaces lists {', '.join(twice)} more than once")
    return settings


def _setting(index: int, entry: Any) -> Setting:
    where = f"monitoredNamespaces[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object with a namespace")
    unknown = sorted(set(entry) - {"namespace", "tracingEnabled", "loggingEnabled"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    namespace = entry.get("namespace")
    if not isinstance(namespace, str) or not _DNS_LABEL.fullmatch(namespace):
        raise ValueError(
            f"{where}.namespace {json.dumps(namespace)} is not a namespace name "
            "(a DNS label: lower-case letters, digits and '-', at most 63)"
        )
    flags: dict[str, bool | None] = {}
    for flag, key in (("tracing", "tracingEnabled"), ("logging", "loggingEnabled")):
        value = entry.get(key)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{where}.{key} must be true or false, not {json.dumps(value)}")
        flags[flag] = value
    return Setting(namespace, flags)


def is_ours(lumigo: dict[str, Any], release: str) -> bool:
    """Created by this release's quick start (now, or as a Helm hook by an older chart)."""
    meta = objects.metadata(lumigo)
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    if annotations.get(ANNOTATION_RELEASE) == release:
        return True
    return labels.get(LABEL_INSTANCE) == release and ANNOTATION_HELM_HOOK in annotations


def new_lumigo(setting: Setting, release: str, secret_name: str, secret_key: str) -> dict[str, Any]:
    flags = {k: _CREATE_DEFAULTS[k] if v is None else v for k, v in setting.flags.items()}
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {
            "name": NAME,
            "labels": {LABEL_INSTANCE: release},
            "annotations": {ANNOTATION_RELEASE: release},
        },
        "spec": {
            "lumigoToken": {"secretRef": {"name": secret_name, "key": secret_key}},
            "tracing": {"enabled": flags["tracing"]},
            "logging": {"enabled": flags["logging"]},
        },
    }


def update_patch(lumigo: dict[str, Any], setting: Setting) -> dict[str, Any]:
    """The merge patch an upgrade applies ({} when nothing changes)."""
    spec = lumigo.get("spec") or {}
    patch: dict[str, Any] = {}
    for flag, given in setting.flags.items():
        current = (spec.get(flag) or {}).get("enabled")
        wanted = given if given is not None else current
        if wanted is None:
            wanted = _UPDATE_DEFAULTS[flag]
        if wanted != current:
            patch.setdefault("spec", {})[flag] = {"enabled": wanted}
    return patch


@dataclass
class _Run:
    client: KubeClient
    release: str
    secret_name: str
    secret_key: str
    # Called once, with the namespace, before the first write (both go through the defaulter).
    before_first_write: Callable[[str], object]
    report: Report = field(default_factory=Report)
    written: bool = False

    def write(self, namespace: str) -> None:
        if not self.written:
            self.before_first_write(namespace)
            self.written = True


def apply(
    client: KubeClient,
    settings: list[Setting],
    *,
    release: str,
    secret_name: str,
    secret_key: str,
    before_first_write: Callable[[str], object] = lambda namespace: None,
) -> Report:
    """Create or update the `lumigo` Lumigo of every entry; one entry's failure never stops
    the others."""
    run = _Run(client, release, secret_name, secret_key, before_first_write)
    for setting in settings:
        try:
            _apply_one(run, setting)
        except ApiError as err:
            run.report.failures.append(f"{setting.namespace}: {err.message}")
    return run.report


def _apply_one(run: _Run, setting: Setting) -> None:
    client, report, release, namespace = run.client, run.report, run.release, setting.namespace
    if client.get_or_none(NAMESPACES, namespace) is None:
        report.failures.append(f'monitoredNamespaces: namespace "{namespace}" does not exist')
        return
    lumigoes, _ = client.list(LUMIGOES, namespace)
    mine = next((x for x in lumigoes if x["metadata"]["name"] == NAME), None)
    if mine is None:
        if lumigoes:
            others = ", ".join(f"{namespace}/{x['metadata']['name']}" for x in lumigoes)
            report.left_alone.append(f"{others} (the namespace's own Lumigo)")
            return
        run.write(namespace)
        body = new_lumigo(setting, release, run.secret_name, run.secret_key)
        client.create(LUMIGOES, body, namespace)
        report.created.append(namespace)
        return
    if not is_ours(mine, release):
        report.left_alone.append(f"{namespace}/{NAME} (not created by release {release})")
        return
    patch = update_patch(mine, setting)
    if not patch:
        report.unchanged.append(namespace)
        return
    run.write(namespace)
    client.merge_patch(LUMIGOES, NAME, patch, namespace)
    report.updated.append(namespace)
