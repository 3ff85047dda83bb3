"""Fixtures for the end-to-end tests: one real control plane per test session.

Every test under tests/e2e is marked ``e2e`` automatically, so ``pytest -m "not e2e"`` skips
them all. A missing Go toolchain or a failed build is a test failure, not a skip: the e2e
suite must not pass silently without a cluster.
"""
from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import pytest

from tests.e2e import binaries
from tests.e2e.cluster import ControlPlane, ControlPlaneError

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the items collected from this folder with ``e2e``.

    The hook sees every item of the session, not only this folder's, hence the path check.
    """
    for item in items:
        if HERE == item.path.parent or HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running ControlPlane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    audit log on), shared by the whole session and stopped at its end.

    Fails the requesting test (pytest.fail) when the binaries cannot be built or the control
    plane does not start; the message names the cause and the log tail.
    """
    try:
        bin_dir = binaries.build_control_plane()
        tools_dir = binaries.client_tools_dir()
    except binaries.BinariesError as exc:
        pytest.fail(f"cannot provide the Kubernetes binaries for the e2e tests: {exc}", pytrace=False)
    cp = ControlPlane(tmp_path_factory.mktemp("control-plane"), controllers=True, audit_log=True,
                      bin_dir=bin_dir, tools_dir=tools_dir)
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
