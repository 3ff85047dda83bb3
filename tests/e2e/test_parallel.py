"""Parallel apiserver traffic (issue 21, item 3): ClusterRoleBindings created at once through the
real apiserver, as GitOps tools do, are all judged by dra-guard in time. Before issue 21, 18 to 21
of 50 got the 3 s webhook timeout and the fail-closed RBAC webhook answered HTTP 500.

50 here, the burst that failed before: 200 at once passed alone here 7 times out of 7 but not
under a loaded machine (31 of 200 timed out once), so the issue's 200 stays open
(docs/reliability.md) and CI asserts what holds."""
from __future__ import annotations

import concurrent.futures
import time

COUNT = 50


def test_compliant_bindings_created_in_parallel_all_succeed(control_plane, guard):
    cp = control_plane
    url = f"{cp.url}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    reviewed = guard.reviews_counted()

    def create(i: int) -> tuple[int, float, str]:
        body = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"e2e-parallel-{i:03d}", "labels": {"e2e": "parallel"}},
                "subjects": [{"kind": "Group", "name": f"team-{i}", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "ClusterRole", "name": "view", "apiGroup": "rbac.authorization.k8s.io"}}
        started = time.monotonic()
        r = cp.session("alice").post(url, json=body, timeout=30)
        return r.status_code, time.monotonic() - started, r.text[:300]

    try:
        with concurrent.futures.ThreadPoolExecutor(COUNT) as pool:
            results = list(pool.map(create, range(COUNT)))
        failed = [r for r in results if r[0] != 201]
        slowest = max(r[1] for r in results)
        print(f"\n{COUNT} parallel creates: {len(failed)} failed, slowest {slowest:.2f} s")
        assert not failed, failed[:5]
        # every one was judged by dra-guard (not let through by anything else)
        assert guard.reviews_counted() - reviewed >= COUNT
    finally:
        cp.kubectl("admin", "delete", "clusterrolebindings", "-l", "e2e=parallel", "--wait=false", check=False)
