"""The in-server periodic audit over the worker's caches: it waits for them to be in sync
before its first run instead of skipping a whole interval (600 s by default)."""

from __future__ import annotations

import datetime
import threading

from webhook.config import from_mapping
from webhook.kube import leases
from webhook.kube.errors import ClusterError
from webhook.serve.periodic import LEASE_POLL_SECONDS, PeriodicAudit, next_wait


class Caches:
    """Facts whose synced() turns true after `after` calls (what a starting worker's caches do)."""

    def __init__(self, after: int) -> None:
        self.calls, self.after = 0, after

    def synced(self, names=None):
        self.calls += 1
        return (self.calls > self.after), "caches not synced: pods"


def test_the_first_audit_runs_once_the_caches_are_in_sync_not_an_interval_later(monkeypatch):
    config = from_mapping({"audit": {"intervalSeconds": 600}})
    audit = PeriodicAudit.__new__(PeriodicAudit)  # no API client: run_once is replaced below
    caches = Caches(after=2)
    audit.config, audit.synced = config, caches.synced
    ran = threading.Event()

    def run_once():
        ran.set()
        return "a summary"  # this replica holds the Lease

    monkeypatch.setattr(audit, "run_once", run_once)
    waits = []
    stop = threading.Event()

    def wait(seconds):
        waits.append(seconds)
        return len(waits) > 3  # stop after the first interval's wait

    monkeypatch.setattr(stop, "wait", wait)
    audit.loop(stop)
    assert ran.is_set() and caches.calls == 3
    assert waits[:2] == [1.0, 1.0] and 600 in waits  # polled each second, then the interval


def test_reports_without_an_owner_are_warned_about_once_not_every_interval(caplog):
    audit = PeriodicAudit.__new__(PeriodicAudit)  # no API client: only the log decision is exercised
    audit.owner_problem_logged = ""
    problems = ["no owner configured (audit.reportOwnerClusterRole)"] * 3 + [
        "",
        "cannot read ClusterRole dg-dra-guard: 403 Forbidden",
        "cannot read ClusterRole dg-dra-guard: 403 Forbidden",
    ]
    with caplog.at_level("WARNING", logger="dra_guard.audit"):
        for problem in problems:  # what six audits' summaries said
            audit.log_owner_problem(problem)
    warned = [r for r in caplog.records if "carry no owner" in r.getMessage()]
    assert [r.reason for r in warned] == [problems[0], problems[4]]  # type: ignore[attr-defined]


def test_a_replica_without_the_lease_asks_again_soon(monkeypatch):
    """Held: the next audit an interval later; not held (another replica audits): asked again
    after LEASE_POLL_SECONDS, so that the replica of a new configuration audits as soon as the old
    holder is gone (it gives the Lease up once drained: webhook.serve.draining.at_exit)."""
    config = from_mapping({"audit": {"intervalSeconds": 600}})
    audit = PeriodicAudit.__new__(PeriodicAudit)
    audit.config, audit.synced = config, None
    held = iter([None, None, "a summary"])  # another holds it twice, then this replica takes it
    monkeypatch.setattr(audit, "run_once", lambda: next(held))
    waits = []
    stop = threading.Event()

    def wait(seconds):
        waits.append(seconds)
        return len(waits) == 3

    monkeypatch.setattr(stop, "wait", wait)
    audit.loop(stop)
    assert waits == [LEASE_POLL_SECONDS, LEASE_POLL_SECONDS, 600]


def test_a_failed_audit_is_retried_with_a_backoff_not_an_interval_later(monkeypatch):
    """An apiserver away for a minute: the reports are fresh again about a minute later, not one
    interval later; a failure that lasts is tried at most every interval; a success resets it."""
    config = from_mapping({"audit": {"intervalSeconds": 600}})
    audit = PeriodicAudit.__new__(PeriodicAudit)
    audit.config, audit.synced = config, None
    away = ClusterError("apiserver away")
    outcomes = iter([away, away, away, "a summary", away, *[away] * 8])

    def run_once():
        outcome = next(outcomes)
        if outcome is away:
            raise away
        return outcome

    monkeypatch.setattr(audit, "run_once", run_once)
    waits = []
    stop = threading.Event()

    def wait(seconds):
        waits.append(seconds)
        return len(waits) == 13

    monkeypatch.setattr(stop, "wait", wait)
    audit.loop(stop)
    poll = LEASE_POLL_SECONDS
    assert waits[:5] == [poll, 2 * poll, 4 * poll, 600, poll]
    assert max(waits) == 600 and waits[-1] == 600  # a failure that lasts: every interval at most
    assert next_wait(held=False, failures=0, interval=5) == 5  # never longer than the interval


class Leases:
    """coordination.k8s.io/v1 Lease dicts by name (webhook.kube.leases.LeaseCalls), in memory."""

    def __init__(self) -> None:
        self.leases: dict[str, dict] = {}

    def get_lease(self, name):
        return self.leases.get(name)

    def create_lease(self, lease):
        self.leases[lease["metadata"]["name"]] = dict(lease)

    def update_lease(self, lease):
        self.leases[lease["metadata"]["name"]] = dict(lease)


def test_a_released_lease_is_taken_at_once_by_another_replica_and_only_its_holder_releases_it():
    api = Leases()
    now = datetime.datetime.now(datetime.UTC)
    assert leases.hold_lease(api, "audit", identity="old", now=now, duration_seconds=930)
    assert not leases.hold_lease(api, "audit", identity="new", now=now, duration_seconds=930)  # live: waits
    assert not leases.release_lease(api, "audit", identity="new")  # not its own
    assert api.leases["audit"]["spec"]["holderIdentity"] == "old"
    assert leases.release_lease(api, "audit", identity="old")
    assert leases.hold_lease(api, "audit", identity="new", now=now, duration_seconds=930)  # not 930 s later
    assert not leases.release_lease(api, "missing", identity="new")
