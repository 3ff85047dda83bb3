"""Every test here runs a code check (ruff, mypy, import-linter)."""

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this folder `lint`."""
    for item in items:
        if "tests/lint/" in str(item.fspath):
            item.add_marker(pytest.mark.lint)
