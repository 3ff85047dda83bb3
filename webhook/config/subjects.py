"""RBAC identities of the configuration: SubjectSet, the never-privileged identities, the
kube-system controllers trusted by default, and the escalation check names."""

from __future__ import annotations

import dataclasses
from typing import Final

from webhook.config.declare import key

# Identities that are never admins or drivers, whatever the config says: they stand for everyone
# (or every ServiceAccount), so granting them DRA write would grant it to the whole cluster.
# Source: Kubernetes RBAC docs, "Default roles and role bindings" / "Referring to subjects".
NEVER_PRIVILEGED_GROUPS: Final = frozenset({"system:authenticated", "system:unauthenticated", "system:serviceaccounts"})
NEVER_PRIVILEGED_GROUP_PREFIXES: Final = ("system:serviceaccounts:",)
NEVER_PRIVILEGED_USERS: Final = frozenset({"system:anonymous"})


#: rbac.escalationChecks: the families of escalation powers judged like DRA write (webhook.model.powers)
ESCALATION_CHECKS: Final = (
    "impersonate",
    "admission",
    "guard-rbac",
    "bind-escalate",
    "namespace-powers",
    "nodes-csr",
    "api-routing",
    "admin-access",
    "claim-allocation",
)

# kube-system ServiceAccounts the v1.37 bootstrap RBAC (the apiserver's default ClusterRoleBindings
# and kube-system RoleBindings) gives DRA write or an escalation power: the controllers of
# kube-controller-manager --use-service-account-credentials. Measured on the real apiserver
# (tests/e2e/test_cluster_audit.py fails when one is missing); any other kube-system
# ServiceAccount is judged like everyone else.
KUBE_SYSTEM_CONTROLLERS: Final = frozenset(
    f"kube-system:{name}"
    for name in (
        "bootstrap-signer",
        "certificate-controller",
        "cronjob-controller",
        "daemon-set-controller",
        "deployment-controller",
        "device-taint-eviction-controller",
        "endpoint-controller",
        "endpointslice-controller",
        "endpointslicemirroring-controller",
        "generic-garbage-collector",
        "job-controller",
        "legacy-service-account-token-cleaner",
        "namespace-controller",
        "node-controller",
        "persistent-volume-binder",
        "pod-garbage-collector",
        "replicaset-controller",
        "replication-controller",
        "resource-claim-controller",
        "resourcequota-controller",
        "root-ca-cert-publisher",
        "statefulset-controller",
        "storage-version-migrator-controller",
        "token-cleaner",
    )
)
#: users the v1.37 bootstrap ClusterRoleBindings give a power (the controller manager: secrets,
#: serviceaccounts/token; the scheduler: Leases in every namespace, dra-guard's included)
CONTROL_PLANE_USERS: Final = frozenset({"system:kube-controller-manager", "system:kube-scheduler"})


#: how a ServiceAccount may be written in a config list: the config's own "ns:name", the "ns/name"
#: dra-guard's messages print, and the username the apiserver authenticates it as; name may be *
SERVICE_ACCOUNT_PATTERN: Final = r"^(system:serviceaccount:[^:/]+:[^:/]+|[^:/]+[:/][^:/]+)$"
SERVICE_ACCOUNT_FORMS: Final = "'namespace:name', 'namespace/name' or 'system:serviceaccount:namespace:name' (name may be *)"
_SA_USER_PREFIX: Final = "system:serviceaccount:"


def service_account_entry(text: str) -> str:
    """A ServiceAccount entry of SERVICE_ACCOUNT_PATTERN in the one form SubjectSet matches,
    "ns:name" ("ns:*" stays); "ops/admin" and "system:serviceaccount:ops:admin" -> "ops:admin"."""
    if text.startswith(_SA_USER_PREFIX) and text.count(":") == 3:
        text = text[len(_SA_USER_PREFIX) :]
    return text.replace("/", ":", 1)


@dataclasses.dataclass(frozen=True)
class SubjectSet:
    """A set of RBAC identities: user names, group names and ServiceAccounts ("ns:name" / "ns:*";
    the config loader turns the other spellings of SERVICE_ACCOUNT_PATTERN into these)."""

    users: frozenset[str] = dataclasses.field(default=frozenset(), metadata=key("users", help="user names"))
    groups: frozenset[str] = dataclasses.field(
        default=frozenset(), metadata=key("groups", help="group names (system:authenticated and the like are never trusted)")
    )
    service_accounts: frozenset[str] = dataclasses.field(
        default=frozenset(),
        metadata=key(
            "serviceAccounts",
            pattern=SERVICE_ACCOUNT_PATTERN,
            pattern_help=SERVICE_ACCOUNT_FORMS,
            help="ServiceAccounts as namespace:name (or namespace/name, or system:serviceaccount:namespace:name), "
            "name * for every one of a namespace",
        ),
    )

    def union(self, other: SubjectSet) -> SubjectSet:
        """The identities of both sets."""
        return SubjectSet(
            users=self.users | other.users,
            groups=self.groups | other.groups,
            service_accounts=self.service_accounts | other.service_accounts,
        )

    def contains(self, *, kind: str, name: str, namespace: str = "") -> bool:
        """Whether an RBAC subject belongs to the set.

        kind is "User", "Group" or "ServiceAccount" (rbac.authorization.k8s.io/v1 Subject.kind).
        A User named ``system:serviceaccount:<ns>:<name>`` is the ServiceAccount <ns>/<name>, as the
        apiserver authenticates it. Never-privileged identities (system:authenticated, ...) are
        never members.
        """
        if kind == "Group":
            if name in NEVER_PRIVILEGED_GROUPS or name.startswith(NEVER_PRIVILEGED_GROUP_PREFIXES):
                return False
            return name in self.groups
        if kind == "User":
            if name in NEVER_PRIVILEGED_USERS:
                return False
            if name.startswith("system:serviceaccount:") and name.count(":") == 3:
                _, _, ns, sa = name.split(":")
                if self._has_service_account(ns, sa):
                    return True
            return name in self.users
        if kind == "ServiceAccount":
            return self._has_service_account(namespace, name)
        return False

    def _has_service_account(self, namespace: str, name: str) -> bool:
        return f"{namespace}:{name}" in self.service_accounts or f"{namespace}:*" in self.service_accounts

    def contains_requester(self, *, username: str, groups: list[str] | tuple[str, ...]) -> bool:
        """Whether an authenticated requester (AdmissionReview request.userInfo) is in the set."""
        if self.contains(kind="User", name=username):
            return True
        return any(self.contains(kind="Group", name=g) for g in groups)
