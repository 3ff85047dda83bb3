"""Fixtures shared by the tests of the real `dra-guard serve` (tests/http): `server` is a fresh
`dra-guard serve --no-cluster` per test, for the tests that stop, kill or saturate their server;
`shared_server` is one per module for the tests that only send it requests (starting one costs
about a second of CPU); both are ready (/readyz 200) when the test starts. `held` replaces every
policy with one that holds its judgment until the test releases it (for the in-process front of
tests/http/inprocess.py)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from tests.serve import DraGuardProcess
from webhook.policies.decision import ALLOW
from webhook.serve import app as app_module


def _ready_server(workdir):
    proc = DraGuardProcess(workdir, "--no-cluster")
    try:
        proc.wait("/readyz")
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def server(tmp_path):
    yield from _ready_server(tmp_path)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    yield from _ready_server(tmp_path_factory.mktemp("serve"))


@pytest.fixture
def held(monkeypatch):
    """Every policy replaced by one that allows once the test sets `release` (and says, in
    `running`, that a judgment has started)."""
    running, release, ended = threading.Event(), threading.Event(), threading.Event()

    def policy(request, facts, config):
        running.set()
        release.wait(30)
        ended.set()
        return ALLOW

    monkeypatch.setattr(app_module, "POLICIES", tuple(dataclasses.replace(p, review=policy) for p in app_module.POLICIES))
    try:
        yield running, release, ended
    finally:
        release.set()
