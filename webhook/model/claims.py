"""Claim facts for the drain order: what dra-guard keeps of Pods and allocated ResourceClaims.

Field shapes: resource.k8s.io v1 ResourceClaim status (v1beta1/v1beta2 have the same status shape):
``status.allocation.devices.results[].driver``, ``status.allocation.nodeSelector`` (a core/v1
NodeSelector: ``metadata.name In`` for node-local devices, labels for devices usable from several
nodes; absent for devices usable anywhere) and ``status.reservedFor[]`` (ResourceClaimConsumerReference
``{apiGroup, resource, name, uid}``: pods, or other consumers such as scheduling.k8s.io
``podgroups``); core/v1 Pod, with ``status.extendedResourceClaimStatus`` (PodExtendedResourceClaimStatus
``{resourceClaimName, requestMappings[]: {containerName, resourceName, requestName}}``: the claim
the scheduler made for the pod's DRA-backed extended resources, KEP-5004). Pure.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.model.nodes import Selector, named_nodes, read_selector
from webhook.model.readers import as_list, as_map, as_str

_SETS: dict[frozenset[str], frozenset[str]] = {}


def shared(values: frozenset[str]) -> frozenset[str]:
    """One frozenset object for equal sets of names (a claim's drivers, its nodes): 100,000 claims
    of one driver on 5,000 nodes hold 5,001 sets, not 200,000 (about 200 bytes each).
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
    finished: bool  # phase Succeeded or Failed
    terminating: bool  # metadata.deletionTimestamp set
    daemonset: str  # owning DaemonSet name ("" if none)
    ready: bool = False  # status.conditions Ready is True
    claims: tuple[str, ...] = ()  # names of the ResourceClaims (in its namespace) it references


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """Slim a core/v1 Pod dict into a PodInfo."""
    meta, spec, status = as_map(pod.get("metadata")), as_map(pod.get("spec")), as_map(pod.get("status"))
    owner = next(
        (
            as_str(o.get("name"))
            for o in map(as_map, as_list(meta.get("ownerReferences")))
            if o.get("kind") == "DaemonSet" and o.get("controller")
        ),
        "",
    )
    return PodInfo(
        namespace=_name(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        node=_name(spec.get("nodeName")),
        finished=finished(status),
        claims=referenced_claims(spec, status),
        terminating=bool(meta.get("deletionTimestamp")),
        daemonset=_name(owner),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in map(as_map, as_list(status.get("conditions")))),
    )


def finished(status: Mapping[str, Any]) -> bool:
    """Whether a core/v1 PodStatus dict says the pod stopped: phase Succeeded or Failed, and no
    container or init container still running. The kubelet writes a terminal phase only once
    every container stopped and the pod's claims were unprepared; a terminal phase next to a
    running container was written by someone else (a pods/status writer) and is not trusted."""
    if as_str(status.get("phase")) not in ("Succeeded", "Failed"):
        return False
    statuses = as_list(status.get("containerStatuses")) + as_list(status.get("initContainerStatuses"))
    return not any("running" in as_map(as_map(c).get("state")) for c in statuses)


def referenced_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the ResourceClaims a pod references (in its own namespace): spec.resourceClaims
    by resourceClaimName, the claims made from its templates (status.resourceClaimStatuses[].
    resourceClaimName) and the claim the scheduler made for its extended resources
    (status.extendedResourceClaimStatus.resourceClaimName)."""
    names = [as_str(c.get("resourceClaimName")) for c in map(as_map, as_list(spec.get("resourceClaims")))]
    names += [as_str(c.get("resourceClaimName")) for c in map(as_map, as_list(status.get("resourceClaimStatuses")))]
    names.append(as_str(as_map(status.get("extendedResourceClaimStatus")).get("resourceClaimName")))
    return tuple(sys.intern(n) for n in dict.fromkeys(names) if n)


def pod_is_relevant(pod: Mapping[str, Any]) -> bool:
    """Whether the index keeps this Pod: owned by a DaemonSet, or using ResourceClaims: listed in
    ``spec.resourceClaims``, or made for its extended resources by the scheduler (named in
    ``status.extendedResourceClaimStatus.resourceClaimName``; such a pod lists no claim).

    Everything else is dropped at once, so memory follows DRA pods and DaemonSet pods, not all pods.
    """
    meta, spec = as_map(pod.get("metadata")), as_map(pod.get("spec"))
    extended = as_map(as_map(pod.get("status")).get("extendedResourceClaimStatus"))
    return (
        bool(as_list(spec.get("resourceClaims")))
        or bool(as_str(extended.get("resourceClaimName")))
        or any(o.get("kind") == "DaemonSet" for o in map(as_map, as_list(meta.get("ownerReferences"))))
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimInfo:
    """What the index keeps of a ResourceClaim's status.

    Where the allocation reaches: `nodes` when every term of its nodeSelector names nodes
    (node-local devices), else `selector` when it selects by labels, else (both empty) anywhere.
    """

    namespace: str
    name: str
    drivers: frozenset[str]  # allocation.devices.results[].driver
    nodes: frozenset[str]  # nodes allocation.nodeSelector names (empty: not limited by name)
    reserved_for: tuple[tuple[str, str], ...]  # (pod name, pod uid) of reservedFor entries for pods
    selector: Selector = ()  # allocation.nodeSelector when it selects by labels
    others: tuple[str, ...] = ()  # "namespace/name (resource.group)" of reservedFor entries not pods


def _is_pod(ref: Mapping[str, Any]) -> bool:
    return ref.get("resource") == "pods" and not as_str(ref.get("apiGroup"))


def _consumer(namespace: str, ref: Mapping[str, Any]) -> str:
    group = as_str(ref.get("apiGroup"))
    return f"{namespace}/{as_str(ref.get('name'))} ({as_str(ref.get('resource')) or 'unknown'}{'.' + group if group else ''})"


def claim_info(claim: Mapping[str, Any]) -> ClaimInfo | None:
    """Slim a resource.k8s.io ResourceClaim dict (v1, v1beta2 or v1beta1); None when not allocated."""
    meta, status = as_map(claim.get("metadata")), as_map(claim.get("status"))
    allocation = as_map(status.get("allocation"))
    if not allocation:
        return None
    results = as_list(as_map(allocation.get("devices")).get("results"))
    driver_names = shared(frozenset(_name(r.get("driver")) for r in map(as_map, results) if as_str(r.get("driver"))))
    refs = [r for r in map(as_map, as_list(status.get("reservedFor"))) if r]
    reserved = tuple((as_str(r.get("name")), as_str(r.get("uid"))) for r in refs if _is_pod(r) and as_str(r.get("name")))
    namespace = _name(meta.get("namespace"))
    # a consumer that is not a pod (a PodGroup, or a resource dra-guard does not know) runs where
    # dra-guard cannot see: it holds the driver wherever the allocation reaches
    others = tuple(_consumer(namespace, r) for r in refs if not _is_pod(r))
    selector = read_selector(allocation.get("nodeSelector"))
    nodes = named_nodes(selector)
    return ClaimInfo(
        namespace=namespace,
        name=as_str(meta.get("name")),
        drivers=driver_names,
        nodes=shared(nodes or frozenset()),
        reserved_for=reserved,
        selector=selector if nodes is None else (),
        others=others,
    )


@dataclasses.dataclass(frozen=True)
class Hold:
    """A claim that still needs driver D on node N, and what holds it: pods ("namespace/name") and
    consumers that are not pods ("namespace/name (resource.group)")."""

    claim: str  # namespace/name
    pods: tuple[str, ...]


def claim_entry(claim: Mapping[str, Any]) -> tuple[tuple[str, str], ClaimInfo | None]:
    """A ResourceClaim dict as ((namespace, name), its ClaimInfo, None when unallocated)."""
    meta = as_map(claim.get("metadata"))
    return (as_str(meta.get("namespace")), as_str(meta.get("name"))), claim_info(claim)


def claim_hold(info: ClaimInfo, node: str, find: Callable[[str, str, str], PodInfo | None]) -> Hold | None:
    """The Hold of allocated claim `info` on `node`: its reserving pods on `node` that have not
    finished (a pod not seen yet counts for a node-local claim: assume it is there), and its
    consumers that are not pods; None when nothing holds it there. find(namespace, name, uid):
    the indexed pod."""
    pods = []
    for name, uid in info.reserved_for:
        pod = find(info.namespace, name, uid)
        if pod is None:
            if info.nodes:
                pods.append(f"{info.namespace}/{name}")
        elif pod.node == node and not pod.finished:
            pods.append(f"{pod.namespace}/{pod.name}" + (" (Terminating)" if pod.terminating else ""))
    pods += info.others
    return Hold(claim=f"{info.namespace}/{info.name}", pods=tuple(pods)) if pods else None


def unaccounted(pods: Iterable[PodInfo], claims: Mapping[tuple[str, str], ClaimInfo], driver: str) -> list[Hold]:
    """Claims `pods` (on one node) that have not finished still reference although the claim
    objects no longer say so: the claim is missing or not allocated (not in `claims`, keyed by
    (namespace, name); its drivers unknown, so it holds every driver on the node), or allocated
    to `driver` without the pod in its reservedFor. The node still holds those devices until the
    kubelet unprepares them when the pod stops (a claim deleted or de-allocated under a running pod)."""
    out = []
    for pod in pods:
        if pod.finished:
            continue
        who = f"{pod.namespace}/{pod.name}" + (" (Terminating)" if pod.terminating else "")
        for claim in pod.claims:
            info = claims.get((pod.namespace, claim))
            if info is None:
                why = "missing or not allocated, still referenced"
            elif driver not in info.drivers or any(
                uid == pod.uid if uid and pod.uid else name == pod.name for name, uid in info.reserved_for
            ):
                continue
            else:
                why = "no longer reserved for its pod, still referenced"
            out.append(Hold(claim=f"{pod.namespace}/{claim} ({why})", pods=(who,)))
    return out
