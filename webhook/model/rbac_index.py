"""RbacIndex: the in-memory view of ClusterRoles and ClusterRoleBindings the RBAC guard reads.

webhook.kube keeps one up to date from watches; `dra-guard audit` and `drain-plan` fill one from
manifest files or lists (webhook.model.facts). Thread-safe; lookups never do I/O.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.config import RbacConfig
from webhook.model.rbac import Grant, LabelMatcher, aggregation_matcher, protected_grants, subjects_of
from webhook.model.readers import annotations_of, as_list, as_map, as_str, labels_of, name_of


def _slim_role(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name_of(obj), "labels": dict(labels_of(obj)), "annotations": dict(annotations_of(obj))},
        "rules": as_list(obj.get("rules")),
        **({"aggregationRule": obj["aggregationRule"]} if isinstance(obj.get("aggregationRule"), Mapping) else {}),
    }


def _slim_binding(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name_of(obj), "annotations": dict(annotations_of(obj))},
        "roleRef": dict(as_map(obj.get("roleRef"))),
        "subjects": as_list(obj.get("subjects")),
    }


class RbacIndex:
    """Thread-safe in-memory view of ClusterRoles and ClusterRoleBindings, indexed for the guard.

    Holds slimmed copies (name, labels, annotations, rules, aggregationRule; roleRef, subjects), so
    memory is proportional to the RBAC objects, not to their managedFields. Lookups are O(1) by
    name and by roleRef; aggregation lookups scan only the aggregating roles and are memoised
    until the next ClusterRole change.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._roles: dict[str, dict[str, Any]] = {}
        self._aggregators: set[str] = set()
        self._bindings: dict[str, dict[str, Any]] = {}
        self._by_role: dict[str, set[str]] = {}
        self._grants_memo: dict[str, tuple[Grant, ...]] = {}  # role name -> effective grants
        self._sa_memo: dict[tuple[str, str, str], bool] = {}  # (namespace, name, resource) -> may write
        self._matchers: dict[str, LabelMatcher] = {}  # aggregating role name -> its compiled aggregationRule

    def _changed(self) -> None:
        """Drop memoised answers after any RBAC change (caller holds the lock)."""
        self._grants_memo.clear()
        self._sa_memo.clear()
        self._matchers.clear()

    def _matcher(self, name: str) -> LabelMatcher:
        """The compiled aggregationRule of indexed aggregating role `name` (the lock is held)."""
        found = self._matchers.get(name)
        if found is None:
            found = self._matchers[name] = aggregation_matcher(self._roles[name]) or (lambda labels: False)
        return found

    # -- updates (from watches or manifest files)
    def upsert_role(self, obj: Mapping[str, Any]) -> None:
        """Add or replace a ClusterRole (rbac.authorization.k8s.io/v1 dict)."""
        slim = _slim_role(obj)
        name = slim["metadata"]["name"]
        with self._lock:
            self._roles[name] = slim
            if "aggregationRule" in slim:
                self._aggregators.add(name)
            else:
                self._aggregators.discard(name)
            self._changed()

    def delete_role(self, name: str) -> None:
        """Forget a ClusterRole by name (no error when unknown)."""
        with self._lock:
            self._roles.pop(name, None)
            self._aggregators.discard(name)
            self._changed()

    def upsert_binding(self, obj: Mapping[str, Any]) -> None:
        """Add or replace a ClusterRoleBinding (rbac.authorization.k8s.io/v1 dict)."""
        slim = _slim_binding(obj)
        name = slim["metadata"]["name"]
        with self._lock:
            self.delete_binding(name)
            self._changed()
            self._put_binding(slim)

    def _put_binding(self, slim: dict[str, Any]) -> None:
        """Index a slimmed binding by name and by its roleRef's name; the lock is held."""
        name = slim["metadata"]["name"]
        self._bindings[name] = slim
        self._by_role.setdefault(as_str(slim["roleRef"].get("name")), set()).add(name)

    def delete_binding(self, name: str) -> None:
        """Forget a ClusterRoleBinding by name (no error when unknown)."""
        with self._lock:
            old = self._bindings.pop(name, None)
            if old is not None:
                self._changed()
                role = as_str(old["roleRef"].get("name"))
                names = self._by_role.get(role)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._by_role[role]

    def replace_roles(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Replace every ClusterRole with `objects` (after a relist). `objects` may be a stream of
        list pages: it is consumed, and slimmed, before the lock is taken."""
        slims = [_slim_role(o) for o in objects]
        with self._lock:
            self._roles = {s["metadata"]["name"]: s for s in slims}
            self._aggregators = {n for n, s in self._roles.items() if "aggregationRule" in s}
            self._changed()

    def replace_bindings(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Replace every ClusterRoleBinding with `objects` (after a relist). `objects` may be a
        stream of list pages: it is consumed, and slimmed, before the lock is taken."""
        slims = [_slim_binding(o) for o in objects]
        with self._lock:
            self._bindings = {}
            self._by_role = {}
            for slim in slims:
                self._put_binding(slim)
            self._changed()

    # -- queries
    def role(self, name: str) -> Mapping[str, Any] | None:
        """The slimmed ClusterRole `name`, or None."""
        with self._lock:
            return self._roles.get(name)

    def bindings(self) -> list[Mapping[str, Any]]:
        """All ClusterRoleBindings (slimmed), sorted by name."""
        with self._lock:
            return [self._bindings[n] for n in sorted(self._bindings)]

    def bindings_of(self, role: str) -> list[Mapping[str, Any]]:
        """The ClusterRoleBindings whose roleRef names ClusterRole `role`."""
        with self._lock:
            return [self._bindings[n] for n in sorted(self._by_role.get(role, ()))]

    def counts(self) -> tuple[int, int]:
        """(number of ClusterRoles, number of ClusterRoleBindings)."""
        with self._lock:
            return len(self._roles), len(self._bindings)

    def aggregators_of(self, labels: Mapping[str, str], *, exclude: str = "") -> list[str]:
        """Names of ClusterRoles that aggregate a role with `labels`, transitively (nearest first)."""
        with self._lock:
            found: list[str] = []
            frontier = [(exclude, labels)]
            seen = {exclude}
            while frontier:
                _, lbls = frontier.pop(0)
                for agg in sorted(self._aggregators):
                    if agg not in seen and self._matcher(agg)(lbls):
                        seen.add(agg)
                        found.append(agg)
                        frontier.append((agg, labels_of(self._roles[agg])))
            return found

    def members_of(self, aggregator: Mapping[str, Any]) -> list[str]:
        """Names of ClusterRoles whose labels match `aggregator`'s aggregationRule (direct members)."""
        name = name_of(aggregator)
        with self._lock:
            matcher = self._matcher(name) if self._roles.get(name) is aggregator else aggregation_matcher(aggregator)
            if matcher is None:
                return []
            return sorted(n for n, r in self._roles.items() if n != name and matcher(labels_of(r)))

    def effective_grants(self, role: Mapping[str, Any], config: RbacConfig) -> tuple[Grant, ...]:
        """Protected grants of a ClusterRole dict: its own rules plus, for an aggregating role, its
        members' rules (transitively), as the aggregation controller would merge them."""
        name = name_of(role)
        with self._lock:
            indexed = self._roles.get(name) is role
            if indexed and name in self._grants_memo:
                return self._grants_memo[name]
            grants: set[Grant] = set(protected_grants(role.get("rules"), config, role=name))
            seen = {name}
            stack = [role]
            while stack:
                current = stack.pop()
                if not isinstance(current.get("aggregationRule"), Mapping):
                    continue
                for member_name in self.members_of(current):
                    if member_name in seen:
                        continue
                    seen.add(member_name)
                    member = self._roles[member_name]
                    grants |= set(protected_grants(member.get("rules"), config, role=member_name))
                    stack.append(member)
            result = tuple(sorted(grants))
            if indexed:
                self._grants_memo[name] = result
            return result

    def service_account_may_write(self, namespace: str, name: str, resource: str, config: RbacConfig) -> bool:
        """Whether ClusterRoleBindings give ServiceAccount namespace/name write on `resource`.

        Counts subjects that name the ServiceAccount (kind ServiceAccount or its User form) and the
        groups every ServiceAccount is in (system:serviceaccounts, system:serviceaccounts:<ns>,
        system:authenticated). Memoised until the next RBAC change.
        """
        key = (namespace, name, resource)
        with self._lock:
            if key in self._sa_memo:
                return self._sa_memo[key]
            groups = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}
            user = f"system:serviceaccount:{namespace}:{name}"
            result = False
            for binding in self._bindings.values():
                if not any((s.kind == "ServiceAccount" and s.namespace == namespace and s.name == name)
                           or (s.kind == "User" and s.name == user) or (s.kind == "Group" and s.name in groups)
                           for s in subjects_of(binding)):
                    continue
                role = self._roles.get(as_str(as_map(binding.get("roleRef")).get("name")))
                if role is not None and any(g.resource == resource for g in self.effective_grants(role, config)):
                    result = True
                    break
            self._sa_memo[key] = result
            return result

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> RbacIndex:
        """An index of the ClusterRoles and ClusterRoleBindings among `objects` (others ignored)."""
        index = cls()
        for obj in objects:
            kind = obj.get("kind")
            if kind == "ClusterRole":
                index.upsert_role(obj)
            elif kind == "ClusterRoleBinding":
                index.upsert_binding(obj)
        return index
