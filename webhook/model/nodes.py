"""Node selectors and the nodes they select: which nodes a ResourceClaim's allocation reaches.

Source: core/v1 NodeSelector (``nodeSelectorTerms[]``, each with ``matchExpressions[]`` on labels
and ``matchFields[]`` on ``metadata.name``; terms are ORed, the requirements of a term ANDed;
operators In, NotIn, Exists, DoesNotExist, Gt, Lt), as the scheduler copies it from a
ResourceSlice's ``spec.nodeSelector`` (or a device's, with perDeviceNodeSelection) into a claim's
``status.allocation.nodeSelector`` for devices usable from several nodes. NodeIndex keeps of each
Node only its name, labels, uid and its NoSchedule/NoExecute taints (``spec.taints[]``: ``{key,
value, effect}``; whether a driver DaemonSet's pod comes back on the node). Thread-safe; no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.model.readers import as_list, as_map, as_str

#: (key, operator, values, on a field): one requirement; on a field, key is "metadata.name"
Requirement = tuple[str, str, tuple[str, ...], bool]
#: the terms of a NodeSelector (ORed), each a tuple of requirements (ANDed)
Selector = tuple[tuple[Requirement, ...], ...]
#: (key, value, effect) of a node taint that keeps pods off (NoSchedule) or evicts them (NoExecute)
Taint = tuple[str, str, str]
#: the taint effects that decide whether a DaemonSet pod is (re)created on a node
PLACING_EFFECTS = ("NoSchedule", "NoExecute")


def read_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The NoSchedule and NoExecute taints of a core/v1 Node dict (PreferNoSchedule keeps no pod off)."""
    return tuple(
        (as_str(t.get("key")), as_str(t.get("value")), as_str(t.get("effect")))
        for t in map(as_map, as_list(as_map(node.get("spec")).get("taints")))
        if as_str(t.get("effect")) in PLACING_EFFECTS
    )


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Taint) -> bool:
    """Whether one of core/v1 Toleration dicts tolerates `taint` (core/v1 ToleratesTaint: an empty
    effect matches every effect; operator Exists with an empty key matches every taint; Equal,
    the default, needs the same key and value)."""
    key, value, effect = taint
    for t in tolerations:
        if as_str(t.get("effect")) not in ("", effect):
            continue
        operator = as_str(t.get("operator")) or "Equal"
        if operator == "Exists" and (not as_str(t.get("key")) or as_str(t.get("key")) == key):
            return True
        if operator == "Equal" and as_str(t.get("key")) == key and as_str(t.get("value")) == value:
            return True
    return False


def read_selector(node_selector: Any) -> Selector:
    """The terms of a core/v1 NodeSelector dict; () when absent or unreadable."""
    terms = []
    for term in map(as_map, as_list(as_map(node_selector).get("nodeSelectorTerms"))):
        reqs = [
            (
                as_str(r.get("key")),
                as_str(r.get("operator")),
                tuple(v for v in as_list(r.get("values")) if isinstance(v, str)),
                field,
            )
            for field, group in ((False, "matchExpressions"), (True, "matchFields"))
            for r in map(as_map, as_list(term.get(group)))
        ]
        terms.append(tuple(reqs))
    return tuple(terms)


def named_nodes(selector: Selector) -> frozenset[str] | None:
    """The node names a selector is limited to when each term has a ``metadata.name In`` field
    requirement (what the scheduler writes for node-local devices): their union, a superset of the
    nodes selected whatever their labels. None when a term is not limited by name."""
    names: set[str] = set()
    for term in selector:
        named = [set(values) for key, op, values, field in term if field and key == "metadata.name" and op == "In"]
        if not named:
            return None
        names.update(set.intersection(*named))
    return frozenset(names)


def _number(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _holds(req: Requirement, name: str, labels: Mapping[str, str]) -> bool:
    key, op, values, field = req
    if field:
        value: str | None = name if key == "metadata.name" else None
    else:
        value = labels.get(key)
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _number(value), _number(values[0])
        return have is not None and bound is not None and (have > bound if op == "Gt" else have < bound)
    return False  # an operator the API does not define selects nothing, as in the scheduler


def selects(selector: Selector, name: str, labels: Mapping[str, str]) -> bool:
    """Whether `selector` selects node `name` with `labels` (a term with no requirement selects none)."""
    return any(term and all(_holds(r, name, labels) for r in term) for term in selector)


class NodeIndex:
    """Node name -> its labels (and uid), kept from a watch or a list (core/v1 Node dicts).
    on_change is called (outside this index's lock) after a node appears, goes or changes its labels."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._labels: dict[str, dict[str, str]] = {}
        self._uids: dict[str, str] = {}  # the owner of the node's shared records (webhook.kube.records)
        self._taints: dict[str, tuple[Taint, ...]] = {}  # only nodes that have NoSchedule/NoExecute taints
        self._on_change = on_change

    @staticmethod
    def _entry(obj: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
        meta = as_map(obj.get("metadata"))
        labels = {str(k): v for k, v in as_map(meta.get("labels")).items() if isinstance(v, str)}
        return as_str(meta.get("name")), labels

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """Add or replace a Node dict (a status-only update changes nothing here)."""
        name, labels = self._entry(obj)
        uid = as_str(as_map(obj.get("metadata")).get("uid"))
        taints = read_taints(obj)
        with self._lock:
            changed = self._labels.get(name) != labels
            self._labels[name] = labels
            self._uids[name] = uid
            if taints:
                self._taints[name] = taints
            else:
                self._taints.pop(name, None)
        if changed:
            self._on_change()

    def delete(self, name: str) -> None:
        """Forget Node `name`."""
        with self._lock:
            known = self._labels.pop(name, None) is not None
            self._uids.pop(name, None)
            self._taints.pop(name, None)
        if known:
            self._on_change()

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Replace every Node (after a relist); `items` is consumed and slimmed before the lock."""
        uids: dict[str, str] = {}
        taints: dict[str, tuple[Taint, ...]] = {}

        def entry(obj: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
            name, labels = self._entry(obj)
            uids[name] = as_str(as_map(obj.get("metadata")).get("uid"))
            if found := read_taints(obj):
                taints[name] = found
            return name, labels

        fresh = dict(map(entry, items))
        with self._lock:
            self._labels, self._uids, self._taints = fresh, uids, taints
        self._on_change()

    def uid(self, name: str) -> str:
        """Node `name`'s metadata.uid ("" when unknown)."""
        with self._lock:
            return self._uids.get(name, "")

    def node(self, name: str) -> tuple[dict[str, str], tuple[Taint, ...]] | None:
        """(labels, NoSchedule/NoExecute taints) of Node `name`, None when it is not known."""
        with self._lock:
            labels = self._labels.get(name)
            return None if labels is None else (labels, self._taints.get(name, ()))

    def selected(self, selector: Selector) -> frozenset[str]:
        """The known nodes `selector` selects. O(nodes)."""
        with self._lock:
            return frozenset(name for name, labels in self._labels.items() if selects(selector, name, labels))

    def __len__(self) -> int:
        with self._lock:
            return len(self._labels)
