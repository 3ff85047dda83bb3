"""RBAC guard: only cluster admins and DRA drivers may write DeviceClasses and ResourceSlices.

Source: "Good practices for Dynamic Resource Allocation as a Cluster Admin", section "Separate
permissions to DRA related APIs": DeviceClass and ResourceSlice (resource.k8s.io, cluster-scoped)
belong to cluster admins and DRA drivers; workload operators need only ResourceClaim and
ResourceClaimTemplate. Rule semantics follow the Kubernetes RBAC authorizer
(k8s.io/kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go) and the ClusterRole aggregation
controller (pkg/controller/clusterroleaggregation).

A *protected grant* is a PolicyRule whose apiGroups match the DRA group (or "*"), whose resources
match a protected resource (or "*", or "<resource>/<subresource>"), with a write verb (or "*").
resourceNames narrows a grant but is still a grant; nonResourceURLs rules grant nothing here.
Because DeviceClass and ResourceSlice are cluster-scoped, only a ClusterRoleBinding can grant them.

Everything here is pure: plain dicts in, Decisions and Findings out. RbacIndex is the in-memory
view of ClusterRoles and ClusterRoleBindings; webhook.cluster keeps one up to date from watches,
and `dra-guard audit` fills one from manifest files.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from webhook.config import RbacConfig, SubjectSet
from webhook.policies import as_map as _map, as_list as _list, as_str as _str, ALLOW, Decision, Finding, short

POLICY = "rbac"
BREAK_GLASS_ANNOTATION = "dra-guard.io/allow-dra-write"
RBAC_GROUP = "rbac.authorization.k8s.io"


# --------------------------------------------------------------------------- small dict helpers

def _strings(value: Any) -> list[str]:
    return [v for v in _list(value) if isinstance(v, str)]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(obj.get("metadata"))


def _name(obj: Mapping[str, Any]) -> str:
    return _str(_meta(obj).get("name"))


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return {k: v for k, v in _map(_meta(obj).get("labels")).items() if isinstance(v, str)}


def _break_glass(obj: Mapping[str, Any]) -> str | None:
    value = _map(_meta(obj).get("annotations")).get(BREAK_GLASS_ANNOTATION)
    return value if isinstance(value, str) else None


# --------------------------------------------------------------------------- grants

@dataclasses.dataclass(frozen=True, order=True)
class Grant:
    """Write access to one protected resource with one verb ("*" for all verbs), via a ClusterRole."""

    resource: str
    verb: str
    role: str


def protected_grants(rules: Any, config: RbacConfig, *, role: str) -> list[Grant]:
    """The protected write grants in a list of PolicyRules (rbac.authorization.k8s.io/v1 PolicyRule dicts).

    Tolerates missing keys and wrong types (they grant nothing). `role` names the ClusterRole
    the rules belong to, for messages.
    """
    grants: set[Grant] = set()
    for rule in _list(rules):
        rule = _map(rule)
        groups = _strings(rule.get("apiGroups"))
        if "*" not in groups and config.api_group not in groups:
            continue
        verbs = _strings(rule.get("verbs"))
        write = ["*"] if "*" in verbs else sorted(set(verbs) & config.write_verbs)
        if not write:
            continue
        resources: set[str] = set()
        for res in _strings(rule.get("resources")):
            if res == "*":
                resources |= config.protected_resources
            else:
                base = res.split("/", 1)[0]  # a subresource of a protected resource is protected too
                if base in config.protected_resources:
                    resources.add(base)
        grants |= {Grant(resource=r, verb=v, role=role) for r in resources for v in write}
    return sorted(grants)


# --------------------------------------------------------------------------- label selectors

def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a metav1.LabelSelector dict matches `labels` (an empty selector matches everything).

    Supports matchLabels and matchExpressions with In, NotIn, Exists, DoesNotExist. An unknown
    operator matches nothing (the apiserver would have rejected it).
    """
    selector = _map(selector)
    for key, value in _map(selector.get("matchLabels")).items():
        if labels.get(key) != value:
            return False
    for expr in _list(selector.get("matchExpressions")):
        expr = _map(expr)
        key, op, values = _str(expr.get("key")), _str(expr.get("operator")), _strings(expr.get("values"))
        present = key in labels
        if op == "In":
            ok = present and labels[key] in values
        elif op == "NotIn":
            ok = not present or labels[key] not in values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        else:
            ok = False
        if not ok:
            return False
    return True


