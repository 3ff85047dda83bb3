"""RBAC guard: only cluster admins and DRA drivers may write DeviceClasses and ResourceSlices.

Source: "Good practices for Dynamic Resource Allocation as a Cluster Admin", section "Separate
permissions to DRA related APIs": DeviceClass and ResourceSlice (resource.k8s.io, cluster-scoped)
belong to cluster admins and DRA drivers; workload operators need only ResourceClaim and
ResourceClaimTemplate. What counts as a protected grant, and how aggregation merges rules, is in
webhook.model.rbac. Because DeviceClass and ResourceSlice are cluster-scoped, only a
ClusterRoleBinding can grant them.

Decisions only: plain dicts and the RbacIndex (webhook.model.rbac_index) in, Decisions and
Findings out; no I/O of its own (the two API reads it may ask for come as callables from Facts).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from webhook.config import Config, RbacConfig, SubjectSet
from webhook.model.facts import Facts
from webhook.model.rbac import Grant, Subject, subjects_of
from webhook.model.rbac_index import RbacIndex
from webhook.model.readers import annotations_of, as_map, as_str, labels_of, name_of, namespace_of, strings
from webhook.policies.decision import ALLOW, Decision, Finding, short

POLICY = "rbac"
BREAK_GLASS_ANNOTATION = "dra-guard.io/allow-dra-write"


def _break_glass(obj: Mapping[str, Any]) -> str | None:
    value = annotations_of(obj).get(BREAK_GLASS_ANNOTATION)
    return value if isinstance(value, str) else None


# --------------------------------------------------------------------------- violations
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
    out: list[Violation] = []
    if not grants:
        return out
    for subject in subjects_of(binding):
        may = allowed_resources(subject, config)
        bad = tuple(g for g in grants if g.resource not in may)
        if bad:
            out.append(Violation(binding=name_of(binding), subject=subject, grants=bad, via=via))
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
        fix = "add the subject to rbac.adminSubjects in dra-guard's config (Helm value config.rbac.adminSubjects)"
    else:
        who = f"only cluster admins and DRA drivers may write {', '.join(resources)}"
        fix = ("add the subject to rbac.adminSubjects or rbac.driverSubjects in dra-guard's config (Helm values "
               "config.rbac.adminSubjects, config.rbac.driverSubjects)")
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
        info = as_map(request.get("userInfo"))
        return cls(username=as_str(info.get("username")), groups=tuple(strings(info.get("groups"))))

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
    operation = as_str(request.get("operation"))
    if operation not in ("CREATE", "UPDATE"):
        return ALLOW
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        return ALLOW
    old = request.get("oldObject") if operation == "UPDATE" else None
    old = old if isinstance(old, Mapping) else None
    kind = as_str(as_map(request.get("kind")).get("kind")) or as_str(obj.get("kind"))
    requester = _Requester.from_request(request)
    ok, why = synced
    if not ok and kind in ("ClusterRoleBinding", "ClusterRole"):
        return Decision(findings=(Finding(
            policy=POLICY, kind=kind, name=name_of(obj), check="cache-not-synced", code=503, reason="ServiceUnavailable",
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
    name = name_of(obj)
    role_ref = as_map(obj.get("roleRef"))
    role_name = as_str(role_ref.get("name"))
    if as_str(role_ref.get("kind")) not in ("", "ClusterRole"):
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
    role_ref = as_map(obj.get("roleRef"))
    if as_str(role_ref.get("kind")) != "ClusterRole":
        return ALLOW
    role = index.role(as_str(role_ref.get("name")))
    if role is None or not index.effective_grants(role, config):
        return ALLOW
    ns = namespace_of(obj)
    return Decision(warnings=(short(
        f"dra-guard: RoleBinding {ns}/{name_of(obj)} binds ClusterRole {role_ref.get('name')}, whose DRA write "
        f"grants nothing in a namespace; allowed"),))


def _role_violations(role: Mapping[str, Any], *, index: RbacIndex, config: RbacConfig,
                     requester: _Requester) -> list[Violation]:
    """Violations created by ClusterRole `role` through every ClusterRoleBinding that reaches it:
    bindings of the role itself and of every role that aggregates it."""
    name = name_of(role)
    grants = index.effective_grants(role, config)
    if not grants:
        return []
    out: list[Violation] = []
    for via in [name, *index.aggregators_of(labels_of(role), exclude=name)]:
        for binding in index.bindings_of(via):
            if _break_glass(binding) is not None and requester.is_admin(config.admin_subjects):
                continue
            out.extend(binding_violations(binding, grants, config, via=via))
    return out


def _review_cluster_role(obj: Mapping[str, Any], old: Mapping[str, Any] | None, *, index: RbacIndex,
                         config: RbacConfig, requester: _Requester,
                         refresh_bindings: Callable[[], str | None] | None = None) -> Decision:
    name = name_of(obj)
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
            and obj.get("aggregationRule") == old.get("aggregationRule") and labels_of(obj) == labels_of(old)
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
        role_name = as_str(as_map(binding.get("roleRef")).get("name"))
        role = index.role(role_name)
        if role is None:
            continue
        for v in binding_violations(binding, index.effective_grants(role, config), config, via=role_name):
            yield _finding(v, config, kind="ClusterRoleBinding", name=name_of(binding))


# --------------------------------------------------------------------------- registry entry points

def admit(request: Mapping[str, Any], facts: Facts, config: Config) -> Decision:
    """review() over Facts: the RBAC caches, their two bounded API reads, and whether the
    ClusterRole/ClusterRoleBinding caches are in sync. (The registry's `review`.)"""
    return review(request, index=facts.rbac, config=config.rbac, fetch_role=facts.fetch_cluster_role,
                  refresh_bindings=facts.refresh_bindings, synced=facts.synced(("clusterroles", "clusterrolebindings")))


def audit_objects(facts: Facts, config: Config, objects: Mapping[str, list[dict[str, Any]]]) -> Iterator[Finding]:
    """audit() over Facts (the registry's `audit`); `objects` (kind -> object dicts) is not needed:
    every ClusterRoleBinding is already in facts.rbac."""
    return audit(facts.rbac, config.rbac)
