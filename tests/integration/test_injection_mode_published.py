"""`--injection-mode=auto` with a separate webhook Deployment (issue 28 item 7): the manager's
Lease holder publishes the mode it decides in a ConfigMap, and the webhook, which may neither
read Nodes nor create Pods, follows it through a one-object watch, on the real API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from api import constants
from controller.lumigo.injection_mode import (
    MODE_KEY,
    InjectionModePublisher,
    PublishedInjectionMode,
)
from controller.runtime.informer import Informer, Selection
from controller.runtime.kube import KubeClient
from envtest.process import wait_until
from kube.http.readiness import NotReady
from kube.kinds import CONFIGMAPS

NAME = "lumigo-injection-mode"


@pytest.fixture
def informer(kube: KubeClient, namespace: str) -> Iterator[Informer]:
    selection = Selection(CONFIGMAPS, namespace, field_selector=f"metadata.name={NAME}")
    informer = Informer(kube, selection)
    informer.start()
    assert informer.wait_for_sync(30), informer.last_error
    try:
        yield informer
    finally:
        informer.stop()


def test_the_webhook_follows_the_mode_the_manager_publishes(
    kube: KubeClient, namespace: str, informer: Informer
) -> None:
    decided = [constants.INJECTION_MODE_IMAGE_VOLUME]
    answered = [False]

    def api_server_answered() -> None:
        if not answered[0]:
            raise NotReady("asking the API server whether it keeps image volumes")

    publisher = InjectionModePublisher(kube, namespace, NAME, lambda: decided[0],
                                       decided=api_server_answered)  # fmt: skip
    published = PublishedInjectionMode(informer, namespace, NAME)
    published.start()
    # Nothing decided, nothing published: the init container (works on every node), not ready.
    publisher.sync()
    assert kube.get_or_none(CONFIGMAPS, NAME, namespace) is None
    assert published.mode() == constants.INJECTION_MODE_INIT_CONTAINER
    with pytest.raises(NotReady):
        published.ready()

    answered[0] = True
    publisher.sync()
    wait_until(lambda: published.mode() == constants.INJECTION_MODE_IMAGE_VOLUME, 30, "followed")
    published.ready()

    # A Node with an older runtime joins: the manager decides again, the webhook follows.
    decided[0] = constants.INJECTION_MODE_INIT_CONTAINER
    publisher.sync()
    wait_until(lambda: published.mode() == constants.INJECTION_MODE_INIT_CONTAINER, 30, "back")

    # Whatever else someone writes there is read as the init container.
    kube.merge_patch(CONFIGMAPS, NAME, {"data": {MODE_KEY: "rm -rf /"}}, namespace)
    wait_until(
        lambda: (informer.get(namespace, NAME) or {}).get("data", {}).get(MODE_KEY) == "rm -rf /",
        30,
        "the edit seen",
    )
    assert published.mode() == constants.INJECTION_MODE_INIT_CONTAINER
