"""tests/e2e/hostdeps.py: the real node's Debian packages are named when missing, never skipped."""

from __future__ import annotations

import pytest

from tests.e2e import hostdeps


def test_missing_names_packages_whose_marker_file_is_absent(tmp_path):
    present = tmp_path / "runc"
    present.write_text("")
    packages = {"runc": (str(present), "runtime"), "containernetworking-plugins": (str(tmp_path / "bridge"), "CNI")}
    assert hostdeps.missing(packages) == ["containernetworking-plugins"]


def test_ensure_without_install_raises_naming_the_packages(monkeypatch, tmp_path):
    monkeypatch.setattr(hostdeps, "PACKAGES", {"runc": (str(tmp_path / "nope"), "the OCI runtime")})
    with pytest.raises(RuntimeError, match="missing Debian packages for the real node and image: runc"):
        hostdeps.ensure(install=False)


def test_ensure_as_non_root_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(hostdeps, "PACKAGES", {"runc": (str(tmp_path / "nope"), "the OCI runtime")})
    monkeypatch.setattr(hostdeps.os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="apt-get install -y --no-install-recommends runc"):
        hostdeps.ensure()
