"""The krew plugin: hack/release.py builds its archive (a shiv zipapp of the work tree's sources
and LICENSE) and fills plugins/dra-guard.yaml with its URL and sha256; krew's own
validate-krew-manifest accepts the result, which includes installing it with the real
`kubectl krew install` from a local HTTP server standing in for the release's download URL;
the installed plugin runs through the real kubectl."""

from __future__ import annotations

import functools
import http.server
import os
import pathlib
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator

import pytest
import yaml

from tests.e2e import binaries
from tests.e2e.binaries import REPO

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
TAG = f"v{VERSION}"
ARCHIVE = f"kubectl-dra_guard-{TAG}-linux-amd64.tar.gz"


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pathlib.Path, str]]:
    """(the folder hack/release.py built the krew archive and manifest into, the URL a local HTTP
    server serves that folder at) for the module's tests."""
    out = tmp_path_factory.mktemp("release")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "hack" / "release.py"),
                TAG,
                "--worktree",
                "--only",
                "krew",
                "--out",
                str(out),
                "--download-url",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
        yield out, url
    finally:
        server.shutdown()
        server.server_close()


def tools_path() -> str:
    """The real kubectl and krew (as kubectl-krew) and the validator, then the system's folders
    (python3.11 for the zipapp)."""
    return f"{binaries.krew_dir()}:{binaries.client_tools_dir()}:/usr/bin:/bin"


def validate(manifest: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binaries.krew_dir() / "validate-krew-manifest"), "-manifest", str(manifest)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": tools_path()},
    )


def test_the_rendered_manifest_names_the_archive_and_its_sha256(release):
    out, url = release
    manifest = yaml.safe_load((out / "dra-guard.yaml").read_text())
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "dra-guard"
    assert manifest["spec"]["version"] == TAG
    (platform,) = manifest["spec"]["platforms"]
    assert platform["uri"] == f"{url}/{ARCHIVE}" and platform["bin"] == "kubectl-dra_guard"
    sums = dict(line.split()[::-1] for line in (out / "SHA256SUMS").read_text().splitlines())
    assert platform["sha256"] == sums[ARCHIVE]


def test_krew_validator_accepts_the_manifest_and_installs_it(release):
    out, _ = release
    proc = validate(out / "dra-guard.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "structural validation OK" in proc.stderr and "all 1 spec.platforms installed fine" in proc.stderr


def test_krew_validator_refuses_a_wrong_sha256(release, tmp_path):
    """The validator really checks: the same manifest with another sha256 fails its install."""
    out, _ = release
    text = (out / "dra-guard.yaml").read_text()
    good = yaml.safe_load(text)["spec"]["platforms"][0]["sha256"]
    (tmp_path / "dra-guard.yaml").write_text(text.replace(good, "f" * 64))
    proc = validate(tmp_path / "dra-guard.yaml")
    assert proc.returncode != 0 and "checksum does not match" in proc.stderr, proc.stderr[-2000:]


def test_the_plugin_krew_installs_runs_through_kubectl(release, tmp_path):
    out, _ = release
    env = {"PATH": tools_path(), "KREW_ROOT": str(tmp_path / "krew"), "HOME": str(tmp_path), "KUBECONFIG": "/nonexistent"}
    install = subprocess.run(
        ["kubectl", "krew", "install", "--manifest", str(out / "dra-guard.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert install.returncode == 0, install.stderr
    env["PATH"] = f"{tmp_path / 'krew' / 'bin'}:{env['PATH']}"
    version = subprocess.run(["kubectl", "dra-guard", "--version"], capture_output=True, text=True, timeout=120, env=env)
    # built from files, not a checkout, and without a stamp: a release says its version alone
    assert version.returncode == 0 and version.stdout.strip() == f"dra-guard {VERSION}", version.stderr
    audit = subprocess.run(
        ["kubectl", "dra-guard", "audit", "-f", str(REPO / "examples" / "compliant")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr
    # the caveat's link gives completion through kubectl
    (tmp_path / "krew" / "bin" / "kubectl_complete-dra_guard").symlink_to("kubectl-dra_guard")
    complete = subprocess.run(["kubectl", "__complete", "dra-guard", "au"], capture_output=True, text=True, timeout=120, env=env)
    assert complete.stdout.splitlines()[0].split("\t")[0] == "audit", complete.stdout + complete.stderr
