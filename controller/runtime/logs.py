"""Structured JSON-lines logging with per-thread context (e.g. the reconcile key).

Every line is one JSON object: ts, level, logger, msg, the context fields bound with
`log_context(...)` on the current thread, and any `extra={...}` fields. Nothing else is added,
so what reaches a log line is always explicit (tokens are never passed to a logger). An attached
exception goes to `stacktrace`, as zap does for controller-runtime; `error` stays the message
(the caller's `extra={"error": ...}`, else the exception's last line).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "lumigo_log_context", default=None
)

# Attributes every LogRecord has; anything else came from `extra=`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add fields to every log line emitted in this block (this thread/context only)."""
    current = _context.get() or {}
    token = _context.set({**current, **fields})
    try:
        yield
    finally:
        _context.reset(token)


def in_log_context(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, run with the caller's log context wherever it runs.

    A thread pool does not inherit context variables: wrap the work handed to it, so that its
    lines carry e.g. the reconcile ID of the reconcile that asked for it.
    """
    fields = _context.get() or {}

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with log_context(**fields):
            return fn(*args, **kwargs)

    return run


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_context.get() or {})
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["stacktrace"] = self.formatException(record.exc_info)
            if "error" not in line and record.exc_info[1] is not None:
                line["error"] = traceback.format_exception_only(record.exc_info[1])[-1].strip()
        return json.dumps(line, default=str)


def setup_logging(level: str = "info", stream: Any = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("urllib3", "requests"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@dataclass
class WarnWhileMissing:
    """A warning logged once when a prerequisite goes missing, not on every resync while it
    stays missing; again only after it came back and went missing anew."""

    logger: logging.Logger
    message: str
    missing: bool = field(default=False, init=False)

    def present(self, found: bool, **fields: str) -> bool:
        """`found`, after logging the warning (with `fields`) if this is the start of a gap."""
        if not found and not self.missing:
            self.logger.warning(self.message, extra=fields)
        self.missing = not found
        return found
