"""RFC 6902 JSON Patch: compute one between two documents, and apply one.

The admission webhook answers with a JSON patch, and the API server applies it to *its* copy of
the object, so the patch must be exact: keys containing `/` or `~` are escaped (`~1`, `~0`), a
missing map is added whole (an `add` to `/metadata/labels/x` fails when `labels` is absent), and
`true` is never confused with `1`.

Public interface (pure, no I/O):

    ops = diff(before, after)          # list of {"op", "path"[, "value"]}; [] when equal
    doc = apply(before, ops)           # a new document; `before` is never modified
    assert equal(doc, after)           # JSON equality (true != 1, 1 == 1.0)

`diff` shares sub-trees of `after` in its `value`s (no copy): serialise the ops, or copy them,
before mutating `after`. Lists are diffed by trimming the common prefix and suffix and pairing
the rest by position, so the usual "appended an env var / container / volume" change is a single
`add`, and any change is still correct.
"""

from __future__ import annotations

import marshal
import re
from collections.abc import Callable, Sequence
from typing import Any

Operation = dict[str, Any]

_INDEX = re.compile(r"0|[1-9][0-9]*")
# marshal format 0: no back-references (a copy never shares sub-objects) and no "interned"
# flag on strings (equal values always serialise to equal bytes); True and 1 differ.
_MARSHAL = 0


class JsonPatchError(ValueError):
    """A patch that is malformed or does not apply; the message names the operation and path."""


# --- equality and copying ------------------------------------------------------------------


def equal(a: Any, b: Any) -> bool:
    """JSON equality: like `==`, except that booleans are never equal to numbers."""
    if a is b:
        return True
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        return all(key in b and equal(value, b[key]) for key, value in a.items())
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return False
        return all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float):
        return isinstance(b, int | float) and a == b
    return type(a) is type(b) and bool(a == b)


def same(a: Any, b: Any) -> bool:
    """`equal`, fast for the usual case of a subtree and its copy: the C-level `==` rejects most
    differences at once, and identical serialisations prove equality without a Python walk."""
    if a is b:
        return True
    if isinstance(a, dict | list):
        if type(a) is not type(b) or a != b:
            return False  # `==` is looser than JSON equality, so unequal is unequal
        try:
            if marshal.dumps(a, _MARSHAL) == marshal.dumps(b, _MARSHAL):
                return True
        except ValueError:
            pass
        # Equal as Python values but spelled differently (key order, 1 vs 1.0, true vs 1).
    return equal(a, b)


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON document, never sharing a sub-object between two places (so that a
    patch applied to one place cannot change another). marshal runs in C: a few times faster
    than a Python walk or copy.deepcopy on a workload, and exact for JSON's types."""
    if isinstance(value, dict | list):
        try:
            return marshal.loads(marshal.dumps(value, _MARSHAL))  # noqa: S302 - bytes we just made
        except ValueError:  # not plain JSON types (a dict subclass...), or deeper than marshal goes
            pass
        if isinstance(value, dict):
            return {k: copy_json(v) for k, v in value.items()}
        return [copy_json(v) for v in value]
    return value


# --- pointers ------------------------------------------------------------------------------


def escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901): `~` -> `~0`, then `/` -> `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(tokens: Sequence[str | int]) -> str:
    """The JSON Pointer for a path of keys and indexes (`[]` is the whole document)."""
    return "".join("/" + escape(str(t)) for t in tokens)


def parse_pointer(path: str) -> list[str]:
    """The unescaped reference tokens of a JSON Pointer; raises JsonPatchError if malformed."""
    if path == "":
        return []
    if not path.startswith("/"):
        raise JsonPatchError(f"JSON pointer {path!r} must be empty or start with '/'")
    tokens = path.split("/")[1:]
    for token in tokens:
        if re.search(r"~(?![01])", token):
            raise JsonPatchError(f"JSON pointer {path!r} has a '~' not followed by 0 or 1")
    return [t.replace("~1", "/").replace("~0", "~") for t in tokens]


# --- diff ----------------------------------------------------------------------------------


def diff(before: Any, after: Any) -> list[Operation]:
    """The operations that turn `before` into `after` (`[]` when they are equal)."""
    ops: list[Operation] = []
    _diff(before, after, "", ops)
    return ops


def _diff(a: Any, b: Any, path: str, ops: list[Operation]) -> None:
    if same(a, b):
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if key not in b:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in b.items():
            child = f"{path}/{escape(key)}"
            if key in a:
                _diff(a[key], value, child, ops)
            else:
                ops.append({"op": "add", "path": child, "value": value})
    elif isinstance(a, list) and isinstance(b, list):
        _diff_list(a, b, path, ops)
    else:
        ops.append({"op": "replace", "path": path, "value": b})


def _diff_list(a: list[Any], b: list[Any], path: str, ops: list[Operation]) -> None:
    n, m = len(a), len(b)
    start = 0
    while start < n and start < m and same(a[start], b[start]):
        start += 1
    tail = 0
    while tail < n - start and tail < m - start and same(a[n - 1 - tail], b[m - 1 - tail]):
        tail += 1
    middle_a, middle_b = n - start - tail, m - start - tail
    paired = min(middle_a, middle_b)
    for k in range(paired):
        _diff(a[start + k], b[start + k], f"{path}/{start + k}", ops)
    for k in range(paired, middle_b):
        ops.append({"op": "add", "path": f"{path}/{start + k}", "value": b[start + k]})
    for _ in range(paired, middle_a):
        ops.append({"op": "remove", "path": f"{path}/{start + paired}"})


# --- apply ---------------------------------------------------------------------------------


def apply(doc: Any, ops: Any) -> Any:
    """`doc` with every operation applied in order; raises JsonPatchError, `doc` is untouched."""
    if not isinstance(ops, list | tuple):
        raise JsonPatchError("a JSON patch must be an array of operations")
    result = copy_json(doc)
    for number, op in enumerate(ops):
        try:
            result = _apply_one(result, op)
        except JsonPatchError as err:
            raise JsonPatchError(f"operation {number} {_describe(op)}: {err}") from None
    return result


def _describe(op: Any) -> str:
    if isinstance(op, dict):
        return f"({op.get('op')!s} {op.get('path')!s})"
    return "(not an object)"


def _apply_one(doc: Any, op: Any) -> Any:
    if not isinstance(op, dict):
        raise JsonPatchError("an operation must be an object")
    kind, path = op.get("op"), op.get("path")
    if not isinstance(path, str):
        raise JsonPatchError("'path' must be a string")
    tokens = parse_pointer(path)
    if kind in ("add", "replace", "test") and "value" not in op:
        raise JsonPatchError(f"'{kind}' needs a 'value'")
    apply = _OPERATIONS.get(kind) if isinstance(kind, str) else None
    if apply is None:
        raise JsonPatchError(f"unknown op {kind!r}")
    return apply(doc, tokens, op)


def _op_add(doc: Any, tokens: list[str], op: Operation) -> Any:
    return _add(doc, tokens, copy_json(op["value"]))


def _op_remove(doc: Any, tokens: list[str], op: Operation) -> Any:
    _remove(doc, tokens)
    return doc


def _op_replace(doc: Any, tokens: list[str], op: Operation) -> Any:
    _get(doc, tokens)  # must exist
    if not tokens:
        return copy_json(op["value"])
    _remove(doc, tokens)
    return _add(doc, tokens, copy_json(op["value"]))


def _op_test(doc: Any, tokens: list[str], op: Operation) -> Any:
    if not equal(_get(doc, tokens), op["value"]):
        raise JsonPatchError("test failed: the value differs")
    return doc


def _op_copy(doc: Any, tokens: list[str], op: Operation) -> Any:
    return _add(doc, tokens, copy_json(_get(doc, _from(op))))


def _op_move(doc: Any, tokens: list[str], op: Operation) -> Any:
    from_tokens = _from(op)
    value = copy_json(_get(doc, from_tokens))
    if tokens[: len(from_tokens)] == from_tokens and tokens != from_tokens:
        raise JsonPatchError("cannot move a value into one of its own children")
    if tokens == from_tokens:
        return doc
    if not from_tokens:
        raise JsonPatchError("cannot move the whole document")
    _remove(doc, from_tokens)
    return _add(doc, tokens, value)


def _from(op: Operation) -> list[str]:
    """The parsed 'from' pointer of a move or copy."""
    source = op.get("from")
    if not isinstance(source, str):
        raise JsonPatchError(f"'{op['op']}' needs a 'from' string")
    return parse_pointer(source)


_OPERATIONS: dict[str, Callable[[Any, list[str], Operation], Any]] = {
    "add": _op_add,
    "remove": _op_remove,
    "replace": _op_replace,
    "test": _op_test,
    "move": _op_move,
    "copy": _op_copy,
}


def _get(doc: Any, tokens: list[str]) -> Any:
    current = doc
    for depth, token in enumerate(tokens):
        if isinstance(current, dict):
            if token not in current:
                raise JsonPatchError(f"path not found: {pointer(tokens[: depth + 1])}")
            current = current[token]
        elif isinstance(current, list):
            current = current[_index(token, len(current), pointer(tokens[: depth + 1]))]
        else:
            raise JsonPatchError(f"path not found: {pointer(tokens[: depth + 1])}")
    return current


def _index(token: str, size: int, where: str, allow_end: bool = False) -> int:
    if not _INDEX.fullmatch(token):
        raise JsonPatchError(f"{where}: {token!r} is not an array index")
    index = int(token)
    if index > size or (index == size and not allow_end):
        raise JsonPatchError(f"{where}: index {index} is out of range (size {size})")
    return index


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            parent.insert(_index(last, len(parent), pointer(tokens), allow_end=True), value)
    else:
        raise JsonPatchError(f"cannot add to a {type(parent).__name__} at {pointer(tokens[:-1])}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> None:
    if not tokens:
        raise JsonPatchError("cannot remove the whole document")
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise JsonPatchError(f"path not found: {pointer(tokens)}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(last, len(parent), pointer(tokens))]
    else:
        raise JsonPatchError(f"path not found: {pointer(tokens)}")
