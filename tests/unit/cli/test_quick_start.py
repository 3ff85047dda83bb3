"""README's quick start installs only what the CLI needs and runs on self-contained examples;
"Run the tests" and CI (.ci/run) install the test extra the tests and code checks need."""

from __future__ import annotations

import pathlib
import re

from webhook.cli import main

REPO = pathlib.Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text()


def _section_sh(title: str) -> str:
    """The first ```sh block of README section `title`."""
    found = re.search(rf"^## {re.escape(title)}\n.*?```sh\n(.*?)```", README, re.S | re.M)
    assert found, title
    return found.group(1)


def test_quick_start_installs_the_runtime_only_and_audits_the_examples():
    line = _section_sh("Quick start (set up and first run)").strip()
    assert "pip install -c constraints.txt -e . " in line and "[test]" not in line, line
    assert line.endswith("dra-guard audit -f examples/"), line


def test_run_the_tests_and_ci_install_the_test_extra():
    assert "pip install -c constraints.txt -e '.[test]'" in _section_sh("Run the tests")
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^pip install -q -c constraints\.txt -e '\.\[test\]'$", ci, re.M), (
        "CI must install what the tests need, at the pinned versions"
    )


def test_each_example_folder_is_self_contained(capsys):
    """`audit -f examples/compliant` finds its configuration in its own folder (exit 0) and
    `audit -f examples/` still reports examples/non-compliant (exit 1) with the same one."""
    assert main(["audit", "-q", "-f", str(REPO / "examples" / "compliant")]) == 0
    _, err = capsys.readouterr()
    assert "config: the DraGuardConfiguration among the manifests" in err
    assert main(["audit", "-q", "-f", str(REPO / "examples")]) == 1
    _, err = capsys.readouterr()
    assert "config: the DraGuardConfiguration among the manifests" in err
    assert main(["audit", "-q", "-f", str(REPO / "examples" / "non-compliant")]) == 1
