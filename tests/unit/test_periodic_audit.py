"""The in-server periodic audit over the worker's caches: it waits for them to be in sync
before its first run instead of skipping a whole interval (600 s by default)."""

from __future__ import annotations

import threading

from webhook.config import from_mapping
from webhook.serve.periodic import PeriodicAudit


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
    monkeypatch.setattr(audit, "run_once", ran.set)
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
