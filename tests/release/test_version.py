"""`dra-guard --version` names the commit of a development build: from git in a checkout (the
editable install the tests run), from the stamp the Dockerfile writes in an image, and nothing
but the version for a release."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import types

import pytest

from tests.chart.test_dockerfile import DOCKERFILE, parse
from tests.e2e.binaries import REPO
from webhook import version as v

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def git(*args: str, cwd=REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_version_in_this_checkout_names_its_commit():
    dra_guard = shutil.which("dra-guard") or str(REPO / ".venv" / "bin" / "dra-guard")
    out = subprocess.run([dra_guard, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    assert out == f"dra-guard {VERSION}+g{git('rev-parse', '--short=7', 'HEAD')}" + (".dirty" if dirty else "")


def test_a_commit_and_a_change_move_the_label(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    head = git("rev-parse", "HEAD", cwd=clone)
    assert v.checkout_label(clone / "webhook") == f"g{head[:7]}"
    (clone / "webhook" / "__init__.py").write_text("# changed\n")
    assert v.checkout_label(clone / "webhook") == f"g{head[:7]}.dirty"
    (clone / "scratch.txt").write_text("untracked files do not make a build dirty\n")
    subprocess.run(["git", "commit", "--quiet", "-am", "change"], cwd=clone, check=True, env={**os.environ, **env})
    assert v.checkout_label(clone / "webhook") == f"g{git('rev-parse', 'HEAD', cwd=clone)[:7]}"


def test_outside_a_checkout_there_is_no_label(tmp_path):
    (tmp_path / "webhook").mkdir()
    assert v.checkout_label(tmp_path / "webhook") is None  # e.g. site-packages, or the image
    assert v.with_commit("0.2.0", None) == "0.2.0"
    assert v.with_commit("0.2.0", "gabc1234") == "0.2.0+gabc1234"
    with pytest.raises(ValueError, match="not a git commit id"):
        v.local_label("HEAD; rm -rf /", False)


def test_the_dockerfile_stamp_is_what_version_reads(tmp_path, monkeypatch):
    """The build stage's RUN that writes webhook/_commit.py from VCS_REF, run by sh, and the
    module it writes read by stamped_label(); an empty VCS_REF writes nothing, a bad one stops."""
    run = next(line for line in parse(DOCKERFILE.read_text())[0].all("RUN") if "VCS_REF" in line)
    (tmp_path / "webhook").mkdir()

    def stamp(ref: str, dirty: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", run],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "VCS_REF": ref, "VCS_DIRTY": dirty},
        )

    assert stamp("", "false").returncode == 0 and not (tmp_path / "webhook" / "_commit.py").exists()
    assert stamp("1234abc; echo", "false").returncode != 0
    assert stamp("d78f162deadbeef", "true").returncode == 0
    module = types.ModuleType("webhook._commit")
    exec((tmp_path / "webhook" / "_commit.py").read_text(), module.__dict__)
    monkeypatch.setitem(sys.modules, "webhook._commit", module)
    assert v.stamped_label() == "gd78f162.dirty"
    assert re.fullmatch(rf"{re.escape(VERSION)}\+gd78f162\.dirty", v.version())
