"""Pages (webhook/kube/pages.py) and the indexes' replace_*: a relist is streamed page by page, and
a list that fails half-way leaves every index as it was (peak RSS without losing atomicity)."""

from __future__ import annotations

import json

import pytest

from tests.builders import binding, claim, cluster_role, index_with, pod, subject
from webhook.kube.pages import Pages, list_pages
from webhook.model.rbac_index import RbacIndex


class FakeList:
    """A list function over `items` in pages of the size asked for; fails on page `fail_at`."""

    def __init__(self, items, *, fail_at=None):
        self.items, self.fail_at, self.calls = items, fail_at, []

    def __call__(self, *, limit, _continue=None, **_kwargs):
        start = int(_continue or 0)
        self.calls.append(start)
        if self.fail_at is not None and len(self.calls) > self.fail_at:
            raise ConnectionError("apiserver went away")
        end = start + limit
        meta = {"resourceVersion": "42"}
        if end < len(self.items):
            meta["continue"] = str(end)
        body = json.dumps({"metadata": meta, "items": self.items[start:end]}).encode()
        return type("Resp", (), {"data": body})()


def test_pages_stream_every_item_once_then_give_the_resource_version(monkeypatch):
    monkeypatch.setattr("webhook.kube.pages.LIST_PAGE_SIZE", 3)
    fake = FakeList([{"n": i} for i in range(8)])
    pages = Pages(fake, resource="things", timeout_seconds=1)
    seen = []
    for item in pages:
        seen.append(item["n"])
        assert pages.resource_version is None  # not before the last page
        assert len(fake.calls) == (item["n"] // 3) + 1  # one page read at a time, lazily
    assert seen == list(range(8)) and pages.count == 8 and pages.resource_version == "42"
    assert list_pages(FakeList([{"n": 1}]), resource="things", timeout_seconds=1) == ([{"n": 1}], "42")


def test_a_failed_relist_leaves_the_rbac_index_as_it_was(monkeypatch):
    monkeypatch.setattr("webhook.kube.pages.LIST_PAGE_SIZE", 2)
    index = RbacIndex()
    index.replace_roles([cluster_role("old-role")])
    index.replace_bindings([binding("old-binding", "old-role", [subject("Group", "g")])])
    roles = [cluster_role(f"r{i}") for i in range(5)]
    bindings = [binding(f"b{i}", f"r{i}", [subject("Group", "g")]) for i in range(5)]
    with pytest.raises(ConnectionError):
        index.replace_roles(Pages(FakeList(roles, fail_at=1), resource="clusterroles", timeout_seconds=1))
    with pytest.raises(ConnectionError):
        index.replace_bindings(Pages(FakeList(bindings, fail_at=2), resource="clusterrolebindings", timeout_seconds=1))
    assert index.role("old-role") is not None and index.role("r0") is None
    assert [b["metadata"]["name"] for b in index.bindings_of("old-role")] == ["old-binding"]
    index.replace_bindings(Pages(FakeList(bindings), resource="clusterrolebindings", timeout_seconds=1))
    assert [b["metadata"]["name"] for b in index.bindings_of("r3")] == ["b3"] and not index.bindings_of("old-role")


def test_a_failed_relist_leaves_the_claim_index_as_it_was(monkeypatch):
    monkeypatch.setattr("webhook.kube.pages.LIST_PAGE_SIZE", 2)
    index = index_with(pod("consumer", "node-a"), claim("gpu"))
    held = index.holds("gpu.example.com", "node-a")
    assert held
    others = [claim(f"c{i}", node="node-b", reserved=()) for i in range(5)]
    with pytest.raises(ConnectionError):
        index.replace_claims(Pages(FakeList(others, fail_at=1), resource="resourceclaims", timeout_seconds=1))
    with pytest.raises(ConnectionError):
        index.replace_pods(Pages(FakeList([pod("x", "node-b")] * 3, fail_at=1), resource="pods", timeout_seconds=1))
    assert index.holds("gpu.example.com", "node-a") == held
    index.replace_claims(Pages(FakeList([]), resource="resourceclaims", timeout_seconds=1))
    # the claim is gone from the index; the consumer running on node-a still references it
    assert [h.claim for h in index.holds("gpu.example.com", "node-a")] == [
        "work/gpu (missing or not allocated, still referenced)"
    ]


class TimedList(FakeList):
    """FakeList that records the _request_timeout each page was asked with."""

    def __init__(self, items, **kwargs):
        super().__init__(items, **kwargs)
        self.timeouts = []

    def __call__(self, **kwargs):
        self.timeouts.append(kwargs.get("_request_timeout"))
        return super().__call__(**kwargs)


def test_a_deadline_bounds_the_whole_list_not_each_page(monkeypatch):
    import time

    monkeypatch.setattr("webhook.kube.pages.LIST_PAGE_SIZE", 2)
    fake = TimedList([{"n": i} for i in range(6)])
    pages = Pages(fake, resource="things", timeout_seconds=5, deadline=time.monotonic() + 1.0)
    assert [i["n"] for i in pages] == list(range(6)) and not pages.truncated and pages.resource_version == "42"
    assert all(0 < t <= 1.0 for t in fake.timeouts), fake.timeouts  # each page waits only for what is left

    fake = TimedList([{"n": i} for i in range(6)])
    pages = Pages(fake, resource="things", timeout_seconds=5, deadline=time.monotonic() - 1)
    # the first page is always asked for (briefly); once past the deadline no further page is
    assert [i["n"] for i in pages] == [0, 1] and pages.truncated and pages.resource_version is None
    assert fake.calls == [0] and fake.timeouts[0] <= 0.01


def test_after_page_runs_once_a_page_is_consumed_and_before_the_next_is_asked(monkeypatch):
    monkeypatch.setattr("webhook.kube.pages.LIST_PAGE_SIZE", 3)
    fake = FakeList([{"n": i} for i in range(7)])
    events = []
    pages = Pages(fake, resource="things", timeout_seconds=1, after_page=lambda: events.append(("settled", len(fake.calls))))
    for item in pages:
        events.append(item["n"])
    assert events == [0, 1, 2, ("settled", 1), 3, 4, 5, ("settled", 2), 6, ("settled", 3)]


def test_the_informers_settle_the_collector_after_every_page(monkeypatch):
    """A relist's fresh tables, unfrozen, would make full collections walk millions of objects with
    the GIL held (reviews stalled up to ~470 ms at the envelope); the informer freezes what is
    alive after each page, not only at the end of the list."""
    import gc
    import threading

    from webhook.kube import informer as informer_module

    monkeypatch.setattr("webhook.kube.pages.LIST_PAGE_SIZE", 2)
    freezes = []
    monkeypatch.setattr(informer_module, "settle_page", lambda: freezes.append(len(seen)))
    seen = []
    done = threading.Event()

    def on_replace(items):
        seen.extend(items)
        done.set()

    inf = informer_module.Informer(
        name="things",
        list_func=FakeList([{"n": i} for i in range(5)]),
        on_replace=on_replace,
        on_event=lambda *_: None,
        timeout_seconds=1,
    )
    monkeypatch.setattr(inf, "_watch_from", lambda rv: inf._stop.wait(5))
    monkeypatch.setattr(informer_module, "release_free_memory", lambda: None)
    inf.start()
    assert done.wait(5)
    inf.stop()
    inf.thread.join(5)
    assert freezes == [2, 4, 5]  # after each page of 2
    assert gc.isenabled()


def test_relists_run_one_at_a_time_while_first_lists_run_together(monkeypatch):
    """Every watch breaks when the apiserver restarts; relisting every cache at once held every
    large cache twice (417 -> 600 MiB at the envelope). First lists have nothing old to hold."""
    import threading

    from kubernetes.client.rest import ApiException

    from webhook.kube import informer as informer_module

    monkeypatch.setattr(informer_module, "release_free_memory", lambda: None)
    monkeypatch.setattr(informer_module, "SERIAL_RELIST_OBJECTS", 1)  # every test cache counts as large
    inside, overlap, lists = [], [], {"a": 0, "b": 0}
    both_in_first = threading.Barrier(2, timeout=5)
    relisted = threading.Event()
    lock = threading.Lock()

    def make(name):
        def on_replace(items):
            list(items)
            with lock:
                lists[name] += 1
                first = lists[name] == 1
                inside.append((name, first))
                overlap.append(sum(1 for _, f in inside if f == first))  # lists of the same sort at once
            if first:
                both_in_first.wait()  # the first lists run together (a slot would deadlock here)
            else:
                relisted.wait(0.2)  # hold the relist a while: the other must not be inside meanwhile
            with lock:
                inside.remove((name, first))

        inf = informer_module.Informer(
            name=name, list_func=FakeList([{"n": 1}]), on_replace=on_replace, on_event=lambda *_: None, timeout_seconds=1
        )
        watches = []

        def watch_from(rv):
            watches.append(rv)
            if len(watches) == 1:
                raise ApiException(status=410, reason="too old")  # one relist, then quiet
            inf._stop.wait(5)

        monkeypatch.setattr(inf, "_watch_from", watch_from)
        return inf

    infs = [make("a"), make("b")]
    for inf in infs:
        inf.start()
    deadline = __import__("time").monotonic() + 5
    while min(lists.values()) < 2 and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.01)
    for inf in infs:
        inf.stop()
    assert lists == {"a": 2, "b": 2}
    assert overlap[:2] == [1, 2] and max(overlap[2:]) == 1  # together at first, one at a time after


