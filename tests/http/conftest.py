"""Fixtures shared by the tests of the real `dra-guard serve` (tests/http): `server` is a fresh
`dra-guard serve --no-cluster` per test, ready (/readyz 200) when the test starts."""

from __future__ import annotations

import pytest

from tests.serve import DraGuardProcess


@pytest.fixture
def server(tmp_path):
    proc = DraGuardProcess(tmp_path, "--no-cluster")
    try:
        proc.wait("/readyz")
        yield proc
    finally:
        proc.stop()
