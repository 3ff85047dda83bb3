"""RbacIndex: the in-memory view of ClusterRoles, ClusterRoleBindings, Roles and RoleBindings
the RBAC guard reads.

webhook.kube keeps one up to date from watches; `dra-guard audit` and `drain-plan` fill one from
manifest files or lists (webhook.model.facts). Thread-safe; lookups never do I/O.
Objects are keyed (namespace, name): namespace "" for the cluster-scoped kinds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.config import RbacConfig
from webhook.model.bootstrap import default_rules, with_defaults
from webhook.model.pending import Pending
from webhook.model.powers import power_grants, privileged
from webhook.model.rbac import Grant, LabelMatcher, aggregation_matcher, protected_grants, service_account_reach
from webhook.model.readers import as_list, as_map, as_str, labels_of, name_of, namespace_of
from webhook.model.release import release_gradually
from webhook.model.slim import slim_binding, slim_role

#: role dicts outside the index whose grants are kept (the ones being reviewed, a few at a time)
REVIEWED_MEMO = 64

Key = tuple[str, str]  # (namespace, name); "" for ClusterRoles and ClusterRoleBindings


def _key(slim: Mapping[str, Any]) -> Key:
    return namespace_of(slim), name_of(slim)


def ref_key(binding: Mapping[str, Any]) -> Key:
    """The (namespace, name) of a binding's roleRef: ("", name) for a ClusterRole, (the binding's
    namespace, name) for a Role."""
    ref = as_map(binding.get("roleRef"))
    ns = namespace_of(binding) if as_str(ref.get("kind")) == "Role" else ""
    return ns, as_str(ref.get("name"))


class RbacIndex:
    """Thread-safe in-memory view of the RBAC objects, indexed for the guard.

    Holds slimmed copies (name, namespace, labels, annotations, rules, aggregationRule; roleRef,
    subjects), so memory is proportional to the RBAC objects, not to their managedFields. Lookups
    are O(1) by key and by roleRef; aggregation lookups scan only the aggregating roles; grants are
    memoised until the next RBAC change.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._roles: dict[Key, dict[str, Any]] = {}
        self._aggregators: set[str] = set()
        self._bindings: dict[Key, dict[str, Any]] = {}
        self._by_role: dict[Key, set[Key]] = {}  # roleRef key -> binding keys
        # ("sa", "namespace/name") or ("group", name) -> keys of the ClusterRoleBindings whose subjects
        # can be that ServiceAccount (service_account_may_write reads these, not all bindings)
        self._sa_reach: dict[tuple[str, str], set[Key]] = {}
        self._grants_memo: dict[tuple[Key, int], tuple[Grant, ...]] = {}  # (role key, id(config)) -> grants
        # a role dict not in the index (the one a review judges): id(role) -> (role, id(config),
        # grants); the role is held, so its id is not reused while it is here (REVIEWED_MEMO entries)
        self._reviewed_memo: dict[int, tuple[Mapping[str, Any], int, tuple[Grant, ...]]] = {}
        self._visiting: set[Key] = set()
        self._sa_memo: dict[tuple[str, str, str], bool] = {}  # (namespace, name, resource) -> may write
        self.pending = Pending()  # objects this replica allowed that the watch has not delivered yet
        self._matchers: dict[str, LabelMatcher] = {}  # aggregating ClusterRole name -> compiled aggregationRule

    def sizes(self) -> dict[str, int]:
        """Objects held, by cache name (clusterroles, roles, clusterrolebindings, rolebindings).
        Reads a snapshot of the keys without the lock: a scrape never delays a review."""
        roles, bindings = list(self._roles), list(self._bindings)
        namespaced_roles = sum(1 for namespace, _ in roles if namespace)
        namespaced_bindings = sum(1 for namespace, _ in bindings if namespace)
        return {
            "clusterroles": len(roles) - namespaced_roles,
            "roles": namespaced_roles,
            "clusterrolebindings": len(bindings) - namespaced_bindings,
            "rolebindings": namespaced_bindings,
        }

    def _changed(self) -> None:
        """Drop memoised answers after any RBAC change (caller holds the lock)."""
        self._grants_memo.clear()
        self._reviewed_memo.clear()
        self._sa_memo.clear()
        self._matchers.clear()

    def _matcher(self, name: str) -> LabelMatcher:
        """The compiled aggregationRule (bootstrap defaults included) of indexed aggregating
        ClusterRole `name`: selector values held as sets, compiled once per RBAC change (the
        lock is held)."""
        found = self._matchers.get(name)
        if found is None:
            found = self._matchers[name] = aggregation_matcher(self._aggregation(name)) or (lambda labels: False)
        return found

    # -- updates (from watches or manifest files)
    def upsert_role(self, obj: Mapping[str, Any]) -> None:
        """Add or replace a ClusterRole or Role (rbac.authorization.k8s.io/v1 dict)."""
        slim = slim_role(obj)
        key = _key(slim)
        self.pending.settle("role", *key)
        with self._lock:
            self._roles[key] = slim
            if not key[0]:
                (self._aggregators.add if "aggregationRule" in with_defaults(slim) else self._aggregators.discard)(key[1])
            self._changed()

    def delete_role(self, name: str, namespace: str = "") -> None:
        """Forget a ClusterRole (or the Role namespace/name) (no error when unknown)."""
        with self._lock:
            self._roles.pop((namespace, name), None)
            if not namespace:
                self._aggregators.discard(name)
            self._changed()

    def upsert_binding(self, obj: Mapping[str, Any]) -> None:
        """Add or replace a ClusterRoleBinding or RoleBinding (rbac.authorization.k8s.io/v1 dict)."""
        slim = slim_binding(obj)
        self.pending.settle("binding", *_key(slim))
        with self._lock:
            self.delete_binding(*reversed(_key(slim)))
            self._changed()
            self._put_binding(slim)

    def _put_binding(self, slim: dict[str, Any]) -> None:
        """Index a slimmed binding by key, by its roleRef and (ClusterRoleBindings) by the
        ServiceAccounts its subjects can be; the lock is held."""
        key = _key(slim)
        self._bindings[key] = slim
        self._by_role.setdefault(ref_key(slim), set()).add(key)
        if not key[0]:
            for reach in service_account_reach(slim):
                self._sa_reach.setdefault(reach, set()).add(key)

    def delete_binding(self, name: str, namespace: str = "") -> None:
        """Forget a ClusterRoleBinding (or the RoleBinding namespace/name) (no error when unknown)."""
        with self._lock:
            if self._unbind((namespace, name)):
                self._changed()

    def _unbind(self, key: Key) -> bool:
        """Remove binding `key` from every table; whether it was there (the lock is held)."""
        old = self._bindings.pop(key, None)
        if old is None:
            return False
        ref = ref_key(old)
        keys = self._by_role.get(ref)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_role[ref]
        for reach in service_account_reach(old) if not key[0] else ():
            reached = self._sa_reach.get(reach)
            if reached is not None:
                reached.discard(key)
                if not reached:
                    del self._sa_reach[reach]
        return True

    def replace_roles(self, objects: Iterable[Mapping[str, Any]], *, namespaced: bool = False) -> None:
        """Replace every ClusterRole (namespaced: every Role) with `objects` (after a relist).
        `objects` may be a stream of list pages: it is consumed, slimmed and put in a fresh table
        before the lock is taken; under the lock only the other kind's entries are copied in and
        the tables swapped; the old table is freed after, outside the lock (so no review waits
        on a relist of 50,000 ClusterRoles)."""
        fresh = {_key(s): s for s in map(slim_role, objects)}
        aggregators = None if namespaced else {k[1] for k, s in fresh.items() if "aggregationRule" in with_defaults(s)}
        with self._lock:
            old = self._roles
            # the other kind is watched by another informer: its entries as they are now
            fresh.update((k, s) for k, s in old.items() if bool(k[0]) != namespaced)
            self._roles = fresh
            if aggregators is not None:
                self._aggregators = aggregators
            self._changed()
        release_gradually(old)

    def replace_bindings(self, objects: Iterable[Mapping[str, Any]], *, namespaced: bool = False) -> None:
        """Replace every ClusterRoleBinding (namespaced: every RoleBinding) with `objects` (after a
        relist). `objects` may be a stream of list pages: consumed and slimmed before the lock is
        taken. When the other kind is the smaller one (50,000 ClusterRoleBindings relisted beside
        5,000 RoleBindings), the new bindings are indexed into fresh tables outside the lock and the
        lock is held to index the other kind's into them and swap; otherwise the old bindings of
        this kind are replaced in place under the lock. Either way the lock is held for the smaller
        side's work only."""
        slims = [slim_binding(o) for o in objects]
        with self._lock:
            others = sum(1 for k in self._bindings if bool(k[0]) != namespaced)
        if others > len(slims):  # in place, under the lock
            with self._lock:
                for key in [k for k in self._bindings if bool(k[0]) == namespaced]:
                    self._unbind(key)
                for slim in slims:
                    self._put_binding(slim)
                self._changed()
            return
        fresh = RbacIndex()
        for slim in slims:
            fresh._put_binding(slim)
        del slims
        with self._lock:
            for key, slim in self._bindings.items():
                if bool(key[0]) != namespaced:
                    fresh._put_binding(slim)
            old = self._bindings, self._by_role, self._sa_reach
            self._bindings, self._by_role, self._sa_reach = fresh._bindings, fresh._by_role, fresh._sa_reach
            self._changed()
        release_gradually(*old)

    # -- queries
    def role(self, name: str, namespace: str = "") -> Mapping[str, Any] | None:
        """The slimmed ClusterRole `name` (or Role namespace/name), or None."""
        with self._lock:
            return self._roles.get((namespace, name))

    def bindings(self, *, namespaced: bool = False) -> list[Mapping[str, Any]]:
        """All ClusterRoleBindings (namespaced: all RoleBindings) (slimmed), sorted by namespace and name."""
        with self._lock:
            return [self._bindings[k] for k in sorted(self._bindings) if bool(k[0]) == namespaced]

    def bindings_of(self, role: str) -> list[Mapping[str, Any]]:
        """The ClusterRoleBindings whose roleRef names ClusterRole `role`."""
        with self._lock:
            return [self._bindings[k] for k in sorted(self._by_role.get(("", role), ())) if not k[0]]

    def role_bindings_of(self, role: str, namespace: str = "") -> list[Mapping[str, Any]]:
        """The RoleBindings whose roleRef names ClusterRole `role` (namespace ""), or Role namespace/role."""
        with self._lock:
            return [self._bindings[k] for k in sorted(self._by_role.get((namespace, role), ())) if k[0]]

    def counts(self) -> tuple[int, int]:
        """(number of ClusterRoles and Roles, number of ClusterRoleBindings and RoleBindings)."""
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
                        frontier.append((agg, labels_of(self._roles["", agg])))
            return found

    def _aggregation(self, name: str) -> Mapping[str, Any]:
        """ClusterRole `name` with a bootstrap role's default aggregationRule (webhook.model.bootstrap)."""
        return with_defaults(self._roles["", name])

    def members_of(self, aggregator: Mapping[str, Any]) -> list[str]:
        """Names of ClusterRoles whose labels match `aggregator`'s aggregationRule (direct members)."""
        name = name_of(aggregator)
        with self._lock:
            indexed = self._roles.get(("", name)) is aggregator
            matcher = self._matcher(name) if indexed else aggregation_matcher(with_defaults(aggregator))
            if matcher is None:
                return []
            return sorted(k[1] for k, r in self._roles.items() if not k[0] and k[1] != name and matcher(labels_of(r)))

    def _own_grants(self, role: Mapping[str, Any], config: RbacConfig) -> set[Grant]:
        """DRA write and escalation powers of one role's own rules (bootstrap defaults included)."""
        name, namespaced = name_of(role), bool(namespace_of(role))
        rules = as_list(role.get("rules")) + default_rules(role)
        grants = set() if namespaced else set(protected_grants(rules, config, role=name))
        grants |= set(
            power_grants(
                rules,
                role=name,
                write_verbs=config.write_verbs,
                checks=config.escalation_checks,
                guard_names=config.guard_names,
                privileged_name=lambda kind, n: privileged(kind, n, config),
                role_grants=self._role_has_grants(config),
            )
        )
        return {g for g in grants if g.namespaced} if namespaced else grants

    def _role_has_grants(self, config: RbacConfig) -> Any:
        def has(name: str) -> bool:
            role = self._roles.get(("", name))
            if role is None or ("", name) in self._visiting:
                return False
            return bool(self.effective_grants(role, config))

        return has

    def effective_grants(self, role: Mapping[str, Any], config: RbacConfig) -> tuple[Grant, ...]:
        """DRA write grants and escalation powers of a ClusterRole or Role dict: its own rules plus,
        for an aggregating role, its members' rules (transitively), as the aggregation controller
        would merge them; a bootstrap role's default rules count too (webhook.model.bootstrap)."""
        key = _key(role)
        with self._lock:
            indexed = self._roles.get(key) is role
            if indexed and (key, id(config)) in self._grants_memo:
                return self._grants_memo[key, id(config)]
            reviewed = None if indexed else self._reviewed_memo.get(id(role))
            if reviewed is not None and reviewed[0] is role and reviewed[1] == id(config):
                return reviewed[2]
            self._visiting.add(key)
            try:
                grants = self._own_grants(role, config)
                seen = {key[1]}
                stack = [role] if not key[0] else []
                while stack:
                    current = stack.pop()
                    if not isinstance(with_defaults(current).get("aggregationRule"), Mapping):
                        continue
                    for member_name in self.members_of(current):
                        if member_name not in seen:
                            seen.add(member_name)
                            member = self._roles["", member_name]
                            grants |= self._own_grants(member, config)
                            stack.append(member)
            finally:
                self._visiting.discard(key)
            result = tuple(sorted(grants))
            if indexed:
                self._grants_memo[key, id(config)] = result
            else:
                # the RBAC guard asks for a reviewed role's grants three times in one review
                if len(self._reviewed_memo) >= REVIEWED_MEMO:
                    del self._reviewed_memo[next(iter(self._reviewed_memo))]
                self._reviewed_memo[id(role)] = (role, id(config), result)
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
            reaches = [
                ("sa", f"{namespace}/{name}"),
                ("group", "system:serviceaccounts"),
                ("group", f"system:serviceaccounts:{namespace}"),
                ("group", "system:authenticated"),
            ]
            candidates = set().union(*(self._sa_reach.get(r, ()) for r in reaches))
            result = False
            for bkey in sorted(candidates):
                role = self._roles.get(ref_key(self._bindings[bkey]))
                if role is not None and any(g.resource == resource for g in self.effective_grants(role, config)):
                    result = True
                    break
            self._sa_memo[key] = result
            return result

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> RbacIndex:
        """An index of the ClusterRoles, ClusterRoleBindings, Roles and RoleBindings among `objects`
        (others ignored)."""
        index = cls()
        for obj in objects:
            index.upsert(obj)
        return index

    def upsert(self, obj: Mapping[str, Any]) -> bool:
        """upsert_role or upsert_binding by the object's `kind`; whether it was an RBAC kind
        (ClusterRole, Role, ClusterRoleBinding, RoleBinding: others are left alone)."""
        kind = obj.get("kind")
        if kind in ("ClusterRole", "Role"):
            self.upsert_role(obj)
        elif kind in ("ClusterRoleBinding", "RoleBinding"):
            self.upsert_binding(obj)
        else:
            return False
        return True
