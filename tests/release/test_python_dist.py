"""The Python distributions a release publishes: the sdist and the wheel built by PyPA's `build`
(the sdist first, then the wheel from the unpacked sdist, as `python -m build` does: a file the
build needs but the sdist lacks fails it), their metadata checked by `twine check --strict` (what
PyPI would refuse or render badly), the sdist free of caches, and the wheel installed in a fresh
virtual environment, where its `dra-guard` command runs.

Needs PyPI or its cache (the build's isolated environment installs setuptools, the fresh venv the
wheel's dependencies), like `pip install -e '.[test]'` before it.
"""

from __future__ import annotations

import email.parser
import pathlib
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
NAME = PYPROJECT["project"]["name"].replace("-", "_")
VERSION = PYPROJECT["project"]["version"]
#: what never belongs in a distribution: the tests' and tools' caches, compiled files, local venvs
CACHES = ("__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", ".import_linter_cache", ".venv")


def run(*argv: str | pathlib.Path, timeout: float = 600, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, pathlib.Path]:
    """{"sdist": .tar.gz, "wheel": .whl} built by `python -m build` from the working tree."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO)
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert [p.name for p in sdists] == [f"{NAME}-{VERSION}.tar.gz"], sdists
    assert [p.name for p in wheels] == [f"{NAME}-{VERSION}-py3-none-any.whl"], wheels
    return {"sdist": sdists[0], "wheel": wheels[0]}


def tracked(*folders: str) -> set[str]:
    """The files git tracks under `folders` (relative paths)."""
    return set(run("git", "ls-files", *folders, cwd=REPO).stdout.split())


def test_twine_check_strict_passes(dist):
    out = run(sys.executable, "-m", "twine", "check", "--strict", dist["sdist"], dist["wheel"])
    assert out.stdout.count("PASSED") == 2, out.stdout


def test_the_metadata_renders_the_readme_and_names_the_entry_point(dist):
    with zipfile.ZipFile(dist["wheel"]) as whl:
        meta = email.parser.Parser().parsestr(whl.read(f"{NAME}-{VERSION}.dist-info/METADATA").decode())
        entry_points = whl.read(f"{NAME}-{VERSION}.dist-info/entry_points.txt").decode()
    assert meta["Name"] == "dra-guard" and meta["Version"] == VERSION
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta["License-Expression"] == PYPROJECT["project"]["license"]
    assert meta.get_payload().strip() == (REPO / "README.md").read_text().strip()
    assert "dra-guard = webhook.cli:main" in entry_points


def test_the_sdist_holds_the_sources_and_no_caches(dist):
    with tarfile.open(dist["sdist"]) as tar:
        names = [n.partition("/")[2] for n in tar.getnames()]
    files = set(names)
    # what a build needs: the project file, the README it reads, every tracked source file
    assert {"pyproject.toml", "README.md", "PKG-INFO"} <= files
    missing = {f for f in tracked("webhook", "certs") if f.endswith(".py")} - files
    assert not missing, f"tracked sources missing from the sdist: {sorted(missing)}"
    leaked = [n for n in names if set(pathlib.PurePosixPath(n).parts) & set(CACHES) or n.endswith((".pyc", ".pyo"))]
    assert not leaked, f"caches in the sdist: {leaked[:20]}"
    assert not [n for n in names if n.startswith(("tests/", "bench/", ".venv/", "build/", "dist/"))]


def test_the_wheel_installs_in_a_fresh_venv_and_its_command_runs(dist, tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", dist["wheel"])
    # from elsewhere than the repository, so the checkout cannot stand in for the installed package
    version = run(venv / "bin" / "dra-guard", "--version", cwd=tmp_path)
    assert version.stdout.startswith(f"dra-guard {VERSION}"), version.stdout
    where = run(venv / "bin" / "python", "-c", "import webhook; print(webhook.__file__)", cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where
    run(venv / "bin" / "dra-guard", "--help", cwd=tmp_path)
