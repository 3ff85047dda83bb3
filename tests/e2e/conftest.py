"""End-to-end tests: every test in this folder is marked ``e2e`` (``pytest -m "not e2e"`` skips them).

The session fixture `control_plane` (one real control plane per test session) lives in
tests/conftest.py, shared with tests/chart.
"""
from __future__ import annotations

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the items collected from this folder with ``e2e``.

    The hook sees every item of the session, not only this folder's, hence the path check.
    """
    for item in items:
        if HERE == item.path.parent or HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def guard(control_plane, tmp_path_factory):
    """A dra-guard server in enforce mode registered through the chart's webhook configurations,
    one per test module, unregistered and stopped after the module."""
    from tests.e2e.guard import Guard

    g = Guard(control_plane, tmp_path_factory.mktemp("dra-guard"))
    g.start(mode="enforce")
    g.register()
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="session")
def dra_guard_image():
    """The dra-guard image built from the Dockerfile (tests/e2e/image.py: an `image.Image` with its
    OCI archive), built once per source hash and cached. A host that cannot build it (not root, not
    Linux, a missing Debian package that apt-get could not install) fails the test, never skips."""
    from tests.e2e import image

    try:
        return image.build()
    except image.ImageError as exc:
        pytest.fail(f"cannot build the dra-guard image: {exc}", pytrace=False)
