"""The objects of the e2e scenarios on nodes without a kubelet, as dicts: the DRA objects
(DeviceClass, a node's ResourceSlice, a claim template), Namespaces and consumer Pods; manifests()
makes the YAML stream `kubectl apply -f -` and `kubectl delete -f -` read."""

from __future__ import annotations

import json
from typing import Any


def device_class(name: str, driver: str, **spec: Any) -> dict[str, Any]:
    """A DeviceClass selecting every device of `driver` (CEL), with extra spec fields."""
    selectors = [{"cel": {"expression": f"device.driver == '{driver}'"}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": selectors, **spec},
    }


def node_slice(node: str, driver: str, devices: tuple[str, ...] = ("gpu-0",)) -> dict[str, Any]:
    """The ResourceSlice `<node>-gpu` of `driver` on `node` (its own pool, one slice) with `devices`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device} for device in devices],
        },
    }


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def claim_template(namespace: str, device_class: str, name: str = "gpu") -> dict[str, Any]:
    """A ResourceClaimTemplate `name` asking for exactly one device of `device_class`."""
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def consumer(name: str, namespace: str, node: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    """A Pod on `node` (nodeSelector; `tolerations`: a node without a kubelet is soon tainted) whose
    container uses a claim made from the template `gpu`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": tolerations,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [{"name": "c", "image": "registry.example/app:v1", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def manifests(*objects: dict[str, Any]) -> str:
    """The objects as one YAML stream (for kubectl's -f -)."""
    return "".join(f"---\n{json.dumps(obj)}\n" for obj in objects)


#: the RBAC a `dra-guard drain` user needs (webhook.kube.nodedrain.REQUIRED), Events on the Node
#: and the RBAC lists it reads once for driver detection; no nodes/proxy (the kubelet's gauge)
DRAIN_USER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles", "clusterrolebindings"], "verbs": ["list"]},
]