def _aggregates(aggregator: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    rule = aggregator.get("aggregationRule")
    if not isinstance(rule, Mapping):
        return False
    return any(selector_matches(sel, labels) for sel in _list(rule.get("clusterRoleSelectors")))


# --------------------------------------------------------------------------- the index

def _slim_role(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = _meta(obj)
    return {
        "metadata": {"name": _name(obj), "labels": dict(_labels(obj)), "annotations": dict(_map(meta.get("annotations")))},
        "rules": _list(obj.get("rules")),
        **({"aggregationRule": obj["aggregationRule"]} if isinstance(obj.get("aggregationRule"), Mapping) else {}),
    }


def _slim_binding(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = _meta(obj)
    return {
        "metadata": {"name": _name(obj), "annotations": dict(_map(meta.get("annotations")))},
        "roleRef": dict(_map(obj.get("roleRef"))),
        "subjects": _list(obj.get("subjects")),
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

    def _changed(self) -> None:
        """Drop memoised answers after any RBAC change (caller holds the lock)."""
        self._grants_memo.clear()
        self._sa_memo.clear()

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
        self._by_role.setdefault(_str(slim["roleRef"].get("name")), set()).add(name)

    def delete_binding(self, name: str) -> None:
        """Forget a ClusterRoleBinding by name (no error when unknown)."""
        with self._lock:
            old = self._bindings.pop(name, None)
            if old is not None:
                self._changed()
                role = _str(old["roleRef"].get("name"))
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
                    if agg not in seen and _aggregates(self._roles[agg], lbls):
                        seen.add(agg)
                        found.append(agg)
                        frontier.append((agg, _labels(self._roles[agg])))
            return found

    def members_of(self, aggregator: Mapping[str, Any]) -> list[str]:
        """Names of ClusterRoles whose labels match `aggregator`'s aggregationRule (direct members)."""
        name = _name(aggregator)
        with self._lock:
            return sorted(n for n, r in self._roles.items() if n != name and _aggregates(aggregator, _labels(r)))

    def effective_grants(self, role: Mapping[str, Any], config: RbacConfig) -> tuple[Grant, ...]:
        """Protected grants of a ClusterRole dict: its own rules plus, for an aggregating role, its
        members' rules (transitively), as the aggregation controller would merge them."""
        name = _name(role)
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
                role = self._roles.get(_str(_map(binding.get("roleRef")).get("name")))
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


# --------------------------------------------------------------------------- violations

@dataclasses.dataclass(frozen=True)
class Subject:
    """An RBAC subject (rbac.authorization.k8s.io/v1 Subject)."""

    kind: str
    name: str
    namespace: str = ""

    def __str__(self) -> str:
        if self.kind == "ServiceAccount":
            return f"ServiceAccount {self.namespace}/{self.name}"
        return f"{self.kind} {self.name}"


def subjects_of(binding: Mapping[str, Any]) -> list[Subject]:
    """The subjects of a binding dict; malformed entries are skipped."""
    out = []
    for s in _list(binding.get("subjects")):
        s = _map(s)
        kind, name = _str(s.get("kind")), _str(s.get("name"))
        if kind and name:
            out.append(Subject(kind=kind, name=name, namespace=_str(s.get("namespace"))))
    return out


def allowed_resources(subject: Subject, config: RbacConfig) -> frozenset[str]:
    """The protected resources `subject` may write: all for admins, driver resources for drivers."""
    if config.admin_subjects.contains(kind=subject.kind, name=subject.name, namespace=subject.namespace):
        return config.protected_resources
    if config.driver_subjects.contains(kind=subject.kind, name=subject.name, namespace=subject.namespace):
        return config.driver_resources
    return frozenset()


@dataclasses.dataclass(frozen=True)
class Violation:
    """A subject of a ClusterRoleBinding that gets grants it must not have."""

    binding: str
    subject: Subject
    grants: tuple[Grant, ...]
    via: str  # the roleRef's ClusterRole name

    def keys(self) -> set[tuple[str, Subject, str, str]]:
        """(binding, subject, resource, verb) for each grant: what makes a violation 'new' on UPDATE."""
        return {(self.binding, self.subject, g.resource, g.verb) for g in self.grants}


def binding_violations(binding: Mapping[str, Any], grants: Iterable[Grant], config: RbacConfig, *, via: str) -> list[Violation]:
    """Violations of one ClusterRoleBinding dict given the protected grants of its roleRef."""
    grants = tuple(grants)
    out = []
    if not grants:
        return out
    for subject in subjects_of(binding):
        may = allowed_resources(subject, config)
        bad = tuple(g for g in grants if g.resource not in may)
        if bad:
            out.append(Violation(binding=_name(binding), subject=subject, grants=bad, via=via))
    return out


def _describe(v: Violation, config: RbacConfig) -> tuple[str, str]:
    """(message, summary) for a violation."""
    resources = sorted({g.resource for g in v.grants})
    verbs = sorted({g.verb for g in v.grants})
    verb_text = "every verb: *" if "*" in verbs else ", ".join(verbs)
    roles = sorted({g.role for g in v.grants} - {v.via})
    via = f"ClusterRole {v.via}" + (f" (aggregating {', '.join(roles)})" if roles else "")
    admin_only = [r for r in resources if r in config.admin_only_resources]
    if admin_only:
        who = f"only cluster admins may write {', '.join(admin_only)}"
        fix = "add the subject to rbac.adminSubjects in dra-guard's config"
    else:
        who = f"only cluster admins and DRA drivers may write {', '.join(resources)}"
        fix = "add the subject to rbac.adminSubjects or rbac.driverSubjects in dra-guard's config"
    message = (f"ClusterRoleBinding {v.binding} grants write ({verb_text}) on {', '.join(resources)} "
               f"({config.api_group}) to {v.subject} via {via}; {who}. "
               f"Bind a narrower role (ResourceClaims and ResourceClaimTemplates are enough for workloads), "
               f"or {fix}.")
    summary = short(f"dra-guard: {v.subject} would get write on {', '.join(resources)} via ClusterRoleBinding {v.binding}")
    return message, summary


def _finding(v: Violation, config: RbacConfig, *, kind: str, name: str) -> Finding:
    message, summary = _describe(v, config)
    if kind == "ClusterRole":
        message = f"ClusterRole {name}: " + message
    return Finding(
        policy=POLICY, kind=kind, name=name, message=message, summary=summary, check="rbac-write",
        details={"binding": v.binding, "subject": str(v.subject), "roleRef": v.via,
                 "resources": sorted({g.resource for g in v.grants}), "verbs": sorted({g.verb for g in v.grants}),
                 "roles": sorted({g.role for g in v.grants})},
    )


# --------------------------------------------------------------------------- admission review

@dataclasses.dataclass(frozen=True)
class _Requester:
    username: str
    groups: tuple[str, ...]

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> _Requester:
        info = _map(request.get("userInfo"))
        return cls(username=_str(info.get("username")), groups=tuple(_strings(info.get("groups"))))

    def is_admin(self, admins: SubjectSet) -> bool:
        return admins.contains_requester(username=self.username, groups=self.groups)


def review(request: Mapping[str, Any], *, index: RbacIndex, config: RbacConfig,
           fetch_role: Callable[[str], Mapping[str, Any] | None] | None = None,
           refresh_bindings: Callable[[], str | None] | None = None,
           synced: tuple[bool, str] = (True, "")) -> Decision:
    """Judge one AdmissionReview request (the `request` dict of admission.k8s.io/v1 or v1beta1).

    Handles ClusterRoleBinding, RoleBinding and ClusterRole CREATE/UPDATE; DELETE and CONNECT,
    and any other kind, are allowed. Uses `index` for roleRef and aggregation lookups (no I/O).
    fetch_role(name): asked only when a binding's roleRef is not in the index (a role created a
    moment ago may not have reached the watch yet); returns the ClusterRole dict or None.
    refresh_bindings(): asked before judging a ClusterRole that grants protected write, to add
    ClusterRoleBindings the watch has not delivered yet to `index` (the reverse race); returns
    None, or a note when it could read only part of them in time (the decision then carries it
    as a warning and is made from `index` as it stands).
    synced: (False, why) when the ClusterRole/ClusterRoleBinding caches lost their watch: a
    ClusterRole or ClusterRoleBinding write is then refused (enforce) with the reason rather
    than judged on stale data; warn and audit modes let it through with the reason.
    Returns the decision enforce mode would give.
    """
    operation = _str(request.get("operation"))
    if operation not in ("CREATE", "UPDATE"):
        return ALLOW
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        return ALLOW
    old = request.get("oldObject") if operation == "UPDATE" else None
    old = old if isinstance(old, Mapping) else None
    kind = _str(_map(request.get("kind")).get("kind")) or _str(obj.get("kind"))
    requester = _Requester.from_request(request)
    ok, why = synced
    if not ok and kind in ("ClusterRoleBinding", "ClusterRole"):
        return Decision(findings=(Finding(
            policy=POLICY, kind=kind, name=_name(obj), check="cache-not-synced", code=503, reason="ServiceUnavailable",
            message=f"dra-guard cannot judge this {kind} now: its RBAC caches are not in sync with the apiserver "
                    f"({why}); it does not decide on stale data. Retry in a few seconds.",
            summary=short(f"dra-guard: RBAC caches not synced ({why}); not judged")),))
    if kind == "ClusterRoleBinding":
        return _review_cluster_role_binding(obj, old, index=index, config=config, requester=requester, fetch_role=fetch_role)
    if kind == "ClusterRole":
        return _review_cluster_role(obj, old, index=index, config=config, requester=requester,
                                    refresh_bindings=refresh_bindings)
    if kind == "RoleBinding":
        return _review_role_binding(obj, index=index, config=config)
    return ALLOW


def _split_new(new: list[Violation], old: list[Violation]) -> tuple[list[Violation], list[Violation]]:
    """(violations adding a grant that `old` did not have, violations that were already there)."""
    old_keys: set[Any] = set().union(*(v.keys() for v in old)) if old else set()
    added, kept = [], []
    for v in new:
        fresh = tuple(g for g in v.grants if (v.binding, v.subject, g.resource, g.verb) not in old_keys)
        if fresh:
            added.append(dataclasses.replace(v, grants=fresh))
        else:
            kept.append(v)
    return added, kept


def _decide(kind: str, name: str, obj: Mapping[str, Any], added: list[Violation], kept: list[Violation],
            *, config: RbacConfig, requester: _Requester, warnings: list[str]) -> Decision:
    for v in kept:
        warnings.append(short(f"dra-guard: {kind} {name} already grants {v.subject} write on "
                              f"{', '.join(sorted({g.resource for g in v.grants}))}; allowed, please fix"))
    if not added:
        return Decision(warnings=tuple(warnings))
    reason = _break_glass(obj)
    if reason is not None:
        if requester.is_admin(config.admin_subjects):
            warnings.append(short(f"dra-guard: break-glass {BREAK_GLASS_ANNOTATION} honoured for {kind} {name}"))
            return Decision(warnings=tuple(warnings),
                            audit_annotations={"break-glass": short(f"{requester.username}: {reason}", 250)})
        findings = tuple(dataclasses.replace(
            _finding(v, config, kind=kind, name=name),
            message=_finding(v, config, kind=kind, name=name).message
            + f" The annotation {BREAK_GLASS_ANNOTATION} is honoured only when a cluster admin makes the request.")
            for v in added)
        return Decision(findings=findings, warnings=tuple(warnings))
    return Decision(findings=tuple(_finding(v, config, kind=kind, name=name) for v in added), warnings=tuple(warnings))


def _review_cluster_role_binding(obj: Mapping[str, Any], old: Mapping[str, Any] | None, *, index: RbacIndex,
                                 config: RbacConfig, requester: _Requester,
                                 fetch_role: Callable[[str], Mapping[str, Any] | None] | None = None) -> Decision:
    name = _name(obj)
    role_ref = _map(obj.get("roleRef"))
    role_name = _str(role_ref.get("name"))
    if _str(role_ref.get("kind")) not in ("", "ClusterRole"):
        return ALLOW
    role = index.role(role_name)
    if role is None and fetch_role is not None and role_name:
        role = fetch_role(role_name)
    if role is None:
        return Decision(warnings=(short(f"dra-guard: ClusterRole {role_name} does not exist yet; "
                                        f"it will be checked against {name} when it is created"),))
    grants = index.effective_grants(role, config)
    new = binding_violations(obj, grants, config, via=role_name)
    old_v = binding_violations(old, grants, config, via=role_name) if old is not None else []
    added, kept = _split_new(new, old_v)
    return _decide("ClusterRoleBinding", name, obj, added, kept, config=config, requester=requester, warnings=[])


def _review_role_binding(obj: Mapping[str, Any], *, index: RbacIndex, config: RbacConfig) -> Decision:
    role_ref = _map(obj.get("roleRef"))
    if _str(role_ref.get("kind")) != "ClusterRole":
        return ALLOW
    role = index.role(_str(role_ref.get("name")))
    if role is None or not index.effective_grants(role, config):
        return ALLOW
    ns = _str(_meta(obj).get("namespace"))
    return Decision(warnings=(short(
        f"dra-guard: RoleBinding {ns}/{_name(obj)} binds ClusterRole {role_ref.get('name')}, whose DRA write "
        f"grants nothing in a namespace; allowed"),))


def _role_violations(role: Mapping[str, Any], *, index: RbacIndex, config: RbacConfig,
                     requester: _Requester) -> list[Violation]:
    """Violations created by ClusterRole `role` through every ClusterRoleBinding that reaches it:
    bindings of the role itself and of every role that aggregates it."""
    name = _name(role)
    grants = index.effective_grants(role, config)
    if not grants:
        return []
    out: list[Violation] = []
    for via in [name, *index.aggregators_of(_labels(role), exclude=name)]:
        for binding in index.bindings_of(via):
            if _break_glass(binding) is not None and requester.is_admin(config.admin_subjects):
                continue
            out.extend(binding_violations(binding, grants, config, via=via))
    return out


def _review_cluster_role(obj: Mapping[str, Any], old: Mapping[str, Any] | None, *, index: RbacIndex,
                         config: RbacConfig, requester: _Requester,
                         refresh_bindings: Callable[[], str | None] | None = None) -> Decision:
    name = _name(obj)
    warnings: list[str] = []
    if refresh_bindings is not None and index.effective_grants(obj, config):
        # A role that grants protected write: a binding created a moment ago may not have reached
        # the watch yet, so the bindings are read from the API once before judging (rare: roles
        # with DRA write are few; everything else is decided from the cache).
        note = refresh_bindings()
        if note:
            warnings.append(short(f"dra-guard: {note}"))
    new = _role_violations(obj, index=index, config=config, requester=requester)
    old_v = _role_violations(old, index=index, config=config, requester=requester) if old is not None else []
    added, kept = _split_new(new, old_v)
    if (added and old is not None and isinstance(obj.get("aggregationRule"), Mapping)
            and obj.get("aggregationRule") == old.get("aggregationRule") and _labels(obj) == _labels(old)
            and requester.username in config.aggregation_controller_users):
        # The aggregation controller copying members' rules into an aggregating role: the member
        # role is where enforcement bites; refusing here would only wedge the controller. Anyone
        # else adding rules or labels to an aggregating role is judged like any other change.
        warnings.extend(short(f"dra-guard: aggregated rules of ClusterRole {name} give {v.subject} write on "
                              f"{', '.join(sorted({g.resource for g in v.grants}))}") for v in added)
        return Decision(warnings=tuple(warnings))
    return _decide("ClusterRole", name, obj, added, kept, config=config, requester=requester, warnings=warnings)


# --------------------------------------------------------------------------- audit

def audit(index: RbacIndex, config: RbacConfig) -> Iterator[Finding]:
    """Findings for every ClusterRoleBinding in `index` that gives a non-admin protected write.

    Grants reached through aggregation are attributed to the binding of the aggregating role.
    Bindings carrying the break-glass annotation are skipped (an admin accepted them).
    """
    for binding in index.bindings():
        if _break_glass(binding) is not None:
            continue
        role_name = _str(_map(binding.get("roleRef")).get("name"))
        role = index.role(role_name)
        if role is None:
            continue
        for v in binding_violations(binding, index.effective_grants(role, config), config, via=role_name):
            yield _finding(v, config, kind="ClusterRoleBinding", name=_name(binding))
