"""Protocol edges with the real admission routes, over TLS (issue 14 item 8).

Bodies that are not UTF-8 JSON are refused with 400 (the API server only sends UTF-8), and a 400
quotes the caller's values only up to a bounded length, wherever the message is made (server,
review parsing, handlers).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from kube.http.messages import MESSAGE_LIMIT, QUOTE_LIMIT
from kube.http.server import AdmissionServer
from kube.http.tls import ServingTLS
from tests.support import reviews
from tests.support.webhook_server import (
    client_context,
    exchange,
    message,
    new_pki,
    post,
    real_routes,
    running,
    tls_socket,
)

INJECT = "/v1alpha1/inject"
LONG = "x" * 20_000


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[AdmissionServer, ssl.SSLContext]]:
    pki = new_pki()
    tls = ServingTLS()
    tls.load_pem(pki.serving.cert_pem, pki.serving.key_pem)
    with running(real_routes(), tls) as server:
        yield server, client_context(pki)


def review() -> dict[str, Any]:
    return reviews.review(reviews.deployment(), uid="edge")


def send(served: tuple[AdmissionServer, ssl.SSLContext], raw: bytes) -> tuple[int, str]:
    server, context = served
    with tls_socket(server.port, context) as sock:
        status, _, reply = exchange(sock, raw)
    return status, message(reply) if status != 200 else ""


def test_a_utf8_review_is_admitted(served: tuple[AdmissionServer, ssl.SSLContext]) -> None:
    assert send(served, post(INJECT, json.dumps(review()).encode()))[0] == 200


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(review()).encode("utf-16"),  # json.loads(bytes) would take it
        json.dumps(review()).encode("utf-32-le"),
        b"\xef\xbb\xbf" + json.dumps(review()).encode(),  # a UTF-8 byte-order mark
        json.dumps(review()).replace("shop", "sh\udc80p").encode("utf-8", "surrogatepass"),
        json.dumps(review()).replace("shop", "sh\xe9p").encode("latin-1"),
    ],
    ids=["utf-16", "utf-32", "utf-8-bom", "lone-surrogate", "latin-1"],
)
def test_a_body_that_is_not_utf8_json_is_a_400(
    served: tuple[AdmissionServer, ssl.SSLContext], body: bytes
) -> None:
    status, text = send(served, post(INJECT, body))
    assert status == 400
    assert "UTF-8" in text or "not valid JSON" in text


def _with(path: tuple[str, ...], value: Any) -> bytes:
    document = review()
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    "raw",
    [
        post(INJECT, _with(("kind",), LONG)),
        post(INJECT, _with(("apiVersion",), LONG)),
        post(INJECT, _with(("kind",), {"nested": [LONG] * 50})),
        post(INJECT, _with(("request", "operation"), LONG)),
        post(INJECT, json.dumps(review()).encode(), content_type="application/" + LONG[:6000]),
        post("/" + LONG[:6000], b"{}"),
        b"POST /v1alpha1/inject HTTP/1.1\r\nContent-Length: " + b"1" * 6000 + b"x\r\n\r\n",
        b"POST /v1alpha1/inject " + LONG[:6000].encode() + b"\r\n\r\n",
        b"POST " + LONG[:6000].encode() + b"\r\n\r\n",
        b"POST /v1alpha1/inject HTTP/1.1\r\n" + LONG[:6000].encode() + b"\r\n\r\n",
    ],
    ids=["kind", "apiVersion", "kind-object", "operation", "content-type", "path",
         "content-length", "version", "request-line", "header-line"],
)  # fmt: skip
def test_messages_quote_the_callers_values_only_so_far(
    served: tuple[AdmissionServer, ssl.SSLContext], raw: bytes
) -> None:
    status, text = send(served, raw)
    assert 400 <= status < 500
    assert "x" * (QUOTE_LIMIT + 1) not in text  # no quote runs past the limit...
    assert len(text) <= MESSAGE_LIMIT + 1  # ...and no message, whoever wrote it
    # and the cut is visible, or the value is not echoed at all (llhttp's parse errors)
    assert "…" in text or "..." in text or "x" * 20 not in text


def test_a_handler_message_is_clipped_whatever_it_quotes(
    served: tuple[AdmissionServer, ssl.SSLContext],
) -> None:
    """The inject handler names a bad label by its key; a huge key cannot make a huge 400."""
    labels = ("request", "object", "spec", "template", "metadata", "labels")
    status, text = send(served, post(INJECT, _with(labels, {LONG: 1})))
    assert status == 400
    assert "labels" in text
    assert len(text) <= MESSAGE_LIMIT + 1
    assert LONG not in text  # the key is quoted up to its bound, or the message clipped
