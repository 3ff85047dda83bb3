"""Release hygiene: LICENSE is the Apache License 2.0 that pyproject.toml declares, CHANGELOG.md
follows Keep a Changelog and names the version the package and chart carry, CONTRIBUTING.md and
SECURITY.md say what a contributor and a reporter need, and hack/release.py refuses a tag that
the sources do not carry."""

from __future__ import annotations

import datetime
import hashlib
import re
import subprocess
import sys
import tomllib

import yaml

from tests.e2e.binaries import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CHART = yaml.safe_load((REPO / "charts" / "dra-guard" / "Chart.yaml").read_text())
# Keep a Changelog 1.1.0: the kinds of change a version lists
CHANGE_TYPES = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
VERSION_HEADING = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})$")


def test_license_is_the_apache_2_0_text_pyproject_declares():
    assert PROJECT["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    head = [line.strip() for line in text.splitlines() if line.strip()][:3]
    assert head == ["Apache License", "Version 2.0, January 2004", "http://www.apache.org/licenses/"]
    sections = re.findall(r"^\s+(\d)\. ([A-Z][^.]+)\.", text, re.M)
    assert [int(n) for n, _ in sections] == list(range(1, 10)), sections
    assert sections[0][1] == "Definitions" and sections[-1][1] == "Accepting Warranty or Additional Liability"
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License to your work." in text


def changelog() -> tuple[str, list[tuple[str, list[str]]]]:
    """(the text before the first section, [(section heading, its lines)])."""
    text = (REPO / "CHANGELOG.md").read_text()
    intro, *parts = re.split(r"(?m)^(?=## )", text)
    return intro, [(part.splitlines()[0], part.splitlines()[1:]) for part in parts]


def test_changelog_follows_keep_a_changelog():
    intro, sections = changelog()
    assert intro.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in intro and "https://semver.org/spec/v2.0.0.html" in intro
    assert sections[0][0] == "## [Unreleased]", "the Unreleased section comes first"
    released = []
    for heading, _ in sections[1:]:
        match = VERSION_HEADING.match(heading)
        assert match, f"not '## [X.Y.Z] - YYYY-MM-DD': {heading!r}"
        released.append((tuple(int(n) for n in match["version"].split(".")), datetime.date.fromisoformat(match["date"])))
    assert released == sorted(released, reverse=True), "newest version first, dates not going up"
    assert [v for v, _ in released][-2:] == [(0, 2, 0), (0, 1, 0)]
    for heading, lines in sections:
        kinds = [line[4:] for line in lines if line.startswith("### ")]
        assert kinds and set(kinds) <= CHANGE_TYPES, f"{heading}: {kinds}"
        assert len(kinds) == len(set(kinds)), f"{heading}: a kind of change listed twice"


def test_changelog_names_the_version_of_the_package_and_the_chart():
    _, sections = changelog()
    versions = [VERSION_HEADING.match(h)["version"] for h, _ in sections[1:]]  # type: ignore[index]
    assert PROJECT["version"] == CHART["version"] == CHART["appVersion"]
    assert PROJECT["version"] in versions


def test_changelog_keeps_the_upgrade_notes():
    """The upgrade from 0.1.0 while dra-guard is down (README "When dra-guard is down, upgrades
    and rollbacks") and the declared drivers of the eviction guard are in their versions."""
    _, sections = changelog()
    by_heading = {h: "\n".join(lines) for h, lines in sections}
    v020 = next(text for h, text in by_heading.items() if h.startswith("## [0.2.0]"))
    assert "**Upgrading from 0.1.0**" in v020 and "the same command again succeeds" in v020
    assert "**Upgrading from 0.2.0**" in by_heading["## [Unreleased]"]
    assert "config.drivers.declared" in by_heading["## [Unreleased]"]


def test_contributing_says_how_to_set_up_test_and_check():
    text = (REPO / "CONTRIBUTING.md").read_text()
    readme = (REPO / "README.md").read_text()
    for command in (
        "pip install -c constraints.txt -e '.[test]'",
        "tests/run",
        "ruff check .",
        "mypy",
        "lint-imports",
        "bench/run",
    ):
        assert command in text, command
    assert "tests/run" in readme  # the same command README "Run the tests" gives
    for doc in ("docs/architecture.md", "CHANGELOG.md", "SECURITY.md"):
        assert doc in text and (REPO / doc).exists(), doc


def test_security_policy_says_how_to_report_and_what_is_supported():
    text = (REPO / "SECURITY.md").read_text()
    minor = ".".join(PROJECT["version"].split(".")[:2])
    assert re.search(rf"^\| {re.escape(minor)}\.x +\| yes", text, re.M), "the current minor version is supported"
    assert "Report a vulnerability privately" in text and "not a public issue" in text
    assert "docs/threat-model.md" in text and "RBAC guard" in text


def test_release_script_refuses_a_tag_the_sources_do_not_carry(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "hack" / "release.py"), "v9.9.9", "--worktree", "--only", "chart", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2, out.stderr
    assert f"pyproject.toml says {PROJECT['version']}" in out.stderr
    assert "CHANGELOG.md has no section '## [9.9.9] - YYYY-MM-DD'" in out.stderr
    assert list(tmp_path.iterdir()) == [], "nothing built"


def test_release_script_packages_the_chart_of_the_version(tmp_path):
    from tests.e2e import binaries

    helm = str(binaries.client_tools_dir() / "helm")
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "hack" / "release.py"),
            f"v{PROJECT['version']}",
            "--worktree",
            "--only",
            "chart",
            "--helm",
            helm,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    chart = tmp_path / f"dra-guard-{PROJECT['version']}.tgz"
    assert out.stdout.split() == [str(chart)]
    shown = subprocess.run([helm, "show", "chart", str(chart)], capture_output=True, text=True, check=True).stdout
    assert yaml.safe_load(shown)["appVersion"] == PROJECT["version"]
    assert (tmp_path / "SHA256SUMS").read_text() == f"{hashlib.sha256(chart.read_bytes()).hexdigest()}  {chart.name}\n"
