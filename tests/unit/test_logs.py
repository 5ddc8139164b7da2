"""Structured JSON log lines carry the reconcile context and nothing implicit."""

from __future__ import annotations

import io
import json
import logging
import threading

from controller.logs import log_context, setup_logging


def test_json_lines_with_thread_local_context() -> None:
    stream = io.StringIO()
    setup_logging("info", stream)
    log = logging.getLogger("lumigo.test")
    with log_context(controller="lumigo", key="ns/name"):
        log.info("reconciling", extra={"attempt": 2})
        other = threading.Thread(target=lambda: log.info("elsewhere"))
        other.start()
        other.join()
    log.warning("after")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    first, elsewhere, after, failed = lines
    assert first["msg"] == "reconciling"
    assert first["level"] == "info"
    assert first["logger"] == "lumigo.test"
    assert (first["controller"], first["key"], first["attempt"]) == ("lumigo", "ns/name", 2)
    assert "key" not in elsewhere  # the context belongs to the thread that set it
    assert "key" not in after
    assert after["level"] == "warning"
    assert "ValueError: boom" in failed["error"]
    logging.getLogger().handlers.clear()
