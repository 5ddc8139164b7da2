"""Kubernetes resource quantities ("500m", "128Mi", "1e3"), parsed to exact decimals.

Needed to compare what we would write with what the API server stored: it canonicalises
quantities ("0.5" is stored as "500m"), so comparing strings would see a change on every update
and re-trigger events and patches forever.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]{1,3}))?"
)


def parse_quantity(text: object) -> Decimal:
    """The exact value of a quantity; raises ValueError with the offending text."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (expected a string like '128Mi')")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. '500m', '128Mi', '1')")
    try:
        number = Decimal(match["number"])
    except InvalidOperation:  # pragma: no cover - the pattern only admits valid decimals
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from None
    if match["exponent"] is not None:
        return number.scaleb(int(match["exponent"]))
    return number * _SUFFIX[match["suffix"] or ""]


def same_quantity(a: object, b: object) -> bool:
    """Whether two quantities are equal in value ("0.5" == "500m"); False if either is invalid."""
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return False
