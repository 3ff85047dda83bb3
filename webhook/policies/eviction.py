"""Drain order: refuse evicting a DRA driver pod while its claims are still prepared on the node.

Source: "Good practices for DRA as a Cluster Admin", section "Draining nodes: drain the DRA driver
last": the driver un-prepares devices (NodeUnprepareResources) when the pods that used them go
away; if the driver leaves the node first, that cleanup cannot finish, the pods stay Terminating
(kubernetes/kubernetes#129402) and their devices cannot be reused. Custom drain logic should check
for allocated and reserved ResourceClaims before terminating the driver.

Decision: the driver pod of driver D on node N is still needed while a ResourceClaim has an
allocation result with ``driver == D`` on N (N from ``status.allocation.nodeSelector``, or the node of
a reserving pod for devices usable anywhere) and a ``status.reservedFor`` pod on N that has not
finished (a Terminating pod counts: it is the one waiting for the driver). Then the eviction is
refused with HTTP 429 TooManyRequests, which kubectl drain, cluster-autoscaler and Karpenter retry
like a PodDisruptionBudget refusal. Field shapes: resource.k8s.io v1 (v1beta1/v1beta2 have the
same status shape), policy/v1 Eviction.

ClaimIndex is the pure in-memory view the policy reads: webhook.cluster fills it from watches of
ResourceClaims, DaemonSets and (slimmed) Pods; `dra-guard drain-plan` fills it from lists.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.config import DetectionConfig, EvictionConfig
from webhook.policies import as_map as _map, as_list as _list, as_str as _str, ALLOW, Decision, Finding, drivers, short

POLICY = "eviction"


# --------------------------------------------------------------------------- slim records

@dataclasses.dataclass(frozen=True)
class PodInfo:
    """What the index keeps of a Pod: identity, node, whether it finished, its DaemonSet owner."""

    namespace: str
    name: str
    uid: str
    node: str
    finished: bool      # phase Succeeded or Failed
    terminating: bool   # metadata.deletionTimestamp set
    daemonset: str      # owning DaemonSet name ("" if none)
    uses_claims: bool   # spec.resourceClaims is not empty


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """Slim a core/v1 Pod dict into a PodInfo."""
    meta, spec, status = _map(pod.get("metadata")), _map(pod.get("spec")), _map(pod.get("status"))
    owner = next((_str(o.get("name")) for o in map(_map, _list(meta.get("ownerReferences")))
                  if o.get("kind") == "DaemonSet" and o.get("controller")), "")
    return PodInfo(namespace=_str(meta.get("namespace")), name=_str(meta.get("name")), uid=_str(meta.get("uid")),
                   node=_str(spec.get("nodeName")), finished=_str(status.get("phase")) in ("Succeeded", "Failed"),
                   terminating=bool(meta.get("deletionTimestamp")), daemonset=owner,
                   uses_claims=bool(_list(spec.get("resourceClaims"))))


def pod_is_relevant(pod: Mapping[str, Any]) -> bool:
    """Whether the index keeps this Pod: owned by a DaemonSet, or using ResourceClaims.

    Everything else is dropped at once, so memory follows DRA pods and DaemonSet pods, not all pods.
    """
    meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
    return bool(_list(spec.get("resourceClaims"))) or any(
        o.get("kind") == "DaemonSet" for o in map(_map, _list(meta.get("ownerReferences"))))


@dataclasses.dataclass(frozen=True)
class ClaimInfo:
    """What the index keeps of a ResourceClaim's status."""

    namespace: str
    name: str
    drivers: frozenset[str]            # allocation.devices.results[].driver
    nodes: frozenset[str]              # from allocation.nodeSelector (empty: usable anywhere)
    reserved_for: tuple[tuple[str, str], ...]  # (pod name, pod uid) of reservedFor entries for pods


def claim_nodes(node_selector: Any) -> frozenset[str]:
    """Node names a claim's allocation.nodeSelector (core/v1 NodeSelector) pins it to.

    Reads matchFields ``metadata.name In [...]`` (what the scheduler writes for node-local devices);
    an absent selector, or one it cannot read, gives the empty set (usable anywhere).
    """
    nodes: set[str] = set()
    for term in map(_map, _list(_map(node_selector).get("nodeSelectorTerms"))):
        for field in map(_map, _list(term.get("matchFields"))):
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                nodes.update(v for v in _list(field.get("values")) if isinstance(v, str))
    return frozenset(nodes)


