"""Which drivers a DRA driver pod serves on its node, and what still needs it there (pure, over a ClaimIndex).

The drain-order guard and `drain-plan` both judge through `need()`, so they cannot differ.

Rules (source: "Good practices for DRA as a Cluster Admin", "drain the DRA driver last"; the
resource.k8s.io v1 ResourceSlice ``spec.driver``/``spec.nodeName`` say which drivers serve a node):

- A driver pod serves the names its DaemonSet's spec, label or selector gives (webhook.model.drivers).
- A recognised driver pod with a plugin container whose names the spec does not give
  (``Driver.complete`` False) is also attributed the node's drivers (node-local ResourceSlices, and
  the drivers of claims allocated there) that no other trusted driver pod on that node names.
  When several such pods are on the node the attribution is ambiguous, and each is attributed all
  of those drivers: every one is held while any claim of them is reserved on the node. No claim is
  left without a driver pod because a name was unknown.
- Names from an untrusted label (``Driver.protects`` False) account for nothing: a tenant's label
  cannot take a driver's attribution away from the real driver pod.
- Seamless upgrade: while another Ready, not Terminating pod of the same DaemonSet runs on the node
  (a surge rollout, maxSurge 1), evicting this one is allowed; the last one is held.
"""

from __future__ import annotations

import dataclasses

from webhook.model.claim_index import ClaimIndex
from webhook.model.claims import Hold, PodInfo
from webhook.model.drivers import Driver


@dataclasses.dataclass(frozen=True)
class Need:
    """What keeps a driver pod on its node.

    names: (driver name, how it was learned) for every driver the pod serves there.
    holds: (driver name, Hold) for each claim of those drivers still reserved on the node.
    peer: "namespace/name" of another Ready pod of the same DaemonSet on the node ("" if none).
    """

    pod: PodInfo
    driver: Driver
    names: tuple[tuple[str, str], ...]
    holds: tuple[tuple[str, Hold], ...]
    peer: str

    @property
    def held(self) -> bool:
        """Whether the pod must stay: claims still need it and no Ready peer takes over."""
        return bool(self.holds) and not self.peer

    @property
    def held_names(self) -> tuple[str, ...]:
        """The driver names with a claim still reserved on the node."""
        return tuple(dict.fromkeys(name for name, _ in self.holds))


def served_names(index: ClaimIndex, pod: PodInfo, driver: Driver) -> list[tuple[str, str]]:
    """(name, how learned) of the drivers `pod` of `driver` serves on its node (rules above)."""
    learned = driver.learned or ("",) * len(driver.names)
    names = list(zip(driver.names, learned, strict=False))
    if driver.complete or not pod.node:
        return names
    accounted: set[str] = set(driver.names)
    unnamed: set[tuple[str, str]] = set()  # DaemonSets (a surge rollout runs two pods of one)
    for other_pod, other in index.driver_pods_on(pod.node):
        if other.protects:
            accounted.update(other.names)
        if not other.complete:
            unnamed.add((other_pod.namespace, other_pod.daemonset))
    from_slices = index.slices.drivers_on(pod.node)
    rest = sorted((from_slices | index.claim_drivers_on(pod.node)) - accounted)
    for name in rest:
        how = f"ResourceSlice on node {pod.node}" if name in from_slices else f"ResourceClaim allocated on node {pod.node}"
        how += ", named by no other driver pod there"
        if len(unnamed) > 1:
            how += f" (ambiguous: driver pods of {len(unnamed)} DaemonSets there do not name all theirs; each is held)"
        names.append((name, how))
    return names


def ready_peer(index: ClaimIndex, pod: PodInfo, *, leaving: frozenset[tuple[str, str]] = frozenset()) -> str:
    """ "namespace/name" of another Ready, running, not Terminating pod of pod's DaemonSet on its
    node, or "". `leaving`: (namespace, name) of pods whose own eviction was just allowed
    (webhook.model.leaving): no one's peer."""
    for other, _ in index.driver_pods_on(pod.node):
        if (
            other.daemonset == pod.daemonset
            and other.namespace == pod.namespace
            and other.name != pod.name
            and other.ready
            and not other.terminating
            and not other.finished
            and (other.namespace, other.name) not in leaving
        ):
            return f"{other.namespace}/{other.name}"
    return ""


def need(index: ClaimIndex, pod: PodInfo, driver: Driver) -> Need:
    """The Need of driver pod `pod` (of DaemonSet driver `driver`): dict lookups in the index, no I/O."""
    if not pod.node:
        return Need(pod=pod, driver=driver, names=tuple(zip(driver.names, driver.learned, strict=False)), holds=(), peer="")
    names = served_names(index, pod, driver)
    holds = tuple((name, h) for name, _ in names for h in index.holds(name, pod.node))
    peer = ready_peer(index, pod) if holds else ""
    return Need(pod=pod, driver=driver, names=tuple(names), holds=holds, peer=peer)
