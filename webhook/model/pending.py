"""Pending: the RBAC objects this replica allowed a moment ago that its watch has not delivered
yet (docs/threat-model.md, path 9: without it, a role UPDATE adding DRA write and a binding of that
role sent at the same moment could both be stored).

A review first records its own object here, then judges reading the other kind's pending
objects; since both records happen before either read, of two concurrent reviews at least one
sees the other (and refuses, or both do). A refused review drops its own record (and only its
own); an allowed one stays until the watch delivers the object (settle) or `ttl` seconds pass.
Across replicas the watch re-judging (webhook.kube.drift) reports what slipped through.

What a review says is not trusted (anyone who reaches the webhook port can send one): a pending
object is judged *beside* the informers' version of the same object and beside every other
pending version of it, never instead of them. So a review can only add restrictions: a forged
CREATE of an existing binding with an admin subject hides nothing, it adds a binding that grants
nothing (docs/threat-model.md, "Callers of the webhook port"). Thread-safe; no I/O.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

from webhook.model.readers import as_map, as_str, name_of, namespace_of

Key = tuple[str, str, str]  # ("role" | "binding", namespace, name)

#: seconds an allowed object waits for its watch event at most
TTL_SECONDS = 30.0
#: records kept at most (every version of every object). Anyone who reaches the webhook port
#: (without server.clientCAFile) can send reviews: a flood must not grow memory, nor the scan each
#: RBAC review makes of the records, without bound. Past it a review is not judged (PendingFull)
#: until records expire or settle; a helm install of a few thousand RBAC objects stays far below.
MAX_RECORDS = 10_000


class PendingFull(RuntimeError):
    """MAX_RECORDS records are held: the review cannot be recorded, so it is not judged."""


def _kind(obj: Mapping[str, Any]) -> str:
    return "binding" if isinstance(obj.get("roleRef"), Mapping) else "role"


def _key(obj: Mapping[str, Any]) -> Key:
    return _kind(obj), namespace_of(obj), name_of(obj)


class Pending:
    """Objects allowed (or being judged) by this replica and not yet seen on the watch: every
    version recorded, each with its own token and expiry."""

    def __init__(self, ttl: float = TTL_SECONDS, max_records: int = MAX_RECORDS) -> None:
        self.ttl = ttl
        self.max_records = max_records
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        # key -> {token: (object, monotonic expiry)}
        self._items: dict[Key, dict[int, tuple[Mapping[str, Any], float]]] = {}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._items.values())

    def add(self, obj: Mapping[str, Any]) -> int:
        """Record a ClusterRole/Role or ClusterRoleBinding/RoleBinding dict being judged, beside any
        other version of it already recorded; the token that drops this record (and no other).
        Raises PendingFull when max_records records are held after the expired ones are dropped."""
        with self._lock:
            if sum(len(v) for v in self._items.values()) >= self.max_records:
                self._expire(time.monotonic())
                if sum(len(v) for v in self._items.values()) >= self.max_records:
                    raise PendingFull(
                        f"{self.max_records} RBAC objects allowed in the last {self.ttl:g} s await their watch events"
                    )
            token = next(self._tokens)
            self._items.setdefault(_key(obj), {})[token] = (obj, time.monotonic() + self.ttl)
            return token

    def _expire(self, now: float) -> None:
        """Drop the records past their expiry (the lock held)."""
        for key, versions in list(self._items.items()):
            for token in [t for t, (_, expiry) in versions.items() if expiry < now]:
                del versions[token]
            if not versions:
                del self._items[key]

    def drop(self, token: int) -> None:
        """Forget the record `token` (its review refused it); the other versions stay."""
        with self._lock:
            for key, versions in list(self._items.items()):
                if versions.pop(token, None) is not None:
                    if not versions:
                        del self._items[key]
                    return

    def settle(self, kind: str, namespace: str, name: str) -> None:
        """The watch delivered (or deleted) object kind ("role" or "binding") namespace/name: the
        informers now hold what the apiserver stored, so every recorded version goes."""
        with self._lock:
            self._items.pop((kind, namespace, name), None)

    def _live(self) -> list[tuple[Key, Mapping[str, Any]]]:
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            return [(key, obj) for key, versions in self._items.items() for obj, _ in versions.values()]

    def roles(self, name: str, namespace: str = "") -> list[Mapping[str, Any]]:
        """Every pending version of ClusterRole `name` (or Role namespace/name)."""
        return [o for k, o in self._live() if k == ("role", namespace, name)]

    def bindings_of(self, role: str, namespace: str = "") -> list[Mapping[str, Any]]:
        """Pending bindings (every version) whose roleRef names ClusterRole `role` (namespace "")
        or Role namespace/role."""
        out = []
        for (kind, ns, _), obj in self._live():
            ref = as_map(obj.get("roleRef"))
            ref_ns = ns if as_str(ref.get("kind")) == "Role" else ""
            if kind == "binding" and as_str(ref.get("name")) == role and ref_ns == namespace:
                out.append(obj)
        return out
