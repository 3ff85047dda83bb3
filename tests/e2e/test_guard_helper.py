"""The helper every e2e test relies on: Guard.wait_called() must wait for dra-guard's real answer.

Matching "dra-guard" anywhere in kubectl's output is not enough: the probe's own name
(dra-guard-probe) is echoed by the apiserver, so such a wait returns at once with no webhook
registered, and a test asserting a refusal right after registering races the apiserver.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.guard import DENIED, PROBE, Guard, called


def test_the_probe_alone_never_counts_as_called():
    """What the apiserver prints for the probe without dra-guard contains "dra-guard" but is not its answer."""
    unregistered = [
        "clusterrolebinding.rbac.authorization.k8s.io/dra-guard-probe created (server dry run)\n",
        'Error from server (Forbidden): clusterrolebindings.rbac.authorization.k8s.io "dra-guard-probe" '
        'is forbidden: User "alice" cannot create resource "clusterrolebindings"\n',
    ]
    for text in unregistered:
        for mode in ("enforce", "warn", "audit"):
            assert not called(text, mode=mode)
    assert called(f"Error from server (Forbidden): error when creating: {DENIED}: dra-guard: ...", mode="enforce")
    assert called("Warning: dra-guard: Group dra-guard-probe would get write on ...", mode="warn")


@pytest.fixture(scope="module")
def unregistered(control_plane, tmp_path_factory):
    g = Guard(control_plane, tmp_path_factory.mktemp("dra-guard-helper"))
    g.unregister()  # whatever an earlier module left: nothing sends reviews to dra-guard now
    g.start(mode="enforce")
    try:
        yield g
    finally:
        g.stop()


@pytest.mark.parametrize("mode", ["enforce", "warn", "audit"])
def test_wait_called_times_out_when_nothing_is_registered(control_plane, unregistered, mode):
    guard = unregistered
    guard.unregister()
    guard.start(mode=mode)
    out = control_plane.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=PROBE, check=False)
    assert "dra-guard-probe" in out.stdout + out.stderr  # the trap the old helper fell into
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        guard.wait_called(timeout=3)
    assert time.monotonic() - started >= 3
    # and once registered it does return, in every mode
    guard.register()
