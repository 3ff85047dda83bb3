"""The docs site's reference pages, generated from the code at every `mkdocs build` (an mkdocs hook).

mkdocs.yml names this file under ``hooks:``; ``on_files`` adds four pages that exist only in the
build, never in git, so they cannot go stale:

- ``reference/configuration.md``: every config key, from its declaration (webhook.config.declare,
  through the JSON schema webhook.config.schema writes) with its default from ``Config()``;
- ``reference/helm-values.md``: every value of charts/dra-guard/values.yaml with its default, the
  comment above it and its type from values.schema.json;
- ``reference/metrics.md``: every metric of webhook/metrics.py (name, type, labels, help);
- ``reference/cli.md``: every command's ``--help``, from webhook.cli.parser.build_parser().

``pages()`` returns the same pages ({path under docs/: markdown}) for tests (tests/docs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "dra-guard"
GENERATED = "<!-- generated at build time by hack/docs_reference.py from the code: do not edit -->"


def _cell(text: object) -> str:
    """`text` fit for one cell of a Markdown table (no newline, no bare pipe)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(value: object) -> str:
    """A default as inline code (JSON: what the file takes; a long one is cut)."""
    if isinstance(value, frozenset | set):
        value = sorted(value)
    elif isinstance(value, tuple):
        value = list(value)
    text = json.dumps(value, default=str)
    if len(text) > 80:
        text = text[:77] + "..."
    return "`" + text.replace("|", "\\|") + "`"


# --------------------------------------------------------------------------------- configuration
def _defaults(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key path: default} of a config section instance, from its declared fields."""
    from webhook.config.declare import entries

    out: dict[str, Any] = {}
    for entry in entries(type(obj)):
        path, value = prefix + entry.key.name, getattr(obj, entry.attr)
        if entry.kind == "section" and dataclasses.is_dataclass(value):
            out.update(_defaults(value, path + "."))
        elif entry.kind == "family":
            for name, member in dict(value).items():
                out.update(_defaults(member, f"{path}.{name}."))
        else:
            out[path] = value
    return out


def _schema_type(node: Mapping[str, Any]) -> str:
    kind = node.get("type", "")
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    if kind == "array":
        return "list of " + _schema_type(node.get("items", {}))
    if kind in ("integer", "number"):
        bounds = [
            f"≥ {node['minimum']}" if "minimum" in node else "",
            f"> {node['exclusiveMinimum']}" if "exclusiveMinimum" in node else "",
            f"≤ {node['maximum']}" if "maximum" in node else "",
        ]
        return " ".join([kind] + [b for b in bounds if b])
    if isinstance(kind, list):
        return " or ".join(kind)
    return str(kind or "any")


def _leaves(node: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(dotted path, schema node) of every key of a JSON schema object, sections included."""
    for name, child in node.get("properties", {}).items():
        path = prefix + name
        yield path, child
        if child.get("type") == "object" and "properties" in child:
            yield from _leaves(child, path + ".")
        elif child.get("type") == "array" and "properties" in child.get("items", {}):
            yield from _leaves(child["items"], path + "[].")


