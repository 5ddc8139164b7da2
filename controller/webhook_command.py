"""`lumigo-operator webhook`: admission only, under an identity of its own.

The admission workers parse what anyone who reaches port 9443 sends. This process serves them
(workers, probes, metrics) and nothing else: no controller, no leader election, no certificate
signing. What it needs from the API server, and so all its ServiceAccount is granted:
- Lumigo objects: list, watch (the cache every admission answers from);
- the serving Secret, by name: get, list, watch (the serving pair and the CA certificates; the
  CA key stays in the manager's Secret);
- the webhook configurations, by name: get, list, watch (ready only once they trust what is
  served; never swap to a certificate they do not trust yet);
- the injection-mode ConfigMap, by name: list, watch (`--injection-mode=auto`: the manager
  decides, from Nodes and a Pod dry-run, powers this identity must not hold);
- Events: create, patch (instrumentation events; repeats patch the count);
- the six workload kinds: get (an event about an object being created waits until it exists,
  then carries its uid: found with a GET, as this process caches no workloads).
"""

from __future__ import annotations

import logging

from api import constants
from controller.flag_table import pick
from controller.lumigo.resources import WORKLOADS_BY_KIND
from controller.operator import start
from controller.options import RunOptions
from controller.runtime.events import EventRecorder
from controller.runtime.kube import KubeClient
from controller.runtime.manager import Manager, ManagerOptions, Runnable
from controller.webhook_serving import add_admission, add_injection_mode

log = logging.getLogger("lumigo.webhook")


def check_options(opts: RunOptions) -> None:
    """ValueError for what `lumigo-operator webhook` cannot do with its identity."""
    if opts.injection_mode == constants.INJECTION_MODE_AUTO and not opts.injection_mode_configmap:
        raise ValueError(
            "--injection-mode=auto needs --injection-mode-configmap in `lumigo-operator webhook`:"
            " the manager decides the mode and publishes it there"
        )


def build_webhook(client: KubeClient, opts: RunOptions) -> Manager:
    check_options(opts)
    manager = Manager(client, pick(ManagerOptions, opts, leader_election=False))
    # No workload cache: an object is found with a GET.
    recorder = EventRecorder(client, resources=WORKLOADS_BY_KIND)
    manager.add_runnable(
        Runnable("event-recorder", recorder.start, recorder.stop, healthy=recorder.healthy)
    )
    # Worker processes follow the Lumigo objects and the injection mode themselves; with
    # --webhook-workers=0 this process does.
    here = opts.webhook_workers == 0
    mode = add_injection_mode(manager, client, opts, decide=False) if here else None
    add_admission(manager, client, opts, lumigoes=None, recorder=recorder, injection_mode=mode)
    return manager


def run_webhook(opts: RunOptions) -> int:
    check_options(opts)
    return start(build_webhook, opts, "starting the webhook")
