"""Builders of RBAC objects and AdmissionReviews for tests (plain dicts, the wire shapes)."""
from __future__ import annotations

import itertools
import uuid
from typing import Any

_counter = itertools.count()


def cluster_role(name: str, rules: list[dict[str, Any]] | None = None, *, labels: dict[str, str] | None = None,
                 aggregation: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A rbac.authorization.k8s.io/v1 ClusterRole dict."""
    obj: dict[str, Any] = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                           "metadata": {"name": name}, "rules": rules or []}
    if labels:
        obj["metadata"]["labels"] = labels
    if annotations:
        obj["metadata"]["annotations"] = annotations
    if aggregation is not None:
        obj["aggregationRule"] = {"clusterRoleSelectors": aggregation}
    return obj


def rule(resources: list[str], verbs: list[str], groups: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A PolicyRule dict (apiGroups default to resource.k8s.io)."""
    return {"apiGroups": groups if groups is not None else ["resource.k8s.io"], "resources": resources, "verbs": verbs, **extra}


def subject(kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """An RBAC Subject dict."""
    s: dict[str, Any] = {"kind": kind, "name": name}
    if kind == "ServiceAccount":
        s["namespace"] = namespace or "default"
    else:
        s["apiGroup"] = "rbac.authorization.k8s.io"
    return s


def binding(name: str, role: str, subjects: list[dict[str, Any]], *, kind: str = "ClusterRoleBinding",
            namespace: str | None = None, role_kind: str = "ClusterRole", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A ClusterRoleBinding (or RoleBinding with kind=, namespace=) dict."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, "subjects": subjects,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}}


def review(obj: dict[str, Any] | None, *, operation: str = "CREATE", old: dict[str, Any] | None = None,
           api_version: str = "admission.k8s.io/v1", user: str = "alice", groups: list[str] | None = None,
           dry_run: bool = False, kind: str | None = None) -> dict[str, Any]:
    """An AdmissionReview request for an RBAC object, as the kube-apiserver sends it."""
    target = obj if obj is not None else old
    assert target is not None
    k = kind or target["kind"]
    plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "RoleBinding": "rolebindings",
              "Role": "roles"}.get(k, k.lower() + "s")
    meta = target.get("metadata") or {}
    return {
        "apiVersion": api_version, "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": k},
            "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": plural},
            "requestKind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": k},
            "requestResource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": plural},
            "name": meta.get("name", ""), "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": user, "groups": groups if groups is not None else ["team-a", "system:authenticated"]},
            "object": obj, "oldObject": old, "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
        },
    }
