"""Is the Lumigo defaulter webhook reachable from the API server? A server-side dry-run create.

Right after `helm install --wait` the manager is Ready, but the API server may not reach it yet:
kube-proxy has not routed the webhook Service to the new pod, or the API server has not loaded
the caBundle the manager just wrote. Because the defaulter's failurePolicy is Fail, a Lumigo
created in that moment is refused ("failed calling webhook"). A dry run goes through the same
admission chain and stores nothing, so retrying it until it passes is how a Helm hook (or a test)
knows a Lumigo can now be created.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from api import constants
from controller.lumigo.resources import LUMIGOES
from controller.runtime.kube import KubeClient
from kube.rest import ApiError
from webhook.lumigo_defaulter import ALREADY_EXISTS

log = logging.getLogger("lumigo.admission-probe")
# The start of the defaulter's one-Lumigo-per-namespace denial (webhook.lumigo_defaulter).
ALREADY_THERE: Final = ALREADY_EXISTS.partition("{namespace}")[0]

PROBE: Final = {
    "apiVersion": constants.API_VERSION,
    "kind": constants.KIND,
    "metadata": {"name": "lumigo-admission-probe"},
    "spec": {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}},
}


def wait_until_admitted(client: KubeClient, namespace: str, timeout: float) -> float:
    """Retry a dry-run create of a Lumigo in `namespace` until the webhook admits it; the seconds
    it took. The defaulter's own denial (that namespace already has a Lumigo) means it answered;
    any other error but "failed calling webhook" (e.g. no permission) is raised at once."""
    started = time.monotonic()
    while True:
        try:
            client.request(
                "POST", LUMIGOES.path(namespace), params={"dryRun": "All"}, body=PROBE, retry=False
            )
            return time.monotonic() - started
        except ApiError as err:
            if ALREADY_THERE in err.message:  # the defaulter answered: that namespace has one
                return time.monotonic() - started
            if "failed calling webhook" not in err.message:
                raise
            if time.monotonic() - started > timeout:
                raise TimeoutError(
                    f"the API server did not reach the Lumigo webhook within {timeout:.0f} s: "
                    f"{err.message}"
                ) from None
            log.info("webhook not reachable yet", extra={"error": err.message})
        time.sleep(1.0)
