"""Each config key is declared once (webhook/config/types.py): the reader, the JSON schema, the chart's
values.schema.json and the documented example all follow from that declaration and must agree."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import math
import pathlib
import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

import webhook.config as config_mod
from webhook.config import POLICY_NAMES, Config, ConfigError, from_mapping
from webhook.config.declare import Entry, entries, group_help
from webhook.config.schema import CHART_SCHEMA, config_schema, main, write_chart_schema
from webhook.config.types import HEADER_KEYS

REPO = pathlib.Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------- helpers
def validate(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The draft-07 keywords the generator emits, checked; returns "path: problem" lines."""
    errors: list[str] = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}
    if kind is not None:
        if isinstance(value, bool) and kind in ("integer", "number") or not isinstance(value, types[kind]):
            return [f"{path}: not {kind}: {value!r}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: not in enum")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: below minimum")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        errors.append(f"{path}: not above exclusiveMinimum")
    if "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{path}: above maximum")
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{path}: shorter than minLength")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: does not match pattern")
    if "anyOf" in schema:
        formats = {"ipv4": ipaddress.IPv4Address, "ipv6": ipaddress.IPv6Address}

        def ok(alternative: dict[str, Any]) -> bool:
            try:
                formats[alternative["format"]](value)
            except ValueError:
                return False
            return True

        if not any(ok(alt) for alt in schema["anyOf"]):
            errors.append(f"{path}: matches no anyOf")
    if kind == "array":
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}/{i}")
    if kind == "object":
        props = schema.get("properties", {})
        errors += [f"{path}/{k}: required" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            if k in props:
                errors += validate(v, props[k], f"{path}/{k}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}/{k}: additional property")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += validate(v, schema["additionalProperties"], f"{path}/{k}")
    return errors


def document(cls: type[Any], obj: Any) -> dict[str, Any]:
    """Section `obj` of dataclass `cls` as a config document, by its declarations."""
    out: dict[str, Any] = {}
    for e in entries(cls):
        value = getattr(obj, e.attr)
        if e.kind in ("strings", "sorted_strings"):
            value = sorted(value)
        elif e.kind == "string_map":
            value = dict(value)
        elif e.kind == "section":
            value = document(e.section, value)
        elif e.kind == "sections":
            value = [document(e.section, item) for item in value]
        elif e.kind == "family":
            value = {name: document(e.section, obj.policy(name)) for name in e.key.names}
        elif value is None:
            continue  # a bool | None key left unset: a document leaves it out
        group, _, name = e.key.name.rpartition(".")
        (out.setdefault(group, {}) if group else out)[name] = value
    return out


def declared(cls: type[Any] = Config, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Entry]]:
    """Every declared key as (path in the file, Entry); families and item lists expanded once."""
    for e in entries(cls):
        path = prefix + tuple(e.key.name.split("."))
        yield path, e
        if e.kind == "section":
            yield from declared(e.section, path)
        elif e.kind == "family":
            for name in e.key.names:
                yield from declared(e.section, path + (name,))
        elif e.kind == "sections":
            yield from declared(e.section, path + ("[]",))


def nest(path: tuple[str, ...], value: Any, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = {} if doc is None else doc
    node = doc
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return doc


def resolved(cfg: Config) -> Config:
    """`cfg` with every policy spelled out (Config() leaves policies empty: policy() falls back)."""
    return dataclasses.replace(cfg, policies={name: cfg.policy(name) for name in POLICY_NAMES})


# ---------------------------------------------------------------- (a) the chart
def test_chart_config_subtree_is_the_generated_one():
    """Regenerate with: python -m webhook.config.schema --write"""
    chart = json.loads(CHART_SCHEMA.read_text())
    assert chart["properties"]["config"] == config_schema(chart=True)


def test_write_keeps_the_chart_file_byte_for_byte(tmp_path, capsys):
    copy = tmp_path / "values.schema.json"
    shutil.copy(CHART_SCHEMA, copy)
    assert write_chart_schema(copy) is False
    values = json.loads(copy.read_text())
    values["properties"]["config"]["properties"].pop("mode")
    copy.write_text(json.dumps(values, indent=2) + "\n")
    assert main(["--write", str(copy)]) == 0
    assert copy.read_text() == CHART_SCHEMA.read_text()
    assert "updated" in capsys.readouterr().err


def test_chart_subtree_leaves_out_what_the_chart_sets():
    chart, full = config_schema(chart=True), config_schema()
    assert set(full["properties"]) - set(chart["properties"]) == {"apiVersion", "kind", "certificates"}
    assert full["$schema"] == "http://json-schema.org/draft-07/schema#"


def test_main_prints_the_schema(capsys):
    assert main([]) == 0
    assert json.loads(capsys.readouterr().out) == config_schema()
    assert main(["--chart"]) == 0
    assert json.loads(capsys.readouterr().out) == config_schema(chart=True)


# ---------------------------------------------------------------- (b) defaults
def test_defaults_validate_against_the_schema_and_round_trip():
    doc = document(Config, Config())
    assert validate(doc, config_schema()) == []
    chart_doc = copy.deepcopy(doc)
    for path, e in declared():  # what the chart sets itself (the certificates section, the reports' owner)
        if not e.key.chart and "[]" not in path:
            parent = chart_doc
            for part in path[:-1]:
                parent = parent.get(part, {})
            parent.pop(path[-1], None)
    assert "certificates" not in chart_doc and "reportOwnerClusterRole" not in chart_doc["audit"]
    assert validate(chart_doc, config_schema(chart=True)) == []
    assert from_mapping(doc) == resolved(Config())


def test_a_selector_validates_and_reads_back():
    doc = {"drivers": {"selectors": [{"namespace": "gpu", "matchLabels": {"app": "d"}, "driverName": "gpu.example.com"}]}}
    assert validate(doc, config_schema()) == []
    assert document(Config, from_mapping(doc))["drivers"] == {
        "autoDetect": True,
        "kubeletRootDirs": ["/var/lib/kubelet"],
        "declared": [],
        "selectors": [{**doc["drivers"]["selectors"][0], "driverNames": []}],
    }
    assert validate({"drivers": {"selectors": [{"matchLabels": {}}]}}, config_schema()) == [
        "/drivers/selectors/0/namespace: required"
    ]


# ---------------------------------------------------------------- (c) bounds
def _bound_cases() -> Iterator[Any]:
    for path, e in declared():
        if e.kind not in ("int", "number") or "[]" in path:
            continue
        lo, hi = e.key.lo, e.key.hi
        if e.kind == "int":
            below, above = lo - 1, hi + 1
        else:
            below, above = math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)
        accepted = [hi] + ([math.nextafter(lo, math.inf)] if e.key.lo_exclusive else [lo])
        refused = [above, lo if e.key.lo_exclusive else below]
        for value in accepted:
            yield pytest.param(path, e, value, True, id=f"{'.'.join(path)}={value}")
        for value in refused:
            yield pytest.param(path, e, value, False, id=f"{'.'.join(path)}={value}")


