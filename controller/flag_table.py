"""Options declared once: one dataclass field per option, from which the command line is made.

A command's options are a dataclass (`controller.options.RunOptions` for `run` and `webhook`,
`WatchdogOptions`, …). Each field declared with `option()` is a flag `--<field-name>` whose
type, default, environment-variable fallback, help and consumer are written in that one place:

    resync_period: float = option(30.0, "controller", "how often every Lumigo is reconciled")

From the fields come the argparse flags (`add_flags`), the environment fallback (read when the
parser is built, so a flag given on the command line wins), the typed options (`from_args`), and
the table that tests check the chart, config/ and the OLM bundle against (`declared`).

The flag's parser follows the default's type unless `parse` says otherwise: a bool is a switch
(`--x`/`--no-x`), a float a duration (`parse_duration`: 90s, 2m, 1.5h), an int and a Path
themselves, a str as given. A field without `option()` is not a flag (something the process
sets for itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

T = TypeVar("T")

_KEY = "lumigo.option"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'90s' -> 90.0, '2m' -> 120.0, '365d', '1.5h', '250ms'; a bare number means seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with an optional unit ms, s, m, h or d"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")


def parse_collector_duration(text: str) -> str:
    """A duration the collector reads (Go's syntax: 15s, 1h, 1h30m), kept as written."""
    if not _GO_DURATION.match(text.strip()):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: expected a collector duration such as 15s, 10m or 1h"
        )
    return text.strip()


def parse_bool(text: str) -> bool:
    """'true'/'false' (and 1/0, yes/no, on/off), as Go's flag package reads a bool."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on", "t"):
        return True
    if value in ("false", "0", "no", "off", "f"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}: expected true or false")


def parse_names(text: str) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c')."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def parse_name_list(text: str) -> list[str]:
    """'a,b' -> ['a', 'b'] (empty entries dropped)."""
    return [x for x in text.split(",") if x]


@dataclass(frozen=True)
class Option:
    """How one option is given: its flag, environment variable, parser and meaning."""

    dest: str  # the field's name, and the flag's with '-' for '_'
    default: object
    consumer: str  # the component that reads it (a `--help` group)
    help: str
    env: str  # read when set, below the command line; "" for none
    parse: Callable[[str], object] | None  # None: a switch (--x/--no-x)
    choices: tuple[str, ...] | None
    optional_value: bool  # `--x` alone means true, `--x=false` too (a Go-style bool)
    env_empty_is_unset: bool  # an empty variable counts as unset
    dynamic_default: Callable[[], object] | None  # below the env var, above `default`
    required: bool  # no default: the flag must be given

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def is_switch(self) -> bool:
        return self.parse is None

    def environment_value(self) -> str | None:
        value = os.environ.get(self.env) if self.env else None
        if value == "" and self.env_empty_is_unset:
            return None
        return value

    def initial(self) -> object:
        """The value without the flag: the env var (parsed by argparse, or read as a switch),
        then the dynamic default, then the declared default."""
        if (value := self.environment_value()) is not None:
            return value.lower() == "true" if self.is_switch else value
        if self.dynamic_default is not None:
            return self.dynamic_default()
        return list(self.default) if isinstance(self.default, list) else self.default

    def value_of(self, text: str) -> object:
        """What `--flag=text` gives (ValueError/ArgumentTypeError when it is not one)."""
        if self.is_switch:
            raise ValueError(f"{self.flag} is a switch: --{self.dest}/--no-{self.dest}")
        assert self.parse is not None
        value = self.parse(text)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.flag}={text!r}: expected one of {', '.join(self.choices)}")
        return value


def _inferred_parser(default: object) -> Callable[[str], object] | None:
    if isinstance(default, bool):
        return None
    if isinstance(default, float):
        return parse_duration
    if isinstance(default, int):
        return int
    if isinstance(default, Path):
        return Path
    return str


def option(  # noqa: PLR0913 - every part of a declaration, by keyword
    default: T,
    consumer: str,
    help: str = "",
    *,
    env: str = "",
    parse: Callable[[str], object] | None = None,
    choices: Sequence[str] | None = None,
    optional_value: bool = False,
    env_empty_is_unset: bool = False,
    dynamic_default: Callable[[], object] | None = None,
    required: bool = False,
) -> T:
    """A dataclass field that is a command-line option (see the module docstring)."""
    meta = {
        _KEY: Option(
            dest="",  # set by `declared` from the field's name
            default=default,
            consumer=consumer,
            help=help,
            env=env,
            parse=parse if parse is not None else _inferred_parser(default),
            choices=tuple(choices) if choices is not None else None,
            optional_value=optional_value,
            env_empty_is_unset=env_empty_is_unset,
            dynamic_default=dynamic_default,
            required=required,
        )
    }
    if isinstance(default, list):
        items = list(default)
        return cast(T, dataclasses.field(default_factory=lambda: list(items), metadata=meta))
    return dataclasses.field(default=default, metadata=meta)


def declared(cls: type[Any]) -> tuple[Option, ...]:
    """The options of an options dataclass, in declaration order."""
    return tuple(
        dataclasses.replace(f.metadata[_KEY], dest=f.name)
        for f in dataclasses.fields(cls)
        if _KEY in f.metadata
    )


def add_flags(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """The flags of `cls`'s options, grouped by consumer in `--help`."""
    groups: dict[str, Any] = {}
    for opt in declared(cls):
        if opt.consumer not in groups:
            groups[opt.consumer] = parser.add_argument_group(opt.consumer)
        help_text = f"{opt.help} [{opt.env}]".strip() if opt.env else opt.help
        kwargs: dict[str, Any] = {"default": opt.initial(), "help": help_text or None}
        if opt.is_switch:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = opt.parse
            if opt.choices is not None:
                kwargs["choices"] = opt.choices
            if opt.optional_value:
                kwargs.update(nargs="?", const=True)
            if opt.required:
                kwargs = {"required": True, "type": opt.parse, "help": kwargs["help"]}
        groups[opt.consumer].add_argument(opt.flag, **kwargs)


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """`cls` from parsed flags (its fields that are not flags keep their defaults)."""
    names = {f.name for f in dataclasses.fields(cast(Any, cls))}
    return cast(Callable[..., T], cls)(**{k: v for k, v in vars(args).items() if k in names})


def pick(
    cls: type[T],
    source: object,
    names: Mapping[str, str | None] | None = None,
    **given: object,
) -> T:
    """A component's settings dataclass `cls`: each field is `given`, or else `source`'s
    option of the same name, or of the name `names` declares for that field (`None`: no
    option fills it), or else the field's own default when `source` has no such option."""
    renamed = names or {}
    fields = dataclasses.fields(cast(Any, cls))
    if unknown := set(renamed) - {f.name for f in fields}:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
    if missing := {n for n in renamed.values() if n is not None and not hasattr(source, n)}:
        raise TypeError(f"no option {sorted(missing)} for {cls.__name__}")
    values = dict(given)
    for f in fields:
        name = renamed.get(f.name, f.name)
        if f.init and f.name not in values and name is not None and hasattr(source, name):
            values[f.name] = getattr(source, name)
    return cast(Callable[..., T], cls)(**values)
