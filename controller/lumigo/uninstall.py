"""`lumigo-operator uninstall`: leave the cluster as if the operator had never been there.

1. Delete every Lumigo resource; a running operator's finalizer removes instrumentation per
   namespace (honouring `removeLumigoFromResourcesOnDeletion`).
2. Wait (bounded) for them to disappear. Any that remain — no operator running, or a stuck
   finalizer — get the same treatment here (`controller.lumigo.removal`, the finalizer's own
   code), and then their finalizer is dropped.
3. Strip instrumentation from every workload still labelled as instrumented in every namespace
   (this covers workloads opted in with the `lumigo.auto-trace=true` label and no Lumigo), and
   from those labelled `false` whose pod template still carries it (an opt-out the webhook did
   not see, a re-applied export); their `false` label stays: it is the user's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import cast

from api.lumigo import Lumigo
from controller.lumigo import removal
from controller.lumigo.instrumentation import InstrumentationIncomplete, Instrumenter
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from kube.rest import ApiError
from webhook.injection_events import UNINSTALL_COMPONENT, UNINSTALL_TRIGGER

log = logging.getLogger("lumigo.uninstall")


@dataclass
class UninstallReport:
    deleted_lumigoes: int = 0
    finalized_here: int = 0
    uninstrumented: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _list_lumigoes(client: KubeClient) -> list[Lumigo]:
    try:
        items, _ = client.list(LUMIGOES)
    except ApiError as err:
        if err.not_found:  # the CRD is already gone: nothing to delete
            return []
        raise
    return cast(list[Lumigo], items)  # what the API server returns for the kind


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
    found = removal.labelled_targets(client)
    outcomes = instrumenter.uninstrument_all(
        found.instrumented, UNINSTALL_TRIGGER, UNINSTALL_COMPONENT
    )
    outcomes += instrumenter.remove_opted_out_all(
        found.opted_out, UNINSTALL_TRIGGER, UNINSTALL_COMPONENT
    )
    report.uninstrumented += sum(1 for o in outcomes if o.changed)
    report.failures += [
        f"{o.target.resource.kind} {o.target.namespace}/{o.target.name}: {o.error}"
        for o in outcomes
        if o.error
    ]
    return report


def _finalize_here(
    client: KubeClient, instrumenter: Instrumenter, lumigo: Lumigo, report: UninstallReport
) -> None:
    """What the operator's finalizer would have done (`removal`), reported instead of retried."""
    meta = lumigo["metadata"]
    try:
        done = removal.finalize(client, instrumenter, lumigo)
        report.uninstrumented += done.uninstrumented
        report.finalized_here += int(done.finalizer_removed)
    except InstrumentationIncomplete as err:
        # The finalizer stays: the Lumigo remains as a visible sign of what is left.
        report.failures += [f"{o.target.name}: {o.error}" for o in err.failed]
    except ApiError as err:
        report.failures.append(f"Lumigo {meta['namespace']}/{meta['name']}: {err.message}")
