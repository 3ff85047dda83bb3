"""Escalation powers: PolicyRules that are as good as DRA write, because they let a user act as,
or switch off, someone who holds it (docs/threat-model.md lists every path).

Source: Kubernetes "Role Based Access Control Good Practices", section "Privilege escalation
risks" (impersonate, bind/escalate, serviceaccounts/token, workload creation, secrets, admission
webhooks, nodes/proxy, CSR approval), matched with the RBAC authorizer's rules
(k8s.io/kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go: "*" matches every group, resource and
verb; "*/<subresource>" matches that subresource of every resource; resourceNames narrows).

A power is returned as a webhook.model.rbac.Grant whose `resource` names the power (e.g.
"impersonate:groups", "validatingwebhookconfigurations", "pods/exec", "secrets") and whose
`namespaced` says whether a RoleBinding grants it in its namespace (namespaced powers matter in
the sensitive namespaces only: those whose ServiceAccounts hold DRA write).
Pure: plain dicts in, Grants out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from webhook.config import ESCALATION_CHECKS, RbacConfig
from webhook.model.rbac import Grant
from webhook.model.readers import as_list, as_map, strings

#: the check names of rbac.escalationChecks (all on by default)
CHECKS: Final = ESCALATION_CHECKS

ADMISSION_GROUP: Final = "admissionregistration.k8s.io"
ADMISSION_RESOURCES: Final = (
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
)
RBAC_GROUP: Final = "rbac.authorization.k8s.io"
#: workload controllers: write on them runs pods as any ServiceAccount of the namespace
WORKLOADS: Final = (
    ("apps", "deployments"),
    ("apps", "daemonsets"),
    ("apps", "statefulsets"),
    ("apps", "replicasets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
    ("", "replicationcontrollers"),
)
WORKLOAD_VERBS: Final = frozenset({"create", "update", "patch"})
#: (group, resource, verbs, power name): namespaced powers that let a user act as a ServiceAccount
#: of the namespace (or read what stands for one)
NAMESPACE_POWERS: Final = (
    ("", "serviceaccounts/token", frozenset({"create"}), "serviceaccounts/token"),
    # create runs a pod as any ServiceAccount of the namespace; update/patch swaps a running pod's image
    # (the kubelet restarts it with the same token and host mounts)
    ("", "pods", frozenset({"create", "update", "patch"}), "pods"),
    ("", "pods/exec", frozenset({"create", "get"}), "pods/exec"),
    ("", "pods/attach", frozenset({"create", "get"}), "pods/attach"),
    ("", "pods/ephemeralcontainers", frozenset({"update", "patch"}), "pods/ephemeralcontainers"),
    ("", "secrets", frozenset({"get", "list", "watch", "create", "update", "patch"}), "secrets"),
    # a Job's pod template is immutable once created: update/patch only suspends, resumes or
    # relabels it (cluster-autoscaler's chart patches Jobs everywhere); creating one runs a pod
    *((g, r, frozenset({"create"}) if r == "jobs" else WORKLOAD_VERBS, r) for g, r in WORKLOADS),
)
_WRITE: Final = frozenset({"create", "update", "patch", "delete"})
#: extra namespaced powers in dra-guard's own namespace: its configuration, and where the apiserver
#: sends its reviews (its Service, and EndpointSlices: an endpoint of one's own gets the reviews or
#: makes them fail). Not Endpoints: the apiserver finds a webhook through the Service's ClusterIP
#: or its EndpointSlices (kube-apiserver buildServiceResolver), and the Endpoints of a Service with
#: a selector are never mirrored into EndpointSlices (the endpointslicemirroring controller).
#: Not its Leases: whoever holds the audit's or the certificates' Lease stops them and a forged
#: eviction record holds a driver pod for a minute at most, a denial of service the gauges report
#: (docs/threat-model.md, row 22), while Lease write in every namespace is what each leader-electing
#: controller's chart asks for (cluster-autoscaler, Karpenter, NVIDIA's).
GUARD_NAMESPACE_POWERS: Final = (
    ("", "configmaps", _WRITE, "configmaps"),
    ("", "services", _WRITE, "services"),
    ("discovery.k8s.io", "endpointslices", _WRITE, "endpointslices"),
)
#: extra namespaced powers in a declared driver's namespace (drivers.declared): deleting its pods takes
#: a DRA driver off its node, which the drain order forbids while claims need it (refused at
#: admission too: eviction.guardDeletes); elsewhere pod deletion is every autoscaler's and operator's
#: everyday right, not an escalation
DRIVER_NAMESPACE_POWERS: Final = (("", "pods", frozenset({"delete", "deletecollection"}), "pods:delete"),)
#: every namespaced power name a DRA driver subject may hold (drivers run controllers of their own)
NAMESPACE_POWER_NAMES: Final = frozenset(p[3] for p in NAMESPACE_POWERS + GUARD_NAMESPACE_POWERS + DRIVER_NAMESPACE_POWERS)

#: cluster-scoped powers over the API dra-guard and everyone else reads: (group, resource, power name).
#: An APIService with spec.service makes the aggregator proxy a whole group/version (e.g.
#: v1.resource.k8s.io) to a Service of one's own; FlowSchemas and PriorityLevelConfigurations can
#: throttle dra-guard's watches (API Priority and Fairness) until its caches go stale.
API_ROUTING: Final = (
    ("apiregistration.k8s.io", "apiservices", "apiservices"),
    ("flowcontrol.apiserver.k8s.io", "flowschemas", "flowschemas"),
    ("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations", "prioritylevelconfigurations"),
)
#: kubelet client certificates: create on these CSR subresources is what the controller manager's
#: csrapproving controller checks before it auto-approves a CSR for system:node:<any name> (the Node
#: authorizer and NodeRestriction then let that identity write the node's ResourceSlices)
NODE_CLIENT_CSRS: Final = ("certificatesigningrequests/nodeclient", "certificatesigningrequests/selfnodeclient")

#: DRA admin access: the Namespace label resource.kubernetes.io/admin-access lets its ResourceClaims
#: use any device. The apiserver keeps label changes made through the status and finalize
#: subresources too (seen on v1.37), so update/patch on each is the same power.
NAMESPACE_LABEL_WRITERS: Final = ("namespaces", "namespaces/status", "namespaces/finalize")
#: allocating devices: writing a ResourceClaim's status.allocation/reservedFor needs update/patch on
#: resourceclaims/status plus resourceclaims/binding (granular status authorization, on by default
#: since 1.36; without that feature gate resourceclaims/status alone). The apiserver does not check
#: the devices are free: the writer can allocate another tenant's device to a second claim.
#: Source: Kubernetes "Hardening Guide - Dynamic Resource Allocation", "DRA status update permissions".
CLAIM_ALLOCATION: Final = ("resourceclaims/status", "resourceclaims/binding")
#: the powers DRA drivers (rbac.driverSubjects) may hold wherever they are bound, like driverResources
DRIVER_POWERS: Final = frozenset(CLAIM_ALLOCATION)
#: namespaced powers that matter through a RoleBinding in every namespace, not only in the sensitive
#: ones: the devices are the cluster's, so allocating them to a claim of any namespace can hand out
#: another tenant's device (a RoleBinding of `cluster-admin` or of a `resource.k8s.io` `*` role
#: grants it in its namespace; the built-in `admin` and `edit` roles do not)
EVERY_NAMESPACE_POWERS: Final = frozenset(CLAIM_ALLOCATION)

#: impersonation: (group, resource, namespaced)
IMPERSONATE: Final = (
    ("", "users", False),
    ("", "groups", False),
    ("", "serviceaccounts", True),
    ("authentication.k8s.io", "uids", False),
)


#: the API group of each power name power_grants returns ("" for the core group), for messages
POWER_GROUPS: Final = {
    **{power: group for group, _, _, power in NAMESPACE_POWERS + GUARD_NAMESPACE_POWERS + DRIVER_NAMESPACE_POWERS},
    **{power: group for group, _, power in API_ROUTING},
    **dict.fromkeys(ADMISSION_RESOURCES, ADMISSION_GROUP),
    **{f"impersonate:{resource}": group for group, resource, _ in IMPERSONATE},
    **{
        f"{r}:{suffix}": RBAC_GROUP
        for r in ("clusterroles", "clusterrolebindings", "roles")
        for suffix in ("dra-guard", "bind-escalate")
    },
    **dict.fromkeys(("certificatesigningrequests/approval", *NODE_CLIENT_CSRS), "certificates.k8s.io"),
    "nodes/proxy": "",
    **dict.fromkeys(NAMESPACE_LABEL_WRITERS, ""),
    **dict.fromkeys(CLAIM_ALLOCATION, "resource.k8s.io"),
}


def _group_ok(groups: list[str], group: str) -> bool:
    return "*" in groups or group in groups


def resource_ok(resources: list[str], resource: str) -> bool:
    """Whether a rule's resources match `resource` ("pods" or "pods/exec"), as the authorizer does."""
    if "*" in resources or resource in resources:
        return True
    if "/" in resource:
        sub = resource.split("/", 1)[1]
        return f"*/{sub}" in resources
    return False


