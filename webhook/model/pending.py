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

Cost: the same object sent again (the apiserver's retries, a bench, a flood of one forged review)
is one version with a count, not a record per review; a review looks up the versions of the one
role or roleRef it needs by key, never scanning the others; expired records leave in the order
they came (one TTL for all). So an RBAC review costs the same with 10 pending records or 10,000.
"""

from __future__ import annotations

import collections
import itertools
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from webhook.model.readers import as_map, as_str, name_of, namespace_of

Key = tuple[str, str, str]  # ("role" | "binding", namespace, name)
RoleRef = tuple[str, str]  # (namespace of a Role, "" for a ClusterRole; role name)

#: seconds an allowed object waits for its watch event at most
TTL_SECONDS = 30.0
#: distinct versions kept at most. Anyone who reaches the webhook port (without
#: server.clientCAFile) can send reviews: a flood of different objects must not grow memory
#: without bound. Past it a review is not judged (PendingFull) until records expire or settle; a
#: helm install of a few thousand RBAC objects stays far below, and the same object sent again
#: is no new version.
MAX_RECORDS = 10_000


class PendingFull(RuntimeError):
    """MAX_RECORDS versions are held: the review cannot be recorded, so it is not judged."""


def _kind(obj: Mapping[str, Any]) -> str:
    return "binding" if isinstance(obj.get("roleRef"), Mapping) else "role"


def _key(obj: Mapping[str, Any]) -> Key:
    return _kind(obj), namespace_of(obj), name_of(obj)


def _role_ref(binding: Mapping[str, Any]) -> RoleRef:
    ref = as_map(binding.get("roleRef"))
    return (namespace_of(binding) if as_str(ref.get("kind")) == "Role" else ""), as_str(ref.get("name"))


def _content(obj: Mapping[str, Any]) -> str:
    """What makes two versions of one object the same version (everything but what the apiserver
    changes on each write)."""
    meta = {k: v for k, v in as_map(obj.get("metadata")).items() if k not in ("resourceVersion", "managedFields", "generation")}
    return json.dumps({**obj, "metadata": meta}, sort_keys=True, default=str)


class _Version:
    """One pending version of an object: how many live records hold it."""

    __slots__ = ("holders", "obj")

    def __init__(self, obj: Mapping[str, Any]) -> None:
        self.obj, self.holders = obj, 0


class Pending:
    """Objects allowed (or being judged) by this replica and not yet seen on the watch: every
    distinct version recorded, each held by the records (tokens) of the reviews that sent it."""

    def __init__(self, ttl: float = TTL_SECONDS, max_records: int = MAX_RECORDS) -> None:
        self.ttl = ttl
        self.max_records = max_records
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._items: dict[Key, dict[str, _Version]] = {}  # key -> content -> version
        self._records: dict[int, tuple[Key, str, _Version]] = {}  # live token -> its version
        self._expiries: collections.deque[tuple[float, int]] = collections.deque()  # (expiry, token), oldest first
        self._by_role: dict[RoleRef, set[Key]] = {}  # roleRef -> keys of the bindings pending with it
        self._versions = 0

    def __len__(self) -> int:
        with self._lock:
            return self._versions

    def add(self, obj: Mapping[str, Any]) -> int:
        """Record a ClusterRole/Role or ClusterRoleBinding/RoleBinding dict being judged, beside any
        other version of it already recorded; the token that drops this record (and no other).
        Raises PendingFull when max_records versions are held after the expired ones are dropped
        and `obj` is not one of them."""
        key, content = _key(obj), _content(obj)
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            versions = self._items.setdefault(key, {})
            version = versions.get(content)
            if version is None:
                if self._versions >= self.max_records:
                    if not versions:
                        del self._items[key]
                    raise PendingFull(
                        f"{self.max_records} RBAC objects allowed in the last {self.ttl:g} s await their watch events"
                    )
                version = versions[content] = _Version(obj)
                self._versions += 1
                if key[0] == "binding":
                    self._by_role.setdefault(_role_ref(obj), set()).add(key)
            version.holders += 1
            token = next(self._tokens)
            self._records[token] = (key, content, version)
            self._expiries.append((now + self.ttl, token))
            return token

    def drop(self, token: int) -> None:
        """Forget the record `token` (its review refused it); the other records stay."""
        with self._lock:
            self._release(token)

    def settle(self, kind: str, namespace: str, name: str) -> None:
        """The watch delivered (or deleted) object kind ("role" or "binding") namespace/name: the
        informers now hold what the apiserver stored, so every recorded version goes."""
        with self._lock:
            versions = self._items.pop((kind, namespace, name), None)
            if versions:
                self._versions -= len(versions)
                for version in versions.values():
                    self._unindex((kind, namespace, name), version.obj)
            # the records of those versions are released lazily (their key is gone)

    def roles(self, name: str, namespace: str = "") -> list[Mapping[str, Any]]:
        """Every pending version of ClusterRole `name` (or Role namespace/name)."""
        with self._lock:
            self._expire(time.monotonic())
            return [v.obj for v in self._items.get(("role", namespace, name), {}).values()]

    def bindings_of(self, role: str, namespace: str = "") -> list[Mapping[str, Any]]:
        """Pending bindings (every version) whose roleRef names ClusterRole `role` (namespace "")
        or Role namespace/role."""
        with self._lock:
            self._expire(time.monotonic())
            return [
                v.obj
                for key in sorted(self._by_role.get((namespace, role), ()))
                for v in self._items.get(key, {}).values()
                if _role_ref(v.obj) == (namespace, role)
            ]

    # -- with the lock held

    def _expire(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] < now:
            self._release(self._expiries.popleft()[1])

    def _release(self, token: int) -> None:
        record = self._records.pop(token, None)
        if record is None:
            return
        key, content, version = record
        versions = self._items.get(key)
        if versions is None or versions.get(content) is not version:
            return  # settled meanwhile (a version recorded since is another's)
        version.holders -= 1
        if version.holders <= 0:
            del versions[content]
            self._versions -= 1
            self._unindex(key, version.obj)
            if not versions:
                del self._items[key]

    def _unindex(self, key: Key, obj: Mapping[str, Any]) -> None:
        if key[0] != "binding":
            return
        ref = _role_ref(obj)
        if any(_role_ref(v.obj) == ref for v in self._items.get(key, {}).values() if v.obj is not obj):
            return  # another version of this binding still names that role
        keys = self._by_role.get(ref)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_role[ref]
