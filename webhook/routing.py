"""What the HTTPS server needs from an admission handler, and how a handler rejects a request.

A route gets the raw body and the Content-Type header and returns the AdmissionReview response
(serialized JSON bytes, or a dict to serialize; always HTTP 200), or raises `BadRequest` when
the request is not a usable AdmissionReview (HTTP 400 with the message). Keeping this contract
tiny keeps the server independent of the handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Route = Callable[[bytes, str], bytes | Mapping[str, Any]]


class BadRequest(Exception):
    """The request body cannot be handled; the message is shown to the caller (HTTP 400)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)
