"""docs/getting-started.md's install block followed in order on the real control plane, from a clean
install in audit mode to enforce, each step's documented outcome asserted.

Replaced, as in tests/chart/test_printed_commands.py: the registry (chart from charts/dra-guard,
image from a made-up registry: no kubelet pulls it), the release name and namespace (`dra-guard`
is the e2e tests' own). Added: the development value webhooks.url (and its caBundle) on the
install, so the chart's webhooks call a real `dra-guard serve` on loopback (tests/e2e/guard.py),
which is restarted with the release's mode after each upgrade, as the Deployment's rollout would
(its pods need a kubelet); `--release-namespace` on `dra-guard audit`. Left out, each needing
what is not here: `docker build/push` and `helm push` (a registry), `kubectl logs` and `helm test`
(running pods).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time

import pytest
import yaml

from tests.chart.test_printed_commands import REPO, commands_in, dra_guard, helm_run, runnable
from tests.e2e.guard import DENIED, PROBE, Guard

pytestmark = pytest.mark.e2e

RELEASE, NAMESPACE = "started", "getting-started"
FULLNAME = f"{RELEASE}-dra-guard"


def install_block() -> list[str]:
    """The shell lines of the install block (the ```sh block after "## Install, audit"), in order,
    continuations joined, comments dropped."""
    text = (REPO / "docs" / "getting-started.md").read_text()
    section = text.split("## Install, audit", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    lines, current = [], ""
    for raw in block.group(1).splitlines():
        if raw.lstrip().startswith("#"):
            continue
        current += raw.rstrip().removesuffix("\\") + " " if raw.rstrip().endswith("\\") else raw
        if not raw.rstrip().endswith("\\"):
            lines.append(re.split(r"\s+#\s", current)[0].strip())
            current = ""
    return [line for line in lines if line]


def release_config(cp) -> dict:
    cm = json.loads(cp.kubectl("admin", "get", "configmap", FULLNAME, "-n", NAMESPACE, "-o", "json").stdout)
    return yaml.safe_load(cm["data"]["config.yaml"])


def rbac_failure_policy(cp) -> str:
    config = json.loads(cp.kubectl("admin", "get", "validatingwebhookconfiguration", FULLNAME, "-o", "json").stdout)
    return next(w["failurePolicy"] for w in config["webhooks"] if w["name"] == "rbac.dra-guard.io")


def probe(cp) -> str:
    """stderr of alice's server-side dry run of PROBE (a cluster-admin binding dra-guard refuses in enforce)."""
    return cp.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=PROBE, check=False).stderr


def test_getting_started_from_a_clean_install_to_enforce(control_plane, tmp_path):
    cp = control_plane
    guard = Guard(cp, tmp_path / "guard")
    guard.start(mode="audit")
    dev = [
        "--set",
        f"webhooks.url={guard.url}",
        "--set",
        f"webhooks.caBundle={base64.b64encode(guard.proc.ca_file.read_bytes()).decode()}",
    ]
    steps = install_block()
    done = []
    try:
        for line in steps:
            words = line.split()
            if words[0] == "docker" or words[:2] in (["helm", "package"], ["helm", "test"]) or words[0] == "kubectl":
                continue  # a registry or running pods (module docstring)
            if words[0] == "dra-guard":
                command, _, target = line.partition(">")
                run = dra_guard(cp, *shlex.split(command)[1:], "--release-namespace", NAMESPACE, cwd=tmp_path)
                assert run.returncode in (0, 1), (line, run.stderr)  # 1: findings, as the docs say
                assert "judged" in run.stderr, run.stderr
                if target:
                    (tmp_path / target.strip()).write_text(run.stdout)
                    assert yaml.safe_load(run.stdout) is not None  # Helm values
                done.append(line)
                continue
            [command] = commands_in(line)
            argv = runnable(command, release=RELEASE, namespace=NAMESPACE) + (dev if words[1] == "install" else [])
            out = helm_run(cp, argv, tmp_path)
            assert out.returncode == 0, (line, out.stderr)
            mode = release_config(cp).get("mode", "enforce")
            guard.start(mode=mode)  # the rollout the new ConfigMap's checksum starts
            if words[1] == "install":  # 1. audit first: nothing is refused
                assert mode == "audit" and rbac_failure_policy(cp) == "Ignore"
                assert DENIED not in probe(cp)
            done.append(line)
        # 4. enforce: the release says so, the webhook fails closed, and the cluster-admin binding is refused
        assert release_config(cp)["mode"] == "enforce" and rbac_failure_policy(cp) == "Fail"
        deadline = time.monotonic() + 30
        while DENIED not in (stderr := probe(cp)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert DENIED in stderr, stderr
        assert [w.split()[:2] for w in done] == [
            ["helm", "install"],
            ["dra-guard", "audit"],
            ["dra-guard", "audit"],
            ["helm", "upgrade"],
            ["helm", "upgrade"],
        ], done
    finally:
        cp.kubectl(
            "admin", "delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", FULLNAME, "--ignore-not-found"
        )
        helm_run(cp, ["helm", "uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks"], tmp_path)
        cp.kubectl("admin", "delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)
        guard.stop()
