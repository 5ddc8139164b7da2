"""RFC 6902 diff/apply: exact, escaped, and never confusing true with 1."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube.jsonpatch import (
    JsonPatchError,
    apply,
    copy_json,
    diff,
    equal,
    escape,
    parse_pointer,
    pointer,
    same,
)

# Keys deliberately full of the characters JSON Pointer escapes.
keys = st.text(alphabet="ab/~01-", max_size=4)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False)
    | st.text(max_size=3)
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400)
@given(documents, documents)
def test_apply_of_diff_reproduces_the_target(before: Any, after: Any) -> None:
    ops = diff(before, after)
    assert equal(apply(before, ops), after)
    # What the webhook sends must survive a JSON round trip unchanged.
    assert equal(apply(before, json.loads(json.dumps(ops))), after)


@given(documents)
def test_diff_of_equal_documents_is_empty(doc: Any) -> None:
    assert diff(doc, json.loads(json.dumps(doc))) == []


@given(documents, documents)
def test_apply_never_modifies_its_input(before: Any, after: Any) -> None:
    snapshot = json.dumps(before, sort_keys=True)
    apply(before, diff(before, after))
    assert json.dumps(before, sort_keys=True) == snapshot


def test_pointer_escaping_round_trips() -> None:
    assert escape("a/b~c") == "a~1b~0c"
    assert pointer(["metadata", "labels", "app.kubernetes.io/name", "x~y"]) == (
        "/metadata/labels/app.kubernetes.io~1name/x~0y"
    )
    assert parse_pointer("/a~1b/c~0d/~01") == ["a/b", "c~d", "~1"]
    assert parse_pointer("") == []


def test_missing_map_is_added_whole_not_key_by_key() -> None:
    before = {"metadata": {"name": "x"}}
    after = {"metadata": {"name": "x", "labels": {"lumigo.auto-trace": "v"}}}
    assert diff(before, after) == [
        {"op": "add", "path": "/metadata/labels", "value": {"lumigo.auto-trace": "v"}}
    ]


def test_appending_to_a_list_is_one_add_per_item() -> None:
    before = {"env": [{"name": "A"}, {"name": "B"}]}
    after = {"env": [{"name": "A"}, {"name": "B"}, {"name": "C"}]}
    assert diff(before, after) == [{"op": "add", "path": "/env/2", "value": {"name": "C"}}]


def test_removing_from_the_middle_of_a_list_is_one_remove() -> None:
    before = {"env": [{"name": "A"}, {"name": "X"}, {"name": "B"}]}
    after = {"env": [{"name": "A"}, {"name": "B"}]}
    assert diff(before, after) == [{"op": "remove", "path": "/env/1"}]


def test_booleans_and_numbers_differ() -> None:
    assert not equal(True, 1)
    assert not equal({"a": [False]}, {"a": [0]})
    assert equal(1, 1.0)
    assert diff({"readOnly": 1}, {"readOnly": True}) == [
        {"op": "replace", "path": "/readOnly", "value": True}
    ]


def test_rfc6902_operations() -> None:
    doc = {"foo": ["bar", "baz"], "q": {"x": 1}}
    ops = [
        {"op": "add", "path": "/foo/1", "value": "qux"},
        {"op": "add", "path": "/foo/-", "value": "end"},
        {"op": "test", "path": "/foo", "value": ["bar", "qux", "baz", "end"]},
        {"op": "move", "from": "/q/x", "path": "/moved"},
        {"op": "copy", "from": "/foo/0", "path": "/copied"},
        {"op": "replace", "path": "/foo/0", "value": "BAR"},
        {"op": "remove", "path": "/foo/3"},
    ]
    assert apply(doc, ops) == {
        "foo": ["BAR", "qux", "baz"],
        "q": {},
        "moved": 1,
        "copied": "bar",
    }
    assert doc == {"foo": ["bar", "baz"], "q": {"x": 1}}


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([{"op": "add", "path": "/a/b", "value": 1}], "operation 0 (add /a/b): path not found: /a"),
        ([{"op": "remove", "path": "/nope"}], "path not found: /nope"),
        ([{"op": "replace", "path": "/l/5", "value": 1}], "index 5 is out of range"),
        ([{"op": "add", "path": "/l/01", "value": 1}], "'01' is not an array index"),
        ([{"op": "test", "path": "/n", "value": True}], "test failed"),
        ([{"op": "jump", "path": "/n"}], "unknown op 'jump'"),
        ([{"op": "add", "path": "n", "value": 1}], "must be empty or start with '/'"),
        ([{"op": "add", "path": "/a~2", "value": 1}], "'~' not followed by 0 or 1"),
        ([{"op": "add", "path": "/x"}], "'add' needs a 'value'"),
        ([{"op": "move", "from": "/l", "path": "/l/0"}], "into one of its own children"),
        (["add"], "an operation must be an object"),
        ({"op": "add"}, "must be an array of operations"),
    ],
)
def test_bad_patches_fail_with_a_clear_message(ops: Any, message: str) -> None:
    doc = {"l": [1, 2], "n": 1}
    with pytest.raises(JsonPatchError, match=_escape_regex(message)):
        apply(doc, ops)
    assert doc == {"l": [1, 2], "n": 1}


def _escape_regex(text: str) -> str:
    import re

    return re.escape(text)


def test_shared_sub_objects_are_copied_apart() -> None:
    """A document built in Python may use one object in two places; a patch to one place must
    not change the other (a copy that kept the sharing did exactly that)."""
    shared = {"secretKeyRef": {"name": "s", "key": "k"}}
    doc = {"env": [{"name": "A", "valueFrom": shared}, {"name": "B", "valueFrom": shared}]}
    out = apply(doc, [{"op": "remove", "path": "/env/0/valueFrom/secretKeyRef"}])
    assert out["env"][1]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    copied = copy_json(doc)
    assert copied == doc
    assert copied["env"][0]["valueFrom"] is not copied["env"][1]["valueFrom"]


def test_same_is_exact_where_python_equality_is_not() -> None:
    assert same({"a": [1, {"b": True}]}, {"a": [1, {"b": True}]})
    assert not same({"a": [1, {"b": True}]}, {"a": [1, {"b": 1}]})
    assert same({"x": 1, "y": 2}, {"y": 2, "x": 1})  # key order is not significant
    assert same([1], [1.0])
