"""How a config key is declared: once, on the dataclass field that holds its value.

``dataclasses.field(default=10, metadata=key("periodSeconds", lo=1, hi=3600, help="..."))`` says
the key's name in the file (camelCase), its bounds or form, and one line of help. The value's
kind comes from the field's type annotation (bool or bool | None, int, float, str, a Literal of choices,
frozenset[str] / tuple[str, ...] lists, Mapping[str, str], datetime (an RFC 3339 date-time), a
nested dataclass section, a tuple of dataclass sections, a Mapping of named sections). webhook.config.load reads a file by walking these
declarations and webhook.config.schema writes the JSON schema from the same ones.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from collections.abc import Mapping
from typing import Any, Final, Literal

#: the dataclasses.field metadata entry that holds a field's Key
METADATA: Final = "dra_guard_key"

Kind = Literal[
    "bool", "int", "number", "str", "choice", "strings", "sorted_strings", "section", "sections", "string_map", "family", "time"
]


class ConfigError(ValueError):
    """The configuration is invalid: `problems` holds one line per error, each starting with the
    offending key's dotted path (file loads: with the file's name before it); str() is those lines
    joined by newlines, so a single error reads as it always did."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key.

    name: the key in the file (camelCase); "group.name" puts a flat attribute under a nested
    mapping (``startupProbe.enabled``). help: one line, the schema's description.
    lo / hi: inclusive bounds of a number (lo_exclusive: lo itself is refused).
    choices: allowed strings when the annotation is plain str (else the Literal's arguments).
    min_length: strings shorter than this are refused. required: a section item must set it.
    pattern / pattern_help: every item of a string list must match the regex (search), else
    "<key>: '<item>' must be <pattern_help>". ip: every item must be an IP address.
    below: the value must be smaller than this sibling key's value (durations: "must be shorter than").
    names: for a Mapping of sections, the allowed section names.
    inherit: in such a section, the default is the value of this key of the enclosing section.
    per_name: in such a section, the default by section name.
    chart: the key is part of the Helm chart's ``config`` value (else the chart sets it itself).
    """

    name: str
    help: str
    lo: int | float | None = None
    hi: int | float | None = None
    lo_exclusive: bool = False
    choices: tuple[str, ...] = ()
    min_length: int = 0
    required: bool = False
    pattern: str = ""
    pattern_help: str = ""
    ip: bool = False
    below: str = ""
    names: tuple[str, ...] = ()
    inherit: str = ""
    per_name: Mapping[str, str] | None = None
    chart: bool = True


def key(
    name: str,
    *,
    help: str,
    lo: int | float | None = None,
    hi: int | float | None = None,
    lo_exclusive: bool = False,
    choices: tuple[str, ...] = (),
    min_length: int = 0,
    required: bool = False,
    pattern: str = "",
    pattern_help: str = "",
    ip: bool = False,
    below: str = "",
    names: tuple[str, ...] = (),
    inherit: str = "",
    per_name: Mapping[str, str] | None = None,
    chart: bool = True,
) -> dict[str, Key]:
    """The ``metadata`` of a dataclasses.field declaring config key `name` (see Key for the arguments)."""
    return {
        METADATA: Key(
            name=name,
            help=help,
            lo=lo,
            hi=hi,
            lo_exclusive=lo_exclusive,
            choices=choices,
            min_length=min_length,
            required=required,
            pattern=pattern,
            pattern_help=pattern_help,
            ip=ip,
            below=below,
            names=names,
            inherit=inherit,
            per_name=per_name,
            chart=chart,
        )
    }


@dataclasses.dataclass(frozen=True)
class Entry:
    """A declared field of a section: its attribute, its Key, the kind of value and, for kinds
    "section", "sections" and "family", the dataclass of the nested section(s)."""

    attr: str
    key: Key
    kind: Kind
    choices: tuple[str, ...] = ()
    section: type[Any] | None = None


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _kind(tp: Any, declared: Key) -> tuple[Kind, tuple[str, ...], type[Any] | None]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool or (origin in (typing.Union, types.UnionType) and set(args) == {bool, type(None)}):
        return "bool", (), None  # bool | None: None means unset here, the policy then reads another key
    if tp is int:
        return "int", (), None
    if tp is float:
        return "number", (), None
    if tp is datetime.datetime:
        return "time", (), None  # an RFC 3339 date-time (webhook.config.exceptions.parse_expiry)
    if tp is str:
        return ("choice", declared.choices, None) if declared.choices else ("str", (), None)
    if origin is Literal:
        return "choice", tuple(str(a) for a in args), None
    if origin is frozenset and args == (str,):
        return "strings", (), None
    if origin is tuple and args == (str, Ellipsis):
        return "sorted_strings", (), None
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and _is_section(args[0]):
        return "sections", (), args[0]
    if origin is Mapping and args == (str, str):
        return "string_map", (), None
    if origin is Mapping and len(args) == 2 and _is_section(args[1]) and declared.names:
        return "family", (), args[1]
    if _is_section(tp):
        return "section", (), tp
    raise TypeError(f"config key {declared.name}: no reader for type {tp!r}")


_ENTRIES: dict[type[Any], tuple[Entry, ...]] = {}


def entries(cls: type[Any]) -> tuple[Entry, ...]:
    """The declared fields of section dataclass `cls`, in declaration order (fields without a Key,
    like Config.ignored, are not read from the file). Raises TypeError for an unsupported annotation."""
    if cls not in _ENTRIES:
        _ENTRIES[cls] = _entries(cls)
    return _ENTRIES[cls]


def _entries(cls: type[Any]) -> tuple[Entry, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(METADATA)
        if declared is None:
            continue
        kind, choices, section = _kind(hints[f.name], declared)
        out.append(Entry(attr=f.name, key=declared, kind=kind, choices=choices, section=section))
    return tuple(out)


def class_defaults(cls: type[Any]) -> dict[str, Any]:
    """The defaults of dataclass `cls`'s fields by attribute (fields without a default are left out)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def instance_values(obj: Any) -> dict[str, Any]:
    """A dataclass instance's field values by attribute (shallow)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def group_help(cls: type[Any], group: str) -> str:
    """The help of the nested mapping `group` of dotted keys ("startupProbe" of "startupProbe.enabled"),
    from the section's ``key_groups`` class attribute."""
    groups: Mapping[str, str] = getattr(cls, "key_groups", {})
    return groups[group]
