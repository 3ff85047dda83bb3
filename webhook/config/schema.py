"""The config file's JSON schema (draft-07), generated from the declared keys (webhook.config.declare).

``python -m webhook.config.schema`` prints the schema of the whole file; ``--chart`` prints the
subtree the Helm chart's values.schema.json holds under ``properties.config`` (without the keys
the chart sets itself: apiVersion, kind, certificates); ``--write [FILE]`` rewrites that subtree of
charts/dra-guard/values.schema.json (or FILE) in place, the rest of the file unchanged.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any, Final

from webhook.config.declare import Entry, Key, entries, group_help
from webhook.config.types import HEADER_KEYS, Config

DRAFT_07: Final = "http://json-schema.org/draft-07/schema#"
CHART_SCHEMA: Final = pathlib.Path(__file__).resolve().parents[2] / "charts" / "dra-guard" / "values.schema.json"
FILE_DESCRIPTION: Final = "the dra-guard configuration file (DraGuardConfiguration); every key is optional"
CHART_DESCRIPTION: Final = "the dra-guard configuration file (docs/configuration.md); certificates are set by the chart"

_STRING_ITEM: Final = {"type": "string", "minLength": 1}


def _described(node: dict[str, Any], text: str) -> dict[str, Any]:
    if text:
        node["description"] = text
    return node


def _number(entry: Entry) -> dict[str, Any]:
    declared = entry.key
    node: dict[str, Any] = {"type": "integer" if entry.kind == "int" else "number"}
    if declared.lo is not None:
        node["exclusiveMinimum" if declared.lo_exclusive else "minimum"] = declared.lo
    if declared.hi is not None:
        node["maximum"] = declared.hi
    return node


def _items(declared: Key) -> dict[str, Any]:
    item: dict[str, Any] = dict(_STRING_ITEM)
    if declared.pattern:
        item["pattern"] = declared.pattern
        _described(item, declared.pattern_help)
    if declared.ip:
        item["anyOf"] = [{"format": "ipv4"}, {"format": "ipv6"}]
        item["description"] = "an IPv4 or IPv6 address"
    return item


def _value(entry: Entry, *, chart: bool, member: str = "") -> dict[str, Any]:
    """The schema of one declared key (`member`: the name of the family section it is in)."""
    declared, kind = entry.key, entry.kind
    node: dict[str, Any]
    if kind == "bool":
        node = {"type": "boolean"}
    elif kind in ("int", "number"):
        node = _number(entry)
    elif kind == "str":
        node = {"type": "string"}
        if declared.min_length:
            node["minLength"] = declared.min_length
        if declared.pattern:
            node["pattern"] = declared.pattern
    elif kind == "choice":
        node = {"type": "string", "enum": list(entry.choices)}
    elif kind == "time":
        node = {"type": "string", "format": "date-time"}
    elif kind in ("strings", "sorted_strings"):
        node = {"type": "array", "items": _items(declared)}
    elif kind == "string_map":
        node = {"type": "object", "additionalProperties": {"type": "string"}}
    else:
        assert entry.section is not None
        if kind == "section":
            node = section(entry.section, chart=chart)
        elif kind == "sections":
            node = {"type": "array", "items": section(entry.section, chart=chart)}
        else:
            node = {
                "type": "object",
                "properties": {name: section(entry.section, chart=chart, member=name) for name in declared.names},
                "additionalProperties": False,
            }
    text = declared.help
    if member and declared.per_name is not None:
        text = f"{text} (default {declared.per_name[member]})"
    return _described(node, text)


def section(cls: type[Any], *, chart: bool = False, member: str = "", description: str = "") -> dict[str, Any]:
    """The object schema of section dataclass `cls`: its declared keys (those with chart=False left
    out when `chart`), dotted keys as nested objects, no other keys, required keys listed.
    `member` names the family section `cls` is read as (per-name defaults in the descriptions)."""
    properties: dict[str, Any] = {}
    for entry in entries(cls):
        if chart and not entry.key.chart:
            continue
        group, _, name = entry.key.name.rpartition(".")
        target = properties
        if group:
            nested = properties.setdefault(
                group, {"type": "object", "properties": {}, "additionalProperties": False, "description": group_help(cls, group)}
            )
            target = nested["properties"]
        target[name] = _value(entry, chart=chart, member=member)
    node: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    required = [e.key.name for e in entries(cls) if e.key.required]
    if required:
        node["required"] = required
    return _described(node, description)


def config_schema(*, chart: bool = False) -> dict[str, Any]:
    """The JSON schema (a dict) of a whole config file; with `chart`, the chart's ``properties.config``
    subtree (no $schema/title, no apiVersion/kind/certificates)."""
    body = section(Config, chart=chart)
    if chart:
        return _described(body, CHART_DESCRIPTION)
    header = {h.name: {"type": "string", "enum": list(h.choices), "description": h.help} for h in HEADER_KEYS}
    body["properties"] = {**header, **body["properties"]}
    return {"$schema": DRAFT_07, "title": "dra-guard configuration", **body, "description": FILE_DESCRIPTION}


def write_chart_schema(path: pathlib.Path = CHART_SCHEMA) -> bool:
    """Rewrite ``properties.config`` of the chart's values.schema.json at `path` (JSON, indent 2, the
    other keys and their order unchanged). Returns whether the file changed. Raises OSError, ValueError."""
    text = path.read_text()
    values = json.loads(text)
    values["properties"]["config"] = config_schema(chart=True)
    new = json.dumps(values, indent=2) + "\n"
    if new == text:
        return False
    path.write_text(new)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: print the schema (or the chart's subtree), or --write it into the chart."""
    parser = argparse.ArgumentParser(prog="python -m webhook.config.schema", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--chart", action="store_true", help="print the chart's properties.config subtree")
    parser.add_argument(
        "--write",
        nargs="?",
        const=str(CHART_SCHEMA),
        metavar="FILE",
        help=f"rewrite properties.config of FILE (default {CHART_SCHEMA})",
    )
    args = parser.parse_args(argv)
    if args.write:
        changed = write_chart_schema(pathlib.Path(args.write))
        print(f"{args.write}: {'updated' if changed else 'unchanged'}", file=sys.stderr)
        return 0
    print(json.dumps(config_schema(chart=args.chart), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
