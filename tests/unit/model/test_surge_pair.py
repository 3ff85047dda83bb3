"""Evictions in flight together: at most one pod of a driver's surge pair leaves while claims are
held, also when the two evictions arrive before the first one's Terminating state reaches the
cache (webhook.model.leaving), within one replica."""

from __future__ import annotations

import threading

from tests.builders import claim, eviction_request, index_with, pod
from webhook.config import from_mapping
from webhook.model.leaving import Leaving
from webhook.policies import eviction

CONFIG = from_mapping(None).eviction


def ready(p, *, terminating=False):
    p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    if terminating:
        p["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    return p


def surge_pair():
    """Node node-a: the driver's pod gpu-driver-a and its surge peer gpu-driver-a2, both Ready; a
    consumer's claim reserved there."""
    return index_with(
        ready(pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver")),
        ready(pod("gpu-driver-a2", "node-a", namespace="gpu", ds="gpu-driver")),
        pod("consumer", "node-a"),
        claim("gpu"),
    )


def decide(idx, name, **kw):
    return eviction.review(eviction_request(name, **kw), index=idx, config=CONFIG)


def test_the_second_pod_of_a_surge_pair_is_held_while_the_first_is_leaving():
    idx = surge_pair()
    first = decide(idx, "gpu-driver-a")
    assert first.allowed and "seamless upgrade" in first.warnings[0]
    second = decide(idx, "gpu-driver-a2")  # the cache still shows gpu-driver-a Ready
    assert not second.allowed and second.findings[0].code == 429
    assert (
        "gpu/gpu-driver-a" in second.findings[0].message
        and "one pod of a surge pair goes at a time" in second.findings[0].message
    )


def test_a_dry_run_leaves_nothing_behind():
    idx = surge_pair()
    assert decide(idx, "gpu-driver-a", dry_run=True).allowed
    assert decide(idx, "gpu-driver-a2").allowed


def test_once_the_cache_shows_the_first_terminating_the_record_goes_and_the_rule_holds_by_itself():
    idx = surge_pair()
    assert decide(idx, "gpu-driver-a").allowed
    idx.upsert_pod(ready(pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"), terminating=True))
    assert idx.leaving.recent() == frozenset()
    assert not decide(idx, "gpu-driver-a2").allowed  # no Ready, not Terminating peer: held


def test_an_eviction_the_apiserver_refused_after_us_holds_its_peer_only_for_the_ttl():
    now = [0.0]
    idx = surge_pair()
    idx.leaving = Leaving(ttl=30, clock=lambda: now[0])
    assert decide(idx, "gpu-driver-a").allowed  # then, say, a PodDisruptionBudget refused it: still Ready
    assert not decide(idx, "gpu-driver-a2").allowed
    now[0] = 31.0
    assert decide(idx, "gpu-driver-a2").allowed


def race(idx) -> list[bool]:
    """Both pods' evictions decided at the same moment in two threads: [allowed, allowed]."""
    start = threading.Barrier(2)
    answers = {}

    def evict(name):
        start.wait()
        answers[name] = decide(idx, name).allowed

    threads = [threading.Thread(target=evict, args=(n,)) for n in ("gpu-driver-a", "gpu-driver-a2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(answers.values())


def test_two_evictions_sent_together_are_never_both_allowed():
    for _ in range(200):
        assert race(surge_pair()) == [False, True]
