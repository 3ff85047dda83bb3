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
do they matter, but for device allocation, which matters in every namespace
(webhook.model.powers.EVERY_NAMESPACE_POWERS); ConfigMap and Service write only in dra-guard's own
namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from webhook.config import RbacConfig
from webhook.model.powers import (
    DRIVER_NAMESPACE_POWERS,
    DRIVER_POWERS,
    EVERY_NAMESPACE_POWERS,
    GUARD_NAMESPACE_POWERS,
    NAMESPACE_POWER_NAMES,
    POWER_GROUPS,
)
from webhook.model.rbac import Grant, Subject, subjects_of
from webhook.model.readers import WARNING_LIMIT, as_map, as_str, name_of, namespace_of
from webhook.policies.decision import Finding, short

POLICY = "rbac"
_GUARD_ONLY = frozenset(p[3] for p in GUARD_NAMESPACE_POWERS)
_DRIVERS_ONLY = frozenset(p[3] for p in DRIVER_NAMESPACE_POWERS)
#: a list a message names whole up to this many items; of a longer one it names the first and
#: "and N more" (the finding's details hold it whole): a wide role's refusal stays readable
NAMED = 4
#: a violation's message at most (characters, about): kubectl shows it whole, and a PolicyReport's
#: message (webhook.audit.reports.MESSAGE_LIMIT) keeps its fix even with a role's name prefixed
MESSAGE_BUDGET = 600


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
    if not namespace or grant.resource in EVERY_NAMESPACE_POWERS:
        return True
    return grant.namespaced and namespace in config.sensitive


def reaches_anywhere(grants: Iterable[Grant]) -> bool:
    """Whether any of `grants` matters through a RoleBinding outside the sensitive namespaces."""
    return any(g.resource in EVERY_NAMESPACE_POWERS for g in grants)


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


def first_names(names: Sequence[str], *, limit: int = NAMED) -> tuple[list[str], int]:
    """(the names a message shows, how many it leaves out): all of `names` when there are at most
    `limit`, else the first limit - 1 (so that "and N more" always stands for at least 2)."""
    if len(names) <= limit:
        return list(names), 0
    return list(names[: limit - 1]), len(names) - limit + 1


