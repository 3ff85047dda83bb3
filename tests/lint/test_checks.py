"""The code checks CI runs before the tests (ruff, mypy --strict, import-linter contracts), and
proof that each of them fails on a deliberate violation: a check that cannot fail keeps nothing.

Each violation is made in a copy of the package in a temporary folder, never in the working tree.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent


def run(tool: str, *args: str, cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run a check installed next to this Python (the project's venv) in `cwd`."""
    exe = BIN / tool
    assert exe.exists(), f"{tool} is not installed in {BIN}: pip install -e '.[test]' installs the checks"
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of webhook/, certs/ and pyproject.toml to break on purpose."""
    for package in ("webhook", "certs"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_import_contracts_hold():
    out = run("lint-imports")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("webhook/policies/rbac.py", "import webhook.kube.state", "Layers"),
        ("webhook/model/readers.py", "import kubernetes", "Only webhook.kube talks to the Kubernetes API"),
        ("certs/__init__.py", "import webhook.config", "certs depends on nothing of webhook"),
        ("webhook/admission.py", "import webhook.audit", "Layers"),  # siblings are independent
        ("webhook/policies/decision.py", "import flask", "No HTTP framework below webhook.serve"),
        ("webhook/cli/audit_command.py", "import webhook.cli.commands", "cli: kubectl"),  # the circle back
        ("webhook/cli/terminal.py", "import webhook.cli.drain_command", "cli: kubectl"),
        ("webhook/cli/parser.py", "import webhook.cli.commands", "cli: kubectl"),  # siblings are independent
        # the front asks the gate it is given; it never reaches the review logic, directly or not
        ("webhook/serve/front/shared.py", "import webhook.admission", "The front judges nothing"),
        ("webhook/serve/front/connection.py", "import webhook.model.facts", "The front judges nothing"),
        ("webhook/serve/front/wsgi.py", "import webhook.serve.lanes", "The front judges nothing"),
        ("webhook/serve/front/capacity.py", "import webhook.serve.app", "serve: server"),
        ("webhook/serve/lanes.py", "import webhook.serve.app", "serve: server"),
    ],
)
def test_import_contracts_fail_on_a_violation(tree, module, line, contract):
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # deliberate violation\n")
    out = run("lint-imports", cwd=tree)
    assert out.returncode != 0, out.stdout
    broken = [ln for ln in out.stdout.splitlines() if "BROKEN" in ln]
    assert any(contract in ln for ln in broken) or contract in out.stdout.split("Broken contracts")[-1], out.stdout


def test_ruff_passes():
    out = run("ruff", "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_fails_on_a_violation(tree):
    (tree / "webhook" / "model" / "readers.py").write_text(
        (tree / "webhook" / "model" / "readers.py").read_text() + "\nimport os  # unused: deliberate violation\n"
    )
    out = run("ruff", "check", "webhook", cwd=tree)
    assert out.returncode != 0 and "F401" in out.stdout, out.stdout


def test_the_code_is_formatted():
    out = run("ruff", "format", "--check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_check_fails_on_unformatted_code(tree):
    path = tree / "webhook" / "model" / "readers.py"
    path.write_text(path.read_text() + "\nx = {  'a':1 }  # deliberate violation\n")
    out = run("ruff", "format", "--check", "webhook", cwd=tree)
    assert out.returncode != 0 and "readers.py" in out.stdout, out.stdout


def test_mypy_strict_passes():
    out = run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_fails_on_a_violation(tree):
    bad = tree / "webhook" / "bad.py"
    bad.write_text('"""An untyped function: mypy --strict refuses it."""\n\n\ndef f(x):\n    return x\n')
    out = run("mypy", "webhook/bad.py", "--config-file", "pyproject.toml", cwd=tree)
    assert out.returncode != 0 and "no-untyped-def" in out.stdout, out.stdout
