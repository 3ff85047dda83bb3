"""Pending: the RBAC objects this replica allowed a moment ago that its watch has not delivered
yet (docs/threat-model.md, path 9: without it, a role UPDATE adding DRA write and a binding of that
role sent at the same moment could both be stored).

A review first records its own object here, then judges reading the other kind's pending
objects; since both records happen before either read, of two concurrent reviews at least one
sees the other (and refuses, or both do). A refused review drops its record; an allowed one stays
until the watch delivers the object (settle) or `ttl` seconds pass. Across replicas the watch
re-judging (webhook.kube.drift) reports what slipped through. Thread-safe; no I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from webhook.model.readers import as_map, as_str, name_of, namespace_of

Key = tuple[str, str, str]  # ("role" | "binding", namespace, name)

#: seconds an allowed object waits for its watch event at most
TTL_SECONDS = 30.0


def _kind(obj: Mapping[str, Any]) -> str:
    return "binding" if isinstance(obj.get("roleRef"), Mapping) else "role"


class Pending:
    """Objects allowed (or being judged) by this replica and not yet seen on the watch."""

    def __init__(self, ttl: float = TTL_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._items: dict[Key, tuple[Mapping[str, Any], float]] = {}

    def add(self, obj: Mapping[str, Any]) -> None:
        """Record a ClusterRole/Role or ClusterRoleBinding/RoleBinding dict being judged."""
        with self._lock:
            self._items[_kind(obj), namespace_of(obj), name_of(obj)] = (obj, time.monotonic() + self.ttl)

    def drop(self, obj: Mapping[str, Any]) -> None:
        """Forget `obj` (its review refused it)."""
        self.settle(_kind(obj), namespace_of(obj), name_of(obj))

    def settle(self, kind: str, namespace: str, name: str) -> None:
        """The watch delivered (or deleted) object kind ("role" or "binding") namespace/name."""
        with self._lock:
            self._items.pop((kind, namespace, name), None)

    def _live(self) -> list[tuple[Key, Mapping[str, Any]]]:
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, expiry) in self._items.items() if expiry < now]:
                del self._items[key]
            return [(k, obj) for k, (obj, _) in self._items.items()]

    def role(self, name: str, namespace: str = "") -> Mapping[str, Any] | None:
        """The pending ClusterRole `name` (or Role namespace/name), or None."""
        return next((o for k, o in self._live() if k == ("role", namespace, name)), None)

    def bindings_of(self, role: str, namespace: str = "") -> list[Mapping[str, Any]]:
        """Pending bindings whose roleRef names ClusterRole `role` (namespace "") or Role namespace/role."""
        out = []
        for (kind, ns, _), obj in self._live():
            ref = as_map(obj.get("roleRef"))
            ref_ns = ns if as_str(ref.get("kind")) == "Role" else ""
            if kind == "binding" and as_str(ref.get("name")) == role and ref_ns == namespace:
                out.append(obj)
        return out
