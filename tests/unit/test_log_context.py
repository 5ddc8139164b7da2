"""The log context follows work handed to a thread pool (e.g. a reconcile's parallel writes)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from controller.runtime.logs import JSONFormatter, in_log_context, log_context


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    logger = logging.getLogger("test.pool")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


def test_work_in_a_pool_logs_with_the_context_of_whoever_handed_it_over(
    lines: io.StringIO,
) -> None:
    log = logging.getLogger("test.pool")

    def write(name: str) -> None:
        log.info("writing", extra={"target": name})

    with ThreadPoolExecutor(2) as pool:
        with log_context(reconcileID="r-1"):
            list(pool.map(in_log_context(write), ["a", "b", "c"]))
            list(pool.map(write, ["plain"]))  # not wrapped: the pool's threads know nothing
        list(pool.map(in_log_context(write), ["after"]))
    by_target = {line["target"]: line for line in map(json.loads, lines.getvalue().splitlines())}
    assert [by_target[t].get("reconcileID") for t in "abc"] == ["r-1"] * 3
    assert "reconcileID" not in by_target["plain"]
    assert "reconcileID" not in by_target["after"]
