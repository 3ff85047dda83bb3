"""ClaimIndex: the in-memory view of ResourceClaims, DaemonSets, relevant Pods and Node labels that
the drain order reads. webhook.kube fills it from watches; `dra-guard drain-plan` and `audit` fill one from
lists (webhook.model.facts). Thread-safe; lookups never do I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from webhook.config import DetectionConfig
from webhook.model import drivers
from webhook.model.claims import ClaimInfo, Hold, PodInfo, claim_entry, claim_hold, pod_info, pod_is_relevant, unaccounted
from webhook.model.leaving import Leaving
from webhook.model.nodes import NodeIndex
from webhook.model.readers import as_map, as_str
from webhook.model.release import release_gradually
from webhook.model.slices import SliceIndex

K = TypeVar("K")
V = TypeVar("V")


def _discard(table: dict[K, set[V]], k: K, value: V) -> bool:
    """Remove `value` from table[k], dropping the entry once empty; whether it was dropped."""
    values = table.get(k)
    if values is None:
        return False
    values.discard(value)
    if values:
        return False
    del table[k]
    return True


class ClaimIndex:
    """Thread-safe view of ResourceClaims, DaemonSets and relevant Pods for the eviction policy.

    Lookups used on the admission path are dict lookups: the pod being evicted by
    (namespace, name), its DaemonSet by (namespace, name), and claims by (driver, node).
    """

    def __init__(
        self, detection: DetectionConfig | None = None, can_write_slices: Callable[[str, str], bool] = lambda ns, sa: False
    ) -> None:
        self._lock = threading.RLock()
        self._detection = detection or DetectionConfig()
        self._can_write = can_write_slices
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._pods_by_uid: dict[str, PodInfo] = {}
        self._daemonsets: dict[tuple[str, str], Mapping[str, Any]] = {}
        self._drivers: dict[tuple[str, str], drivers.Driver | None] = {}
        self._claims: dict[tuple[str, str], ClaimInfo] = {}
        self._by_driver_node: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._slots: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}  # claim -> its (driver, node) keys
        self._anywhere_by_pod: dict[tuple[str, str], set[tuple[str, str]]] = {}  # pod -> claims usable anywhere
        self._ds_pods_by_node: dict[str, set[tuple[str, str]]] = {}  # node -> DaemonSet pods on it
        self._claim_pods_by_node: dict[str, set[tuple[str, str]]] = {}  # node -> pods referencing claims on it
        self._claim_drivers_by_node: dict[str, set[str]] = {}  # node -> drivers of claims indexed there
        self._everywhere: dict[str, set[tuple[str, str]]] = {}  # driver -> claims held on every node
        self._by_labels: set[tuple[str, str]] = set()  # claims placed by node labels
        self.slices = SliceIndex()  # node -> drivers publishing ResourceSlices for it
        self.leaving = Leaving()  # driver pods just allowed to leave on the strength of a peer
        self.nodes = NodeIndex(on_change=self._reindex_label_claims)  # node -> its labels

    def sizes(self) -> dict[str, int]:
        """counts() under the cache names of dra_guard_cache_objects (daemonsets, pods,
        resourceclaims, resourceslices, nodes)."""
        c = self.counts()
        return {
            "daemonsets": c["daemonsets"],
            "pods": c["pods"],
            "resourceclaims": c["claims"],
            "resourceslices": c["resourceslices"],
            "nodes": c["nodes"],
        }

    # -- pods
    def upsert_pod(self, pod: Mapping[str, Any]) -> None:
        """Add or replace a Pod (kept only when pod_is_relevant)."""
        if not pod_is_relevant(pod):
            meta = as_map(pod.get("metadata"))
            self.delete_pod(as_str(meta.get("namespace")), as_str(meta.get("name")))
            return
        info = pod_info(pod)
        with self._lock:
            self._drop_pod((info.namespace, info.name))
            self._put_pod(info)
            self._reindex_claims_of_pod(info)
        if info.terminating or info.finished:
            self.leaving.settle(info.namespace, info.name)  # outside the index's lock: review takes leaving's first

    def delete_pod(self, namespace: str, name: str) -> None:
        """Forget a Pod."""
        with self._lock:
            old = self._drop_pod((namespace, name))
            if old is not None:
                self._reindex_claims_of_pod(old)
        self.leaving.settle(namespace, name)

    def _put_pod(self, info: PodInfo) -> None:
        key = (info.namespace, info.name)
        self._pods[key] = info
        if info.uid:
            self._pods_by_uid[info.uid] = info
        if info.daemonset and info.node:
            self._ds_pods_by_node.setdefault(info.node, set()).add(key)
        if info.claims and info.node:
            self._claim_pods_by_node.setdefault(info.node, set()).add(key)

    def _drop_pod(self, key: tuple[str, str]) -> PodInfo | None:
        old = self._pods.pop(key, None)
        if old is not None and self._pods_by_uid.get(old.uid) is old:
            del self._pods_by_uid[old.uid]
        if old is not None and old.daemonset and old.node:
            _discard(self._ds_pods_by_node, old.node, key)
        if old is not None and old.claims and old.node:
            _discard(self._claim_pods_by_node, old.node, key)
        return old

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Replace every Pod (after a relist). `pods` may be a stream of list pages: it is consumed,
        reduced to PodInfo and indexed into fresh tables before the lock is taken; the lock is held
        only to swap the tables and re-place the claims usable anywhere (a few), so no review waits
        on a relist of 100,000 pods. Pod events come from the same informer thread, so
        nothing changes the pods while the fresh tables are built."""
        fresh = ClaimIndex(self._detection, self._can_write)
        for pod in pods:
            if pod_is_relevant(pod):
                fresh._put_pod(pod_info(pod))
        with self._lock:
            old = self._pods, self._pods_by_uid, self._ds_pods_by_node, self._claim_pods_by_node
            self._pods, self._pods_by_uid, self._ds_pods_by_node = fresh._pods, fresh._pods_by_uid, fresh._ds_pods_by_node
            self._claim_pods_by_node = fresh._claim_pods_by_node
            self._reindex_anywhere_claims()
        # freed outside the lock, entry by entry (a claims relist reading the old pods meanwhile
        # misses some: the claims usable anywhere are placed again under the lock at its swap)
        release_gradually(*old)

    # -- daemonsets
    def upsert_daemonset(self, ds: Mapping[str, Any]) -> None:
        """Add or replace a DaemonSet; it is judged a driver or not at once."""
        meta = as_map(ds.get("metadata"))
        key = (as_str(meta.get("namespace")), as_str(meta.get("name")))
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

    def daemonset(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """DaemonSet namespace/name as last seen (an apps/v1 DaemonSet dict), None when not known."""
        with self._lock:
            return self._daemonsets.get((namespace, name))

    def daemonset_pods(self, namespace: str, name: str) -> list[PodInfo]:
        """The indexed pods DaemonSet namespace/name controls, by name. O(pods)."""
        with self._lock:
            found = [p for (ns, _), p in self._pods.items() if ns == namespace and p.daemonset == name]
        return sorted(found, key=lambda p: p.name)

    def daemonset_drivers(self) -> list[tuple[str, str, drivers.Driver | None]]:
        """(namespace, name, verdict) of every DaemonSet: its drivers.detect() result or None."""
        with self._lock:
            return [(ns, name, driver) for (ns, name), driver in self._drivers.items()]

    def redetect(self) -> None:
        """Judge every DaemonSet again (after RBAC changed what may write ResourceSlices). The
        judging (which may ask the RBAC index) runs outside this index's lock: evictions are not
        held up by an RBAC watch event. A DaemonSet replaced meanwhile keeps its newer verdict."""
        with self._lock:
            daemonsets = dict(self._daemonsets)
        verdicts = {
            key: drivers.detect(ds, config=self._detection, can_write_slices=self._can_write) for key, ds in daemonsets.items()
        }
        with self._lock:
            for key, verdict in verdicts.items():
                if self._daemonsets.get(key) is daemonsets[key]:
                    self._drivers[key] = verdict

    # -- nodes
    def _reindex_label_claims(self) -> None:
        """Nodes or their labels changed (NodeIndex's on_change): place the claims held by labels again."""
        with self._lock:
            for key in list(self._by_labels):
                self._reindex(key)

    # -- claims
    def upsert_claim(self, claim: Mapping[str, Any]) -> None:
        """Add or replace a ResourceClaim (unallocated claims are not kept)."""
        key, info = claim_entry(claim)
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
        is consumed, reduced to ClaimInfo (unallocated claims dropped; at most one page of raw
        claims in memory) and indexed into fresh tables before the lock is taken; the lock
        is held only to swap them in (no review waits on a relist). Claim events come
        from the same informer thread; pods may move meanwhile, so the claims usable anywhere (the
        only ones placed by their pods) are placed again under the lock."""
        fresh = ClaimIndex(self._detection, self._can_write)
        fresh._pods, fresh._pods_by_uid = self._pods, self._pods_by_uid  # read only: where pods run
        fresh.nodes = self.nodes  # read only: the nodes' labels (changes meanwhile: re-placed at the swap)
        for key, info in map(claim_entry, items):
            if info is not None:
                fresh._put_claim(key, info)
        with self._lock:
            old = (
                self._claims,
                self._by_driver_node,
                self._slots,
                self._anywhere_by_pod,
                self._claim_drivers_by_node,
                self._everywhere,
            )
            self._claims, self._by_driver_node, self._slots = fresh._claims, fresh._by_driver_node, fresh._slots
            self._anywhere_by_pod, self._claim_drivers_by_node = fresh._anywhere_by_pod, fresh._claim_drivers_by_node
            self._everywhere, self._by_labels = fresh._everywhere, fresh._by_labels
            self._reindex_anywhere_claims()
            for key in list(self._by_labels):  # the nodes may have changed meanwhile
                self._reindex(key)
        release_gradually(*old)  # outside the lock, entry by entry

    def _claim_nodes(self, info: ClaimInfo) -> set[str] | None:
        """The nodes where `info` holds its drivers; None: every node.

        A reserving pod holds on its node (one the allocation selects: the scheduler put it there,
        and its devices stay prepared there if the node's labels change later). A consumer that is
        not a pod holds on every node the allocation selects: by name, by labels (the nodes known
        now), or, for devices usable anywhere, every node."""
        if info.nodes:
            return set(info.nodes)
        found: set[str] = set()
        if info.others:
            if not info.selector:
                return None
            found.update(self.nodes.selected(info.selector))
        for name, uid in info.reserved_for:
            pod = self._pods_by_uid.get(uid) or self._pods.get((info.namespace, name))
            if pod is not None and pod.node:
                found.add(pod.node)
        return found

    def _index(self, key: tuple[str, str], info: ClaimInfo) -> None:
        nodes = self._claim_nodes(info)
        if nodes is None:
            for driver in info.drivers:
                self._everywhere.setdefault(driver, set()).add(key)
            nodes = set()
        if info.others and info.selector:
            self._by_labels.add(key)
        slots = {(driver, node) for node in nodes for driver in info.drivers}
        self._slots[key] = tuple(slots)  # a tuple: ~150 bytes less than a set per claim
        for dn in slots:
            self._by_driver_node.setdefault(dn, set()).add(key)
            self._claim_drivers_by_node.setdefault(dn[1], set()).add(dn[0])
        if not info.nodes:
            for pod_name, _ in info.reserved_for:
                self._anywhere_by_pod.setdefault((info.namespace, pod_name), set()).add(key)

    def _unindex(self, key: tuple[str, str]) -> None:
        old = self._claims.pop(key, None)
        if old is None:
            return
        self._by_labels.discard(key)
        for driver in old.drivers:
            _discard(self._everywhere, driver, key)
        for dn in self._slots.pop(key, ()):
            if _discard(self._by_driver_node, dn, key):
                _discard(self._claim_drivers_by_node, dn[1], dn[0])
        if not old.nodes:
            for pod_name, _ in old.reserved_for:
                _discard(self._anywhere_by_pod, (old.namespace, pod_name), key)

    def _reindex_claims_of_pod(self, pod: PodInfo) -> None:
        """A pod moved or appeared: claims usable anywhere that it reserves follow it to its node."""
        for key in list(self._anywhere_by_pod.get((pod.namespace, pod.name), ())):
            self._reindex(key)

    def _reindex(self, key: tuple[str, str]) -> None:
        """Place claim `key` again (the lock is held)."""
        info = self._claims.get(key)
        if info is not None:
            self._unindex(key)
            self._claims[key] = info
            self._index(key, info)

    def _reindex_anywhere_claims(self) -> None:
        """Place every claim usable anywhere again by where its reserving pods run now (the lock is
        held). Node-local claims do not depend on pods."""
        for key in set().union(*self._anywhere_by_pod.values()) if self._anywhere_by_pod else ():
            self._reindex(key)

    # -- queries
    def pod(self, namespace: str, name: str) -> PodInfo | None:
        """Pod namespace/name if indexed (DaemonSet-owned or using claims), else None (one dict read: no lock)."""
        return self._pods.get((namespace, name))

    def driver_of_pod(self, namespace: str, name: str) -> tuple[PodInfo, drivers.Driver] | None:
        """(the pod, its driver) when pod namespace/name belongs to a DRA driver DaemonSet, else None. O(1)."""
        with self._lock:
            pod = self._pods.get((namespace, name))
            if pod is None or not pod.daemonset:
                return None
            driver = self._drivers.get((namespace, pod.daemonset))
            return (pod, driver) if driver is not None else None

    def holds(self, driver: str, node: str) -> list[Hold]:
        """Claims allocated to `driver` on `node` whose reserving pods on `node` have not finished,
        or reserved for a consumer that is not a pod (held wherever the allocation reaches)."""
        with self._lock:
            keys = sorted(self._by_driver_node.get((driver, node), set()) | self._everywhere.get(driver, set()))
            held = [claim_hold(self._claims[key], node, self._find_pod) for key in keys]
            pods_on_node = [self._pods[key] for key in sorted(self._claim_pods_by_node.get(node, ()))]
            return [h for h in held if h is not None] + unaccounted(pods_on_node, self._claims, driver)

    def _find_pod(self, namespace: str, name: str, uid: str) -> PodInfo | None:
        return self._pods_by_uid.get(uid) or self._pods.get((namespace, name))

    def driver_pods_on(self, node: str) -> list[tuple[PodInfo, drivers.Driver]]:
        """The DRA driver pods on `node`, finished ones left out. O(DaemonSet pods on the node)."""
        with self._lock:
            out = []
            for key in self._ds_pods_by_node.get(node, ()):
                pod = self._pods[key]
                driver = self._drivers.get((pod.namespace, pod.daemonset))
                if driver is not None and not pod.finished:
                    out.append((pod, driver))
            return sorted(out, key=lambda pd: (pd[0].namespace, pd[0].name))

    def claim_drivers_on(self, node: str) -> frozenset[str]:
        """The drivers of allocated claims indexed on `node` (node-local, or usable anywhere and
        reserved by a pod there, or held on every node)."""
        with self._lock:
            return frozenset(self._claim_drivers_by_node.get(node, ())) | frozenset(self._everywhere)

    def counts(self) -> dict[str, int]:
        """Sizes of the index (pods kept, DaemonSets, drivers, allocated claims)."""
        with self._lock:
            return {
                "pods": len(self._pods),
                "daemonsets": len(self._daemonsets),
                "drivers": sum(1 for d in self._drivers.values() if d is not None),
                "claims": len(self._claims),
                "resourceslices": len(self.slices),
                "nodes": len(self.nodes),
            }
