"""RBAC guard: only cluster admins and DRA drivers may write DeviceClasses, ResourceSlices and
DeviceTaintRules, and only cluster admins may hold what is as good as that write (escalation powers).

Source: "Good practices for Dynamic Resource Allocation as a Cluster Admin", section "Separate
permissions to DRA related APIs": DeviceClass and ResourceSlice (resource.k8s.io, cluster-scoped)
belong to cluster admins and DRA drivers; workload operators need only ResourceClaim and
ResourceClaimTemplate. "Role Based Access Control Good Practices", "Privilege escalation risks":
impersonation, bind/escalate, tokens, pods and workloads, secrets, admission webhooks; each path is
in docs/threat-model.md. What counts as a grant is in webhook.model.rbac and webhook.model.powers,
who may hold it in webhook.policies.rbac_violations. DRA write and cluster-scoped powers come only
through ClusterRoleBindings; namespaced powers also through RoleBindings in sensitive namespaces,
device allocation through RoleBindings in every namespace.
dra-guard's own ClusterRole/ClusterRoleBinding, and Roles/RoleBindings in its namespace, are
written by cluster admins only (removing one rule would blind its caches).

Decisions only: plain dicts and the RbacIndex (webhook.model.rbac_index) in, Decisions and
Findings out; no I/O of its own (the two API reads it may ask for come as callables from Facts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook.config import Config, RbacConfig, SubjectSet
from webhook.model.facts import Facts
from webhook.model.pending import PendingFull
from webhook.model.rbac_index import RbacIndex, ref_key
from webhook.model.readers import annotations_of, as_map, as_str, labels_of, name_of, namespace_of, strings
from webhook.model.slim import BREAK_GLASS_ANNOTATION
from webhook.policies import admin_access
from webhook.policies.decision import ALLOW, Decision, Finding, short
from webhook.policies.rbac_violations import POLICY, Violation, binding_violations, finding, reaches_anywhere

__all__ = [
    "POLICY",
    "RbacIndex",
    "Violation",
    "admit",
    "audit",
    "audit_objects",
    "binding_violations",
    "bindings_reaching",
    "judge_binding",
    "review",
]


def _break_glass(obj: Mapping[str, Any]) -> str | None:
    value = annotations_of(obj).get(BREAK_GLASS_ANNOTATION)
    return value if isinstance(value, str) else None


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


def review(
    request: Mapping[str, Any],
    *,
    index: RbacIndex,
    config: RbacConfig,
    fetch_role: Callable[[str], Mapping[str, Any] | None] | None = None,
    refresh_bindings: Callable[[], str | None] | None = None,
    synced: tuple[bool, str] = (True, ""),
) -> Decision:
    """Judge one AdmissionReview request (the `request` dict of admission.k8s.io/v1 or v1beta1).

    Handles ClusterRoleBinding, RoleBinding, ClusterRole and Role CREATE/UPDATE, and DELETE of
    dra-guard's own RBAC objects; anything else is allowed. Uses `index` for roleRef and
    aggregation lookups (no I/O).
    fetch_role(name): asked only when a binding's ClusterRole is not in the index (a role created a
    moment ago may not have reached the watch yet); returns the ClusterRole dict or None.
    refresh_bindings(): asked before judging a ClusterRole that grants protected write, to add
    ClusterRoleBindings the watch has not delivered yet to `index` (the reverse race); returns
    None, or a note when it could read only part of them in time (the decision then carries it
    as a warning and is made from `index` as it stands).
    synced: (False, why) when the RBAC caches lost their watch: an RBAC write is then refused
    (enforce) with the reason rather than judged on stale data; warn and audit modes let it
    through with the reason.
    Returns the decision enforce mode would give.
    """
    operation = as_str(request.get("operation"))
    obj = request.get("oldObject") if operation == "DELETE" else request.get("object")
    if operation not in ("CREATE", "UPDATE", "DELETE") or not isinstance(obj, Mapping):
        return ALLOW
    if as_str(as_map(request.get("kind")).get("kind")) == "Namespace":
        return admin_access.review(request, requester_is_admin=_Requester.from_request(request).is_admin(config.admin_subjects))
    old = request.get("oldObject") if operation == "UPDATE" else None
    old = old if isinstance(old, Mapping) else None
    kind = as_str(as_map(request.get("kind")).get("kind")) or as_str(obj.get("kind"))
    namespace = as_str(request.get("namespace")) or namespace_of(obj)
    requester = _Requester.from_request(request)
    own = _guards_own(kind, as_str(request.get("name")) or name_of(obj), namespace, config)
    if own is not None and not requester.is_admin(config.admin_subjects):
        return Decision(
            findings=(
                Finding(
                    policy=POLICY,
                    kind=kind,
                    name=name_of(obj),
                    namespace=namespace,
                    check="guard-own-rbac",
                    message=f"{own} belongs to dra-guard: only cluster admins (rbac.adminSubjects) may {operation.lower()} it; "
                    f"a changed rule would blind dra-guard's caches or grant its powers. Change it with "
                    f"`helm upgrade` as a cluster admin.",
                    summary=short(f"dra-guard: only cluster admins may change {own}"),
                ),
            )
        )
    if operation == "DELETE":
        return ALLOW
    if kind in ("Role", "RoleBinding") and namespace not in config.sensitive and not _may_allocate(kind, obj, index, config):
        return ALLOW  # the common case for namespaced RBAC: no power of it matters outside the sensitive namespaces
    ok, why = synced
    if not ok and kind in ("ClusterRoleBinding", "ClusterRole", "RoleBinding", "Role"):
        return _not_judged(
            kind,
            obj,
            "cache-not-synced",
            f"its RBAC caches are not in sync with the apiserver ({why}); it does not decide on stale data",
            f"RBAC caches not synced ({why})",
        )
    if kind not in ("ClusterRoleBinding", "RoleBinding", "ClusterRole", "Role"):
        return ALLOW
    # path 9: recorded before judging, so that of two concurrent reviews of a role and a binding of
    # it at least one sees the other (webhook.model.pending); dropped again when refused
    dry_run = request.get("dryRun") is True
    try:
        token = None if dry_run else index.pending.add(obj)
    except PendingFull as exc:
        return _not_judged(kind, obj, "pending-full", f"{exc} (a flood of reviews?)", "too many RBAC reviews awaiting the watch")
    try:
        if kind in ("ClusterRoleBinding", "RoleBinding"):
            decision = _review_binding(obj, old, index=index, config=config, requester=requester, fetch_role=fetch_role)
        else:
            decision = _review_role(obj, old, index=index, config=config, requester=requester, refresh_bindings=refresh_bindings)
    except BaseException:
        if token is not None:
            index.pending.drop(token)
        raise
    if not decision.allowed and token is not None:
        index.pending.drop(token)
    return decision


def _not_judged(kind: str, obj: Mapping[str, Any], check: str, why: str, summary: str) -> Decision:
    """A 503 refusal of a `kind` dict dra-guard cannot judge now (`why`, a clause; `summary`, the
    kubectl warning's words): the apiserver refuses the write and the client retries."""
    return Decision(
        findings=(
            Finding(
                policy=POLICY,
                kind=kind,
                name=name_of(obj),
                check=check,
                code=503,
                reason="ServiceUnavailable",
                message=f"dra-guard cannot judge this {kind} now: {why}. Retry in a few seconds.",
                summary=short(f"dra-guard: {summary}; not judged"),
            ),
        )
    )


def _may_allocate(kind: str, obj: Mapping[str, Any], index: RbacIndex, config: RbacConfig) -> bool:
    """Whether a Role or RoleBinding dict outside the sensitive namespaces may grant a power that
    matters in every namespace (device allocation): its own rules, or its roleRef's as cached or
    pending. A roleRef not known yet grants nothing now: its creation is judged against this
    binding then (_role_violations reaches RoleBindings everywhere for such a role)."""
    if kind == "Role":
        return reaches_anywhere(index.effective_grants(obj, config))
    role_ref = as_map(obj.get("roleRef"))
    role_name, role_kind = as_str(role_ref.get("name")), as_str(role_ref.get("kind")) or "ClusterRole"
    role_ns = namespace_of(obj) if role_kind == "Role" else ""
    roles = [r for r in (index.role(role_name, role_ns), *index.pending.roles(role_name, role_ns)) if r is not None]
    return any(reaches_anywhere(index.effective_grants(r, config)) for r in roles)


def _guards_own(kind: str, name: str, namespace: str, config: RbacConfig) -> str | None:
    """ "<kind> <name>" when the object is dra-guard's own RBAC (its ClusterRole/ClusterRoleBinding,
    or a Role/RoleBinding in its namespace), else None."""
    if "guard-rbac" not in config.escalation_checks:
        return None
    if kind in ("ClusterRole", "ClusterRoleBinding") and name in config.guard_names:
        return f"{kind} {name}"
    if kind in ("Role", "RoleBinding") and namespace == config.guard_namespace:
        return f"{kind} {namespace}/{name}"
    return None


def _split_new(new: list[Violation], old: list[Violation]) -> tuple[list[Violation], list[Violation]]:
    """(violations adding a grant that `old` did not have, violations that were already there)."""
    old_keys: set[Any] = set().union(*(v.keys() for v in old)) if old else set()
    added, kept = [], []
    for v in new:
        fresh = tuple(g for g in v.grants if (v.namespace, v.binding, v.subject, g.resource, g.verb) not in old_keys)
        if fresh:
            added.append(dataclasses.replace(v, grants=fresh))
        else:
            kept.append(v)
    return added, kept


def _decide(
    kind: str,
    name: str,
    obj: Mapping[str, Any],
    added: list[Violation],
    kept: list[Violation],
    *,
    config: RbacConfig,
    requester: _Requester,
    warnings: list[str],
) -> Decision:
    namespace = namespace_of(obj)
    ref = f"{kind} {namespace + '/' if namespace else ''}{name}"
    for v in kept:
        warnings.append(
            short(
                f"dra-guard: {ref} already grants {v.subject} "
                f"{', '.join(sorted({g.resource for g in v.grants}))}; allowed, please fix"
            )
        )
    if not added:
        return Decision(warnings=tuple(warnings))
    reason = _break_glass(obj)
    if reason is not None:
        if requester.is_admin(config.admin_subjects):
            warnings.append(short(f"dra-guard: break-glass {BREAK_GLASS_ANNOTATION} honoured for {ref}"))
            return Decision(
                warnings=tuple(warnings), audit_annotations={"break-glass": short(f"{requester.username}: {reason}", 250)}
            )
        findings = tuple(
            dataclasses.replace(
                finding(v, config, kind=kind, name=name, namespace=namespace),
                message=finding(v, config, kind=kind, name=name, namespace=namespace).message
                + f" The annotation {BREAK_GLASS_ANNOTATION} is honoured only when a cluster admin makes the request.",
            )
            for v in added
        )
        return Decision(findings=findings, warnings=tuple(warnings))
    return Decision(
        findings=tuple(finding(v, config, kind=kind, name=name, namespace=namespace) for v in added), warnings=tuple(warnings)
    )


def _review_binding(
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    *,
    index: RbacIndex,
    config: RbacConfig,
    requester: _Requester,
    fetch_role: Callable[[str], Mapping[str, Any] | None] | None = None,
) -> Decision:
    """A ClusterRoleBinding, or a RoleBinding (whose namespaced powers matter only in a sensitive
    namespace, device allocation in every one: webhook.policies.rbac_violations.reaches)."""
    name, namespace = name_of(obj), namespace_of(obj)
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    role_ref = as_map(obj.get("roleRef"))
    role_name, role_kind = as_str(role_ref.get("name")), as_str(role_ref.get("kind")) or "ClusterRole"
    if role_kind not in ("ClusterRole", "Role") or (role_kind == "Role" and not namespace):
        return ALLOW
    role_ns = namespace if role_kind == "Role" else ""
    role = index.role(role_name, role_ns)
    if role is None and fetch_role is not None and role_name and role_kind == "ClusterRole":
        role = fetch_role(role_name)
    pending = index.pending.roles(role_name, role_ns)  # an UPDATE of the role allowed a moment ago
    if role is None and not pending:
        return Decision(
            warnings=(
                short(
                    f"dra-guard: {role_kind} {role_name} does not exist yet; "
                    f"it will be checked against {kind} {name} when it is created"
                ),
            )
        )
    # every version counts: the cached one and each pending one (a review adds, never replaces)
    grants = tuple(sorted({g for r in (role, *pending) if r is not None for g in index.effective_grants(r, config)}))
    new = binding_violations(obj, grants, config, via=role_name)
    old_v = binding_violations(old, grants, config, via=role_name) if old is not None else []
    added, kept = _split_new(new, old_v)
    return _decide(kind, name, obj, added, kept, config=config, requester=requester, warnings=[])


def _role_violations(role: Mapping[str, Any], *, index: RbacIndex, config: RbacConfig, requester: _Requester) -> list[Violation]:
    """Violations created by a ClusterRole or Role through every binding that reaches it: bindings
    of the role itself and of every role that aggregates it; RoleBindings in sensitive namespaces,
    and in every namespace when the role allocates devices."""
    name, namespace = name_of(role), namespace_of(role)
    grants = index.effective_grants(role, config)
    if not grants:
        return []
    anywhere = reaches_anywhere(grants)
    found: list[tuple[str, Mapping[str, Any]]] = []
    vias = [name] if namespace else [name, *index.aggregators_of(labels_of(role), exclude=name)]
    for via in vias:
        # a pending binding is judged beside its cached version, never instead of it: what a
        # review says (anyone may send one to the webhook port) can only add restrictions
        for b in [*bindings_reaching(index, config, role, via=via), *index.pending.bindings_of(via, namespace)]:
            if not namespace_of(b) or namespace_of(b) in config.sensitive or anywhere:
                found.append((via, b))
    out: dict[Violation, None] = {}
    for via, binding in found:
        if _break_glass(binding) is not None and requester.is_admin(config.admin_subjects):
            continue
        out.update(dict.fromkeys(binding_violations(binding, grants, config, via=via)))
    return list(out)


def _review_role(
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    *,
    index: RbacIndex,
    config: RbacConfig,
    requester: _Requester,
    refresh_bindings: Callable[[], str | None] | None = None,
) -> Decision:
    name, namespace = name_of(obj), namespace_of(obj)
    kind = "Role" if namespace else "ClusterRole"
    warnings: list[str] = []
    if refresh_bindings is not None and not namespace and any(not g.namespaced for g in index.effective_grants(obj, config)):
        # A role that grants DRA write or a cluster-scoped power: a binding created a moment ago may
        # not have reached the watch yet, so the bindings are read from the API once before judging
        # (rare: such roles are few). Roles with only namespaced powers (workload or Service write:
        # common) are decided from the cache: the pending record and the watch re-judging cover them.
        note = refresh_bindings()
        if note:
            warnings.append(short(f"dra-guard: {note}"))
    new = _role_violations(obj, index=index, config=config, requester=requester)
    old_v = _role_violations(old, index=index, config=config, requester=requester) if old is not None else []
    added, kept = _split_new(new, old_v)
    if (
        added
        and old is not None
        and isinstance(obj.get("aggregationRule"), Mapping)
        and obj.get("aggregationRule") == old.get("aggregationRule")
        and labels_of(obj) == labels_of(old)
        and requester.username in config.aggregation_controller_users
    ):
        # The aggregation controller copying members' rules into an aggregating role: the member
        # role is where enforcement bites; refusing here would only wedge the controller. Anyone
        # else adding rules or labels to an aggregating role is judged like any other change.
        warnings.extend(
            short(
                f"dra-guard: aggregated rules of ClusterRole {name} give {v.subject} "
                f"{', '.join(sorted({g.resource for g in v.grants}))}"
            )
            for v in added
        )
        return Decision(warnings=tuple(warnings))
    return _decide(kind, name, obj, added, kept, config=config, requester=requester, warnings=warnings)


# --------------------------------------------------------------------------- audit


def judge_binding(index: RbacIndex, config: RbacConfig, binding: Mapping[str, Any]) -> list[Finding]:
    """Findings of one ClusterRoleBinding or RoleBinding dict as it stands in `index`: the grants of
    its role (aggregation and bootstrap defaults included) that a subject may not hold. Skipped:
    break-glass bindings (an admin accepted them), RoleBindings outside the sensitive namespaces
    unless their role allocates devices, bindings whose role is not known."""
    namespace = namespace_of(binding)
    if _break_glass(binding) is not None:
        return []
    role = index.role(*reversed(ref_key(binding)))
    if role is None:
        return []
    if namespace and namespace not in config.sensitive and not reaches_anywhere(index.effective_grants(role, config)):
        return []
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    return [
        finding(v, config, kind=kind, name=name_of(binding), namespace=namespace)
        for v in binding_violations(binding, index.effective_grants(role, config), config, via=name_of(role))
    ]


def bindings_reaching(
    index: RbacIndex, config: RbacConfig, role: Mapping[str, Any], *, via: str | None = None
) -> list[Mapping[str, Any]]:
    """The cached bindings a change of ClusterRole or Role dict `role` can affect: its own bindings,
    those of every role aggregating it, and RoleBindings of them in sensitive namespaces (in every
    namespace when the role allocates devices). `via`: only the bindings of that one role (`role`
    itself or one of its aggregators)."""
    name, namespace = name_of(role), namespace_of(role)
    anywhere = reaches_anywhere(index.effective_grants(role, config))
    if namespace:
        return index.role_bindings_of(name, namespace) if namespace in config.sensitive or anywhere else []
    vias = [via] if via is not None else [name, *index.aggregators_of(labels_of(role), exclude=name)]
    return [
        b
        for v in vias
        for b in [
            *index.bindings_of(v),
            *(rb for rb in index.role_bindings_of(v) if anywhere or namespace_of(rb) in config.sensitive),
        ]
    ]


def audit(index: RbacIndex, config: RbacConfig) -> Iterator[Finding]:
    """Findings for every ClusterRoleBinding, and every RoleBinding in a sensitive namespace, in
    `index` that gives a subject a grant it may not hold (DRA write or an escalation power).

    Grants reached through aggregation are attributed to the binding of the aggregating role.
    Bindings carrying the break-glass annotation are skipped (an admin accepted them).
    """
    for binding in [*index.bindings(), *index.bindings(namespaced=True)]:
        yield from judge_binding(index, config, binding)


# --------------------------------------------------------------------------- registry entry points


def admit(request: Mapping[str, Any], facts: Facts, config: Config) -> Decision:
    """review() over Facts: the RBAC caches, their two bounded API reads, and whether the
    ClusterRole/ClusterRoleBinding caches are in sync. (The registry's `review`.)"""
    return review(
        request,
        index=facts.rbac,
        config=config.rbac,
        fetch_role=facts.fetch_cluster_role,
        refresh_bindings=facts.refresh_bindings,
        synced=facts.synced(("clusterroles", "clusterrolebindings", "roles", "rolebindings")),
    )


def audit_objects(facts: Facts, config: Config, objects: Mapping[str, list[dict[str, Any]]]) -> Iterator[Finding]:
    """audit() over Facts (the registry's `audit`): every binding is already in facts.rbac; then the
    DRA admin-access findings over the Namespaces, ResourceClaims and ResourceClaimTemplates among
    `objects` (kind -> object dicts)."""
    yield from audit(facts.rbac, config.rbac)
    yield from admin_access.audit(facts.rbac, objects)