def test_small_caches_relist_without_waiting_for_a_large_one(monkeypatch):
    """A relist of 7 Roles must not wait 48 s for 100,000 Pods to relist (seen at the envelope)."""
    import threading

    from webhook.kube import informer as informer_module

    monkeypatch.setattr(informer_module, "release_free_memory", lambda: None)
    monkeypatch.setattr(informer_module, "SERIAL_RELIST_OBJECTS", 3)
    relisted = threading.Event()
    inf = informer_module.Informer(
        name="roles",
        list_func=FakeList([{"n": 1}, {"n": 2}]),
        on_replace=lambda items: (list(items), inf.listed and relisted.set()),
        on_event=lambda *_: None,
        timeout_seconds=1,
    )
    calls = []

    def watch_from(rv):
        calls.append(rv)
        if len(calls) == 1:
            from kubernetes.client.rest import ApiException

            raise ApiException(status=410, reason="too old")
        inf._stop.wait(5)

    monkeypatch.setattr(inf, "_watch_from", watch_from)
    with informer_module.RELIST_SLOT:  # a large cache is relisting
        inf.start()
        assert relisted.wait(5)  # 2 objects < 3: relisted meanwhile
    inf.stop()


def test_collector_pauses_are_timed_into_a_metric_once_per_process(caplog):
    """dra_guard_gc_pause_seconds{generation}: collector stalls are visible to operators."""
    import gc

    from prometheus_client import REGISTRY

    from webhook.kube import informer as informer_module

    def count(generation):
        return REGISTRY.get_sample_value("dra_guard_gc_pause_seconds_count", {"generation": generation}) or 0

    informer_module.watch_collector_pauses()
    informer_module.watch_collector_pauses()
    try:
        assert gc.callbacks.count(informer_module._on_gc) == 1
        before = count("2")
        gc.collect()
        assert count("2") == before + 1
        informer_module._GC_STARTED[0] -= 0.5  # a collection that "took" half a second is logged
        informer_module._on_gc("stop", {"generation": 2, "collected": 0})
        assert any(r.getMessage() == "a garbage collection paused the worker" for r in caplog.records)
    finally:
        gc.callbacks.remove(informer_module._on_gc)


def test_the_server_caps_malloc_arenas_unless_the_environment_says_otherwise(monkeypatch):
    """Uncapped, threads each get a glibc arena and a relist's freed pages stay spread over them."""
    import platform

    from webhook.serve import server

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    if platform.libc_ver()[0] == "glibc":
        assert server.limit_malloc_arenas() is True
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert server.limit_malloc_arenas() is False  # the operator's setting wins
