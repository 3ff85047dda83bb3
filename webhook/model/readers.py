"""Tolerant readers for Kubernetes object dicts, which may hold any JSON (admission input, manifest
files): a wrong type reads as empty, never raises. Plus the short form of a message that kubectl
shows as a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

WARNING_LIMIT = 119  # characters; kubectl warnings stay under 120 characters each


def as_map(value: Any) -> Mapping[str, Any]:
    """`value` if it is a mapping, else {}."""
    # a dict, as JSON decodes to, is told by its type: the Mapping ABC check costs ~10x more,
    # and the policies read dozens of fields per review
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return {}


def as_list(value: Any) -> list[Any]:
    """`value` if it is a list, else []."""
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    """`value` if it is a string, else ""."""
    return value if isinstance(value, str) else ""


def strings(value: Any) -> list[str]:
    """The string items of `value` if it is a list, else [] (other items are skipped)."""
    return [v for v in as_list(value) if isinstance(v, str)]


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """metadata of an object dict ({} when missing)."""
    return as_map(obj.get("metadata"))


def name_of(obj: Mapping[str, Any]) -> str:
    """metadata.name of an object dict ("" when missing)."""
    return as_str(meta(obj).get("name"))


def namespace_of(obj: Mapping[str, Any]) -> str:
    """metadata.namespace of an object dict ("" when missing or cluster-scoped)."""
    return as_str(meta(obj).get("namespace"))


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """metadata.labels of an object dict, string values only."""
    return {k: v for k, v in as_map(meta(obj).get("labels")).items() if isinstance(v, str)}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """metadata.annotations of an object dict ({} when missing)."""
    return as_map(meta(obj).get("annotations"))


def short(text: str, limit: int = WARNING_LIMIT) -> str:
    """Cut `text` to at most `limit` characters, ending with "..." when cut (for kubectl warnings)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
