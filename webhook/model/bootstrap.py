"""The default rules of the apiserver's bootstrap ClusterRoles that dra-guard knows (docs/threat-model.md, path 7).

A ClusterRole annotated rbac.authorization.kubernetes.io/autoupdate: "true" is reconciled by the
apiserver at every start (k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy,
"Auto-reconciliation" in the RBAC docs): rules and aggregationRule stripped from it come back. So
such a role is judged by its current rules and its defaults together: stripping cluster-admin,
binding it, and waiting for a restart gets nothing past the guard.

Known defaults (the escalation-relevant part of the v1.37 bootstrap policy): cluster-admin (every
verb on every resource), admin, edit and view (their aggregationRules), and the members
system:aggregate-to-edit and system:aggregate-to-admin (workloads, pods and their exec/attach,
secrets, ServiceAccount impersonation, tokens, RoleBindings). Other bootstrap roles are judged by
their current rules only (docs/threat-model.md).

Offline (`dra-guard audit -f` on files that do not define them) the known bootstrap roles are
taken as the apiserver stores them (stored_role): every cluster has them, so a binding of
`cluster-admin` or `edit` is judged by their defaults rather than left unresolved.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from webhook.model.readers import annotations_of, name_of, namespace_of

AUTOUPDATE: Final = "rbac.authorization.kubernetes.io/autoupdate"


def _agg(label: str) -> dict[str, Any]:
    return {"clusterRoleSelectors": [{"matchLabels": {f"rbac.authorization.k8s.io/{label}": "true"}}]}


_WRITE: Final = ["create", "delete", "deletecollection", "patch", "update"]
_EDIT_RULES: Final = [
    {"apiGroups": [""], "resources": ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], "verbs": _WRITE},
    {
        "apiGroups": [""],
        "resources": ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
    {
        "apiGroups": [""],
        "resources": ["configmaps", "secrets", "services", "replicationcontrollers", "serviceaccounts", "serviceaccounts/token"],
        "verbs": _WRITE,
    },
    {"apiGroups": ["apps"], "resources": ["daemonsets", "deployments", "replicasets", "statefulsets"], "verbs": _WRITE},
    {"apiGroups": ["batch"], "resources": ["cronjobs", "jobs"], "verbs": _WRITE},
]
DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = {
    "cluster-admin": {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
    "admin": {"aggregationRule": _agg("aggregate-to-admin")},
    "edit": {"aggregationRule": _agg("aggregate-to-edit")},
    "view": {"aggregationRule": _agg("aggregate-to-view")},
    "system:aggregate-to-edit": {"rules": _EDIT_RULES},
    "system:aggregate-to-admin": {
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings", "roles"], "verbs": _WRITE}]
    },
}


_AGG: Final = "rbac.authorization.k8s.io/aggregate-to-"
#: the aggregation labels the bootstrap policy gives the known roles (edit is aggregated into admin,
#: view into edit)
LABELS: Final[Mapping[str, Mapping[str, str]]] = {
    "edit": {f"{_AGG}admin": "true"},
    "view": {f"{_AGG}edit": "true"},
    "system:aggregate-to-edit": {f"{_AGG}edit": "true"},
    "system:aggregate-to-admin": {f"{_AGG}admin": "true"},
}


def stored_role(name: str) -> dict[str, Any] | None:
    """Known bootstrap ClusterRole `name` as the apiserver stores it (an rbac.authorization.k8s.io/v1
    dict: its default rules or aggregationRule, aggregation labels, autoupdate "true"), or None
    when dra-guard does not know its defaults."""
    found = DEFAULTS.get(name)
    if found is None:
        return None
    labels = {"kubernetes.io/bootstrapping": "rbac-defaults", **LABELS.get(name, {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels, "annotations": {AUTOUPDATE: "true"}},
        **copy.deepcopy(dict(found)),
    }


def _defaults(role: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if namespace_of(role) or str(annotations_of(role).get(AUTOUPDATE, "")).lower() != "true":
        return None
    return DEFAULTS.get(name_of(role))


def default_rules(role: Mapping[str, Any]) -> list[Any]:
    """The default rules the apiserver restores in bootstrap ClusterRole `role` (a dict), or []
    when it is not a known bootstrap role or its autoupdate annotation is not "true"."""
    found = _defaults(role)
    return list(found.get("rules", [])) if found else []


def with_defaults(role: Mapping[str, Any]) -> Mapping[str, Any]:
    """`role` with its default aggregationRule when it is a known bootstrap role (autoupdate "true")
    whose current aggregationRule was removed; otherwise `role` itself."""
    found = _defaults(role)
    if not found or "aggregationRule" not in found or isinstance(role.get("aggregationRule"), Mapping):
        return role
    return {**role, "aggregationRule": found["aggregationRule"]}
