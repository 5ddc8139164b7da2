"""What the Kubernetes object collection may not send upstream: literal env values and chosen
annotations, replaced by `[REDACTED]` in the proxy itself (upstream `transform` processor, OTTL on
the log records' bodies) before any record leaves the cluster.

Off by default, as the reference sends whole objects (the backend reads them). When on:

- env values: `value` of every literal `env` entry (`{name, value}`; `valueFrom` references stay,
  they hold no value) in the containers, initContainers and ephemeralContainers of a Pod, of the
  pod template of a Deployment, DaemonSet, ReplicaSet, StatefulSet or Job, and of a CronJob's
  job template.
- annotations: the value of every annotation whose key matches one of the patterns (RE2, each
  matched against the whole key), on every collected object (Events and the namespace heartbeat's
  Lumigo resources too) and on pod templates (and a CronJob's job template); the key stays.
- either way, the whole value of `kubectl.kubernetes.io/last-applied-configuration`: kubectl's
  JSON copy of the applied object holds the same env values and annotations.

OTTL has no loop: an env list is rewritten container by container, the first UNROLLED of each
list through its JSON (env entries hold only strings and booleans, so the round trip is exact);
a longer list is rewritten whole through its JSON, where numbers come back as doubles (a pod with
more than UNROLLED containers of one kind keeps its values secret, at that price).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kube.objects import JSON, json_list

REDACTED = "[REDACTED]"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
UNROLLED = 8

OBJECT = "log.body"  # every record's body is the object (config.py unwraps watch events)
KIND = f'{OBJECT}["kind"]'
TEMPLATE_KINDS = ("Deployment", "DaemonSet", "ReplicaSet", "StatefulSet", "Job")
# Where each collected kind has a pod spec, and pod-template metadata.
POD_SPECS = (
    (f'{KIND} == "Pod"', f'{OBJECT}["spec"]'),
    (
        " or ".join(f'{KIND} == "{kind}"' for kind in TEMPLATE_KINDS),
        f'{OBJECT}["spec"]["template"]["spec"]',
    ),
    (f'{KIND} == "CronJob"', f'{OBJECT}["spec"]["jobTemplate"]["spec"]["template"]["spec"]'),
)
ANNOTATIONS = (
    f'{OBJECT}["metadata"]["annotations"]',
    f'{OBJECT}["spec"]["template"]["metadata"]["annotations"]',
    f'{OBJECT}["spec"]["jobTemplate"]["metadata"]["annotations"]',
    f'{OBJECT}["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]',
)
# A JSON string, and a literal {name, value} env entry as Go's encoding/json writes one (sorted
# keys; `valueFrom` is another key).
JSON_STRING = r'"(?:[^"\\]|\\.)*"'
NAME_VALUE = rf'\{{"name":({JSON_STRING}),"value":{JSON_STRING}\}}'
NAME_VALUE_REDACTED = f'{{"name":${{1}},"value":"{REDACTED}"}}'
# Constructs Python's re accepts and the collector's RE2 refuses (a configuration the collector
# cannot load would stop every tenant's telemetry): lookaround, backreferences, atomic groups,
# conditionals, possessive quantifiers.
NOT_RE2 = re.compile(r"\(\?<?[=!]|\(\?P=|\\[1-9]|\(\?>|\(\?\(|[*+?}]\+")


class InvalidRedactionError(ValueError):
    """A redaction setting the collector would refuse or misread."""


@dataclass(frozen=True)
class Redaction:
    """What the object collection redacts (see the module doc)."""

    env_values: bool = False
    annotations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern in self.annotations:
            check_pattern(pattern)

    @property
    def enabled(self) -> bool:
        return self.env_values or bool(self.annotations)


def check_pattern(pattern: str) -> None:
    """Refuse what is not an RE2 regular expression the collector would take."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidRedactionError(
            f"invalid annotation pattern {pattern!r}: expected a non-empty regular expression"
        )
    try:
        re.compile(pattern)
    except re.error as err:
        raise InvalidRedactionError(f"invalid annotation pattern {pattern!r}: {err}") from None
    if NOT_RE2.search(pattern):
        raise InvalidRedactionError(
            f"invalid annotation pattern {pattern!r}: lookaround, backreferences, atomic groups, "
            "conditionals and possessive quantifiers are not RE2 (the collector's syntax)"
        )


