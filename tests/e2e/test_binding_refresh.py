"""The ClusterRoleBinding read before a ClusterRole with DeviceClass/ResourceSlice write is judged
(webhook/kube/state.py ClusterState.refresh_bindings) against the real apiserver: bounded as a whole
by cluster.requestTimeoutSeconds (so a cluster with tens of thousands of bindings is not refused by
the RBAC webhook's timeout), shared by concurrent reviews, and a failure when nothing answers."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import signal
import threading
import time

import pytest
from prometheus_client import REGISTRY

from webhook.config import ClusterConfig, Config
from webhook.kube.client import ClusterError, api_client
from webhook.kube.state import ClusterState

LABEL = "e2e-binding-refresh"
COUNT = 1000


def refreshes(outcome: str) -> float:
    return REGISTRY.get_sample_value("dra_guard_binding_refreshes_total", {"outcome": outcome}) or 0.0


def list_requests() -> float:
    return (
        REGISTRY.get_sample_value("dra_guard_kube_api_requests_total", {"verb": "list", "resource": "clusterrolebindings"}) or 0.0
    )


@pytest.fixture(scope="module")
def bindings(control_plane):
    """COUNT harmless ClusterRoleBindings (Group -> view), deleted after the module."""
    sess = control_plane.session("admin")
    url = f"{control_plane.url}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"

    def create(i: int) -> None:
        body = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{LABEL}-{i}", "labels": {LABEL: "1"}},
            "subjects": [{"kind": "Group", "name": f"team-{i}", "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "ClusterRole", "name": "view", "apiGroup": "rbac.authorization.k8s.io"},
        }
        resp = sess.post(url, json=body, timeout=30)
        assert resp.status_code in (201, 409), resp.text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(COUNT)))
    try:
        yield [f"{LABEL}-{i}" for i in range(COUNT)]
    finally:
        sess.delete(url, params={"labelSelector": LABEL}, timeout=60)


def state(control_plane, budget: float) -> ClusterState:
    """A ClusterState with no informers started: its index holds only what refresh_bindings reads."""
    config = dataclasses.replace(Config(), cluster=ClusterConfig(request_timeout_seconds=budget))
    client = api_client(str(control_plane.kubeconfig("admin")), timeout_seconds=budget)
    return ClusterState(client, config=config)


def names_in(st: ClusterState, names: list[str]) -> int:
    held = {b["metadata"]["name"] for b in st.rbac.bindings_of("view")}
    return sum(1 for n in names if n in held)


def test_a_read_in_full_fills_the_index_and_says_nothing(control_plane, bindings):
    st = state(control_plane, 2.0)
    before = refreshes("read")
    assert st.refresh_bindings() is None
    assert names_in(st, bindings) == COUNT
    assert refreshes("read") == before + 1


def test_a_list_longer_than_the_budget_ends_in_time_with_a_note(control_plane, bindings, monkeypatch):
    # one binding per page: over a thousand requests, several times 0.1 s even on a fast machine
    monkeypatch.setattr("webhook.kube.pages.LIST_PAGE_SIZE", 1)
    st = state(control_plane, 0.1)
    before = refreshes("partial")
    started = time.monotonic()
    note = st.refresh_bindings()
    elapsed = time.monotonic() - started
    assert elapsed < 0.1 + 0.5, elapsed
    assert note is not None and "did not finish within cluster.requestTimeoutSeconds (0.1 s;" in note
    read = len(list(st.rbac.bindings_of("view")))
    assert 0 < read and names_in(st, bindings) < COUNT, read
    assert refreshes("partial") == before + 1


def test_concurrent_reviews_share_one_read(control_plane, bindings):
    st = state(control_plane, 2.0)
    reads, shared, lists = refreshes("read"), refreshes("shared"), list_requests()
    barrier = threading.Barrier(4)

    def review() -> str | None:
        barrier.wait()
        return st.refresh_bindings()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        notes = list(pool.map(lambda _: review(), range(4)))
    assert notes == [None] * 4
    # the first read, then at most one more for reviews that arrived while it ran; the rest share
    assert refreshes("read") - reads <= 2 and refreshes("shared") - shared >= 2
    assert refreshes("read") - reads + refreshes("shared") - shared == 4
    assert list_requests() - lists <= 2 * 3  # up to 1,500 bindings: at most 3 pages per read
    assert names_in(st, bindings) == COUNT


def test_a_burst_of_clusterrole_reviews_makes_one_full_read_per_interval(control_plane, bindings):
    """A burst of (forged) ClusterRole reviews with DRA write must not make dra-guard LIST every
    binding for each: at most one full read per cluster.bindingRefreshIntervalSeconds; the rest are "recent"."""
    st = state(control_plane, 2.0)
    st.config = dataclasses.replace(
        st.config, cluster=dataclasses.replace(st.config.cluster, binding_refresh_interval_seconds=30.0)
    )
    reads, recent, lists = refreshes("read"), refreshes("recent"), list_requests()
    for _ in range(50):
        assert st.refresh_bindings() is None
    assert refreshes("read") - reads == 1 and refreshes("recent") - recent == 49
    assert list_requests() - lists <= 3  # one read: up to 1,500 bindings in at most 3 pages
    st.config = dataclasses.replace(
        st.config, cluster=dataclasses.replace(st.config.cluster, binding_refresh_interval_seconds=0.0)
    )
    assert st.refresh_bindings() is None and refreshes("read") - reads == 2  # 0: every review reads


def test_an_apiserver_that_does_not_answer_is_a_failure_in_time(control_plane, bindings):
    st = state(control_plane, 0.5)
    before = refreshes("failed")
    pid = control_plane._procs["kube-apiserver"].popen.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(ClusterError, match="reading ClusterRoleBindings failed"):
            st.refresh_bindings()
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < 0.5 + 0.5, elapsed
    assert refreshes("failed") == before + 1


def test_a_review_left_too_little_time_by_a_concurrent_read_starts_none_and_is_judged_from_the_cache(control_plane, bindings):
    """A review that waited for a concurrent read which ended partial (so cannot be shared) has
    almost none of its budget left: a read of its own would fail (the failureMode) for want of
    time, so it starts none and gets the note. The concurrent read is played by holding the lock."""
    st = state(control_plane, 0.5)
    before, lists = refreshes("partial"), list_requests()
    st._refresh_lock.acquire()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(st.refresh_bindings)
        time.sleep(0.45)  # the concurrent read takes 0.45 s of this review's 0.5 s
        st._refresh_lock.release()
        note = waiting.result()
    assert note and "did not finish within cluster.requestTimeoutSeconds (0.5 s" in note
    assert list_requests() == lists and refreshes("partial") == before + 1
