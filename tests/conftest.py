"""Fixtures shared by every test folder: the real control plane, one per test session (with
pytest-xdist, as tests/run runs the suite: one per worker), and how the workers share the tests.

`control_plane` lives here (not in tests/e2e/conftest.py) so that tests/e2e and tests/chart share
one instance: a fixture defined in two conftest files would start two clusters in one session.
A missing Go toolchain or a failed build is a test failure, not a skip: the end-to-end tests must
not pass silently without a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.e2e.cluster import ControlPlane


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: no error when xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """With ``-n N`` (tests/run), whole modules go to the workers, the real-node modules together
    and first (tests/workers.py); the collection order is kept, so they are first."""
    from tests.workers import ModulesAndOneRealNode

    config.option.loadscopereorder = False
    return ModulesAndOneRealNode(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the tests of the real-node modules (tests/workers.py) first, keeping every other
    order: with xdist they are one unit of work that a worker should start first (without xdist
    they simply run first). Every xdist worker orders the same collection the same way."""
    from tests.workers import is_real_node_module

    items.sort(key=lambda item: not is_real_node_module(item.nodeid.split("::", 1)[0]))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running ControlPlane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    audit log on), shared by the whole session and stopped at its end.

    Fails the requesting test (pytest.fail) when the binaries cannot be built or the control
    plane does not start; the message names the cause and the log tail.
    """
    from tests.e2e import binaries
    from tests.e2e.cluster import ControlPlane, ControlPlaneError

    try:
        bin_dir = binaries.build_control_plane()
        tools_dir = binaries.client_tools_dir()
    except binaries.BinariesError as exc:
        pytest.fail(f"cannot provide the Kubernetes binaries for the e2e tests: {exc}", pytrace=False)
    cp = ControlPlane(
        tmp_path_factory.mktemp("control-plane"), controllers=True, audit_log=True, bin_dir=bin_dir, tools_dir=tools_dir
    )
    started = time.monotonic()
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the control plane did not start (files in {cp.workdir}): {exc}", pytrace=False)
    print(f"\ncontrol plane at {cp.url} ready in {time.monotonic() - started:.1f} s (files in {cp.workdir})")
    try:
        yield cp
    finally:
        cp.stop()