def _verbs(verbs: list[str], wanted: Iterable[str]) -> list[str]:
    return ["*"] if "*" in verbs else sorted(set(verbs) & set(wanted))


def power_grants(
    rules: Any,
    *,
    role: str,
    write_verbs: frozenset[str],
    checks: frozenset[str],
    guard_names: frozenset[str] = frozenset(),
    privileged_name: Callable[[str, str], bool] = lambda kind, name: True,
    role_grants: Callable[[str], bool] = lambda name: False,
) -> list[Grant]:
    """The escalation powers in a list of PolicyRules (rbac.authorization.k8s.io/v1 dicts).

    checks: which families to look for (CHECKS). guard_names: dra-guard's own ClusterRole and
    ClusterRoleBinding names (write on them, by resourceNames, is a power; write on every
    ClusterRole is the RBAC manager's right, judged object by object instead). Write on ConfigMaps
    and Services is returned too (GUARD_NAMESPACE_POWERS): it counts in dra-guard's own namespace only;
    pod deletion (DRIVER_NAMESPACE_POWERS) in the declared drivers' namespaces only.
    privileged_name(kind, name): whether an impersonation target named by resourceNames ("User",
    "Group" or "ServiceAccount") may hold DRA write; impersonation limited to names for which it
    answers False is no power. role_grants(name): whether ClusterRole `name` holds DRA write or a
    power (for bind/escalate limited by resourceNames; bind/escalate on every role is the RBAC
    manager's right). Malformed rules grant nothing.
    """
    out: set[Grant] = set()
    for rule in as_list(rules):
        rule = as_map(rule)
        groups, resources = strings(rule.get("apiGroups")), strings(rule.get("resources"))
        verbs, names = strings(rule.get("verbs")), strings(rule.get("resourceNames"))
        if not groups or not resources or not verbs:
            continue

        def add(
            group: str,
            resource: str,
            wanted: Iterable[str],
            power: str,
            namespaced: bool,
            groups: list[str] = groups,
            resources: list[str] = resources,
            verbs: list[str] = verbs,
        ) -> None:
            if _group_ok(groups, group) and resource_ok(resources, resource):
                out.update(Grant(resource=power, verb=v, role=role, namespaced=namespaced) for v in _verbs(verbs, wanted))

        if "impersonate" in checks:
            imp = [v for v in verbs if v == "*" or v.startswith("impersonate")]
            for group, resource, namespaced in IMPERSONATE:
                if not imp or not (_group_ok(groups, group) and resource_ok(resources, resource)):
                    continue
                kind = {"users": "User", "groups": "Group", "serviceaccounts": "ServiceAccount"}.get(resource, "")
                if names and kind and not any(privileged_name(kind, n) for n in names):
                    continue
                out.update(
                    Grant(resource=f"impersonate:{resource}", verb=v, role=role, namespaced=namespaced)
                    for v in (["*"] if "*" in imp else imp)
                )
        if "admission" in checks:
            for resource in ADMISSION_RESOURCES:
                add(ADMISSION_GROUP, resource, write_verbs, resource, False)
        if "guard-rbac" in checks and guard_names & set(names):
            for resource in ("clusterroles", "clusterrolebindings"):
                add(RBAC_GROUP, resource, write_verbs, f"{resource}:dra-guard", False)
        if "bind-escalate" in checks and names and any(role_grants(n) for n in names if n != role):
            for resource in ("clusterroles", "roles"):
                add(RBAC_GROUP, resource, ("bind", "escalate"), f"{resource}:bind-escalate", False)
        if "nodes-csr" in checks:
            add("", "nodes/proxy", ("get", "create"), "nodes/proxy", False)
            add(
                "certificates.k8s.io",
                "certificatesigningrequests/approval",
                ("update", "patch"),
                "certificatesigningrequests/approval",
                False,
            )
            for resource in NODE_CLIENT_CSRS:
                add("certificates.k8s.io", resource, ("create",), resource, False)
        if "api-routing" in checks:
            for group, resource, power in API_ROUTING:
                add(group, resource, write_verbs, power, False)
        if "admin-access" in checks:
            for resource in NAMESPACE_LABEL_WRITERS:
                add("", resource, ("update", "patch"), resource, False)
        if "claim-allocation" in checks:
            # namespaced, and counted in every namespace (EVERY_NAMESPACE_POWERS)
            for resource in CLAIM_ALLOCATION:
                add("resource.k8s.io", resource, ("update", "patch"), resource, True)
        if "namespace-powers" in checks:
            for group, resource, wanted, power in NAMESPACE_POWERS + GUARD_NAMESPACE_POWERS + DRIVER_NAMESPACE_POWERS:
                add(group, resource, wanted, power, True)
    return sorted(out)


#: identities impersonation of which is always a power, whatever the config says
ALWAYS_PRIVILEGED: frozenset[tuple[str, str]] = frozenset({("Group", "system:masters")})


def privileged(kind: str, name: str, config: RbacConfig) -> bool:
    """Whether an impersonation target named `name` ("User", "Group", or a ServiceAccount name in
    any namespace) may hold DRA write: admins, drivers, system:masters, dra-guard's ServiceAccount."""
    if (kind, name) in ALWAYS_PRIVILEGED:
        return True
    if kind == "ServiceAccount":
        entries = config.admin_subjects.service_accounts | config.driver_subjects.service_accounts
        return name in config.guard_names or any(e.split(":", 1)[1] in (name, "*") for e in entries)
    return any(s.contains(kind=kind, name=name) for s in (config.admin_subjects, config.driver_subjects))
