"""What the HTTPS server needs from an admission handler, and how a handler rejects a request.

A route gets the raw body and the Content-Type header and returns the response body
(serialized JSON bytes, or a dict to serialize; always HTTP 200), or raises `BadRequest` when
the request is not usable (HTTP 400 with the message). Keeping this contract tiny keeps the
server independent of the handlers (an AdmissionReview route: `webhook.admission_review.route_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kube.http.messages import MESSAGE_LIMIT, clip

__all__ = ["BadRequest", "Route"]

Route = Callable[[bytes, str], bytes | Mapping[str, Any]]


class BadRequest(Exception):
    """The body is not a usable request; `message` is shown to the caller (HTTP 400).
    Values from the request belong in it through `quote()`; the whole message is clipped too."""

    def __init__(self, message: str) -> None:
        self.message = clip(message, MESSAGE_LIMIT)
        super().__init__(self.message)
