"""`lumigo-operator uninstall`: leave the cluster as if the operator had never been there.

1. Delete every Lumigo resource; a running operator's finalizer removes instrumentation per
   namespace (honouring `removeLumigoFromResourcesOnDeletion`).
2. Wait (bounded) for them to disappear. Any that remain — no operator running, or a stuck
   finalizer — get the same treatment here, and then their finalizer is dropped.
3. Strip instrumentation from every workload still labelled as instrumented in every namespace
   (this covers workloads opted in with the `lumigo.auto-trace=true` label and no Lumigo).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from api import constants
from api.lumigo import InvalidSpecError, load_spec
from controller.lumigo import status as st
from controller.lumigo.instrumentation import Instrumenter, Target, is_labelled_instrumented
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from controller.runtime.resources import WORKLOADS, ApiError
from webhook.events import UNINSTALL_COMPONENT, UNINSTALL_TRIGGER, controller_trigger
from webhook.mutation import is_deployment_owned

log = logging.getLogger("lumigo.uninstall")

JSON = dict[str, Any]


@dataclass
class UninstallReport:
    deleted_lumigoes: int = 0
    finalized_here: int = 0
    uninstrumented: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _list_lumigoes(client: KubeClient) -> list[JSON]:
    try:
        items, _ = client.list(LUMIGOES)
    except ApiError as err:
        if err.not_found:  # the CRD is already gone: nothing to delete
            return []
        raise
    return items


def uninstall(client: KubeClient, instrumenter: Instrumenter, timeout: float) -> UninstallReport:
    report = UninstallReport()
    for lumigo in _list_lumigoes(client):
        meta = lumigo["metadata"]
        client.delete(LUMIGOES, meta["name"], meta["namespace"])
        report.deleted_lumigoes += 1
    deadline = time.monotonic() + timeout
    remaining = _list_lumigoes(client)
    while remaining and time.monotonic() < deadline:
        time.sleep(1.0)
        remaining = _list_lumigoes(client)
    for lumigo in remaining:
        log.info(
            "finalizing a Lumigo resource ourselves (is the operator running?)",
            extra={
                "namespace": lumigo["metadata"]["namespace"],
                "lumigo": lumigo["metadata"]["name"],
            },
        )
        _finalize_here(client, instrumenter, lumigo, report)
    targets = _instrumented_targets(client)
    outcomes = instrumenter.uninstrument_all(targets, UNINSTALL_TRIGGER, UNINSTALL_COMPONENT)
    report.uninstrumented += sum(1 for o in outcomes if o.changed)
    report.failures += [f"{o.target.resource.kind} {o.target.namespace}/{o.target.name}: "
                        f"{o.error}" for o in outcomes if o.error]  # fmt: skip
    return report


def _instrumented_targets(client: KubeClient, namespace: str | None = None) -> list[Target]:
    """Workloads labelled as instrumented (any value but `false`), Deployment-owned RS aside."""
    targets = []
    for resource in WORKLOADS:
        items, _ = client.list(resource, namespace, label_selector=constants.LABEL_AUTO_TRACE)
        targets += [
            Target.of(o)
            for o in items
            if is_labelled_instrumented(o) and not is_deployment_owned(o)
        ]
    return targets


def _finalize_here(
    client: KubeClient, instrumenter: Instrumenter, lumigo: JSON, report: UninstallReport
) -> None:
    meta = lumigo["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        spec = load_spec(lumigo.get("spec"))
        removal = (
            spec.tracing.injection.enabled
            and spec.tracing.injection.remove_lumigo_from_resources_on_deletion
        )
    except InvalidSpecError:
        removal = False
    if removal and st.is_active(lumigo):
        targets = _instrumented_targets(client, namespace)
        outcomes = instrumenter.uninstrument_all(targets, controller_trigger(namespace, name))
        report.uninstrumented += sum(1 for o in outcomes if o.changed)
        failed = [o for o in outcomes if o.error]
        if failed:
            report.failures += [f"{o.target.name}: {o.error}" for o in failed]
            return  # keep the finalizer: the Lumigo stays as a visible sign of what is left
    finalizers = [f for f in meta.get("finalizers") or [] if f != constants.FINALIZER]
    try:
        client.merge_patch(
            LUMIGOES,
            name,
            {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}},
            namespace,
        )
        report.finalized_here += 1
    except ApiError as err:
        if not err.not_found:
            report.failures.append(f"Lumigo {namespace}/{name}: {err.message}")
