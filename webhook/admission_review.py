"""AdmissionReview v1: parse a request strictly, build responses that echo its uid.

The HTTPS server needs only this contract:

    request  = parse_review(body, content_type)     # AdmissionRequest, or raises BadRequest
    response = handler.handle(request)              # AdmissionResponse (handlers never raise
                                                    #  anything but BadRequest)
    payload  = response.to_json()                   # bytes, HTTP 200, application/json
    # or all three at once:  payload = review(handler, body, content_type)

`BadRequest` means HTTP 400 with `err.message` as the body: the API server counts it as a failed
call and applies the webhook's failurePolicy. Every other outcome is HTTP 200 with a review whose
`response.uid` echoes `request.uid`.

Response builders (controller-runtime's shapes, so `kubectl` shows the same texts):
    allow(request, message)                  allowed, status {code 200, message}
    deny(request, message, code, reason)     refused, status {code 403, reason Forbidden, message}
    errored(request, code, message)          refused, status {code, message}
    patched(request, ops)                    allowed, patchType JSONPatch, base64 patch
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

from kube.http.messages import MAX_BODY_BYTES, quote
from kube.http.routing import BadRequest, Route
from kube.jsonpatch import Operation

T = TypeVar("T")
JSONObject = dict[str, Any] | None

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")


@dataclass(frozen=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        """Go's metav1.GroupVersionKind.String(), which the reference puts in its messages."""
        return f"{self.group}/{self.version}, Kind={self.kind}"


@dataclass(frozen=True)
class AdmissionRequest:
    """The parts of `request` the handlers use, type-checked."""

    uid: str
    kind: GroupVersionKind
    operation: str  # CREATE, UPDATE, DELETE or CONNECT
    namespace: str
    name: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool = False
    sub_resource: str = ""
    username: str = ""


@dataclass(frozen=True)
class AdmissionResponse:
    uid: str
    allowed: bool
    code: int | None = None
    message: str = ""
    reason: str = ""
    patch: Sequence[Operation] = ()
    warnings: Sequence[str] = field(default_factory=tuple)

    def review(self) -> dict[str, Any]:
        """The AdmissionReview v1 object to send back."""
        response: dict[str, Any] = {"uid": self.uid, "allowed": self.allowed}
        status: dict[str, Any] = {}
        if self.code is not None:
            status["code"] = self.code
        if self.reason:
            status["reason"] = self.reason
        if self.message:
            status["message"] = self.message
        if status:
            response["status"] = status
        if self.patch:
            raw = json.dumps(list(self.patch), separators=(",", ":")).encode()
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(raw).decode()
        if self.warnings:
            response["warnings"] = list(self.warnings)
        return {"apiVersion": API_VERSION, "kind": KIND, "response": response}

    def to_json(self) -> bytes:
        return json.dumps(self.review(), separators=(",", ":")).encode()


class Handler(Protocol):
    """One webhook path. `handle` returns a response or raises BadRequest, nothing else."""

    def handle(self, request: AdmissionRequest) -> AdmissionResponse: ...


def review(handler: Handler, body: bytes, content_type: str | None) -> bytes:
    """Parse, handle, serialise: the whole job of a route, minus HTTP."""
    return handler.handle(parse_review(body, content_type)).to_json()


def route_for(handler: Handler) -> Route:
    """Parse the review, let `handler` decide, serialize the answer (BadRequest -> HTTP 400)."""

    def route(body: bytes, content_type: str) -> bytes:
        return review(handler, body, content_type)

    return route


# --- responses -----------------------------------------------------------------------------


def allow(request: AdmissionRequest, message: str = "") -> AdmissionResponse:
    return AdmissionResponse(request.uid, True, code=200, message=message)


def deny(
    request: AdmissionRequest, message: str, code: int = 403, reason: str = "Forbidden"
) -> AdmissionResponse:
    return AdmissionResponse(request.uid, False, code=code, message=message, reason=reason)


def errored(request: AdmissionRequest, code: int, message: str) -> AdmissionResponse:
    return AdmissionResponse(request.uid, False, code=code, message=message)


