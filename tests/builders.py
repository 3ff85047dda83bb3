"""Builders of Kubernetes objects and AdmissionReviews for tests and bench/ (plain dicts, the wire
shapes): RBAC objects, DRA driver DaemonSets shaped like dra-example-driver's chart, Pods,
allocated ResourceClaims, eviction requests."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from webhook.config import from_mapping
from webhook.model.claim_index import ClaimIndex

DRIVER = "gpu.example.com"

_counter = itertools.count()


def cluster_role(
    name: str,
    rules: list[dict[str, Any]] | None = None,
    *,
    labels: dict[str, str] | None = None,
    aggregation: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A rbac.authorization.k8s.io/v1 ClusterRole dict."""
    obj: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules or [],
    }
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


def binding(
    name: str,
    role: str,
    subjects: list[dict[str, Any]],
    *,
    kind: str = "ClusterRoleBinding",
    namespace: str | None = None,
    role_kind: str = "ClusterRole",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ClusterRoleBinding (or RoleBinding with kind=, namespace=) dict."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "subjects": subjects,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
    }


def review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    api_version: str = "admission.k8s.io/v1",
    user: str = "alice",
    groups: list[str] | None = None,
    dry_run: bool = False,
    kind: str | None = None,
) -> dict[str, Any]:
    """An AdmissionReview request for an RBAC object, as the kube-apiserver sends it."""
    target = obj if obj is not None else old
    assert target is not None
    k = kind or target["kind"]
    plural = {
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "RoleBinding": "rolebindings",
        "Role": "roles",
    }.get(k, k.lower() + "s")
    meta = target.get("metadata") or {}
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": k},
            "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": plural},
            "requestKind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": k},
            "requestResource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": plural},
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": user, "groups": groups if groups is not None else ["team-a", "system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
        },
    }


def driver_daemonset(
    *,
    name="gpu-driver",
    namespace="gpu",
    containers=None,
    cdi=True,
    plugin_subdir="gpu.example.com",
    annotations=None,
    labels=None,
    strategy=None,
    sa="gpu-driver",
):
    """A DRA driver DaemonSet shaped like dra-example-driver's chart."""
    volumes = [
        {"name": "plugins-registry", "hostPath": {"path": "/var/lib/kubelet/plugins_registry"}},
        {"name": "plugins", "hostPath": {"path": f"/var/lib/kubelet/plugins/{plugin_subdir}".rstrip("/")}},
    ]
    if cdi:
        volumes.append({"name": "cdi", "hostPath": {"path": "/var/run/cdi"}})
    if containers is None:
        mounts = ("plugins-registry", "plugins", "cdi") if cdi else ("plugins-registry", "plugins")
        containers = [plugin_container("plugin", args=["--healthcheck-port=51515"], mounts=mounts)]
    meta = {"name": name, "namespace": namespace}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"serviceAccountName": sa, "containers": containers, "volumes": volumes},
            },
        },
    }
    if strategy is not None:
        ds["spec"]["updateStrategy"] = strategy
    return ds


def plugin_container(name, *, args=None, env=None, ports=None, mounts=("plugins-registry", "plugins", "cdi"), **extra):
    """A kubelet plugin container dict mounting the volumes named in `mounts`."""
    c = {
        "name": name,
        "image": "registry.example/driver:v1",
        "volumeMounts": [{"name": m, "mountPath": f"/mnt/{m}"} for m in mounts],
        **extra,
    }
    if args is not None:
        c["args"] = args
    if env is not None:
        c["env"] = env
    if ports is not None:
        c["ports"] = ports
    return c


