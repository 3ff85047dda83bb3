"""docs/getting-started.md's install block followed in order on the real control plane, from a clean
install in audit mode to enforce, each step's documented outcome asserted.

The registry is real (tests/e2e/registry.py: the reference distribution registry on loopback, plain
HTTP): the image built from the Dockerfile (tests/e2e/image.py, buildah: `docker` is not here)
is pushed under the tag the `docker build -t` line names, with skopeo, and its digest is the
`sha256:DIGEST` of the later lines; `helm package` and `helm push` run as printed (the chart path
made absolute, `--plain-http` added), and the release is installed and upgraded from
`oci://<registry>/charts/dra-guard` (the registry's access log shows helm fetched it there).
Replaced: REGISTRY by the registry's address; the release name and namespace (`dra-guard` is the
e2e tests' own). Added: the development value webhooks.url (and its caBundle) on the install, so
the chart's webhooks call a real `dra-guard serve` on loopback (tests/e2e/guard.py), which is
restarted with the release's mode after each upgrade, as the Deployment's rollout would (its pods
need a kubelet); `--release-namespace` on `dra-guard audit`. Left out, each needing running pods:
`kubectl logs` and `helm test`.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time

import pytest
import yaml

from tests.chart import helm
from tests.chart.test_printed_commands import REPO, dra_guard, helm_run
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


@pytest.fixture
def registry(tmp_path):
    """A real OCI registry on loopback (tests/e2e/registry.py); a host without it fails, never skips."""
    from tests.e2e.registry import Registry, RegistryError

    reg = Registry(tmp_path / "registry")
    try:
        reg.start()
    except RegistryError as exc:
        pytest.fail(f"the registry did not start: {exc}", pytrace=False)
    yield reg
    reg.stop()


def push_built_image(line: str, registry) -> str:
    """The `docker build -t REGISTRY/<repo>:<tag> . && docker push ...` line done with the image built
    from the Dockerfile here (tests/e2e/image.py) and skopeo; returns the pushed digest."""
    from tests.e2e import image

    tag_ref = shlex.split(line)[shlex.split(line).index("-t") + 1]
    repository, _, tag = tag_ref.removeprefix("REGISTRY/").partition(":")
    assert f"docker push {tag_ref}" in line, line
    try:
        built = image.build()
    except image.ImageError as exc:
        pytest.fail(f"cannot build the dra-guard image: {exc}", pytrace=False)
    return registry.push_image(built.archive, repository, tag)


def with_registry(line: str, registry, digest: str) -> list[str]:
    """argv of a printed helm line with REGISTRY made the real registry (plain HTTP), the digest the
    pushed one, the chart path absolute (helm package writes into the test's folder), and the
    release `dra-guard` in namespace `dra-guard` made RELEASE in NAMESPACE."""
    text = line.replace("REGISTRY", registry.host).replace("sha256:DIGEST", digest)
    argv = shlex.split(text.replace(" charts/dra-guard", f" {helm.CHART}"))
    if argv[1] in ("install", "upgrade", "push"):
        argv.append("--plain-http")
    if argv[1] in ("install", "upgrade"):
        argv[2] = RELEASE
        argv[argv.index("-n") + 1] = NAMESPACE
    return argv


def test_getting_started_from_a_clean_install_to_enforce(control_plane, registry, tmp_path):
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
    done, digest = [], ""
    try:
        for line in steps:
            words = line.split()
            if words[0] == "docker":
                digest = push_built_image(line, registry)
                done.append(line)
                continue
            if words[:2] == ["helm", "test"] or words[0] == "kubectl":
                continue  # running pods (module docstring)
            if words[:2] == ["helm", "package"]:
                for part in line.split(" && "):
                    out = helm_run(cp, with_registry(part, registry, digest), tmp_path)
                    assert out.returncode == 0, (part, out.stderr)
                done.append(line)
                continue
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
            argv = with_registry(line, registry, digest) + (dev if words[1] == "install" else [])
            out = helm_run(cp, argv, tmp_path)
            assert out.returncode == 0, (line, out.stderr)
            mode = release_config(cp).get("mode", "enforce")
            guard.start(mode=mode)  # the rollout the new ConfigMap's checksum starts
            if words[1] == "install":  # 1. audit first: nothing is refused
                assert mode == "audit" and rbac_failure_policy(cp) == "Ignore"
                assert DENIED not in probe(cp)
                # from the registry: the chart helm fetched, the image the pods would run
                assert any(r.path.startswith("/v2/charts/dra-guard/") and r.method == "GET" for r in registry.requests())
                deployment = json.loads(cp.kubectl("admin", "get", "deploy", FULLNAME, "-n", NAMESPACE, "-o", "json").stdout)
                images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
                assert images == [f"{registry.host}/dra-guard@{digest}"], images
            done.append(line)
        # 4. enforce: the release says so, the webhook fails closed, and the cluster-admin binding is refused
        assert release_config(cp)["mode"] == "enforce" and rbac_failure_policy(cp) == "Fail"
        deadline = time.monotonic() + 30
        while DENIED not in (stderr := probe(cp)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert DENIED in stderr, stderr
        assert [w.split()[:2] for w in done] == [
            ["docker", "build"],
            ["helm", "package"],
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
