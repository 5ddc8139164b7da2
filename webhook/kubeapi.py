"""What webhook/ needs from the outside world, as Protocols (webhook never imports controller).

`controller.kube.KubeClient` satisfies `KubeAPI`; objects implementing `EventHandler` can be
registered with `controller.informer.Informer.add_handler`.
"""

from __future__ import annotations

from typing import Any, Protocol

from api.resources import Resource

JSON = dict[str, Any]


class KubeAPI(Protocol):
    """The few Kubernetes verbs the certificate manager uses; errors are `api.ApiError`."""

    def get_or_none(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> JSON | None: ...

    def create(self, resource: Resource, body: JSON, namespace: str | None = None) -> JSON: ...

    def replace(
        self,
        resource: Resource,
        body: JSON,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON: ...

    def json_patch(
        self,
        resource: Resource,
        name: str,
        ops: list[JSON],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON: ...


class EventHandler(Protocol):
    """Told about changes to watched objects (called on the watch thread: keep it quick)."""

    def on_add(self, obj: JSON) -> None: ...

    def on_update(self, old: JSON, new: JSON) -> None: ...

    def on_delete(self, obj: JSON) -> None: ...