def parse_patterns(text: str) -> tuple[str, ...]:
    """A JSON list of annotation key patterns ('' = none), each checked by check_pattern."""
    try:
        patterns = json_list(text, "annotation patterns", "regular expressions")
    except ValueError as err:
        raise InvalidRedactionError(str(err)) from None
    for pattern in patterns:
        check_pattern(pattern)
    return tuple(patterns)


def processor(redaction: Redaction) -> JSON:
    """The `transform` processor that redacts, in every events pipeline before anything leaves
    (after the watch events are unwrapped and the enricher added what it sends). It fails
    closed: a statement that errors drops the record (each watched object is a request of its
    own, with what the enricher sends about it) rather than letting it leave unredacted."""
    return {"error_mode": "propagate", "log_statements": statements(redaction)}


def statements(redaction: Redaction) -> list[str]:
    out: list[str] = []
    if redaction.env_values:
        out += env_statements()
    if redaction.annotations:
        out += annotation_statements(redaction.annotations)
    if redaction.enabled:
        for annotations in ANNOTATIONS[:1]:  # the object's own
            applied = f"{annotations}[{ottl_string(LAST_APPLIED)}]"
            out.append(f"set({applied}, {ottl_string(REDACTED)}) where {applied} != nil")
    return out


def ottl_string(text: str) -> str:
    """`text` as an OTTL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_statements() -> list[str]:
    """Each pod spec is copied to log.cache["spec"], its env lists rewritten there, and copied
    back (a copy both ways: statements short enough to read, and nothing created where the
    object has no pod spec)."""
    spec = 'log.cache["spec"]'
    out = [f"set({spec}, {path}) where ({kind}) and {path} != nil" for kind, path in POD_SPECS]
    for name in CONTAINER_LISTS:
        containers = f'{spec}["{name}"]'
        for i in range(UNROLLED):
            env = f'{containers}[{i}]["env"]'
            out += _rewrite_json(
                env, f"{name}.{i}", f"{containers} != nil and Len({containers}) > {i}"
            )
        out += _rewrite_json(
            containers, f"{name}.all", f"{containers} != nil and Len({containers}) > {UNROLLED}"
        )
    out += [
        f"set({path}, {spec}) where ({kind}) and {path} != nil and {spec} != nil"
        for kind, path in POD_SPECS
    ]
    return out


def _rewrite_json(target: str, key: str, guard: str) -> list[str]:
    """Replace every literal {name, value} pair's value in `target`, through its JSON."""
    text = f'log.cache["json"][{ottl_string(key)}]'
    return [
        f"set({text}, String({target})) where {guard} and {target} != nil",
        f"replace_pattern({text}, {ottl_string(NAME_VALUE)}, "
        f"{ottl_string(NAME_VALUE_REDACTED)}) where {text} != nil",
        f"set({target}, ParseJSON({text})) where {text} != nil",
    ]


def annotation_statements(patterns: tuple[str, ...]) -> list[str]:
    """For each annotations map: the matching entries are copied aside, their values replaced,
    and merged back over the originals (OTTL cannot set a value by a key pattern)."""
    keys = ottl_string("^(?:" + "|".join(f"(?:{p})" for p in patterns) + ")$")
    anything = ottl_string(r"(?s)^.*$")
    out = []
    for i, found in enumerate(ANNOTATIONS):
        aside = f'log.cache["annotations"]["{i}"]'
        out += [
            f"set({aside}, {found}) where {found} != nil",
            f"keep_matching_keys({aside}, {keys}) where {aside} != nil",
            f'replace_all_patterns({aside}, "value", {anything}, {ottl_string(REDACTED)}) '
            f"where {aside} != nil",
            f'merge_maps({found}, {aside}, "upsert") where {aside} != nil',
        ]
    return out
