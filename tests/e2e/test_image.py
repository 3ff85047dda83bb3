"""The dra-guard image built here from the project's Dockerfile (tests/e2e/image.py: bases made
from Debian 12 packages, buildah, no registry) keeps the Dockerfile's promises, checked on the
built image's own files and config, not on the Dockerfile's text (tests/chart/test_dockerfile.py):
it runs as 65532, it has no pip, no ensurepip, no compiler and no sources, and `dra-guard --help`
and `--version` work in it as that user."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from tests.e2e import image

COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "make", "ld", "as", "rustc", "cargo")


@pytest.fixture(scope="module")
def rootfs(dra_guard_image, tmp_path_factory):
    """(root filesystem of the unpacked image, the image's OCI config)."""
    return image.unpack(dra_guard_image, tmp_path_factory.mktemp("image"))


def run_in_image(root: pathlib.Path, config: dict, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the image's entrypoint with `args` in its root filesystem (chroot), as the image's user,
    with the image's environment only."""
    uid, _, gid = str(config["User"]).partition(":")
    env = dict(item.split("=", 1) for item in config["Env"])  # type: ignore[union-attr]
    argv = ["chroot", f"--userspec={uid}:{gid or uid}", str(root), *config["Entrypoint"], *args]  # type: ignore[misc]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_runs_as_65532_with_the_console_script(rootfs):
    root, config = rootfs
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["dra-guard"]
    assert config["Cmd"] == ["serve", "--config", "/etc/dra-guard/config.yaml"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PATH"].startswith("/opt/dra-guard/bin:")
    assert (root / "opt/dra-guard/bin/dra-guard").is_file()


def test_dra_guard_help_and_version_work_in_the_image_as_its_user(rootfs):
    root, config = rootfs
    helped = run_in_image(root, config, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "usage: dra-guard" in helped.stdout and "serve" in helped.stdout
    version = run_in_image(root, config, "--version")
    assert version.returncode == 0 and "0.2.0" in version.stdout + version.stderr, version
    # the user really is 65532 inside: it cannot write to the image's own files
    probe = subprocess.run(
        [
            "chroot",
            "--userspec=65532:65532",
            str(root),
            "/opt/dra-guard/bin/python",
            "-c",
            "import os; print(os.getuid(), os.getgid()); open('/opt/dra-guard/x', 'w')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.split() == ["65532", "65532"] and "PermissionError" in probe.stderr, probe


def test_final_image_has_no_pip_no_ensurepip_no_compiler_no_sources(rootfs):
    root, config = rootfs
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = pathlib.Path(dirpath)
        for name in dirnames:
            if name in ("pip", "ensurepip", "setuptools", "python-wheels") or name.startswith("pip-"):
                found.append(here / name)
        for name in filenames:
            if (
                name.endswith(".whl")
                or (here.name == "bin" and name in COMPILERS)
                or (here.name == "bin" and name.startswith(("pip", "gcc", "x86_64-linux-gnu-")))
            ):
                found.append(here / name)
    assert not found, [str(p.relative_to(root)) for p in found]
    for gone in ("src", "wheels"):
        assert not (root / gone).exists(), gone
    # and the interpreter agrees: neither module can be imported
    for module in ("pip", "ensurepip", "setuptools"):
        proc = subprocess.run(
            ["chroot", "--userspec=65532:65532", str(root), "/opt/dra-guard/bin/python", "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, (module, proc.stderr)


def test_the_tag_is_the_hash_of_what_goes_into_the_image(dra_guard_image, tmp_path, monkeypatch):
    assert dra_guard_image.tag == image.image_key() and dra_guard_image.archive.exists()
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in image.SOURCES:
        src = image.REPO / name
        if src.is_file():
            shutil.copy2(src, copy / name)
        else:
            shutil.copytree(src, copy / name)
    monkeypatch.setattr(image, "REPO", copy)
    assert image.image_key() == dra_guard_image.key
    changed = copy / "webhook" / "__init__.py"
    changed.write_text(changed.read_text() + "\n# changed\n")
    assert image.image_key() != dra_guard_image.key
