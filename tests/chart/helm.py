"""Run the real helm (v4, from tests.e2e.binaries) on charts/dra-guard: lint, template, install.

Shared by tests/chart and tests/e2e/guard.py (which registers the end-to-end tests' dra-guard
with the webhook configurations this chart renders).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from tests.e2e import binaries

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dra-guard"


class HelmError(subprocess.CalledProcessError):
    """helm exited non-zero with check=True; str() includes its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr:\n{self.stderr}"


def helm_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for helm: `base` (default os.environ) with helm's cache, config and data folders
    under the dra-guard cache unless `base` sets them (ControlPlane.env() does, under its workdir)."""
    env = dict(base if base is not None else os.environ)
    home = binaries.cache_root() / "helm-home"
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")):
        env.setdefault(var, str(home / sub))
    return env


def run(
    *args: str, env: Mapping[str, str] | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real helm with `args`; return the CompletedProcess (text output captured).

    With check=True a non-zero exit raises HelmError (message includes stderr).
    """
    argv = [str(binaries.client_tools_dir() / "helm"), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=helm_env(env))
    if check and proc.returncode != 0:
        raise HelmError(proc.returncode, argv, proc.stdout, proc.stderr)
    return proc


#: The chart requires image.repository (no default image exists); the tests render with this one
#: unless their values set another (tests/e2e/image.py's tag where a node really pulls it).
TEST_VALUES: Mapping[str, Any] = {"image": {"repository": "registry.example/dra-guard"}}


def values_args(values: Mapping[str, Any] | None, folder: pathlib.Path, *, base: bool = True) -> list[str]:
    """["-f", FILE, ...] for TEST_VALUES (unless base is False) and then a values mapping, each
    written as YAML into `folder` (a later file wins)."""
    out = []
    for doc in ((TEST_VALUES,) if base else ()) + ((values,) if values else ()):
        fd, name = tempfile.mkstemp(prefix="values-", suffix=".yaml", dir=folder)
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(dict(doc), fh)
        out += ["-f", name]
    return out


def template_text(
    *,
    values: Mapping[str, Any] | None = None,
    release: str = "dra-guard",
    namespace: str = "dra-guard",
    show_only: Sequence[str] = (),
    extra: Sequence[str] = (),
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`helm template RELEASE charts/dra-guard -n NAMESPACE` with `values` (merged over values.yaml);
    returns the CompletedProcess (rendered YAML on stdout)."""
    with tempfile.TemporaryDirectory(prefix="dra-guard-helm-") as tmp:
        args = ["template", release, str(CHART), "--namespace", namespace, *values_args(values, pathlib.Path(tmp)), *extra]
        for path in show_only:
            args += ["--show-only", path]
        return run(*args, check=check)


def template(
    *,
    values: Mapping[str, Any] | None = None,
    release: str = "dra-guard",
    namespace: str = "dra-guard",
    show_only: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The objects `helm template` renders (empty documents dropped). Raises HelmError on failure."""
    out = template_text(values=values, release=release, namespace=namespace, show_only=show_only, extra=extra)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]
