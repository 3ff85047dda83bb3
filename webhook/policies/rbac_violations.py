"""Who may hold which grant, and the violations of one binding (the RBAC guard's core rule).

Source: "Good practices for Dynamic Resource Allocation as a Cluster Admin" (DeviceClass,
ResourceSlice, DeviceTaintRule belong to cluster admins; ResourceSlices to drivers too) and
"Role Based Access Control Good Practices" (escalation powers: webhook.model.powers). Trust:
adminSubjects may hold everything; driverSubjects the driver resources and, through a RoleBinding
in the driver ServiceAccount's own namespace, the namespaced powers its own controllers need
(DaemonSets, Pods, Secrets...); dra-guard's own ServiceAccount
everything it is given (it is the guard; acting as it is itself a power of its namespace);
everyone else none. A ClusterRoleBinding grants everything its role holds; a
RoleBinding only the namespaced powers, and only in a sensitive namespace (RbacConfig.sensitive)
do they matter; ConfigMap and Service write only in dra-guard's own namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.config import RbacConfig
from webhook.model.powers import (
    DRIVER_NAMESPACE_POWERS,
    DRIVER_POWERS,
    GUARD_NAMESPACE_POWERS,
    NAMESPACE_POWER_NAMES,
    POWER_GROUPS,
)
from webhook.model.rbac import Grant, Subject, subjects_of
from webhook.model.readers import as_map, as_str, name_of, namespace_of
from webhook.policies.decision import Finding, short

POLICY = "rbac"
_GUARD_ONLY = frozenset(p[3] for p in GUARD_NAMESPACE_POWERS)
_DRIVERS_ONLY = frozenset(p[3] for p in DRIVER_NAMESPACE_POWERS)


def may_hold(subject: Subject, grant: Grant, config: RbacConfig, *, namespace: str = "") -> bool:
    """Whether `subject` may hold `grant` through a binding in `namespace` ("" for a
    ClusterRoleBinding; see the module docstring). A driver's namespaced powers are its own
    controllers' only through a RoleBinding in the driver's own namespace (a ServiceAccount's):
    through a ClusterRoleBinding they reach every namespace, kube-system's tokens included."""
    kw = {"kind": subject.kind, "name": subject.name, "namespace": subject.namespace}
    if config.admin_subjects.contains(**kw):
        return True
    if config.is_guard(**kw):
        return True  # dra-guard itself (self mode: patch on its own webhook configurations)
    if config.driver_subjects.contains(**kw):
        own = subject.kind == "ServiceAccount" and bool(namespace) and namespace == subject.namespace
        return (
            grant.resource in config.driver_resources
            or grant.resource in DRIVER_POWERS
            or (own and grant.namespaced and grant.resource in NAMESPACE_POWER_NAMES)
        )
    return False


def reaches(grant: Grant, namespace: str, config: RbacConfig) -> bool:
    """Whether a binding in `namespace` ("" for a ClusterRoleBinding) gives `grant` where it matters."""
    if grant.resource in _GUARD_ONLY and namespace not in ("", config.guard_namespace):
        return False
    if grant.resource in _DRIVERS_ONLY:
        # a ClusterRoleBinding reaches every namespace, the declared drivers' among them
        return namespace in config.driver_namespaces or (not namespace and bool(config.driver_namespaces))
    if not namespace:
        return True
    return grant.namespaced and namespace in config.sensitive


@dataclasses.dataclass(frozen=True)
class Violation:
    """A subject of a binding that gets grants it must not have."""

    binding: str
    subject: Subject
    grants: tuple[Grant, ...]
    via: str  # the roleRef's role name
    namespace: str = ""  # the RoleBinding's namespace; "" for a ClusterRoleBinding
    via_kind: str = "ClusterRole"  # the roleRef's kind: ClusterRole or Role

    @property
    def binding_kind(self) -> str:
        """ClusterRoleBinding or RoleBinding."""
        return "RoleBinding" if self.namespace else "ClusterRoleBinding"

    @property
    def binding_ref(self) -> str:
        """ "RoleBinding ns/name" or "ClusterRoleBinding name"."""
        return f"{self.binding_kind} {self.namespace + '/' if self.namespace else ''}{self.binding}"

    def keys(self) -> set[tuple[str, str, Subject, str, str]]:
        """(namespace, binding, subject, resource, verb) per grant: what makes a violation 'new' on UPDATE."""
        return {(self.namespace, self.binding, self.subject, g.resource, g.verb) for g in self.grants}


def binding_violations(binding: Mapping[str, Any], grants: Iterable[Grant], config: RbacConfig, *, via: str) -> list[Violation]:
    """Violations of one ClusterRoleBinding or RoleBinding dict given the grants of its roleRef."""
    ns = namespace_of(binding)
    grants = tuple(g for g in grants if reaches(g, ns, config))
    out: list[Violation] = []
    if not grants:
        return out
    for subject in subjects_of(binding):
        bad = tuple(g for g in grants if not may_hold(subject, g, config, namespace=ns))
        if bad:
            out.append(
                Violation(
                    binding=name_of(binding),
                    subject=subject,
                    grants=bad,
                    via=via,
                    namespace=ns,
                    via_kind=as_str(as_map(binding.get("roleRef")).get("kind")) or "ClusterRole",
                )
            )
    return out


def _group_of(resource: str, config: RbacConfig) -> str:
    """The API group of a DRA resource or an escalation power, as messages print it ("core" for "")."""
    if resource in config.protected_resources:
        return config.api_group
    return POWER_GROUPS.get(resource, "") or "core"


def with_groups(resources: Iterable[str], config: RbacConfig) -> str:
    """ "pods (core), leases (coordination.k8s.io)": each resource with its API group."""
    return ", ".join(f"{r} ({_group_of(r, config)})" for r in resources)


def _subject_entry(s: Subject) -> str:
    """The subject as an exception's `subjects` map: {serviceAccounts: [ns:name]}, {users: [..]}..."""
    if s.kind == "ServiceAccount":
        return f"{{serviceAccounts: [{s.namespace}:{s.name}]}}"
    return f"{{{'groups' if s.kind == 'Group' else 'users'}: [{s.name}]}}"


def exception_fix(v: Violation, resources: list[str]) -> str:
    """The rbac exception that admits exactly this binding's grant of `resources` to v.subject
    (docs/policies/exceptions.md): pinned to the binding, its roleRef, that subject, those resources."""
    where = f"namespace: {v.namespace}, " if v.namespace else ""
    return (
        f"to accept exactly this grant, add an rbac exception (Helm value config.exceptions): "
        f"{{policy: rbac, kind: {v.binding_kind}, {where}name: {v.binding}, roleRef: {v.via}, "
        f"subjects: {_subject_entry(v.subject)}, resources: [{', '.join(resources)}], reason: <why>, owner: <team>, "
        f"expires: <at most 366 days ahead>}}"
    )


def _remedy(v: Violation, config: RbacConfig, dra: list[str], powers: list[str], *, on_role: bool = False) -> tuple[str, str]:
    """(who may hold the violation's grants, the one setting that admits exactly them).

    `dra`: the DRA resources written, `powers`: the escalation powers (both sorted, never both
    empty). The setting is never wider than the grant: a ServiceAccount that writes a driver
    resource (a driver not yet configured) is told of driverSubjects; a driver subject refused an
    admin-only DRA resource, of driverResources (every driver subject may then write it: the
    documented setting for a driver's own DRA kinds); anything else (a power, an admin-only DRA
    resource of a non-driver) of the rbac exception pinned to this binding, roleRef, subject and
    resources. adminSubjects lifts every check: it is named only for a User or Group, as what a
    cluster admin is. on_role: the change judged is a role's, which no exception covers (a role's
    rules reach every binding of it): a cluster admin makes it, and the exception keeps the binding
    out of the drift watch's and the audits' findings.
    """
    s = v.subject
    is_driver = config.driver_subjects.contains(kind=s.kind, name=s.name, namespace=s.namespace)
    admin_dra = [r for r in dra if r not in config.driver_resources]
    driver_dra = [r for r in dra if r in config.driver_resources]
    # the Helm values named are the extra lists: a --set of a list itself drops its defaults
    widened = ", ".join(sorted(config.driver_resources | set(admin_dra)))
    widen = (
        f"add {', '.join(admin_dra)} to rbac.driverResources (drivers may then write "
        f"{'it' if len(admin_dra) == 1 else 'them'}; Helm value config.rbac.driverResources: [{widened}])"
    )
    if not powers and s.kind == "ServiceAccount" and (is_driver and admin_dra or not is_driver and driver_dra):
        if is_driver:
            return (
                f"only cluster admins may write {with_groups(admin_dra, config)}; DRA drivers (rbac.driverSubjects, "
                f"which {s} is one of) may write {with_groups(sorted(config.driver_resources), config)}"
            ), widen
        who = f"only cluster admins and DRA drivers may write {with_groups(driver_dra, config)}"
        if admin_dra:
            who += f", only cluster admins {with_groups(admin_dra, config)}"
        fix = (
            f"if it is a DRA driver, add the subject to rbac.driverSubjects (Helm value "
            f"config.rbac.extraDriverSubjects.serviceAccounts: [{s.namespace}:{s.name}])" + (f" and {widen}" if admin_dra else "")
        )
        return who, fix
    held = (powers + admin_dra if is_driver else powers + dra) or dra  # never empty: `dra` or `powers` is not
    who = f"only cluster admins may hold {with_groups(held, config)}"
    if is_driver and s.kind == "ServiceAccount" and any(g.namespaced for g in v.grants if g.resource in powers):
        who += (
            f" (DRA drivers hold namespaced powers only through a RoleBinding in their own namespace "
            f"({s.namespace}) and never through a ClusterRoleBinding, which reaches every namespace)"
        )
    fix = exception_fix(v, sorted(held))
    if on_role:
        fix = (
            f"have a cluster admin make this change (an exception covers a binding, never a role: a role's rules "
            f"reach every binding of it) and, {fix}"
        )
    if s.kind in ("User", "Group"):
        fix += (
            f"; or, if {s} is a cluster admin, add it to rbac.adminSubjects (Helm value "
            f"config.rbac.extraAdminSubjects: it lifts every check)"
        )
    return who, fix


def describe(v: Violation, config: RbacConfig, *, on_role: bool = False) -> tuple[str, str]:
    """(message, summary) for a violation; on_role: reported on the role whose change is judged."""
    dra = sorted({g.resource for g in v.grants if g.resource in config.protected_resources})
    powers = sorted({g.resource for g in v.grants} - set(dra))
    verbs = sorted({g.verb for g in v.grants})
    verb_text = "every verb: *" if "*" in verbs else ", ".join(verbs)
    roles = sorted({g.role for g in v.grants} - {v.via})
    via = f"{v.via_kind} {v.via}" + (f" (aggregating {', '.join(roles)})" if roles else "")
    parts = []
    if dra:
        parts.append(f"write ({verb_text}) on {', '.join(dra)} ({config.api_group})")
    if powers:
        where = f" in namespace {v.namespace}" if v.namespace else ""
        parts.append(
            f"escalation powers{where}: {', '.join(powers)} (each lets the holder act as, or switch off, "
            f"an identity that holds DRA write)"
        )
    who, fix = _remedy(v, config, dra, powers, on_role=on_role)
    message = (
        f"{v.binding_ref} grants {'; and '.join(parts)} to {v.subject} via {via}; {who}. "
        f"Bind a narrower role (ResourceClaims and ResourceClaimTemplates are enough for workloads), "
        f"or {fix}."
    )
    what = ", ".join(dra + powers)
    summary = short(f"dra-guard: {v.subject} would get {what} via {v.binding_ref}")
    return message, summary


def finding(v: Violation, config: RbacConfig, *, kind: str, name: str, namespace: str = "") -> Finding:
    """The Finding of a violation, reported on object `kind` `namespace`/`name`."""
    message, summary = describe(v, config, on_role=kind in ("ClusterRole", "Role"))
    if kind in ("ClusterRole", "Role"):
        message = f"{kind} {namespace + '/' if namespace else ''}{name}: " + message
    return Finding(
        policy=POLICY,
        kind=kind,
        name=name,
        namespace=namespace,
        message=message,
        summary=summary,
        check="rbac-write",
        details={
            "binding": v.binding,
            "bindingNamespace": v.namespace,
            "subject": str(v.subject),
            "roleRef": v.via,
            "resources": sorted({g.resource for g in v.grants}),
            "verbs": sorted({g.verb for g in v.grants}),
            "roles": sorted({g.role for g in v.grants}),
        },
    )
