"""Where the `Lumigo` kind and the workload kinds Lumigo instruments live in the REST API (the
runtime's catalogue knows only core kinds and no list of Lumigo's)."""

from __future__ import annotations

from api import constants
from kube.rest import Resource

LUMIGOES = Resource(constants.API_VERSION, constants.KIND, constants.PLURAL)
# The six workload kinds, in the reference's order (status listing, injection passes); by kind
# for the event recorder and the instrumenter.
WORKLOADS = constants.WORKLOAD_KINDS
WORKLOADS_BY_KIND = {r.kind: r for r in WORKLOADS}
