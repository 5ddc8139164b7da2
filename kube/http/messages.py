"""Requests and responses as handlers see them, and the API server's error body.

Handlers are plain functions from a whole `Request` to a `Response`: the server reads the body
(bounded) before calling them, so they never see the network. Errors use the metav1.Status JSON
body, readable with curl and shown by the API server as the webhook's message.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final
from urllib.parse import urlsplit

# controller-runtime's limit: the API server caps objects at 3 MiB, an AdmissionReview holds two.
MAX_BODY_BYTES: Final = 7 * 1024 * 1024
QUOTE_LIMIT: Final = 100  # characters of a caller's value quoted back in an error message
MESSAGE_LIMIT: Final = 1000  # characters of a 400 message, whatever it quotes

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = QUOTE_LIMIT
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist = 2, 4, 4


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value` as repr() for an error message, at most `limit` characters + "…": a 400 must not
    echo megabytes of the caller's input back (the API server logs and shows these messages).
    reprlib never renders more of a value than it shows."""
    return clip(_REPR.repr(value), limit)


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: Mapping[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    content_length: int | None  # None: the request had no Content-Length

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection after this response


RequestHandler = Callable[[Request], Response]


def status_body(code: int, message: str) -> bytes:
    """A metav1.Status error body, like the API server's own."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": HTTPStatus(code).phrase.replace(" ", ""),
        "code": int(code),
    }
    return json.dumps(status).encode()


def status_response(
    code: int, message: str, *, close: bool = False, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(code, status_body(code, message), headers=headers or {}, close=close)


def status_bytes(code: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection (for errors found while
    parsing, before a request exists)."""
    body = status_body(code, message)
    head = (
        f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
