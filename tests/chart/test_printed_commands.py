"""Every helm command dra-guard tells an admin to copy works as printed, run with the real helm
against the real control plane: the install and upgrades of README's Install block and
docs/getting-started.md, the commands of the chart's NOTES (audit and enforce mode, rendered with
notes.chartReference set to the chart's path), and the ones in the headers of `dra-guard audit
--suggest-values` and `--suggest-exception`.

Only what cannot exist here is replaced: the registry (the chart from charts/dra-guard, the image
from a made-up registry and digest, since no kubelet pulls it), the release name and namespace
(`dra-guard` is the e2e tests' own dra-guard's), and NOTES's placeholders (<ns>, <daemonset>,
<fixed>, <revision>). The install runs for real; each upgrade runs with --dry-run=server (the
apiserver validates and admits every object, nothing is stored), rollback and uninstall with
--dry-run. `helm test` is left out: its pod needs a kubelet (tests/chart/test_cluster.py runs the
hook's command itself). The files the commands name (drivers.yaml, exceptions.yaml) are written
by the real `dra-guard audit --cluster` against the installed release.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tests.chart import helm

pytestmark = pytest.mark.e2e

REPO = helm.REPO
RELEASE, NAMESPACE = "printed", "printed-commands"
DIGEST = "sha256:" + "0" * 64
#: the chart reference every printed command names, and what stands for it here
OCI = "oci://REGISTRY/charts/dra-guard --version 0.2.0"
#: NOTES's placeholders, filled as an admin would
PLACEHOLDERS = {
    "<ns>": "dra-example-driver",
    "<daemonset>": "dra-example-driver-kubeletplugin",
    "<fixed>": "0.2.1",
    "<revision>": "1",
}
#: the helm subcommands an admin is told to run against the release (package/push need a registry)
RELEASE_COMMANDS = ("install", "upgrade", "rollback", "uninstall", "test")


def commands_in(text: str) -> list[str]:
    """The helm commands of shell text or NOTES: lines whose first word is `helm` (after comment
    marks, indentation, a step number "3." or a label "Uninstall:"), with their backslash continuations, trailing
    comments and `&&` chains dropped; only RELEASE_COMMANDS."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = re.sub(r"^\s*#?\s*(\d+\.\s+|[A-Z][a-z]+:\s+)?", "", lines[i])
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        line = re.split(r"\s+#\s|\s+&&\s", line)[0].strip()
        words = line.split()
        if len(words) > 1 and words[0] == "helm" and words[1] in RELEASE_COMMANDS:
            out.append(line)
    return out


def markdown_commands(path: pathlib.Path) -> list[str]:
    """The helm commands of a Markdown file: those of its ```sh blocks, and inline `helm ...` ones."""
    text = path.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    inline = [" ".join(m.split()) for m in re.findall(r"`(helm [^`]+)`", text)]
    return commands_in("\n".join(blocks)) + [c for c in inline if c.split()[1] in RELEASE_COMMANDS]


def runnable(command: str, *, release: str = RELEASE, namespace: str = NAMESPACE) -> list[str]:
    """argv of a printed command with only what cannot exist here replaced (module docstring); the
    release `dra-guard` and namespace `dra-guard` become `release` and `namespace`."""
    text = command.replace(OCI, str(helm.CHART)).replace("oci://REGISTRY/charts/dra-guard", str(helm.CHART))
    text = text.replace("REGISTRY/dra-guard", "registry.example/dra-guard").replace("sha256:DIGEST", DIGEST)
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    argv = shlex.split(text)
    assert argv[0] == "helm" and argv[1] in RELEASE_COMMANDS, command
    if argv[2] == "dra-guard":
        argv[2] = release
    for flag in ("-n", "--namespace"):
        if flag in argv and argv[argv.index(flag) + 1] == "dra-guard":
            argv[argv.index(flag) + 1] = namespace
    for placeholder in ("RELEASE", "CHART", "NAMESPACE", "THIS_FILE"):
        if placeholder in argv:
            argv[argv.index(placeholder)] = {
                "RELEASE": release,
                "CHART": str(helm.CHART),
                "NAMESPACE": namespace,
                "THIS_FILE": "suggested.yaml",
            }[placeholder]
    assert not [w for w in argv if re.search(r"REGISTRY|<[a-z]+>|DIGEST", w)], argv
    return argv


