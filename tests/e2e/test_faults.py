"""API server faults while dra-guard runs: a restart with etcd compacted meanwhile (the
watches' resourceVersions are too old afterwards), readiness that tells the truth, no decision on
stale caches, and an API call that hangs answered by the policy's fallback in time."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import requests

from tests.builders import binding, review, subject
from tests.scrape import metric, scrape


def ready(guard) -> bool:
    try:
        return guard.proc.session().get(guard.url + "/readyz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def compact_etcd(cp) -> None:
    """Compact etcd at its current revision through its gRPC gateway (what etcd does every 5 min)."""
    s = requests.Session()
    s.trust_env = False
    head = s.post(cp.etcd_url + "/v3/kv/range", json={"key": "AA=="}, timeout=5).json()["header"]["revision"]
    s.post(cp.etcd_url + "/v3/kv/compaction", json={"revision": head, "physical": True}, timeout=10).raise_for_status()


def test_apiserver_restart_with_compaction_relists_and_is_ready_within_10_s(control_plane, guard):
    cp = control_plane
    assert ready(guard)
    lists_before = metric(
        scrape(guard.proc), 'dra_guard_kube_api_requests_total{resource="clusterroles",verb="list"}', default=0.0
    )
    # writes, then compaction: the resourceVersions dra-guard watches from are gone afterwards
    for i in range(3):
        cp.kubectl("admin", "create", "clusterrole", f"e2e-fault-{i}", "--verb=get", "--resource=configmaps")
    compact_etcd(cp)
    seen_unready = threading.Event()
    stop = threading.Event()

    def watch_readiness():
        while not stop.is_set():
            if not ready(guard):
                seen_unready.set()
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_readiness)
    watcher.start()
    try:
        cp.restart_apiserver()  # returns once /readyz of the apiserver answers again
        back = time.monotonic()
        while not ready(guard):
            assert time.monotonic() - back < 10, f"not ready 10 s after the apiserver came back:\n{guard.proc.log()}"
            time.sleep(0.1)
        ready_after = time.monotonic() - back
    finally:
        stop.set()
        watcher.join()
        cp.kubectl("admin", "delete", "clusterrole", "e2e-fault-0", "e2e-fault-1", "e2e-fault-2", check=False)
    assert seen_unready.is_set(), "/readyz never said the caches were out of sync while the apiserver was away"
    assert (
        metric(scrape(guard.proc), 'dra_guard_kube_api_requests_total{resource="clusterroles",verb="list"}', default=0.0)
        > lists_before
    )
    assert ready_after < 10
    print(f"\nready {ready_after:.1f} s after the apiserver came back")
    # and it judges again, from the relisted caches
    out = cp.kubectl(
        "alice",
        "create",
        "--dry-run=server",
        "-f",
        "-",
        check=False,
        input=json.dumps(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "e2e-after"},
                "subjects": [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "ClusterRole", "name": "cluster-admin", "apiGroup": "rbac.authorization.k8s.io"},
            }
        ),
    )
    assert out.returncode != 0 and "Group team-a" in out.stderr


def test_hanging_api_call_gets_the_fallback_answer_in_time(control_plane, guard):
    """The only API call on the admission path (a roleRef missing from the cache) hangs: the answer
    still comes well within the 3 s webhook timeout, and it is the RBAC guard's fallback (deny)."""
    cp = control_plane
    pid = cp._procs["kube-apiserver"].popen.pid
    body = review(binding("e2e-hang", "role-nobody-has", [subject("Group", "team-a")]))
    os.kill(pid, signal.SIGSTOP)  # connections open, nothing answers
    try:
        started = time.monotonic()
        out = guard.proc.session().post(guard.url + "/validate/rbac", json=body, timeout=10).json()
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < 3, elapsed
    print(f"\nanswered in {elapsed:.2f} s while the apiserver hung")
    resp = out["response"]
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 500 and "internal error" in resp["status"]["message"]
    assert "Traceback" not in json.dumps(out)
    # once the apiserver answers again the same review is decided normally
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        again = guard.proc.session().post(guard.url + "/validate/rbac", json=body, timeout=10).json()["response"]
        if again["allowed"]:
            break
        time.sleep(0.5)
    assert again["allowed"] is True and "does not exist yet" in again["warnings"][0], (again, guard.proc.log()[-3000:])
