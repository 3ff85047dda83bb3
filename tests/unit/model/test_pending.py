"""webhook.model.pending: what a review records, what it sees, and what a flood costs."""

from __future__ import annotations

import time

from tests.builders import binding, cluster_role, rule, subject
from webhook.model.pending import Pending

ALICE = [subject("User", "alice")]


def test_the_same_object_sent_again_is_one_version_held_by_each_review(monkeypatch):
    pending = Pending(ttl=30.0)
    b = binding("b", "r", ALICE)
    tokens = [pending.add(dict(b)) for _ in range(1000)]
    assert len(pending) == 1 and len(pending.bindings_of("r")) == 1
    for token in tokens[:-1]:
        pending.drop(token)  # each refused review drops only its own record
    assert pending.bindings_of("r") == [b]
    pending.drop(tokens[-1])
    assert pending.bindings_of("r") == [] and len(pending) == 0


def test_versions_are_found_by_key_and_roleref_and_expire_in_order(monkeypatch):
    pending = Pending(ttl=30.0)
    pending.add(cluster_role("r", [rule(["deviceclasses"], ["create"])]))
    pending.add(binding("b1", "r", ALICE))
    pending.add(binding("b2", "other", ALICE))
    assert [r["metadata"]["name"] for r in pending.roles("r")] == ["r"]
    assert [b["metadata"]["name"] for b in pending.bindings_of("r")] == ["b1"]
    # b1 re-pointed at another role: found under its new roleRef only
    pending.add(binding("b1", "other", ALICE))
    assert sorted(b["metadata"]["name"] for b in pending.bindings_of("other")) == ["b1", "b2"]
    assert [b["roleRef"]["name"] for b in pending.bindings_of("r")] == ["r"]  # the first version stays too
    later = time.monotonic() + 31
    monkeypatch.setattr("webhook.model.pending.time.monotonic", lambda: later)
    assert pending.roles("r") == [] and pending.bindings_of("other") == [] and len(pending) == 0


def test_a_settled_object_is_gone_and_an_old_record_never_drops_a_newer_version(monkeypatch):
    pending = Pending(ttl=30.0)
    b = binding("b", "r", ALICE)
    old = pending.add(dict(b))
    pending.settle("binding", "", "b")
    assert pending.bindings_of("r") == []
    pending.add(dict(b))  # sent again after the watch delivered it
    pending.drop(old)
    assert pending.bindings_of("r") == [b]
