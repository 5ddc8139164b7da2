"""The pure parts of delegated authentication (issue 28 item 8): reading the bearer token, and
the decision caches staying bounded whatever clients send. The reviews themselves are tested
against a real API server: tests/integration/test_metrics_auth.py."""

from __future__ import annotations

import pytest

from kube.delegated_auth import MAX_TOKEN_BYTES, _TTLCache, bearer_token


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def-ghi_jkl", "abc.def-ghi_jkl"),
        ("bearer   abc  ", "abc"),
        ("", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Bearer a, Bearer b", None),  # two Authorization headers, joined
        ("Bearer a b", None),
        ("Bearer " + "x" * (MAX_TOKEN_BYTES + 1), None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    headers = {"authorization": header} if header else {}
    assert bearer_token(headers) == token


def test_the_cache_is_bounded_and_entries_expire() -> None:
    now = [0.0]
    cache = _TTLCache(max_entries=3, clock=lambda: now[0])
    for i in range(10):
        cache.put(i, f"v{i}", ttl=10)
    assert len(cache) == 3
    assert [cache.get(i) for i in range(10)] == [None] * 7 + ["v7", "v8", "v9"]
    now[0] = 10.0
    assert cache.get(9) is None  # expired
    cache.put("never", "kept", ttl=0)
    assert cache.get("never") is None