def _siblings_for(path: tuple[str, ...], e: Entry, value: Any) -> dict[str, Any]:
    """A document setting `path` to `value`, with any declared "below" partner set so the cross-check passes."""
    doc = nest(path, value)
    parent = path[:-1]
    section_cls = {p: x for p, x in declared()}.get(parent)
    siblings = entries(section_cls.section) if section_cls is not None else entries(Config)
    for s in siblings:
        if e.key.below == s.key.name:
            nest(parent + (s.key.name,), s.key.hi, doc)
        if s.key.below == e.key.name:
            nest(parent + (s.key.name,), s.key.lo, doc)
    return doc


@pytest.mark.parametrize("path, e, value, ok", list(_bound_cases()))
def test_number_bounds_are_the_schemas(path, e, value, ok):
    doc = _siblings_for(path, e, value)
    key = ".".join(path)
    schema_errors = validate(doc, config_schema())
    below_partners = [s for s in declared() if s[1].key.below == e.key.name]
    if ok and below_partners and value <= below_partners[0][1].key.lo:
        # e.g. caValidityDays=1: in bounds, but no leafValidityDays can be shorter
        with pytest.raises(ConfigError, match="must be shorter than " + re.escape(key)):
            from_mapping(doc)
        return
    if ok:
        from_mapping(doc)
        assert schema_errors == []
    else:
        with pytest.raises(ConfigError) as err:
            from_mapping(doc)
        assert str(err.value).startswith(f"{key}: must be "), str(err.value)
        assert schema_errors == [
            f"/{'/'.join(path)}: "
            + ("above maximum" if value > e.key.hi else "not above exclusiveMinimum" if e.key.lo_exclusive else "below minimum")
        ]


def test_every_choice_is_accepted_and_others_refused():
    cases = [(p, e) for p, e in declared() if e.kind == "choice" and "[]" not in p]  # list items: test_config_exceptions
    assert len(cases) >= 5
    for path, e in cases:
        for choice in e.choices:
            assert validate(nest(path, choice), config_schema()) == []
            from_mapping(nest(path, choice))
        with pytest.raises(ConfigError, match=f"^{re.escape('.'.join(path))}: must be one of {', '.join(e.choices)}; got 'x'$"):
            from_mapping(nest(path, "x"))
        assert validate(nest(path, "x"), config_schema()) != []


# ---------------------------------------------------------------- (d) help
def test_every_declared_key_has_help():
    missing = [".".join(p) for p, e in declared() if not e.key.help.strip()]
    missing += [h.name for h in HEADER_KEYS if not h.help.strip()]
    assert missing == []
    sections = [Config] + [e.section for _, e in declared() if e.section is not None]
    groups = [(cls, e.key.name.split(".")[0]) for cls in sections for e in entries(cls) if "." in e.key.name]
    assert groups and all(group_help(cls, group).strip() for cls, group in groups)


# ---------------------------------------------------------------- (e) the documented example
def _example() -> dict[str, Any]:
    text = config_mod.__doc__.split("Example (all defaults shown)::", 1)[1]
    return yaml.safe_load("\n".join(line[4:] for line in text.splitlines() if line.startswith("    ") or not line.strip()))


def _docs_example() -> dict[str, Any]:
    page = (REPO / "docs" / "configuration.md").read_text()
    return yaml.safe_load(re.search(r"^# Configuration.*?```yaml\n(.*?)```", page, re.S | re.M).group(1))


def test_docstring_example_is_the_defaults():
    cfg = from_mapping(_example())
    assert cfg == resolved(Config())
    assert all(cfg.policy(name) == Config().policy(name) for name in POLICY_NAMES)
    assert validate(_example(), config_schema()) == []


@pytest.mark.parametrize("example", [_example, _docs_example], ids=["docstring", "docs"])
def test_example_shows_every_declared_key(example):
    doc = example()

    def shown(path: tuple[str, ...]) -> bool:
        node: Any = doc
        for part in path:
            if part == "[]":
                return True  # items of a list the example leaves empty
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    headers = [(h.name,) for h in HEADER_KEYS]
    assert [".".join(p) for p in [*headers, *(p for p, _ in declared())] if not shown(p)] == []
