"""The one exception readiness checks raise; the manager's /readyz shows its message."""

from __future__ import annotations


class NotReady(Exception):
    """Not ready to take admission traffic yet; the message says what is missing."""
