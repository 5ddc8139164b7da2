"""Label selectors as list queries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selector_string(selector: Mapping[str, Any] | None) -> str | None:
    """A LabelSelector as a list query's labelSelector; None if it selects nothing we can tell.
    Keys and values were validated by the API server (no commas or parentheses)."""
    if not selector:
        return None
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            terms.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            terms.append(str(key))
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms) or None
