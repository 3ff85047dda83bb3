"""Fill a real kube-apiserver with the objects dra-guard caches, at the scale issue 9 names.

`fill(cp, scale)` creates, through the API (POST, and PATCH of /status for claims):

* `scale.roles` ClusterRoles ``bench-role-NNNNN`` with ordinary rules (a mix of core, apps, batch
  reads and writes; every 100th one reads resource.k8s.io), and the same number of
  ClusterRoleBindings ``bench-binding-NNNNN`` binding each to a Group ``team-NN``, a User or a
  ServiceAccount;
* one ClusterRole ``bench-slice-writer`` that may write ResourceSlices (only the driver may be
  bound to it) and a binding of it to the driver's ServiceAccount;
* a DeviceClass, `scale.nodes` ResourceSlices (one per node ``bench-node-NNNNN``, 8 devices);
* the DRA driver DaemonSet ``dra-system/gpu-driver`` (shaped like dra-example-driver's chart)
  and `scale.driver_pods` pods owned by it, one per node (``nodeName`` set: no scheduler needed);
* `scale.claims` ResourceClaims in namespace ``bench-work``, allocated on the nodes in turn
  and reserved for a pod ``consumer-NNNNN`` (status written through the status subresource, as
  the scheduler does).

Nodes themselves are not created: dra-guard does not watch them and the apiserver does not
check ``nodeName``. Everything goes through `concurrent.futures` threads, one requests Session each.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import requests

DRIVER = "gpu.example.com"
DRIVER_NAMESPACE = "dra-system"
DRIVER_DAEMONSET = "gpu-driver"
WORK_NAMESPACE = "bench-work"
DEVICE_CLASS = "bench-gpu"
SLICE_WRITER_ROLE = "bench-slice-writer"
LABEL = {"bench.dra-guard.io/fill": "true"}

_ORDINARY_RULES = [
    [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]}],
    [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments", "replicasets"],
            "verbs": ["get", "list", "watch", "update", "patch"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
    ],
    [{"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": ["*"]}],
    [
        {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": ["get", "list"]},
    ],
]
_DRA_READ_RULE = {
    "apiGroups": ["resource.k8s.io"],
    "resources": ["deviceclasses", "resourceslices"],
    "verbs": ["get", "list", "watch"],
}


@dataclasses.dataclass(frozen=True)
class Scale:
    """How many objects to create. Defaults are issue 9's figures."""

    roles: int = 5000  # ClusterRoles, and as many ClusterRoleBindings
    nodes: int = 1000  # ResourceSlices (one per node) and driver pods (one per node)
    claims: int = 10000  # allocated, reserved ResourceClaims, spread over the nodes
    threads: int = 8  # concurrent API clients while filling

    @property
    def driver_pods(self) -> int:
        """One driver pod per node."""
        return self.nodes


def node_name(i: int) -> str:
    """Name of the i-th (fake) node."""
    return f"bench-node-{i:05d}"


def driver_pod_name(i: int) -> str:
    """Name of the driver pod on node i."""
    return f"gpu-driver-{i:05d}"


def cluster_role(i: int) -> dict[str, Any]:
    """The i-th ordinary ClusterRole (rbac.authorization.k8s.io/v1 dict)."""
    rules = [dict(r) for r in _ORDINARY_RULES[i % len(_ORDINARY_RULES)]]
    if i % 100 == 0:
        rules.append(_DRA_READ_RULE)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"bench-role-{i:05d}", "labels": LABEL},
        "rules": rules,
    }


def cluster_role_binding(i: int) -> dict[str, Any]:
    """The i-th ClusterRoleBinding, of bench-role-i to a Group, a User or a ServiceAccount."""
    kind = ("Group", "User", "ServiceAccount")[i % 3]
    subject: dict[str, Any] = {"kind": kind, "name": f"team-{i % 50:02d}" if kind == "Group" else f"user-{i:05d}"}
    if kind == "ServiceAccount":
        subject.update(name=f"sa-{i:05d}", namespace=WORK_NAMESPACE)
    else:
        subject["apiGroup"] = "rbac.authorization.k8s.io"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"bench-binding-{i:05d}", "labels": LABEL},
        "subjects": [subject],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"bench-role-{i:05d}"},
    }


def slice_writer_objects() -> list[dict[str, Any]]:
    """The ClusterRole that may write ResourceSlices and its binding to the driver's ServiceAccount."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": SLICE_WRITER_ROLE, "labels": LABEL},
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceslices"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": SLICE_WRITER_ROLE, "labels": LABEL},
        "subjects": [{"kind": "ServiceAccount", "name": DRIVER_DAEMONSET, "namespace": DRIVER_NAMESPACE}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SLICE_WRITER_ROLE},
    }
    return [role, binding]


def resource_slice(i: int, devices: int = 8) -> dict[str, Any]:
    """The ResourceSlice of node i (resource.k8s.io/v1), `devices` GPUs."""
    node = node_name(i)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu", "labels": LABEL},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{d}"} for d in range(devices)],
        },
    }


def driver_daemonset() -> dict[str, Any]:
    """The DRA driver DaemonSet (apps/v1), shaped like dra-example-driver's chart."""
    from tests.builders import driver_daemonset as shaped

    ds = shaped(name=DRIVER_DAEMONSET, namespace=DRIVER_NAMESPACE, sa=DRIVER_DAEMONSET)
    ds["metadata"]["labels"] = LABEL
    return ds


