"""What the RBAC index keeps of each object (memory: 50,000 roles and bindings at the scalability envelope).

Slimmed copies: no managedFields, no annotations but those dra-guard reads (kubectl's
last-applied-configuration is a copy of the whole object), and the repeated short strings of
rules and subjects ("get", "pods", "apps", "Group") interned. Pure.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from webhook.model.bootstrap import AUTOUPDATE
from webhook.model.claims import pod_is_relevant
from webhook.model.readers import annotations_of, as_list, as_map, labels_of, name_of, namespace_of

#: the annotations dra-guard reads (bootstrap autoupdate, break-glass); others, such as kubectl's
#: last-applied-configuration (a copy of the whole object), are not kept (memory)
#: a ClusterRoleBinding with this annotation (value: a reason) may give DRA write (policies/rbac.py)
BREAK_GLASS_ANNOTATION = "dra-guard.io/allow-dra-write"
KEPT_ANNOTATIONS = (AUTOUPDATE, BREAK_GLASS_ANNOTATION)


def _kept_annotations(obj: Mapping[str, Any]) -> dict[str, Any]:
    annotations = annotations_of(obj)
    return {k: annotations[k] for k in KEPT_ANNOTATIONS if k in annotations}


def compact(value: Any) -> Any:
    """A copy of a parsed JSON value with every short string interned: RBAC rules and subjects
    repeat the same verbs, resources, groups and kinds in every role ("get", "pods", "apps"), and
    50,000 roles would otherwise hold a string object for each. Lists stay
    lists (the readers expect them)."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= 64 else value
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, Mapping):
        return {sys.intern(str(k)): compact(v) for k, v in value.items()}
    return value


def slim_role(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the index keeps of a ClusterRole or Role dict: name, namespace, labels, the kept
    annotations, rules and aggregationRule, strings interned."""
    ns = namespace_of(obj)
    return {
        "metadata": {
            "name": name_of(obj),
            "labels": compact(dict(labels_of(obj))),
            "annotations": _kept_annotations(obj),
            **({"namespace": ns} if ns else {}),
        },
        "rules": compact(as_list(obj.get("rules"))),
        **({"aggregationRule": compact(obj["aggregationRule"])} if isinstance(obj.get("aggregationRule"), Mapping) else {}),
    }


def slim_binding(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the index keeps of a ClusterRoleBinding or RoleBinding dict: name, namespace, uid (the
    audit's reports name the binding by it), the kept annotations, roleRef and subjects, strings interned."""
    ns = namespace_of(obj)
    uid = as_map(obj.get("metadata")).get("uid")
    return {
        "metadata": {
            "name": name_of(obj),
            "annotations": _kept_annotations(obj),
            **({"namespace": ns} if ns else {}),
            **({"uid": uid} if isinstance(uid, str) and uid else {}),
        },
        "roleRef": compact(dict(as_map(obj.get("roleRef")))),
        "subjects": compact(as_list(obj.get("subjects"))),
    }


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def audit_view(obj: dict[str, Any]) -> dict[str, Any] | None:
    """What `dra-guard audit --cluster` keeps of one listed object (kind set), or None to drop it
    (so that the audit of a 5,000-node cluster stays within 1 GiB). Every kind loses managedFields
    (a ResourceSlice keeps each entry's apiVersion and manager: the beta-API check reads them) and
    kubectl's last-applied annotation; a Pod outside kube-system is kept only when the claim index
    would keep it (DaemonSet-owned or using claims), and then only what PodInfo reads; a
    ResourceClaim keeps its status, a ResourceSlice its driver, node and pool, a Node its name,
    labels and nodeInfo (the kubelet version). RBAC objects, DaemonSets, kube-system Pods and
    ConfigMaps are kept whole otherwise: the admission policies and control-plane checks read them."""
    meta = dict(as_map(obj.get("metadata")))
    managed = meta.pop("managedFields", None)
    annotations = as_map(meta.get("annotations"))
    if LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    kind = obj.get("kind")
    if kind == "Pod" and meta.get("namespace") != "kube-system":
        if not pod_is_relevant(obj):
            return None
        spec, status = as_map(obj.get("spec")), as_map(obj.get("status"))
        keep = ("name", "namespace", "uid", "ownerReferences", "deletionTimestamp")
        return {
            "kind": kind,
            "metadata": {k: meta[k] for k in keep if k in meta},
            "spec": {k: spec[k] for k in ("nodeName", "resourceClaims") if k in spec},
            "status": {
                **{
                    k: status[k]
                    for k in ("phase", "conditions", "extendedResourceClaimStatus", "resourceClaimStatuses")
                    if k in status
                },
                # whether a container still runs (a terminal phase is trusted only without one)
                **{
                    k: [{"state": as_map(c).get("state") or {}} for c in as_list(status[k])]
                    for k in ("containerStatuses", "initContainerStatuses")
                    if k in status
                },
            },
        }
    if kind == "ResourceClaim":
        return {"kind": kind, "apiVersion": obj.get("apiVersion"), "metadata": meta, "status": obj.get("status") or {}}
    if kind == "ResourceSlice":
        spec = as_map(obj.get("spec"))
        meta["managedFields"] = [
            {"apiVersion": e.get("apiVersion"), "manager": e.get("manager")} for e in map(as_map, as_list(managed))
        ]
        return {
            "kind": kind,
            "apiVersion": obj.get("apiVersion"),
            "metadata": meta,
            "spec": {k: spec[k] for k in ("driver", "nodeName", "pool") if k in spec},
        }
    if kind == "Node":
        node_info = as_map(as_map(obj.get("status")).get("nodeInfo"))
        return {
            "kind": kind,
            "metadata": {k: meta[k] for k in ("name", "labels") if k in meta},
            "status": {"nodeInfo": dict(node_info)},
        }
    return {**obj, "metadata": meta}