def pod(name, node, *, namespace="work", claims=("gpu",), phase="Running", terminating=False, ds=None, uid=None, extended=None):
    """A core/v1 Pod dict on `node`: a claim consumer, or with `ds` a DaemonSet's pod. With
    `extended` (a claim name) it asks extended resource example.com/fabric-gpu, lists no claim, and
    its status names the claim the scheduler made for it (status.extendedResourceClaimStatus)."""
    meta = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    if ds:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds, "uid": "x", "controller": True}]
    spec = {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}
    status: dict[str, Any] = {"phase": phase}
    if extended:
        spec["containers"][0]["resources"] = {
            "requests": {"example.com/fabric-gpu": "1"},
            "limits": {"example.com/fabric-gpu": "1"},
        }
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": extended,
            "requestMappings": [
                {"containerName": "c", "resourceName": "example.com/fabric-gpu", "requestName": "container-0-request-0"}
            ],
        }
    elif claims and not ds:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def claim(
    name,
    *,
    driver=DRIVER,
    node="node-a",
    reserved=("consumer",),
    namespace="work",
    api="resource.k8s.io/v1",
    labels=None,
    consumers=(),
):
    """An allocated ResourceClaim dict (node-local on `node`, usable anywhere with node None, or
    with `labels` ({key: value}) on the nodes with those labels) reserved by pods `reserved` and
    by `consumers` ((apiGroup, resource, name): reservedFor entries that are not pods)."""
    alloc = {"devices": {"results": [{"request": "gpu", "driver": driver, "pool": node or "net", "device": "gpu-0"}]}}
    if labels:
        alloc["nodeSelector"] = {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]}]
        }
    elif node:
        alloc["nodeSelector"] = {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        }
    refs = [{"resource": "pods", "name": r, "uid": f"uid-{namespace}-{r}"} for r in reserved]
    refs += [{"apiGroup": g, "resource": res, "name": n, "uid": f"uid-{n}"} for g, res, n in consumers]
    return {
        "apiVersion": api,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"allocation": alloc, "reservedFor": refs},
    }


def node_object(name, labels=None):
    """A core/v1 Node dict with `labels` ({key: value})."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
    }


def eviction_request(name, namespace="gpu", *, api="policy/v1", dry_run=False, operation="CREATE"):
    """The AdmissionReview request dict for evicting (or with operation DELETE, deleting) pod namespace/name."""
    return {
        "uid": "u",
        "operation": operation,
        "subResource": "eviction" if operation == "CREATE" else "",
        "kind": {"group": "policy", "version": api.split("/")[1], "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": name,
        "namespace": namespace,
        "dryRun": dry_run,
        "userInfo": {"username": "admin", "groups": []},
        "object": {"apiVersion": api, "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}},
    }


def index_with(*objects):
    """A ClaimIndex with DaemonSet gpu/gpu-driver (pods on node-a and node-b) plus `objects` (Pods, ResourceClaims, Nodes)."""
    idx = ClaimIndex(from_mapping(None).detection)
    idx.upsert_daemonset(driver_daemonset(name="gpu-driver", namespace="gpu"))
    idx.upsert_pod(pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"))
    idx.upsert_pod(pod("gpu-driver-b", "node-b", namespace="gpu", ds="gpu-driver"))
    for obj in objects:
        {"Pod": idx.upsert_pod, "ResourceClaim": idx.upsert_claim, "Node": idx.nodes.upsert}[obj["kind"]](obj)
    return idx


def rbac_exception(*, expires: str, **overrides: Any) -> dict[str, Any]:
    """An `exceptions` entry of the configuration (policy rbac: ClusterRoleBinding team-gpu of
    slice-writer to Group team-a, resourceslices, owner team-gpu) expiring at `expires` (RFC 3339),
    with any field replaced by `overrides`."""
    entry = {
        "policy": "rbac",
        "kind": "ClusterRoleBinding",
        "name": "team-gpu",
        "roleRef": "slice-writer",
        "subjects": {"groups": ["team-a"]},
        "resources": ["resourceslices"],
        "reason": "vendor tool republishes slices until driver 2.1",
        "owner": "team-gpu",
        "expires": expires,
    }
    return {**entry, **overrides}


def finding(message: str = "m", **fields: Any) -> Any:
    """A policies.decision.Finding (policy rbac, ClusterRoleBinding b, check rbac-write, summary s)
    with `message` and any field replaced by `fields`."""
    from webhook.policies.decision import Finding

    base = {"policy": "rbac", "kind": "ClusterRoleBinding", "name": "b", "summary": "s", "check": "rbac-write"}
    return Finding(**{**base, "message": message, **fields})