def claim_info(claim: Mapping[str, Any]) -> ClaimInfo | None:
    """Slim a resource.k8s.io ResourceClaim dict (v1, v1beta2 or v1beta1); None when not allocated."""
    meta, status = _map(claim.get("metadata")), _map(claim.get("status"))
    allocation = _map(status.get("allocation"))
    if not allocation:
        return None
    results = _list(_map(allocation.get("devices")).get("results"))
    driver_names = frozenset(_str(r.get("driver")) for r in map(_map, results) if _str(r.get("driver")))
    reserved = tuple((_str(r.get("name")), _str(r.get("uid"))) for r in map(_map, _list(status.get("reservedFor")))
                     if r.get("resource") == "pods" and _str(r.get("name")))
    return ClaimInfo(namespace=_str(meta.get("namespace")), name=_str(meta.get("name")), drivers=driver_names,
                     nodes=claim_nodes(allocation.get("nodeSelector")), reserved_for=reserved)


@dataclasses.dataclass(frozen=True)
class Hold:
    """A claim that still needs driver D on node N, and the pods that hold it (namespace/name)."""

    claim: str   # namespace/name
    pods: tuple[str, ...]


# --------------------------------------------------------------------------- the index

def _claim_entry(claim: Mapping[str, Any]) -> tuple[tuple[str, str], ClaimInfo | None]:
    """A ResourceClaim dict as ((namespace, name), its ClaimInfo, None when unallocated)."""
    meta = _map(claim.get("metadata"))
    return (_str(meta.get("namespace")), _str(meta.get("name"))), claim_info(claim)


