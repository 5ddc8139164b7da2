"""Structured JSON log lines carry the reconcile context and nothing implicit."""

from __future__ import annotations

import io
import json
import logging
import threading

from controller.runtime.logs import WarnWhileMissing, log_context, setup_logging


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


def test_no_log_call_overwrites_a_logrecord_attribute() -> None:
    """`extra={"name": ...}` raises KeyError inside logging, i.e. at the worst moment."""
    import ast
    from pathlib import Path

    reserved = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for package in ("kube", "api", "webhook", "controller"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                for kw in node.keywords:
                    if kw.arg == "extra" and isinstance(kw.value, ast.Dict):
                        offenders += [
                            f"{path.relative_to(root)}:{node.lineno} {k.value}"
                            for k in kw.value.keys
                            if isinstance(k, ast.Constant) and k.value in reserved
                        ]
    assert offenders == []


def test_an_attached_traceback_keeps_the_error_message() -> None:
    """`extra={"error": ...}` with `exc_info` keeps both: the message and, apart, the traceback."""
    stream = io.StringIO()
    setup_logging("info", stream)
    log = logging.getLogger("lumigo.test")
    try:
        raise OSError("disk full")
    except OSError as err:
        log.warning("writing failed", extra={"error": f"cannot write: {err}"}, exc_info=True)
        log.exception("without an error field")
    logging.getLogger().handlers.clear()
    given, derived = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert given["error"] == "cannot write: disk full"
    assert "Traceback" in given["stacktrace"]
    assert "OSError: disk full" in given["stacktrace"]
    assert derived["error"] == "OSError: disk full"
    assert "Traceback" in derived["stacktrace"]


def test_a_missing_prerequisite_is_warned_about_once_per_gap() -> None:
    stream = io.StringIO()
    setup_logging("info", stream)
    wait = WarnWhileMissing(logging.getLogger("lumigo.test"), "waits for its Secret")
    seen = [True, False, False, False, True, True, False, False]
    assert [wait.present(found, secret="ns/token") for found in seen] == seen
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["msg"], line["secret"]) for line in lines] == [
        ("waits for its Secret", "ns/token")
    ] * 2
