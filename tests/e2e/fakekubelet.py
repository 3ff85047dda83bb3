"""`FakeKubelet`: the test plays the kubelet for a node without one (tests.e2e.cluster.fake_node).

Used by test_drain.py (every drain there runs on fake nodes), by test_node_drain.py (a second,
simulated node next to the real one, for devices reachable from two nodes) and by
bench/drain_requests.py.
"""

from __future__ import annotations

import json
import threading
import time

#: the taints the node lifecycle controller puts on a node without kubelet: tolerated by the test
#: pods (and nothing else: the drain's own taints must still keep them off)
NO_KUBELET = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
]


class FakeKubelet:
    """Plays the kubelet for fake node `node` (as admin, every `period` seconds): pods bound there
    become Running and Ready; a pod with a deletionTimestamp becomes Succeeded and is then deleted
    (grace 0, UID precondition), as the kubelet does once it has unprepared its claims, unless its
    name is in `hold` (it stays Terminating, as when its driver cannot unprepare), and not before
    `hold_seconds` after it was first seen Terminating (a slow stop or unprepare)."""

    def __init__(self, cp, node: str, *, period: float = 0.2, hold_seconds: float = 0.0) -> None:
        self.cp, self.node, self.period, self.hold_seconds = cp, node, period, hold_seconds
        self.hold: set[str] = set()
        self.terminating: dict[str, float] = {}  # pod uid -> when first seen Terminating (monotonic)
        self.sess = cp.session("admin")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _status(self, base: str, phase: str, ready: bool) -> None:
        body = {"status": {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}}
        self.sess.patch(
            f"{base}/status", data=json.dumps(body), headers={"Content-Type": "application/merge-patch+json"}, timeout=5
        )

    def _run(self) -> None:
        url = self.cp.url
        while not self._stop.is_set():
            try:
                pods = self.sess.get(f"{url}/api/v1/pods?fieldSelector=spec.nodeName={self.node}", timeout=5).json()["items"]
                for p in pods:
                    meta = p["metadata"]
                    base = f"{url}/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                    if meta.get("deletionTimestamp"):
                        seen = self.terminating.setdefault(meta["uid"], time.monotonic())
                        if meta["name"] in self.hold or time.monotonic() - seen < self.hold_seconds:
                            continue
                        if p["status"].get("phase") != "Succeeded":
                            self._status(base, "Succeeded", False)
                        self.sess.delete(base, json={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}, timeout=5)
                    elif p["status"].get("phase") != "Running":
                        self._status(base, "Running", True)
            except Exception:  # noqa: BLE001 - the apiserver may be busy; the next round tries again
                pass
            self._stop.wait(self.period)
