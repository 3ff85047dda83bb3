"""`kubectl dra-guard` through the real kubectl (v1.37, tests/e2e/binaries.py): the installed
console scripts kubectl-dra_guard and kubectl_complete-dra_guard on PATH, nothing else of ours.
kubectl finds the plugin, runs its commands with its name in usage and errors, and completes
it through `kubectl __complete` (kubectl's own completion entry, which the shell scripts of
`kubectl completion bash|zsh|fish` call)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.e2e import binaries
from tests.e2e.binaries import REPO

SCRIPTS = ("kubectl-dra_guard", "kubectl_complete-dra_guard")


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH holding only the real kubectl and the two installed console scripts (and the
    system's folders, for git)."""
    folder = tmp_path_factory.mktemp("bin")
    (folder / "kubectl").symlink_to(binaries.client_tools_dir() / "kubectl")
    installed = pathlib.Path(sys.executable).parent
    for name in SCRIPTS:
        assert (installed / name).exists(), f"{name} is not installed next to {sys.executable} (pip install -e .)"
        (folder / name).symlink_to(installed / name)
    return f"{folder}:/usr/bin:/bin"


def kubectl(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": path, "HOME": str(REPO), "KUBECONFIG": "/nonexistent"},
        executable=shutil.which("kubectl", path=path),
    )


def test_kubectl_lists_the_plugin(path):
    out = kubectl(path, "plugin", "list")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].endswith("/kubectl-dra_guard"), out.stdout
    assert "warning" not in out.stderr.lower(), out.stderr  # not shadowed, executable


def test_kubectl_dra_guard_help_names_the_plugin(path):
    out = kubectl(path, "dra-guard", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: kubectl dra-guard [-h] [--version] COMMAND ...")
    assert "audit" in out.stdout and "drain-plan" in out.stdout
    sub = kubectl(path, "dra-guard", "audit", "--help")
    assert sub.returncode == 0 and sub.stdout.startswith("usage: kubectl dra-guard audit "), sub.stdout[:200]


def test_kubectl_dra_guard_runs_a_subcommand(path):
    clean = kubectl(path, "dra-guard", "audit", "-f", "examples/compliant")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    found = kubectl(path, "dra-guard", "audit", "-f", "examples/non-compliant", "-o", "json")
    assert found.returncode == 1 and '"kind": "AuditResult"' in found.stdout, found.stderr
    bad = kubectl(path, "dra-guard", "no-such-command")
    assert bad.returncode == 2
    assert "kubectl dra-guard: error: unknown command 'no-such-command'" in bad.stderr
    typo = kubectl(path, "dra-guard", "adit")
    assert typo.returncode == 2 and "kubectl dra-guard: error: unknown command 'adit'; did you mean 'audit'?" in typo.stderr


def completions(path: str, *words: str) -> tuple[list[str], str]:
    """(the candidates kubectl offers for `kubectl dra-guard WORDS...`, without descriptions;
    the directive line)."""
    out = kubectl(path, "__complete", "dra-guard", *words)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    return [line.split("\t")[0] for line in lines[:-1]], lines[-1]


def test_completion_through_kubectl(path):
    assert completions(path, "au") == (["audit"], ":4")
    commands, _ = completions(path, "")
    assert {"serve", "audit", "drain-plan", "certs", "completion"} <= set(commands) and "--help" not in commands
    assert completions(path, "audit", "-o", "j") == (["json", "junit"], ":4")
    assert completions(path, "audit", "--sugg") == (["--suggest-exception", "--suggest-values"], ":4")
    # a folder: no space after it (cobra's NoSpace, 2), so the next TAB goes into it
    assert completions(path, "audit", "-f", "examples/non") == (["examples/non-compliant/"], ":6")


def test_completion_needs_the_completion_executable(path, tmp_path):
    """Without kubectl_complete-dra_guard kubectl offers nothing: the candidates above are ours."""
    only_plugin = tmp_path / "bin"
    only_plugin.mkdir()
    for name in ("kubectl", "kubectl-dra_guard"):
        (only_plugin / name).symlink_to(pathlib.Path(path.split(":")[0]) / name)
    assert completions(f"{only_plugin}:/usr/bin:/bin", "au") == ([], ":0")
