"""What differs on OpenShift, decided once at startup.

There, SecurityContextConstraints (restricted-v2) give every pod a UID and fsGroup from its
namespace's range and refuse a pod that names any other: the injected init container's fixed
user (1234, or the pod's fsGroup, as the reference does) would make every instrumented pod of a
namespace without an fsGroup fail to be created. With `--init-container-user=auto` (the default),
the API server's serving the `security.openshift.io` group means OpenShift, and the init container
then names no user: it runs as the one the platform assigns to the whole pod.
"""

from __future__ import annotations

import logging
from typing import Final

from api import constants
from controller.runtime.kube import KubeClient
from kube.rest import ApiError

log = logging.getLogger("lumigo.platform")

OPENSHIFT_SECURITY_API: Final = "/apis/security.openshift.io"


def is_openshift(client: KubeClient) -> bool:
    """The API server serves OpenShift's SecurityContextConstraints group (a 404 says it does
    not; any other failure is raised, never taken for an answer)."""
    try:
        client.request("GET", OPENSHIFT_SECURITY_API)
    except ApiError as err:
        if err.not_found:
            return False
        raise
    return True


def init_container_user(client: KubeClient, wanted: str) -> str:
    """The init container user to inject with: `wanted`, or for `auto` the platform's."""
    if wanted != constants.INIT_USER_AUTO:
        return wanted
    openshift = is_openshift(client)
    user = constants.INIT_USER_UNSET if openshift else constants.INIT_USER_FSGROUP
    log.info(
        "init container user",
        extra={"user": user, "why": "OpenShift" if openshift else "no security.openshift.io"},
    )
    return user
