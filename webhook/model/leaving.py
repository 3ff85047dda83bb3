"""Leaving: driver pods whose eviction dra-guard allowed a moment ago because a Ready peer of the
same DaemonSet serves their node (the seamless-upgrade rule, webhook.model.attribution).

During a surge rollout both pods of a driver on a node are Ready. Two evictions of them arriving
before the first one's Terminating state reaches the pod cache would each see the other as the
Ready peer, and both be allowed while a claim still needs the driver (cluster-autoscaler evicts a
node's DaemonSet pods together). The apiserver solves the same race for PodDisruptionBudgets with
``status.disruptedPods``; dra-guard's counterpart has two parts:

* Within one replica, `Leaving`: the allow-with-a-peer decision and its record happen under one
  lock, and a pod recorded here is nobody's peer until the cache shows it Terminating or gone, or
  `ttl` seconds pass (an eviction the apiserver then refused, e.g. by a PodDisruptionBudget, holds
  its peer for at most that long: 429, retried).
* Across replicas (the chart runs three; two evictions sent together usually reach two of them),
  a shared record: before such an allow is answered, the serving replica must own the
  `LeaveRecord` of (DaemonSet, node), a coordination.k8s.io/v1 Lease in dra-guard's namespace
  written with optimistic concurrency (webhook.kube.records). `judge()` says what an existing
  record means. Another live holder: that pod is leaving, so this one has no peer (429). At most
  one pod of a DaemonSet on a node leaves on the strength of a peer per record lifetime, whichever
  replica is asked.

The record names the leaving pod (holderIdentity namespace/name/uid) and, for whoever reads it,
the peer it relied on (an annotation). The decision never needs the peer: any live holder other
than the asking pod refuses, which is stricter than "excluded from the peers" (a third pod of the
DaemonSet on the node, which a maxSurge of 1 never makes, waits too) and needs no second record.
Thread-safe; no I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from webhook.model.claims import PodInfo

#: seconds a recorded pod stays no one's peer at most (and the shared record's leaseDurationSeconds)
TTL_SECONDS = 30.0
#: the name of every shared record starts with it (the rest: a digest of DaemonSet and node)
RECORD_PREFIX = "dra-guard-leaving-"

Key = tuple[str, str]  # (namespace, pod name)
#: what an existing shared record means for the pod asking: its own (a retried eviction), held by
#: another pod still leaving, or stale (its holder gone or Terminating, or it expired)
Verdict = Literal["same", "held", "stale"]


class Leaving:
    """Pods whose eviction was allowed on the strength of a peer, by (namespace, name)."""

    def __init__(self, ttl: float = TTL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self.lock = threading.Lock()  # held across "find a peer, then record": see the module docstring
        self._items: dict[Key, float] = {}

    def recent(self) -> frozenset[Key]:
        """The pods recorded less than ttl seconds ago (call with `lock` held to decide on them)."""
        now = self._clock()
        for key in [k for k, t in self._items.items() if now - t > self.ttl]:
            del self._items[key]
        return frozenset(self._items)

    def add(self, namespace: str, name: str) -> None:
        """Record pod namespace/name as leaving (call with `lock` held)."""
        self._items[(namespace, name)] = self._clock()

    def settle(self, namespace: str, name: str) -> None:
        """Forget a pod: the cache shows it Terminating or gone (its peers see that themselves), or
        its allow was withdrawn because the shared record could not be owned."""
        with self.lock:
            self._items.pop((namespace, name), None)


@dataclasses.dataclass(frozen=True)
class LeaveRecord:
    """The shared record a replica must own before it allows pod namespace/pod to leave on the
    strength of its Ready peer `peer` ("namespace/name") on `node`.

    name: the Lease's name (record_name(): one per DaemonSet and node, reused by every rollout).
    uid: the pod's metadata.uid ("" when unknown). seconds: leaseDurationSeconds.
    """

    name: str
    namespace: str
    pod: str
    uid: str
    daemonset: str
    node: str
    peer: str
    seconds: int

    @property
    def holder(self) -> str:
        """holderIdentity: "namespace/name/uid" (or "namespace/name" without a uid)."""
        return "/".join(p for p in (self.namespace, self.pod, self.uid) if p)


def record_name(namespace: str, daemonset: str, node: str) -> str:
    """The Lease name for DaemonSet namespace/daemonset on `node`: RECORD_PREFIX and 20 hex digits
    of a SHA-256 over the three (38 characters, a DNS label: any DaemonSet and node name fits)."""
    digest = hashlib.sha256(f"{namespace}/{daemonset}/{node}".encode()).hexdigest()[:20]
    return RECORD_PREFIX + digest


def record_for(pod: PodInfo, peer: str, *, ttl: float = TTL_SECONDS) -> LeaveRecord:
    """The LeaveRecord for driver pod `pod` leaving on the strength of `peer` ("namespace/name")."""
    return LeaveRecord(
        name=record_name(pod.namespace, pod.daemonset, pod.node),
        namespace=pod.namespace,
        pod=pod.name,
        uid=pod.uid,
        daemonset=f"{pod.namespace}/{pod.daemonset}",
        node=pod.node,
        peer=peer,
        seconds=max(1, round(ttl)),
    )


def parse_time(value: Any) -> datetime.datetime | None:
    """A Lease's MicroTime ("2026-12-01T10:00:00.000000Z") as an aware datetime; None if unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def judge(
    spec: Mapping[str, Any], record: LeaveRecord, *, now: datetime.datetime, live: Callable[[str, str, str], bool]
) -> Verdict:
    """What an existing record's Lease `spec` (coordination.k8s.io/v1 LeaseSpec dict) means for
    `record`'s pod, at `now` (aware datetime; replicas' clocks agree to well under a TTL).

    "same": it names this pod (same namespace/name, and uid when both have one): a retried
    eviction. "held": another pod that live(namespace, name, uid) says is still in the cache, not
    Terminating nor finished, and renewTime + leaseDurationSeconds (at most record.seconds; a
    renewTime more than that ahead of `now` is stale) is not past: that pod is leaving.
    "stale": anything else (no holder, holder gone or Terminating, expired, unreadable): take it over.
    """
    holder = spec.get("holderIdentity")
    if not isinstance(holder, str) or not holder:
        return "stale"
    namespace, _, rest = holder.partition("/")
    name, _, uid = rest.partition("/")
    if (namespace, name) == (record.namespace, record.pod) and (not uid or not record.uid or uid == record.uid):
        return "same"
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    seconds = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(seconds, int):
        return "stale"
    # never longer than dra-guard's own records last, whatever a writer put there: a renewTime
    # further ahead than that is no replica's (their clocks agree far better), a longer duration
    # counts as record.seconds
    ttl = datetime.timedelta(seconds=record.seconds)
    if renewed > now + ttl or renewed + min(datetime.timedelta(seconds=seconds), ttl) < now:
        return "stale"
    return "held" if live(namespace, name, uid) else "stale"