def configuration_page() -> str:
    from webhook.config.schema import config_schema
    from webhook.config.types import Config

    defaults = _defaults(Config())
    lines = [
        GENERATED,
        "",
        "# Configuration keys",
        "",
        "Every key of the configuration file (`dra-guard serve --config`, the chart's `config` value), "
        "generated from its declaration in `webhook/config/`: the type and bounds the loader enforces, "
        "the default and the declared help. [Configuration](../configuration.md) explains the file and "
        "shows it whole; `dra-guard config schema` prints the same as a JSON schema.",
        "",
        "| Key | Type | Default | Meaning |",
        "|---|---|---|---|",
    ]
    for path, node in _leaves(config_schema()):
        section = node.get("type") == "object"
        default = "" if section or path not in defaults else _code(defaults[path])
        kind = "section" if section else _schema_type(node)
        lines.append(f"| `{path}` | {_cell(kind)} | {default} | {_cell(node.get('description', ''))} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------- Helm values
def _comments(text: str) -> dict[str, str]:
    """{dotted value path: the comment lines right above its key} from values.yaml's text."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.lstrip()
        if not stripped:
            comment = []
            continue
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip().removeprefix("-- "))
            continue
        indent = len(line) - len(stripped)
        if stripped.startswith("- ") or ":" not in stripped:
            comment = []
            continue
        key = stripped.split(":", 1)[0].strip().strip('"')
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        out[".".join(k for _, k in stack)] = " ".join(comment)
        comment = []
    return out


def _value_leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for name, child in node.items():
            yield from _value_leaves(child, f"{prefix}.{name}" if prefix else str(name))
    else:
        yield prefix, node


def _schema_at(schema: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    node: Mapping[str, Any] = schema
    for part in path.split("."):
        node = node.get("properties", {}).get(part, {})
    return node


def helm_values_page() -> str:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    comments = _comments(text)
    lines = [
        GENERATED,
        "",
        "# Helm values",
        "",
        "Every value of the chart (`charts/dra-guard/values.yaml`), generated from that file: its default, "
        "the comment above it there (the reason for the default) and its type from `values.schema.json`, "
        "which refuses a wrong type or an unknown key with the key's path. The `config` value is the "
        "configuration file: [its keys](configuration.md). [Install with Helm](../install.md) explains the "
        "main values.",
        "",
        "| Value | Type | Default | Comment in values.yaml |",
        "|---|---|---|---|",
    ]
    for path, default in _value_leaves(values):
        if path.startswith("config."):
            continue  # the config file's keys: reference/configuration.md
        node = _schema_at(schema, path)
        comment = comments.get(path, "")
        lines.append(f"| `{path}` | {_cell(_schema_type(node)) if node else ''} | {_code(default)} | {_cell(comment)} |")
    config_defaults = values.get("config", {})
    lines += [
        "",
        "## `config`",
        "",
        "The chart's `config` value is rendered verbatim into the configuration file; its keys and defaults "
        "are those of [Configuration keys](configuration.md). values.yaml sets these (a long default is cut "
        "with `...`: values.yaml has it whole):",
        "",
    ]
    for path, default in _value_leaves(config_defaults, "config"):
        if path != "config":
            lines.append(f"- `{path}`: {_code(default)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------- metrics
def metric_families() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(exported name, type, labels, help) of every metric of webhook/metrics.py. prometheus-client
    exposes a metric's label names only as the attribute its own code reads (``_labelnames``)."""
    from prometheus_client.metrics import MetricWrapperBase

    from webhook import metrics

    out = []
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            family = next(iter(metric.describe()))
            name = family.name + ("_total" if family.type == "counter" else "")
            out.append((name, family.type, tuple(metric._labelnames), family.documentation))
    return out


def metrics_page() -> str:
    lines = [
        GENERATED,
        "",
        "# Metrics",
        "",
        "Every metric dra-guard exports on `/metrics`, generated from `webhook/metrics.py`: its type, labels "
        "and help text. [Monitoring](../operations/monitoring.md#metrics) says what each means for an operator "
        "and which alert reads it; [the runbooks](../runbooks.md) what to do when one fires.",
        "",
        "| Metric | Type | Labels | Help |",
        "|---|---|---|---|",
    ]
    for name, kind, labels, help_text in metric_families():
        lines.append(f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels)} | {_cell(help_text)} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------- CLI
def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command line, parser) of `dra-guard` and of every subcommand, depth first, in parser order."""
    from webhook.cli.parser import build_parser

    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:  # argparse lists subcommands only there
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(f"{name} {sub}", child)

    walk("dra-guard", build_parser())
    return out


def cli_page() -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width: the same page everywhere
    try:
        helps = [(name, parser.format_help()) for name, parser in commands()]
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    lines = [
        GENERATED,
        "",
        "# Commands",
        "",
        "Every command's `--help`, generated from the parser (`webhook/cli/parser.py`). "
        "The same commands run as `kubectl dra-guard ...` ([kubectl plugin](../install.md#kubectl-plugin)).",
        "",
    ]
    for name, text in helps:
        lines += [f"## `{name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """{path under docs/: Markdown} of the generated reference pages."""
    return {
        "reference/configuration.md": configuration_page(),
        "reference/helm-values.md": helm_values_page(),
        "reference/metrics.md": metrics_page(),
        "reference/cli.md": cli_page(),
    }


# --------------------------------------------------------------------------------- mkdocs hook
def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages to the build (mkdocs >= 1.6, File.generated)."""
    from mkdocs.structure.files import File

    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files
