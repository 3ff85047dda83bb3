"""`FakeKubelet`: the test plays the kubelet for a node without one (tests.e2e.cluster.fake_node).

Used by test_drain.py (every drain there runs on fake nodes) and by test_node_drain.py (a second,
simulated node next to the real one, for devices reachable from two nodes).
"""

from __future__ import annotations

import json
import threading

#: the taints the node lifecycle controller puts on a node without kubelet: tolerated by the test
#: pods (and nothing else: the drain's own taints must still keep them off)
NO_KUBELET = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
]


class FakeKubelet:
    """Plays the kubelet for fake node `node`: pods bound there become Running and Ready; a pod with
    a deletionTimestamp becomes Succeeded and is then deleted (grace 0, UID precondition), unless
    its name is in `hold` (it stays Terminating, as when its driver cannot unprepare)."""

    def __init__(self, cp, node: str) -> None:
        self.cp, self.node = cp, node
        self.hold: set[str] = set()
        self.sess = cp.session("admin")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        url = self.cp.url
        while not self._stop.is_set():
            try:
                pods = self.sess.get(f"{url}/api/v1/pods?fieldSelector=spec.nodeName={self.node}", timeout=5).json()["items"]
                for p in pods:
                    meta = p["metadata"]
                    base = f"{url}/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                    patch = {"headers": {"Content-Type": "application/merge-patch+json"}, "timeout": 5}
                    if meta.get("deletionTimestamp"):
                        if meta["name"] in self.hold:
                            continue
                        if p["status"].get("phase") != "Succeeded":
                            self.sess.patch(
                                f"{base}/status",
                                data=json.dumps(
                                    {"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}}
                                ),
                                **patch,
                            )
                        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
                        self.sess.delete(base, json=body, timeout=5)
                    elif p["status"].get("phase") != "Running":
                        self.sess.patch(
                            f"{base}/status",
                            data=json.dumps(
                                {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
                            ),
                            **patch,
                        )
            except Exception:  # noqa: BLE001 - the apiserver may be busy; the next round tries again
                pass
            self._stop.wait(0.2)