def and_more(names: Sequence[str], *, limit: int = NAMED) -> str:
    """ "a, b, c" or "a, b, c, d and 37 more" (first_names())."""
    shown, more = first_names(names, limit=limit)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def with_groups(resources: Sequence[str], config: RbacConfig, *, limit: int = NAMED) -> str:
    """ "deviceclasses, resourceslices (resource.k8s.io), pods (core) and 37 more": the first
    resources (first_names()), each run of one API group followed by the group once."""
    shown, more = first_names(resources, limit=limit)
    runs: list[tuple[str, list[str]]] = []
    for r in shown:
        group = _group_of(r, config)
        if runs and runs[-1][0] == group:
            runs[-1][1].append(r)
        else:
            runs.append((group, [r]))
    text = ", ".join(f"{', '.join(names)} ({group})" for group, names in runs)
    return text + (f" and {more} more" if more else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _subject_entry(s: Subject) -> str:
    """The subject as an exception's `subjects` map: {serviceAccounts: [ns:name]}, {users: [..]}..."""
    if s.kind == "ServiceAccount":
        return f"{{serviceAccounts: [{s.namespace}:{s.name}]}}"
    return f"{{{'groups' if s.kind == 'Group' else 'users'}: [{s.name}]}}"


def exception_fix(v: Violation, resources: list[str], *, compact: bool = False) -> str:
    """The rbac exception that admits exactly this binding's grant of `resources` to v.subject
    (docs/policies/exceptions.md): pinned to the binding, its roleRef, that subject, those resources.
    The entry itself when it names at most NAMED resources; else where to get it written, since a
    longer one would make the message a wall (the finding's details hold every resource, and
    `dra-guard audit --suggest-exception` writes the entry from them)."""
    if len(resources) > NAMED:
        return "to accept exactly this grant, add an rbac exception (dra-guard audit --suggest-exception writes it)"
    where = f"namespace: {v.namespace}, " if v.namespace else ""
    entry = (
        f"{{policy: rbac, kind: {v.binding_kind}, {where}name: {v.binding}, roleRef: {v.via}, "
        f"subjects: {_subject_entry(v.subject)}, resources: [{', '.join(resources)}]"
    )
    if compact:  # long names: the placeholders said in words (--suggest-exception fills them)
        return f"for exactly this grant, add the rbac exception (config.exceptions) {entry}}} with reason, owner, expires"
    return (
        f"to accept exactly this grant, add an rbac exception (Helm value config.exceptions): "
        f"{entry}, reason: <why>, owner: <team>, expires: <at most 366 days ahead>}}"
    )


def _remedy(
    v: Violation,
    config: RbacConfig,
    dra: list[str],
    powers: list[str],
    *,
    on_role: bool = False,
    notes: bool = True,
    compact: bool = False,
) -> tuple[str, str]:
    """(who may hold the violation's grants, the one setting that admits exactly them).

    `dra`: the DRA resources written, `powers`: the escalation powers (both sorted, never both
    empty). The setting is never wider than the grant: a ServiceAccount that writes a driver
    resource (a driver not yet configured), with or without the claim-allocation powers drivers
    may hold (DRIVER_POWERS), is told of driverSubjects; a driver subject refused an
    admin-only DRA resource, of driverResources (every driver subject may then write it: the
    documented setting for a driver's own DRA kinds); anything else (a power, an admin-only DRA
    resource of a non-driver) of the rbac exception pinned to this binding, roleRef, subject and
    resources. adminSubjects lifts every check: it is named only for a User or Group, as what a
    cluster admin is. on_role: the change judged is a role's, which no exception covers (a role's
    rules reach every binding of it): a cluster admin makes it, and the exception keeps the binding
    out of the drift watch's and the audits' findings. notes: the note on drivers in full; compact:
    the exception entry without its placeholders (exception_fix).
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
    # a driver's own powers (claim allocation) beside its driver resources: still a driver not yet configured
    drivers_powers = set(powers) <= DRIVER_POWERS and not is_driver
    if (
        (not powers or drivers_powers)
        and s.kind == "ServiceAccount"
        and (is_driver and admin_dra or not is_driver and driver_dra)
    ):
        if is_driver:
            return (
                f"only cluster admins may write {with_groups(admin_dra, config)}; DRA drivers (rbac.driverSubjects, "
                f"which {s} is one of) may write {with_groups(sorted(config.driver_resources), config)}"
            ), widen
        who = f"only cluster admins and DRA drivers may write {with_groups(sorted(driver_dra + powers), config)}"
        if admin_dra:
            who += f", only cluster admins {with_groups(admin_dra, config)}"
        fix = (
            f"if it is a DRA driver, add the subject to rbac.driverSubjects (Helm value "
            f"config.rbac.extraDriverSubjects.serviceAccounts: [{s.namespace}:{s.name}])" + (f" and {widen}" if admin_dra else "")
        )
        return who, fix
    held = (admin_dra + powers if is_driver else dra + powers) or dra  # never empty: `dra` or `powers` is not
    who = f"only cluster admins may hold {with_groups(held, config)}"
    if is_driver and s.kind == "ServiceAccount" and any(g.namespaced for g in v.grants if g.resource in powers):
        if compact:
            who += f" (a driver's only through a RoleBinding in {s.namespace})"
        else:
            who += f" (DRA drivers hold namespaced powers only through a RoleBinding in their own namespace ({s.namespace})" + (
                ")" if v.namespace or not notes else ", never through a ClusterRoleBinding, which reaches every namespace)"
            )
    fix = exception_fix(v, sorted(held), compact=compact)
    if on_role:
        fix = f"have a cluster admin make this change (an exception covers a binding, never a role) and, {fix}"
    if s.kind in ("User", "Group"):
        fix = (
            f"if {s} is a cluster admin, add it to rbac.adminSubjects (Helm value config.rbac.extraAdminSubjects; "
            f"it lifts every check); or, {fix}"
        )
    return who, fix


def describe(v: Violation, config: RbacConfig, *, on_role: bool = False) -> tuple[str, str]:
    """(message, summary) for a violation; on_role: reported on the role whose change is judged.

    The message: what the binding grants (counts), who may hold it (each resource named once, the
    first NAMED of a longer list), then the fix, with the exception entry written out when it
    names at most NAMED resources (else the command that writes it). Whatever the role's width (a
    cluster-admin binding included) it stays about MESSAGE_BUDGET characters, notes left out to
    keep it so; only long object names in a written-out entry make it longer (a PolicyReport's
    message, cut at 1024 characters, still ends with the fix). The summary (a kubectl warning)
    is at most WARNING_LIMIT characters."""
    message = _message(v, config, on_role=on_role, notes=True)
    if len(message) > MESSAGE_BUDGET:
        message = _message(v, config, on_role=on_role, notes=False)
    if len(message) > MESSAGE_BUDGET:
        message = _message(v, config, on_role=on_role, notes=False, compact=True)
    dra = sorted({g.resource for g in v.grants if g.resource in config.protected_resources})
    return message, _summary(v, dra + sorted({g.resource for g in v.grants} - set(dra)))


def _message(v: Violation, config: RbacConfig, *, on_role: bool, notes: bool, compact: bool = False) -> str:
    """describe()'s message; notes: with the notes (what an escalation power is, where a driver
    holds its namespaced powers); compact: the shortest wording (long object names): the exception
    entry without placeholders, the narrower-role advice without its example."""
    dra = sorted({g.resource for g in v.grants if g.resource in config.protected_resources})
    powers = sorted({g.resource for g in v.grants} - set(dra))
    verbs = sorted({g.verb for g in v.grants})
    verb_text = "every verb" if "*" in verbs else and_more(verbs)
    roles = sorted({g.role for g in v.grants} - {v.via})
    via = f"{v.via_kind} {v.via}" + (f" (aggregating {and_more(roles)})" if roles else "")
    parts = []
    if dra:
        parts.append(f"write on {_plural(len(dra), 'DRA resource')}")
    if powers:
        where = f" in namespace {v.namespace}" if v.namespace else ""
        parts.append(f"{_plural(len(powers), 'escalation power')}{where}")
    who, fix = _remedy(v, config, dra, powers, on_role=on_role, notes=notes, compact=compact)
    # a role's change is undone by not making it; a binding's by binding another role
    lead = (
        "Keep the role narrow"
        if on_role
        else "Bind a narrower role" + ("" if compact else " (workloads need only ResourceClaims and ResourceClaimTemplates)")
    )
    message = (
        f"{v.binding_ref} grants {v.subject} {' and '.join(parts)} ({verb_text}) via {via}; {who}. "
        f"{lead}, {'or' if fix.startswith('add ') else 'or,'} {fix}."
    )
    if powers and notes:
        message += " An escalation power lets its holder act as, or switch off, an identity allowed to write DRA objects."
    return message


def _summary(v: Violation, resources: list[str]) -> str:
    """ "dra-guard: User alice would get deviceclasses, devicetaintrules and 39 more via
    ClusterRoleBinding x": as many first names as keep it within the warning limit."""
    for limit in range(len(resources), 1 if len(resources) > 1 else 0, -1):  # a limit of 1 would name none
        text = f"dra-guard: {v.subject} would get {and_more(resources, limit=limit)} via {v.binding_ref}"
        if len(text) <= WARNING_LIMIT:
            return text
    return short(f"dra-guard: {v.subject} would get {_plural(len(resources), 'grant')} via {v.binding_ref}")


def finding(v: Violation, config: RbacConfig, *, kind: str, name: str, namespace: str = "") -> Finding:
    """The Finding of a violation, reported on object `kind` `namespace`/`name`."""
    message, summary = describe(v, config, on_role=kind in ("ClusterRole", "Role"))
    if kind in ("ClusterRole", "Role") and (kind, name) != (v.via_kind, v.via):
        # a role aggregated into the bound one: the message names only the bound role
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
