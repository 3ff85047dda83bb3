"""Leaving: driver pods whose eviction this replica allowed a moment ago because a Ready peer of
the same DaemonSet serves their node (the seamless-upgrade rule, webhook.model.attribution).

During a surge rollout both pods of a driver on a node are Ready. Two evictions of them arriving
before the first one's Terminating state reaches the pod cache would each see the other as the
Ready peer, and both be allowed while a claim still needs the driver (cluster-autoscaler evicts a
node's DaemonSet pods together). The apiserver solves the same race for PodDisruptionBudgets with
``status.disruptedPods``; this is its counterpart within one replica: the allow-with-a-peer
decision and its record happen under one lock, and a pod recorded here is nobody's peer until
the cache shows it Terminating or gone, or `ttl` seconds pass (an eviction the apiserver then
refused, e.g. by a PodDisruptionBudget, holds its peer for at most that long: 429, retried).
Across replicas the window is the watch delay of the first pod's deletion to the other replica.
Thread-safe; no I/O.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: seconds a recorded pod stays no one's peer at most
TTL_SECONDS = 30.0

Key = tuple[str, str]  # (namespace, pod name)


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
        """Forget a pod the cache now shows Terminating or gone (its peers see that themselves)."""
        with self.lock:
            self._items.pop((namespace, name), None)
