"""The Kubernetes REST API: where a kind lives (`Resource`), the error, the verbs, watchers.

Both the webhook's certificate manager and the controller runtime use them; the built-in kinds
are in `kube.kinds`. `controller.runtime.kube.KubeClient` satisfies `KubeAPI`; objects
implementing `EventHandler` can be registered with `controller.runtime.informer.Informer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import quote

from kube.objects import JSON


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST API: `/api|apis/<apiVersion>/[namespaces/<ns>/]<plural>`."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path; `namespace` and `name` are escaped, so whatever a caller passes (a
        name from a tenant's spec such as "../../kube-system/secrets/x") stays one segment."""
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{path_segment(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{path_segment(name)}"
        return base


def path_segment(value: str) -> str:
    """`value` as exactly one URL path segment: every reserved character percent-escaped, and
    the dot-segments "." and ".." (which HTTP clients resolve away) escaped too."""
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


class ApiError(Exception):
    """A failed Kubernetes API call. `code` is the HTTP status (0 when no response arrived)."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str = "",
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.code = code
        self.reason = reason
        self.message = message
        self.body = body
        self.retry_after = retry_after
        super().__init__(f"{code} {reason}: {message}" if reason else f"{code}: {message}")

    @property
    def not_found(self) -> bool:
        return self.code == HTTPStatus.NOT_FOUND

    @property
    def conflict(self) -> bool:
        return self.code == HTTPStatus.CONFLICT

    @property
    def already_exists(self) -> bool:
        return self.code == HTTPStatus.CONFLICT and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        return self.code == HTTPStatus.GONE

    @property
    def retryable(self) -> bool:
        """Worth retrying with backoff: throttled, server-side trouble, or no response at all."""
        return (
            self.code in (0, HTTPStatus.TOO_MANY_REQUESTS)
            or self.code >= HTTPStatus.INTERNAL_SERVER_ERROR
        )


class KubeAPI(Protocol):
    """The few Kubernetes verbs the certificate manager uses; errors are `ApiError`."""

    def get_or_none(
        self, resource: Resource, name: str, namespace: str | None = None
    ) -> JSON | None: ...

    def create(self, resource: Resource, body: JSON, namespace: str | None = None) -> JSON: ...

    def replace(self, resource: Resource, body: JSON, namespace: str | None = None) -> JSON: ...

    def json_patch(
        self, resource: Resource, name: str, ops: list[JSON], namespace: str | None = None
    ) -> JSON: ...


class EventHandler(Protocol):
    """Told about changes to watched objects (called on the watch thread: keep it quick)."""

    def on_add(self, obj: JSON) -> None: ...

    def on_update(self, old: JSON, new: JSON) -> None: ...

    def on_delete(self, obj: JSON) -> None: ...
