"""Fixtures shared by the tests of the real `dra-guard serve` (tests/http): every test runs
against both engines of server.engine (`engine`: gthread, asyncio), and `server` is a fresh
`dra-guard serve --no-cluster` per test, ready (/readyz 200) when the test starts."""

from __future__ import annotations

import pytest

from tests.serve import DraGuardProcess

ENGINES = ["gthread", "asyncio"]


@pytest.fixture(scope="module", params=ENGINES, autouse=True)
def engine(request):
    """server.engine of every dra-guard serve the test starts (DraGuardProcess.engine)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DraGuardProcess, "engine", request.param)
        yield request.param


@pytest.fixture
def server(tmp_path):
    proc = DraGuardProcess(tmp_path, "--no-cluster")
    try:
        proc.wait("/readyz")
        yield proc
    finally:
        proc.stop()
