"""DRA admin access is an admin's decision: the Namespace label that lets ResourceClaims ask for
``adminAccess`` may be set only by admins, and the audit lists where it is set and who uses it.

Source: "Good practices for DRA as a Cluster Admin", section "Separate permissions to DRA related
APIs" (DRA's admin-level access is for cluster admins), and the DRAAdminAccess feature (GA in
Kubernetes 1.37): a ResourceClaim or ResourceClaimTemplate may set
``spec.devices.requests[].exactly.adminAccess: true`` (v1beta1: ``requests[].adminAccess``) only in
a Namespace labelled ``resource.kubernetes.io/admin-access: "true"``; such a claim gets access to
every device its request selects, including devices in use by others.

Decision: a CREATE or UPDATE of a Namespace that sets the label to "true" (where it was not "true")
by anyone but rbac.adminSubjects is refused (403). Removing it, or any other change, is allowed.
The chart sends only such label changes by non-admins (matchConditions), to the RBAC guard's path.
Pure: request dicts and object dicts in, Decisions and Findings out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from webhook.model.powers import resource_ok
from webhook.model.rbac import Subject, subjects_of
from webhook.model.rbac_index import RbacIndex
from webhook.model.readers import as_list, as_map, as_str, labels_of, name_of, namespace_of, strings
from webhook.policies.decision import ALLOW, Decision, Finding, short
from webhook.policies.rbac_violations import POLICY

LABEL: Final = "resource.kubernetes.io/admin-access"
RESOURCE_GROUP: Final = "resource.k8s.io"


def labelled(namespace: Mapping[str, Any] | None) -> bool:
    """Whether a Namespace dict carries the admin-access label with value "true"."""
    return isinstance(namespace, Mapping) and as_str(labels_of(namespace).get(LABEL)) == "true"


def review(request: Mapping[str, Any], *, requester_is_admin: bool) -> Decision:
    """Judge a Namespace CREATE/UPDATE (an AdmissionReview request dict): refused (403) when a
    non-admin makes the admin-access label "true"; anything else is allowed."""
    operation = as_str(request.get("operation"))
    if operation not in ("CREATE", "UPDATE") or requester_is_admin:
        return ALLOW
    obj, old = request.get("object"), request.get("oldObject") if operation == "UPDATE" else None
    if not labelled(obj if isinstance(obj, Mapping) else None) or labelled(old if isinstance(old, Mapping) else None):
        return ALLOW
    name = name_of(obj) if isinstance(obj, Mapping) else as_str(request.get("name"))
    user = as_str(as_map(request.get("userInfo")).get("username"))
    return Decision(
        findings=(
            Finding(
                policy=POLICY,
                kind="Namespace",
                name=name,
                check="admin-access-label",
                message=f'{user or "this user"} may not set {LABEL}="true" on Namespace {name}: ResourceClaims there could '
                f"ask for adminAccess to every device their requests select, devices in use by others included. "
                f"Only cluster admins (rbac.adminSubjects) set it; ask one, or request devices without adminAccess.",
                summary=short(f"dra-guard: only cluster admins may set {LABEL} on Namespace {name}"),
                details={"label": LABEL},
            ),
        )
    )


def claim_requests_admin_access(claim: Mapping[str, Any]) -> bool:
    """Whether a ResourceClaim dict, or a ResourceClaimTemplate dict (spec.spec), asks for
    adminAccess in any request (v1: requests[].exactly.adminAccess; v1beta1/v1beta2:
    requests[].adminAccess; firstAvailable subrequests too)."""
    spec = as_map(claim.get("spec"))
    if claim.get("kind") == "ResourceClaimTemplate":
        spec = as_map(spec.get("spec"))
    for request in as_list(as_map(spec.get("devices")).get("requests")):
        request = as_map(request)
        options = [request, as_map(request.get("exactly")), *map(as_map, as_list(request.get("firstAvailable")))]
        if any(option.get("adminAccess") is True for option in options):
            return True
    return False


def _grants_claim_create(rules: Any) -> bool:
    for rule in as_list(rules):
        rule = as_map(rule)
        groups, resources, verbs = strings(rule.get("apiGroups")), strings(rule.get("resources")), strings(rule.get("verbs"))
        if (
            ("*" in groups or RESOURCE_GROUP in groups)
            and ("*" in verbs or "create" in verbs)
            and (resource_ok(resources, "resourceclaims") or resource_ok(resources, "resourceclaimtemplates"))
        ):
            return True
    return False


def who_may_create_claims(index: RbacIndex, namespace: str) -> list[str]:
    """The subjects ("Group x", "ServiceAccount ns/name", ...) bound in `namespace` (RoleBindings
    there, and every ClusterRoleBinding) to a role that allows create on ResourceClaims or
    ResourceClaimTemplates, sorted; admins included (they are not told apart here)."""
    out: set[Subject] = set()
    bindings = [*index.bindings(), *(b for b in index.bindings(namespaced=True) if namespace_of(b) == namespace)]
    for binding in bindings:
        ref = as_map(binding.get("roleRef"))
        kind, name = as_str(ref.get("kind")), as_str(ref.get("name"))
        role = index.role(name, namespace_of(binding) if kind == "Role" else "")
        if role is not None and _grants_claim_create(role.get("rules")):
            out.update(subjects_of(binding))
    return sorted(str(s) for s in out)


def audit(index: RbacIndex, objects: Mapping[str, list[dict[str, Any]]]) -> Iterator[Finding]:
    """Advisory findings: every Namespace labelled for admin access (check
    ``admin-access-namespace``, with who may create ResourceClaims there) and every ResourceClaim
    or ResourceClaimTemplate asking for adminAccess (``admin-access-claim``). `objects`: kind ->
    object dicts (Namespaces, ResourceClaims, ResourceClaimTemplates among them when listed)."""
    spaces = sorted(name_of(ns) for ns in objects.get("Namespace", []) if labelled(ns))
    for space in spaces:
        who = who_may_create_claims(index, space)
        yield Finding(
            policy=POLICY,
            kind="Namespace",
            name=space,
            check="admin-access-namespace",
            enforced=False,
            message=f'Namespace {space} carries {LABEL}="true": its ResourceClaims may use any device with adminAccess, '
            f"devices in use by others included. Who may create ResourceClaims there: "
            f"{', '.join(who) if who else 'nobody but what RBAC gives cluster admins'}. Remove the label unless "
            f"an admin decided it (only rbac.adminSubjects may set it through dra-guard).",
            summary=short(f"dra-guard: Namespace {space} allows DRA adminAccess"),
            details={"label": LABEL, "mayCreateClaims": who},
        )
    for kind in ("ResourceClaim", "ResourceClaimTemplate"):
        for claim in objects.get(kind, []):
            if claim_requests_admin_access(claim):
                ns, name = namespace_of(claim), name_of(claim)
                yield Finding(
                    policy=POLICY,
                    kind=kind,
                    namespace=ns,
                    name=name,
                    check="admin-access-claim",
                    enforced=False,
                    message=f"{kind} {ns}/{name} asks for adminAccess: it may use every device its requests select, "
                    f"devices in use by others included (Namespace {ns} "
                    f'{"is" if ns in spaces else "is not"} labelled {LABEL}="true").',
                    summary=short(f"dra-guard: {kind} {ns}/{name} uses DRA adminAccess"),
                    details={"label": LABEL},
                )
