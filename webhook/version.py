"""dra-guard's version, naming its commit in a development build.

A release reports its package version alone ("0.2.0"). A development build reports the commit it
was built from as a PEP 440 local version label, as setuptools-scm writes it: "0.2.0+g1234abc", and
"0.2.0+g1234abc.dirty" when the work tree had changes not committed.

Where the commit comes from, first found wins:
1. webhook/_commit.py, written by the Dockerfile's build stage from its VCS_REF build argument (the
   image is built from sources without .git; hack/release.py leaves VCS_REF empty for a release);
2. git, when this package is imported from a git checkout (an editable install: the folder above
   webhook/ holds .git and pyproject.toml; an installed wheel's site-packages never does).

The version itself stays the static ``version`` of pyproject.toml (the chart's appVersion and the
CHANGELOG name the same one, and tests check they agree). setuptools-scm, which derives the
version from git tags, does not fit yet: the repository has no release tags, so every build would
read 0.1.devN, below the 0.2.0 the chart and image already carry (docs/releasing.md).
"""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
from importlib import metadata

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
SHA = re.compile(r"^[0-9a-f]{7,40}$")


def local_label(commit: str, dirty: bool) -> str:
    """The local version label for `commit` (a hex sha, shortened to 7): "g1234abc" or
    "g1234abc.dirty". Raises ValueError for anything but 7 to 40 hex digits."""
    if not SHA.match(commit):
        raise ValueError(f"not a git commit id: {commit!r}")
    return f"g{commit[:7]}" + (".dirty" if dirty else "")


def with_commit(version: str, label: str | None) -> str:
    """`version` with the local `label` ("0.2.0" + "g1234abc" -> "0.2.0+g1234abc"); `version`
    alone when there is no label."""
    return f"{version}+{label}" if label else version


def stamped_label() -> str | None:
    """The label the image build wrote into webhook/_commit.py (COMMIT, DIRTY), None when absent
    or empty (a release, or a build outside the Dockerfile)."""
    try:
        stamp = importlib.import_module("webhook._commit")
    except ImportError:
        return None
    commit = str(getattr(stamp, "COMMIT", "")).strip()
    if not commit:
        return None
    return local_label(commit, bool(getattr(stamp, "DIRTY", False)))


def checkout_label(source: pathlib.Path = PACKAGE_DIR) -> str | None:
    """The label of the git checkout `source` (the webhook/ folder) was imported from, None when it
    is not directly in a checkout or git is missing or fails (never raises: a version string must
    not stop the CLI)."""
    top = source.parent
    if not ((top / ".git").exists() and (top / "pyproject.toml").is_file()):
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(top), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        # tracked files only: an untracked scratch file does not make the build differ from the commit
        status = subprocess.run(
            ["git", "-C", str(top), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return local_label(commit, bool(status.strip()))
    except ValueError:
        return None


def version() -> str:
    """dra-guard's version: the installed package's, plus the commit of a development build
    ("0.2.0", "0.2.0+g1234abc", "0.2.0+g1234abc.dirty"); "unknown" outside an installed package."""
    try:
        base = metadata.version("dra-guard")
    except metadata.PackageNotFoundError:
        return "unknown"
    return with_commit(base, stamped_label() or checkout_label())