def dry_run(argv: list[str]) -> list[str]:
    """The command run without storing anything: upgrade --dry-run=server, rollback and uninstall --dry-run."""
    return argv + (["--dry-run=server"] if argv[1] == "upgrade" else ["--dry-run"])


def helm_run(cp, argv: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm.binaries.client_tools_dir() / "helm"), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=helm.helm_env(cp.env("admin")),
    )


def dra_guard(cp, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**cp.env("admin"), "PYTHONPATH": str(REPO)},
    )


def the_install() -> str:
    [install] = [c for c in markdown_commands(REPO / "docs" / "getting-started.md") if c.split()[1] == "install"]
    [readme] = [c for c in markdown_commands(REPO / "README.md") if c.split()[1] == "install"]
    assert readme == install  # README's Install block and Getting started install alike
    return install


@pytest.fixture(scope="module")
def release(control_plane, tmp_path_factory):
    """Getting started's `helm install` (audit mode) run for real, in a folder holding the files the
    printed commands name, written by the real `dra-guard audit --cluster`."""
    cp = control_plane
    folder = tmp_path_factory.mktemp("printed-commands")
    try:
        out = helm_run(cp, runnable(the_install()), folder)
        assert out.returncode == 0, out.stderr
        for name, flags in (
            ("drivers.yaml", ["--suggest-values"]),
            ("exceptions.yaml", ["--suggest-exception", "--owner", "team", "--reason", "why", "--expires", "30d"]),
        ):
            run = dra_guard(cp, "audit", "--cluster", "--release-namespace", NAMESPACE, *flags, cwd=folder)
            assert run.returncode in (0, 1), run.stderr
            (folder / name).write_text(run.stdout)
        yield folder
    finally:
        helm_run(cp, ["helm", "uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks"], folder)
        cp.kubectl(
            "admin",
            "delete",
            "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            f"{RELEASE}-dra-guard",
            "--ignore-not-found",
        )
        cp.kubectl("admin", "delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)


def run_all(cp, commands: list[str], folder: pathlib.Path, *, source: str) -> list[str]:
    """Run each command (dry run), `helm test` left out; assert each succeeds. Returns what ran."""
    ran = []
    for command in commands:
        argv = runnable(command)
        if argv[1] in ("install", "test"):
            continue
        out = helm_run(cp, dry_run(argv), folder)
        assert out.returncode == 0, f"{source}: {command}\n{out.stderr}"
        ran.append(command)
    return ran


def test_the_docs_and_readme_commands_run_as_printed(control_plane, release):
    commands = markdown_commands(REPO / "docs" / "getting-started.md") + markdown_commands(REPO / "README.md")
    ran = run_all(control_plane, commands, release, source="docs")
    assert sum("-f drivers.yaml" in c for c in ran) == 2 and sum("config.mode=enforce" in c for c in ran) == 2
    assert any("-f exceptions.yaml" in c for c in ran) and any("policies.rbac.mode=enforce" in c for c in ran)


@pytest.mark.parametrize("mode", ["audit", "enforce"])
def test_the_notes_commands_run_as_printed(control_plane, release, mode):
    """NOTES as `helm install --dry-run=client` renders them with notes.chartReference set."""
    out = helm.run(
        "install",
        RELEASE,
        str(helm.CHART),
        "-n",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        f"notes.chartReference={helm.CHART}",
        "--set",
        f"config.mode={mode}",
        "--set",
        "image.repository=registry.example/dra-guard",
    )
    notes = out.stdout.split("NOTES:", 1)[1]
    commands = commands_in(notes)
    ran = run_all(control_plane, commands, release, source=f"NOTES ({mode})")
    assert any("config.drivers.declared" in c for c in ran) and any("-f drivers.yaml" in c for c in ran)
    assert any(c.startswith("helm uninstall") for c in ran)
    if mode == "enforce":  # the admin's way out when dra-guard is down and refuses
        assert any(c.startswith("helm rollback") for c in ran) and any("image.tag=" in c for c in ran)


@pytest.mark.parametrize("flags", [["--suggest-values"], ["--suggest-exception", "--owner", "t", "--reason", "r"]])
def test_the_suggest_headers_commands_run_as_printed(control_plane, release, flags):
    run = dra_guard(control_plane, "audit", "--cluster", "--release-namespace", NAMESPACE, *flags, cwd=release)
    (release / "suggested.yaml").write_text(run.stdout)
    [command] = commands_in(run.stdout)
    assert run_all(control_plane, [command], release, source=flags[0]) == [command]