def patched(
    request: AdmissionRequest, ops: Sequence[Operation], message: str = ""
) -> AdmissionResponse:
    """Allowed with a JSON patch (none when `ops` is empty), like controller-runtime's
    PatchResponseFromRaw: no status unless there is a message."""
    return AdmissionResponse(
        request.uid, True, code=200 if message else None, message=message, patch=tuple(ops)
    )


# --- parsing -------------------------------------------------------------------------------


def parse_review(body: bytes, content_type: str | None) -> AdmissionRequest:
    """The request of an AdmissionReview v1 body; raises BadRequest naming what is wrong."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise BadRequest(
            f"unsupported Content-Type {quote(content_type or '(none)')}: expected application/json"
        )
    if not body:
        raise BadRequest("the request body is empty: expected an AdmissionReview")
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"the request body is larger than {MAX_BODY_BYTES} bytes")
    document = _decode_json(body)
    if not isinstance(document, dict):
        raise BadRequest("the request body must be a JSON object (an AdmissionReview)")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if kind != KIND:
        raise BadRequest(f"expected kind {KIND!r}, got {quote(kind)}")
    if api_version != API_VERSION:
        raise BadRequest(
            f"unsupported AdmissionReview version {quote(api_version)}: "
            f"only {API_VERSION} is served"
        )
    request = document.get("request")
    if not isinstance(request, dict):
        raise BadRequest("the AdmissionReview has no 'request' object")
    return _request(request)


def _decode_json(body: bytes) -> Any:
    """The JSON document of a request body; raises BadRequest naming why it cannot be read."""
    try:
        # UTF-8 only, as the API server sends (json.loads would also take UTF-16/32 or a BOM).
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise BadRequest("the JSON body is nested too deeply") from None
    except UnicodeDecodeError as err:
        raise BadRequest(f"the request body is not UTF-8 text: {err.reason}") from None
    except ValueError as err:
        raise BadRequest(f"the request body is not valid JSON: {err}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _request(request: dict[str, Any]) -> AdmissionRequest:
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest("request.uid is missing or not a non-empty string")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise BadRequest(
            f"request.operation must be one of {', '.join(OPERATIONS)}, got {quote(operation)}"
        )
    kind = _kind(request)
    obj, old = _objects(request, operation)
    namespace, name, sub_resource = (
        _optional(request, key, "", str, "a string") for key in ("namespace", "name", "subResource")
    )
    dry_run = _optional(request, "dryRun", False, bool, "a boolean")
    user = request.get("userInfo")
    username = user.get("username", "") if isinstance(user, Mapping) else ""
    return AdmissionRequest(
        uid=uid,
        kind=kind,
        operation=operation,
        namespace=namespace,
        name=name,
        object=obj,
        old_object=old,
        dry_run=dry_run,
        sub_resource=sub_resource,
        username=username if isinstance(username, str) else "",
    )


def _kind(request: dict[str, Any]) -> GroupVersionKind:
    kind = request.get("kind")
    if not isinstance(kind, dict):
        raise BadRequest("request.kind is missing or not an object")
    group, version, kind_name = kind.get("group", ""), kind.get("version"), kind.get("kind")
    if not isinstance(group, str) or not isinstance(version, str) or not version:
        raise BadRequest("request.kind must have a string 'group' and a non-empty 'version'")
    if not isinstance(kind_name, str) or not kind_name:
        raise BadRequest("request.kind.kind is missing or not a non-empty string")
    return GroupVersionKind(group, version, kind_name)


def _objects(request: dict[str, Any], operation: str) -> tuple[JSONObject, JSONObject]:
    """request.object and request.oldObject: objects, or null where the operation allows."""
    obj, old = request.get("object"), request.get("oldObject")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise BadRequest(f"request.object must be a JSON object for {operation}")
    if obj is not None and not isinstance(obj, dict):
        raise BadRequest("request.object must be a JSON object or null")
    if old is not None and not isinstance(old, dict):
        raise BadRequest("request.oldObject must be a JSON object or null")
    return obj, old


def _optional(request: dict[str, Any], key: str, default: T, kind: type[T], what: str) -> T:
    """An optional field: absent or null is `default`, anything but a `kind` is refused."""
    value = request.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, kind):
        raise BadRequest(f"request.{key} must be {what}")
    return value
