"""Random and malformed AdmissionReviews, reproducible from a seed.

Each case is (body bytes, Content-Type, expected uid or None). Roughly a third are valid
reviews of random workloads (the server must answer 200 echoing the uid), the rest break the
review at every level: JSON syntax, encodings, types, missing or odd fields, deep nesting.
"""

from __future__ import annotations

import copy
import json
import random
import string
from collections.abc import Iterator
from typing import Any

from tests.support import reviews

KINDS = (
    ("apps/v1", "Deployment"),
    ("apps/v1", "DaemonSet"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
    ("operator.lumigo.io/v1alpha1", "Lumigo"),
    ("v1", "Pod"),
    ("v1", "ConfigMap"),
)
CONTENT_TYPES = (
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
    "",
    "text/plain",
    "application/yaml",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json;;;",
    "\u00e9\u00e8",
)


def workload(rng: random.Random) -> dict[str, Any]:
    api_version, kind = rng.choice(KINDS)
    obj = reviews.deployment(f"w{rng.randrange(10**6)}", f"ns{rng.randrange(5)}")
    obj["apiVersion"], obj["kind"] = api_version, kind
    if kind == "CronJob":
        obj["spec"] = {"schedule": "* * * * *", "jobTemplate": {"spec": obj["spec"]}}
    elif kind == "Lumigo":
        obj["spec"] = {"lumigoToken": {"secretRef": {"name": "lumigo-credentials", "key": "token"}}}
    if rng.random() < 0.2:
        labels = obj["metadata"].setdefault("labels", {})
        labels["lumigo.auto-trace"] = rng.choice(["false", "true", "skip-next-injector", "FALSE"])
    return obj


def random_scalar(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            False,
            0,
            -1,
            2**63,
            3.5,
            float("1e308"),
            "",
            "x" * rng.randrange(1, 5000),
            "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40))),
            "\u0000\ud7ff\ue000\U0001f600",
            [],
            {},
            [None, 1, "a"],
            {"a": {"b": {"c": []}}},
        ]
    )


def _containers(node: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key) pair in a JSON tree, for picking a random spot."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield node, key
            yield from _containers(value)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield node, index
            yield from _containers(value)


def mutate_structure(rng: random.Random, review: dict[str, Any]) -> dict[str, Any]:
    review = copy.deepcopy(review)
    for _ in range(rng.randrange(1, 4)):
        spots = list(_containers(review))
        if not spots:
            break
        parent, key = rng.choice(spots)
        action = rng.random()
        if action < 0.4:
            del parent[key]
        elif action < 0.8:
            parent[key] = random_scalar(rng)
        elif isinstance(parent, dict):
            parent[f"extra-{rng.randrange(100)}"] = random_scalar(rng)
        else:
            parent.append(random_scalar(rng))
    return review


def mutate_uid(rng: random.Random, review: dict[str, Any]) -> dict[str, Any]:
    review = copy.deepcopy(review)
    request = review["request"]
    choice = rng.randrange(6)
    if choice == 0:
        del request["uid"]
    else:
        request["uid"] = ["", None, 42, ["a"], "u" * 10_000][choice - 1]
    return review


def mutate_bytes(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    choice = rng.randrange(7)
    if choice == 0 and data:
        return bytes(data[: rng.randrange(len(data))])  # truncated
    if choice == 1:
        for _ in range(rng.randrange(1, 10)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if choice == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 2000)))
    if choice == 3:
        depth = rng.randrange(100, 200_000)
        return b"[" * depth + b"]" * depth  # deep nesting
    if choice == 4:
        return body.decode().encode("utf-16")
    if choice == 5:
        return b"\xef\xbb\xbf" + body  # a BOM
    return json.dumps(random_scalar(rng)).encode()


def cases(seed: int, count: int) -> Iterator[tuple[bytes, str, str | None]]:
    rng = random.Random(seed)
    for i in range(count):
        review = reviews.review(workload(rng), uid=f"fuzz-{seed}-{i}")
        roll = rng.random()
        content_type = "application/json"
        if roll < 0.3:
            yield json.dumps(review).encode(), content_type, f"fuzz-{seed}-{i}"
            continue
        if roll < 0.55:
            body = json.dumps(mutate_structure(rng, review)).encode()
        elif roll < 0.65:
            body = json.dumps(mutate_uid(rng, review)).encode()
        elif roll < 0.9:
            body = mutate_bytes(rng, json.dumps(review).encode())
        else:
            body = json.dumps(review).encode()
            content_type = rng.choice(CONTENT_TYPES[3:])
        if rng.random() < 0.1:
            content_type = rng.choice(CONTENT_TYPES)
        yield body, content_type, None
