"""SliceIndex: which DRA drivers serve which node, from ResourceSlices.

Source: resource.k8s.io v1 ResourceSlice ``spec.driver``, ``spec.nodeName``, ``spec.pool.name``
(v1beta1/v1beta2 have the same fields). A driver's kubelet plugin publishes the slices of its node
with ``nodeName`` set; the kubelet deletes them ~30 s after the driver unregisters. Slices with
``nodeSelector``, ``allNodes`` or ``perDeviceNodeSelection`` (network-attached devices) say
nothing about which driver pod runs on a node and are not kept. Only (driver, node, pool) is kept
of each slice: memory follows the number of slices, not their devices. Thread-safe; no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.model.readers import as_map, as_str

SliceEntry = tuple[str, str, str]  # (driver, nodeName, pool name)


def slice_entry(obj: Mapping[str, Any]) -> tuple[str, SliceEntry | None]:
    """(metadata.name, (driver, nodeName, pool)) of a ResourceSlice dict; None when not node-local."""
    meta, spec = as_map(obj.get("metadata")), as_map(obj.get("spec"))
    driver, node = as_str(spec.get("driver")), as_str(spec.get("nodeName"))
    entry = (driver, node, as_str(as_map(spec.get("pool")).get("name"))) if driver and node else None
    return as_str(meta.get("name")), entry


class SliceIndex:
    """Node -> the drivers with node-local ResourceSlices on it, kept from a watch or a list."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[str, SliceEntry] = {}
        self._by_node: dict[str, dict[str, int]] = {}  # node -> driver -> number of slices

    def _add(self, name: str, entry: SliceEntry) -> None:
        self._slices[name] = entry
        counts = self._by_node.setdefault(entry[1], {})
        counts[entry[0]] = counts.get(entry[0], 0) + 1

    def _remove(self, name: str) -> None:
        old = self._slices.pop(name, None)
        if old is None:
            return
        counts = self._by_node.get(old[1], {})
        counts[old[0]] = counts.get(old[0], 1) - 1
        if counts[old[0]] <= 0:
            del counts[old[0]]
        if not counts:
            self._by_node.pop(old[1], None)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """Add or replace a ResourceSlice dict (one that is not node-local is forgotten)."""
        name, entry = slice_entry(obj)
        with self._lock:
            self._remove(name)
            if entry is not None:
                self._add(name, entry)

    def delete(self, name: str) -> None:
        """Forget ResourceSlice `name`."""
        with self._lock:
            self._remove(name)

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Replace every slice (after a relist); `items` is consumed and slimmed before the lock."""
        entries = [(name, entry) for name, entry in map(slice_entry, items) if entry is not None]
        with self._lock:
            self._slices.clear()
            self._by_node.clear()
            for name, entry in entries:
                self._add(name, entry)

    def drivers_on(self, node: str) -> frozenset[str]:
        """The drivers that publish node-local ResourceSlices for `node`. O(drivers on the node)."""
        with self._lock:
            return frozenset(self._by_node.get(node, ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._slices)