def driver_pod(i: int, ds_uid: str) -> dict[str, Any]:
    """The driver pod on node i, owned by the DaemonSet with uid `ds_uid`."""
    ds = driver_daemonset()
    spec = dict(ds["spec"]["template"]["spec"], nodeName=node_name(i))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": driver_pod_name(i),
            "namespace": DRIVER_NAMESPACE,
            "labels": {**ds["spec"]["template"]["metadata"]["labels"], **LABEL},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": DRIVER_DAEMONSET,
                    "uid": ds_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def resource_claim(i: int) -> dict[str, Any]:
    """The i-th ResourceClaim (resource.k8s.io/v1) as created: one GPU request, no status."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{i:05d}", "namespace": WORK_NAMESPACE, "labels": LABEL},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}},
    }


def claim_status(i: int, nodes: int) -> dict[str, Any]:
    """The status the scheduler would write for claim i: allocated on node i % nodes, reserved for
    pod consumer-i."""
    node = node_name(i % nodes)
    return {
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{(i // nodes) % 8}"}]},
                "nodeSelector": {
                    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
                },
            },
            "reservedFor": [{"resource": "pods", "name": f"consumer-{i:05d}", "uid": f"00000000-0000-4000-8000-{i:012d}"}],
        }
    }


class _Clients:
    """One requests.Session per thread, authenticated as the cluster admin."""

    def __init__(self, make: Callable[[], requests.Session]) -> None:
        self._make = make
        self._local = threading.local()

    def get(self) -> requests.Session:
        sess = getattr(self._local, "sess", None)
        if sess is None:
            sess = self._local.sess = self._make()
        return sess


def _post_all(
    cp: Any,
    clients: _Clients,
    path: str,
    objects: Iterable[dict[str, Any]],
    threads: int,
    then: Callable[[requests.Session, dict[str, Any]], None] | None = None,
) -> int:
    """POST every object to cp.url + path (409 AlreadyExists counts as done); return how many."""

    def one(obj: dict[str, Any]) -> None:
        sess = clients.get()
        for attempt in range(5):
            resp = sess.post(cp.url + path.format(**obj["metadata"]), json=obj, timeout=30)
            if resp.status_code in (200, 201, 409):
                break
            if resp.status_code != 429 and resp.status_code < 500:
                raise RuntimeError(f"creating {obj['kind']} {obj['metadata']['name']}: HTTP {resp.status_code} {resp.text[:300]}")
            time.sleep(0.2 * (attempt + 1))
        else:
            raise RuntimeError(f"creating {obj['kind']} {obj['metadata']['name']}: HTTP {resp.status_code} {resp.text[:300]}")
        if then is not None:
            then(sess, obj)

    count = 0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for future in concurrent.futures.as_completed([pool.submit(one, o) for o in objects]):
            future.result()
            count += 1
    return count


def fill(cp: Any, scale: Scale = Scale(), *, log: Callable[[str], None] = print) -> dict[str, float]:
    """Create the objects of `scale` through `cp` (a tests.e2e.cluster.ControlPlane) as admin.

    Returns {"objects": count, "seconds": wall time}. Raises RuntimeError when the apiserver
    refuses an object for another reason than AlreadyExists.
    """
    started = time.monotonic()
    clients = _Clients(lambda: cp.session("admin"))
    sess = clients.get()
    for ns in (DRIVER_NAMESPACE, WORK_NAMESPACE):
        sess.post(
            f"{cp.url}/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, timeout=10
        )
    total = 0
    total += _post_all(
        cp,
        clients,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        [cluster_role(i) for i in range(scale.roles)] + slice_writer_objects()[:1],
        scale.threads,
    )
    total += _post_all(
        cp,
        clients,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        [cluster_role_binding(i) for i in range(scale.roles)] + slice_writer_objects()[1:],
        scale.threads,
    )
    log(f"  {2 * scale.roles + 2} ClusterRoles/ClusterRoleBindings after {time.monotonic() - started:.0f} s")
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }
    total += _post_all(cp, clients, "/apis/resource.k8s.io/v1/deviceclasses", [device_class], 1)
    total += _post_all(
        cp, clients, "/apis/resource.k8s.io/v1/resourceslices", [resource_slice(i) for i in range(scale.nodes)], scale.threads
    )
    ds = driver_daemonset()
    resp = sess.post(f"{cp.url}/apis/apps/v1/namespaces/{DRIVER_NAMESPACE}/daemonsets", json=ds, timeout=10)
    if resp.status_code == 409:
        resp = sess.get(f"{cp.url}/apis/apps/v1/namespaces/{DRIVER_NAMESPACE}/daemonsets/{DRIVER_DAEMONSET}", timeout=10)
    resp.raise_for_status()
    ds_uid = resp.json()["metadata"]["uid"]
    total += _post_all(
        cp,
        clients,
        "/api/v1/namespaces/{namespace}/pods",
        [driver_pod(i, ds_uid) for i in range(scale.driver_pods)],
        scale.threads,
    )
    log(f"  {scale.nodes} ResourceSlices and driver pods after {time.monotonic() - started:.0f} s")

    def allocate(sess: requests.Session, claim: dict[str, Any]) -> None:
        i = int(claim["metadata"]["name"].split("-")[1])
        url = f"{cp.url}/apis/resource.k8s.io/v1/namespaces/{WORK_NAMESPACE}/resourceclaims/{claim['metadata']['name']}/status"
        resp = sess.patch(
            url, json=claim_status(i, scale.nodes), timeout=30, headers={"Content-Type": "application/merge-patch+json"}
        )
        if resp.status_code != 200:
            raise RuntimeError(f"allocating {claim['metadata']['name']}: HTTP {resp.status_code} {resp.text[:300]}")

    total += _post_all(
        cp,
        clients,
        "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        [resource_claim(i) for i in range(scale.claims)],
        scale.threads,
        then=allocate,
    )
    seconds = time.monotonic() - started
    log(f"  {scale.claims} allocated ResourceClaims after {seconds:.0f} s ({total} objects)")
    return {"objects": total, "seconds": round(seconds, 1)}