class ClaimIndex:
    """Thread-safe view of ResourceClaims, DaemonSets and relevant Pods for the eviction policy.

    Lookups used on the admission path are dict lookups: the pod being evicted by
    (namespace, name), its DaemonSet by (namespace, name), and claims by (driver, node).
    """

    def __init__(self, detection: DetectionConfig | None = None,
                 can_write_slices: Callable[[str, str], bool] = lambda ns, sa: False) -> None:
        self._lock = threading.RLock()
        self._detection = detection or DetectionConfig()
        self._can_write = can_write_slices
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._pods_by_uid: dict[str, PodInfo] = {}
        self._daemonsets: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._drivers: dict[tuple[str, str], drivers.Driver | None] = {}
        self._claims: dict[tuple[str, str], ClaimInfo] = {}
        self._by_driver_node: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._slots: dict[tuple[str, str], set[tuple[str, str]]] = {}  # claim -> its (driver, node) keys
        self._anywhere_by_pod: dict[tuple[str, str], set[tuple[str, str]]] = {}  # pod -> claims usable anywhere

    # -- pods
    def upsert_pod(self, pod: Mapping[str, Any]) -> None:
        """Add or replace a Pod (kept only when pod_is_relevant)."""
        if not pod_is_relevant(pod):
            meta = _map(pod.get("metadata"))
            self.delete_pod(_str(meta.get("namespace")), _str(meta.get("name")))
            return
        info = pod_info(pod)
        with self._lock:
            self._drop_pod((info.namespace, info.name))
            self._pods[(info.namespace, info.name)] = info
            if info.uid:
                self._pods_by_uid[info.uid] = info
            self._reindex_claims_of_pod(info)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Forget a Pod."""
        with self._lock:
            old = self._drop_pod((namespace, name))
            if old is not None:
                self._reindex_claims_of_pod(old)

    def _drop_pod(self, key: tuple[str, str]) -> PodInfo | None:
        old = self._pods.pop(key, None)
        if old is not None and self._pods_by_uid.get(old.uid) is old:
            del self._pods_by_uid[old.uid]
        return old

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Replace every Pod (after a relist). `pods` may be a stream of list pages: it is consumed,
        and reduced to PodInfo, before the lock is taken (reviews never wait on the network)."""
        infos = [pod_info(pod) for pod in pods if pod_is_relevant(pod)]
        with self._lock:
            self._pods.clear()
            self._pods_by_uid.clear()
            for info in infos:
                self._pods[(info.namespace, info.name)] = info
                if info.uid:
                    self._pods_by_uid[info.uid] = info
            self._reindex_all_claims()

    # -- daemonsets
    def upsert_daemonset(self, ds: Mapping[str, Any]) -> None:
        """Add or replace a DaemonSet; it is judged a driver or not at once."""
        meta = _map(ds.get("metadata"))
        key = (_str(meta.get("namespace")), _str(meta.get("name")))
        with self._lock:
            self._daemonsets[key] = ds
            self._drivers[key] = drivers.detect(ds, config=self._detection, can_write_slices=self._can_write)

    def delete_daemonset(self, namespace: str, name: str) -> None:
        """Forget a DaemonSet."""
        with self._lock:
            self._daemonsets.pop((namespace, name), None)
            self._drivers.pop((namespace, name), None)

    def replace_daemonsets(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Replace every DaemonSet (after a relist). `items` may be a stream of list pages: it is
        consumed before the lock is taken."""
        daemonsets = list(items)
        with self._lock:
            self._daemonsets.clear()
            self._drivers.clear()
            for ds in daemonsets:
                self.upsert_daemonset(ds)

    def redetect(self) -> None:
        """Judge every DaemonSet again (after RBAC changed what may write ResourceSlices)."""
        with self._lock:
            for key, ds in self._daemonsets.items():
                self._drivers[key] = drivers.detect(ds, config=self._detection, can_write_slices=self._can_write)

    # -- claims
    def upsert_claim(self, claim: Mapping[str, Any]) -> None:
        """Add or replace a ResourceClaim (unallocated claims are not kept)."""
        key, info = _claim_entry(claim)
        with self._lock:
            self._put_claim(key, info)

    def _put_claim(self, key: tuple[str, str], info: ClaimInfo | None) -> None:
        """Index one claim under `key` (namespace, name), replacing what was there; the lock is held."""
        self._unindex(key)
        if info is not None:
            self._claims[key] = info
            self._index(key, info)

    def delete_claim(self, namespace: str, name: str) -> None:
        """Forget a ResourceClaim."""
        with self._lock:
            self._unindex((namespace, name))

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Replace every ResourceClaim (after a relist). `items` may be a stream of list pages: it
        is consumed, and reduced to ClaimInfo (unallocated claims dropped), before the lock is
        taken, so at most one page of raw claims is in memory (issue 9: peak RSS)."""
        entries = [entry for entry in map(_claim_entry, items) if entry[1] is not None]
        with self._lock:
            self._claims.clear()
            self._by_driver_node.clear()
            self._slots.clear()
            self._anywhere_by_pod.clear()
            for key, info in entries:
                self._put_claim(key, info)

    def _claim_nodes(self, info: ClaimInfo) -> set[str]:
        if info.nodes:
            return set(info.nodes)
        found = set()
        for name, uid in info.reserved_for:  # usable anywhere: where its pods run
            pod = self._pods_by_uid.get(uid) or self._pods.get((info.namespace, name))
            if pod is not None and pod.node:
                found.add(pod.node)
        return found

    def _index(self, key: tuple[str, str], info: ClaimInfo) -> None:
        slots = {(driver, node) for node in self._claim_nodes(info) for driver in info.drivers}
        self._slots[key] = slots
        for dn in slots:
            self._by_driver_node.setdefault(dn, set()).add(key)
        if not info.nodes:
            for pod_name, _ in info.reserved_for:
                self._anywhere_by_pod.setdefault((info.namespace, pod_name), set()).add(key)

    def _unindex(self, key: tuple[str, str]) -> None:
        old = self._claims.pop(key, None)
        if old is None:
            return
        for dn in self._slots.pop(key, ()):
            keys = self._by_driver_node.get(dn)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_driver_node[dn]
        if not old.nodes:
            for pod_name, _ in old.reserved_for:
                keys = self._anywhere_by_pod.get((old.namespace, pod_name))
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._anywhere_by_pod[(old.namespace, pod_name)]

    def _reindex_claims_of_pod(self, pod: PodInfo) -> None:
        """A pod moved or appeared: claims usable anywhere that it reserves follow it to its node."""
        for key in list(self._anywhere_by_pod.get((pod.namespace, pod.name), ())):
            info = self._claims.get(key)
            if info is not None:
                self._unindex(key)
                self._claims[key] = info
                self._index(key, info)

    def _reindex_all_claims(self) -> None:
        self._by_driver_node.clear()
        self._slots.clear()
        self._anywhere_by_pod.clear()
        for key, info in self._claims.items():
            self._index(key, info)

    # -- queries
    def driver_of_pod(self, namespace: str, name: str) -> tuple[PodInfo, drivers.Driver] | None:
        """(the pod, its driver) when pod namespace/name belongs to a DRA driver DaemonSet, else None. O(1)."""
        with self._lock:
            pod = self._pods.get((namespace, name))
            if pod is None or not pod.daemonset:
                return None
            driver = self._drivers.get((namespace, pod.daemonset))
            return (pod, driver) if driver is not None else None

    def holds(self, driver: str, node: str) -> list[Hold]:
        """Claims allocated to `driver` on `node` whose reserving pods on `node` have not finished."""
        with self._lock:
            out = []
            for key in sorted(self._by_driver_node.get((driver, node), ())):
                info = self._claims[key]
                pods = []
                for name, uid in info.reserved_for:
                    pod = self._pods_by_uid.get(uid) or self._pods.get((info.namespace, name))
                    if pod is None:
                        if info.nodes:  # node-local claim, pod not seen (yet): assume it is there
                            pods.append(f"{info.namespace}/{name}")
                        continue
                    if pod.node == node and not pod.finished:
                        pods.append(f"{pod.namespace}/{pod.name}" + (" (Terminating)" if pod.terminating else ""))
                if pods:
                    out.append(Hold(claim=f"{key[0]}/{key[1]}", pods=tuple(pods)))
            return out

    def driver_pods_on(self, node: str) -> list[tuple[PodInfo, drivers.Driver]]:
        """The DRA driver pods on `node` (for drain-plan)."""
        with self._lock:
            out = []
            for pod in self._pods.values():
                if pod.node == node and pod.daemonset:
                    driver = self._drivers.get((pod.namespace, pod.daemonset))
                    if driver is not None:
                        out.append((pod, driver))
            return sorted(out, key=lambda pd: (pd[0].namespace, pd[0].name))

    def counts(self) -> dict[str, int]:
        """Sizes of the index (pods kept, DaemonSets, drivers, allocated claims)."""
        with self._lock:
            return {"pods": len(self._pods), "daemonsets": len(self._daemonsets),
                    "drivers": sum(1 for d in self._drivers.values() if d is not None), "claims": len(self._claims)}


# --------------------------------------------------------------------------- the decision

def describe_holds(holds: list[Hold], limit: int) -> str:
    """"ns/claim -> pod ns/p, ..." for at most `limit` claims, then "and N more"."""
    parts = [f"{h.claim} -> pod {', '.join(h.pods)}" for h in holds[:limit]]
    more = f" and {len(holds) - limit} more" if len(holds) > limit else ""
    return "; ".join(parts) + more


def review(request: Mapping[str, Any], *, index: ClaimIndex, config: EvictionConfig,
           synced: tuple[bool, str] = (True, "")) -> Decision:
    """Judge an AdmissionReview request for CREATE of pods/eviction (policy/v1 or v1beta1 Eviction),
    or, when config.guard_deletes, DELETE of a pod.

    synced: (True, "") when the caches are fresh; otherwise (False, why) and every eviction gets
    429 "not ready, retry" (a drain retries; nothing is lost).
    """
    operation = _str(request.get("operation"))
    sub = _str(request.get("subResource"))
    resource = _str(_map(request.get("resource")).get("resource"))
    if resource != "pods":
        return ALLOW
    if operation == "CREATE" and sub == "eviction":
        pass
    elif operation == "DELETE" and not sub and config.guard_deletes:
        user = _str(_map(request.get("userInfo")).get("username"))
        if user in config.daemonset_controller_users:
            return ALLOW  # the DaemonSet controller's own deletes: rolling updates must work
    else:
        return ALLOW
    namespace, name = _str(request.get("namespace")), _str(request.get("name"))
    ok, why = synced
    if not ok:
        return Decision(findings=(Finding(
            policy=POLICY, kind="Pod", namespace=namespace, name=name, code=429, reason="TooManyRequests",
            check="cache-not-ready",
            message=f"dra-guard cannot tell yet whether pod {namespace}/{name} is a DRA driver still needed on its "
                    f"node ({why}); retry the eviction shortly.",
            summary=short(f"dra-guard: caches not ready ({why}); retry")),))
    found = index.driver_of_pod(namespace, name)
    if found is None:
        return ALLOW
    pod, driver = found
    if not driver.name:
        return Decision(warnings=(short(f"dra-guard: cannot tell the driver name of DaemonSet {pod.daemonset}; "
                                        f"set the {drivers.DRIVER_KEY} annotation"),))
    if not pod.node:
        return ALLOW
    holds = index.holds(driver.name, pod.node)
    if not holds:
        return ALLOW
    verb = "evict" if operation == "CREATE" else "delete"
    message = (f"dra-guard: DRA driver pod {namespace}/{name} (driver {driver.name}) is still needed on node {pod.node}: "
               f"{len(holds)} ResourceClaim(s) allocated to it there are still reserved by pods that have not finished: "
               f"{describe_holds(holds, config.max_listed_claims)}. Drain the DRA driver last: {verb} those pods "
               f"first; this {'eviction' if verb == 'evict' else 'deletion'} can be retried once their claims are released.")
    return Decision(findings=(Finding(
        policy=POLICY, kind="Pod", namespace=namespace, name=name, code=429, reason="TooManyRequests",
        check="driver-still-needed", message=message,
        summary=short(f"dra-guard: driver pod {name} still needed on {pod.node} by {len(holds)} claim(s)"),
        details={"driver": driver.name, "node": pod.node, "claims": [h.claim for h in holds]}),))
