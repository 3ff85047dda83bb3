"""Claim facts for the drain order: what dra-guard keeps of Pods and allocated ResourceClaims.

Field shapes: resource.k8s.io v1 ResourceClaim status (v1beta1/v1beta2 have the same status shape):
``status.allocation.devices.results[].driver``, ``status.allocation.nodeSelector`` (node-local
devices) and ``status.reservedFor`` (the consuming pods); core/v1 Pod. Pure.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

from webhook.model.readers import as_list, as_map, as_str

_SETS: dict[frozenset[str], frozenset[str]] = {}


def shared(values: frozenset[str]) -> frozenset[str]:
    """One frozenset object for equal sets of names (a claim's drivers, its nodes): 100,000 claims
    of one driver on 5,000 nodes hold 5,001 sets, not 200,000 (about 200 bytes each; issue 19).
    Bounded: the table starts over past 100,000 distinct sets."""
    if len(_SETS) > 100_000:
        _SETS.clear()
    return _SETS.setdefault(values, values)


def _name(value: Any) -> str:
    """A name many objects repeat (namespace, node, driver, DaemonSet), interned: one string object."""
    return sys.intern(as_str(value))


@dataclasses.dataclass(frozen=True, slots=True)
class PodInfo:
    """What the index keeps of a Pod: identity, node, whether it finished, its DaemonSet owner."""

    namespace: str
    name: str
    uid: str
    node: str
    finished: bool      # phase Succeeded or Failed
    terminating: bool   # metadata.deletionTimestamp set
    daemonset: str      # owning DaemonSet name ("" if none)
    ready: bool = False  # status.conditions Ready is True


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """Slim a core/v1 Pod dict into a PodInfo."""
    meta, spec, status = as_map(pod.get("metadata")), as_map(pod.get("spec")), as_map(pod.get("status"))
    owner = next((as_str(o.get("name")) for o in map(as_map, as_list(meta.get("ownerReferences")))
                  if o.get("kind") == "DaemonSet" and o.get("controller")), "")
    return PodInfo(namespace=_name(meta.get("namespace")), name=as_str(meta.get("name")), uid=as_str(meta.get("uid")),
                   node=_name(spec.get("nodeName")), finished=as_str(status.get("phase")) in ("Succeeded", "Failed"),
                   terminating=bool(meta.get("deletionTimestamp")), daemonset=_name(owner),
                   ready=any(c.get("type") == "Ready" and c.get("status") == "True"
                             for c in map(as_map, as_list(status.get("conditions")))))


def pod_is_relevant(pod: Mapping[str, Any]) -> bool:
    """Whether the index keeps this Pod: owned by a DaemonSet, or using ResourceClaims.

    Everything else is dropped at once, so memory follows DRA pods and DaemonSet pods, not all pods.
    """
    meta, spec = as_map(pod.get("metadata")), as_map(pod.get("spec"))
    return bool(as_list(spec.get("resourceClaims"))) or any(
        o.get("kind") == "DaemonSet" for o in map(as_map, as_list(meta.get("ownerReferences"))))


@dataclasses.dataclass(frozen=True, slots=True)
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
    for term in map(as_map, as_list(as_map(node_selector).get("nodeSelectorTerms"))):
        for field in map(as_map, as_list(term.get("matchFields"))):
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                nodes.update(v for v in as_list(field.get("values")) if isinstance(v, str))
    return frozenset(nodes)


def claim_info(claim: Mapping[str, Any]) -> ClaimInfo | None:
    """Slim a resource.k8s.io ResourceClaim dict (v1, v1beta2 or v1beta1); None when not allocated."""
    meta, status = as_map(claim.get("metadata")), as_map(claim.get("status"))
    allocation = as_map(status.get("allocation"))
    if not allocation:
        return None
    results = as_list(as_map(allocation.get("devices")).get("results"))
    driver_names = shared(frozenset(_name(r.get("driver")) for r in map(as_map, results) if as_str(r.get("driver"))))
    reserved = tuple((as_str(r.get("name")), as_str(r.get("uid"))) for r in map(as_map, as_list(status.get("reservedFor")))
                     if r.get("resource") == "pods" and as_str(r.get("name")))
    return ClaimInfo(namespace=_name(meta.get("namespace")), name=as_str(meta.get("name")), drivers=driver_names,
                     nodes=shared(claim_nodes(allocation.get("nodeSelector"))), reserved_for=reserved)


@dataclasses.dataclass(frozen=True)
class Hold:
    """A claim that still needs driver D on node N, and the pods that hold it (namespace/name)."""

    claim: str   # namespace/name
    pods: tuple[str, ...]



def claim_entry(claim: Mapping[str, Any]) -> tuple[tuple[str, str], ClaimInfo | None]:
    """A ResourceClaim dict as ((namespace, name), its ClaimInfo, None when unallocated)."""
    meta = as_map(claim.get("metadata"))
    return (as_str(meta.get("namespace")), as_str(meta.get("name"))), claim_info(claim)

