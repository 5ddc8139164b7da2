"""What the HTTPS server needs from an admission handler, and how a handler rejects a request.

A route gets the raw body and the Content-Type header and returns the AdmissionReview response
(serialized JSON bytes, or a dict to serialize; always HTTP 200), or raises `BadRequest` when
the request is not a usable AdmissionReview (HTTP 400 with the message). Keeping this contract
tiny keeps the server independent of the handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from webhook.admission.review import BadRequest, Handler, review

__all__ = ["BadRequest", "Route", "route_for"]

Route = Callable[[bytes, str], bytes | Mapping[str, Any]]


def route_for(handler: Handler) -> Route:
    """Parse the review, let `handler` decide, serialize the answer (BadRequest -> HTTP 400)."""

    def route(body: bytes, content_type: str) -> bytes:
        return review(handler, body, content_type)

    return route
