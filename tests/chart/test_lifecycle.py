"""Install, upgrade, roll back and uninstall without dra-guard standing in its own way,
with the real helm on the real control plane.

- The admins of config.rbac.adminSubjects are left out of the RBAC webhook by matchConditions
  rendered from that same list: as an admin, upgrades and rollbacks succeed while dra-guard is down,
  and a non-admin's RBAC write is still refused (fail closed) meanwhile.
- An upgrade from the previous chart (0.1.0, taken from git history) with dra-guard serving and
  down, and a rollback.
- `helm uninstall` finishes within 60 s although no hook pod can run here (no kubelet), leaves no
  webhook configuration, the garbage collector deletes the periodic audit's reports (their owner is
  the release's ClusterRole), and what stays is exactly the "Uninstall" page's table (docs/operations/uninstall.md), which its
  clean-up commands then remove.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pathlib
import re
import shlex
import subprocess
import tarfile
import time
from typing import Any

import pytest
import yaml

from tests.chart import helm
from tests.chart.test_cluster import kubeconfig_for_service_account
from tests.e2e.guard import Guard
from tests.e2e.kube import dra_guard, wait_for
from webhook.config import from_mapping

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
PREVIOUS_CHART_COMMIT = "5f89882"  # the last commit that shipped chart 0.1.0


def previous_chart(folder: pathlib.Path) -> pathlib.Path:
    """charts/dra-guard as chart 0.1.0 shipped it, extracted from git history into `folder`."""
    archive = folder / "chart.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "-o", str(archive), PREVIOUS_CHART_COMMIT, "charts/dra-guard"],
        check=True,
        capture_output=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    chart = folder / "charts" / "dra-guard"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == "0.1.0"
    return chart


def dev_values(guard: Guard, **extra: Any) -> dict[str, Any]:
    assert guard.proc is not None or extra.get("ca")
    ca = extra.pop("ca", None) or guard.proc.ca_file.read_bytes()  # type: ignore[union-attr]
    return {"webhooks": {"url": guard.url, "caBundle": base64.b64encode(ca).decode()}, **extra}


def helm_ok(cp, folder: pathlib.Path, *args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    out = helm.run(*args, *helm.values_args(values, folder), env=cp.env("admin"), check=False)
    return out


def alice_binding(cp, name: str) -> subprocess.CompletedProcess[str]:
    """alice (an RBAC manager, not an admin) creates a harmless ClusterRoleBinding."""
    doc = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "subjects": [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "ClusterRole", "name": "view", "apiGroup": "rbac.authorization.k8s.io"},
    }
    return cp.kubectl("alice", "create", "-f", "-", input=json.dumps(doc), check=False)


@pytest.fixture
def guard(control_plane, tmp_path):
    g = Guard(control_plane, tmp_path / "guard")
    g.start(mode="enforce")
    try:
        yield g
    finally:
        g.stop_server()


def test_upgrades_and_rollbacks_as_admin_with_dra_guard_serving_and_down(control_plane, guard, tmp_path):
    cp = control_plane
    release, ns = "life", "dra-guard-life"
    ca = guard.proc.ca_file.read_bytes()
    values = dev_values(guard)
    try:
        out = helm_ok(
            cp,
            tmp_path,
            "install",
            release,
            str(previous_chart(tmp_path)),
            "-n",
            ns,
            "--create-namespace",
            "--set",
            "preDelete.enabled=false",
            values=values,
        )
        assert out.returncode == 0, out.stderr
        # 0.1.0 -> current with dra-guard serving
        out = helm_ok(cp, tmp_path, "upgrade", release, str(helm.CHART), "-n", ns, values=values)
        assert out.returncode == 0, out.stderr

        guard.stop_server()  # dra-guard down: nothing answers the fail-closed RBAC webhook
        refused = alice_binding(cp, "life-while-down")
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
        # as the admin: upgrade with other values, and roll back, while it is down
        out = helm_ok(cp, tmp_path, "upgrade", release, str(helm.CHART), "-n", ns, values={**values, "config": {"mode": "warn"}})
        assert out.returncode == 0, out.stderr
        assert "failed calling webhook" in alice_binding(cp, "life-still-down").stderr  # still closed
        out = helm.run("rollback", release, "2", "-n", ns, env=cp.env("admin"), check=False)
        assert out.returncode == 0, out.stderr
        # rolled all the way back to 0.1.0 (whose configuration sends admins too), then forward again
        # while down: the first upgrade fails on the chart's ClusterRoles but registers the new
        # configuration; the same command then succeeds (docs/operations/upgrades.md)
        out = helm.run("rollback", release, "1", "-n", ns, env=cp.env("admin"), check=False)
        assert out.returncode == 0, out.stderr
        first = helm_ok(cp, tmp_path, "upgrade", release, str(helm.CHART), "-n", ns, values=values)
        second = helm_ok(cp, tmp_path, "upgrade", release, str(helm.CHART), "-n", ns, values=values)
        assert first.returncode != 0 and "failed calling webhook" in first.stderr, first.stdout + first.stderr
        assert second.returncode == 0, second.stderr
        history = json.loads(helm.run("history", release, "-n", ns, "-o", "json", env=cp.env("admin")).stdout)
        assert history[-1]["status"] == "deployed" and history[-1]["chart"] == "dra-guard-0.2.0"

        # a declared driver (a fail-closed eviction webhook) changes none of that, while down
        declared = {**values, "config": {"drivers": {"declared": [{"namespace": "gpu", "name": "gpu-driver"}]}}}
        out = helm_ok(cp, tmp_path, "upgrade", release, str(helm.CHART), "-n", ns, values=declared)
        assert out.returncode == 0, out.stderr
        hooks = {
            w["name"]: w
            for w in json.loads(
                cp.kubectl("admin", "get", "validatingwebhookconfiguration", f"{release}-dra-guard", "-o", "json").stdout
            )["webhooks"]
        }
        assert hooks["driver-evictions.dra-guard.io"]["failurePolicy"] == "Fail"
        # audit mode never blocks: upgraded to audit while down, alice's binding is admitted
        out = helm_ok(
            cp,
            tmp_path,
            "upgrade",
            release,
            str(helm.CHART),
            "-n",
            ns,
            values={**declared, "config": {**declared["config"], "mode": "audit"}},
        )
        assert out.returncode == 0, out.stderr
        admitted = alice_binding(cp, "life-audit-down")
        assert admitted.returncode == 0, admitted.stderr
        # and uninstall, still down: finishes, and leaves no webhook configuration behind
        out = helm.run("uninstall", release, "-n", ns, "--timeout", "60s", env=cp.env("admin"), check=False)
        assert out.returncode == 0, out.stderr
        left = cp.kubectl("admin", "get", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "-o", "name").stdout
        assert f"{release}-dra-guard" not in left, left
    finally:
        remove_release(cp, release, ns)
        cp.kubectl(
            "admin", "delete", "clusterrolebinding", "life-while-down", "life-still-down", "life-audit-down", "--ignore-not-found"
        )
        guard.start(mode="enforce")
        _ = ca


def remove_release(cp, release: str, namespace: str) -> None:
    """Whatever a test left of `release`: its webhook configurations first (a Fail webhook whose
    server is gone would refuse what the uninstall does), then the release without its hooks."""
    cp.kubectl(
        "admin",
        "delete",
        "validatingwebhookconfiguration,mutatingwebhookconfiguration",
        f"{release}-dra-guard",
        "--ignore-not-found",
    )
    helm.run("uninstall", release, "-n", namespace, "--no-hooks", env=cp.env("admin"), check=False)


def documented_cleanup_commands(namespace: str) -> list[list[str]]:
    """The kubectl and dra-guard commands of the page "Uninstall" (docs/operations/uninstall.md, its clean-up block), for
    `namespace`: each as its words after the program, the program first ("kubectl", "dra-guard")."""
    text = (REPO / "docs" / "operations" / "uninstall.md").read_text()
    section = text.split("# Uninstall", 1)[1]
    block = section.split("Remove them when dra-guard is gone for good:", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(("kubectl ", "dra-guard ")):
            words = [
                namespace if w == "dra-guard" and i and prev in ("-n", "namespace") else w
                for i, (prev, w) in enumerate(zip([""] + shlex.split(line), shlex.split(line), strict=False))
            ]
            commands.append(words)
    return commands


def documented_leftovers() -> set[str]:
    """The first column of the "Uninstall" page's table: what stays after `helm uninstall`."""
    section = (REPO / "docs" / "operations" / "uninstall.md").read_text().split("# Uninstall", 1)[1].split("Remove them", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| stays") and "---" not in r]
    return {r.split("|")[1].strip() for r in rows}


def test_uninstall_finishes_when_no_hook_can_run_and_leaves_only_what_the_uninstall_page_lists(control_plane, guard, tmp_path):
    cp = control_plane
    release, ns = "dg", "dra-guard-uninstall"  # not "dra-guard": the test server's own ClusterRole has that name
    fullname = "dg-dra-guard"
    values = dev_values(guard)
    out = helm_ok(cp, tmp_path, "install", release, str(helm.CHART), "-n", ns, "--create-namespace", values=values)
    assert out.returncode == 0, out.stderr
    # the report CRDs as another tool (or tests/e2e/test_cluster_audit.py) installs them: the
    # periodic audit then writes its reports (installCRDs and its keep policy: test_render.py)
    cp.kubectl("admin", "apply", "-f", str(helm.CHART / "files" / "policyreport-crds.yaml"))
    cp.kubectl(
        "admin",
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/policyreports.wgpolicyk8s.io",
        "crd/clusterpolicyreports.wgpolicyk8s.io",
    )
    # Established is not yet listable: until the new resources' storage is initialized the
    # apiserver answers 429 ("storage is (re)initializing"), which would fail the audit below
    wait_for(
        "the report CRDs' storage to serve lists",
        lambda: cp.kubectl("admin", "get", "clusterpolicyreports,policyreports", "-A", check=False).returncode == 0,
        timeout=60,
    )
    # what dra-guard writes at run time, by its own code with the release's configuration:
    # self mode's Secret and Leases, and the periodic audit's Lease and reports, the audit as the
    # release's ServiceAccount (its RBAC: the reports, and the get of their owner, its ClusterRole)
    from certs.selfmanaged import Reconciler
    from webhook.kube.certapi import KubeCertApi
    from webhook.kube.client import api_client
    from webhook.serve.periodic import PeriodicAudit

    rendered = helm.template(values=values, release=release, namespace=ns, show_only=["templates/configmap.yaml"])
    config = from_mapping(yaml.safe_load(rendered[0]["data"]["config.yaml"]))
    config = dataclasses.replace(config, certificates=dataclasses.replace(config.certificates, dir=str(tmp_path / "certs")))
    client = api_client(str(cp.kubeconfig("admin")), timeout_seconds=5)
    Reconciler(KubeCertApi(client, ns), config.certificates, identity="pod-a").reconcile()
    as_dra_guard = kubeconfig_for_service_account(cp, tmp_path, ns, fullname)
    summary = PeriodicAudit(
        api_client(str(as_dra_guard), timeout_seconds=5), config, identity="pod-a", kubeconfig=str(as_dra_guard)
    ).run_once()
    assert summary is not None and summary.report_owner_problem == "", summary
    role_uid = cp.kubectl("admin", "get", "clusterrole", fullname, "-o", "jsonpath={.metadata.uid}").stdout
    report = json.loads(cp.kubectl("admin", "get", "clusterpolicyreport", "dra-guard", "-o", "json").stdout)
    assert [(o["kind"], o["name"], o["uid"]) for o in report["metadata"]["ownerReferences"]] == [
        ("ClusterRole", fullname, role_uid)
    ]

    # default values: no pre-delete Job; no kubelet runs here, so no hook pod could run anyway
    started = time.monotonic()
    out = helm.run("uninstall", release, "-n", ns, "--timeout", "60s", env=cp.env("admin"), check=False)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 60
    left = cp.kubectl(
        "admin",
        "get",
        "validatingwebhookconfiguration,mutatingwebhookconfiguration",
        fullname,
        "--ignore-not-found",
        "-o",
        "name",
    ).stdout.strip()
    assert left == "", left

    # what stays is exactly the Uninstall page's table
    def names(kind: str, *args: str) -> list[str]:
        out = cp.kubectl("admin", "get", kind, *args, "-o", "json").stdout
        return sorted(i["metadata"]["name"] for i in json.loads(out)["items"])

    leases = names("lease", "-n", ns)
    assert names("secret", "-n", ns) == [f"{fullname}-tls"]
    assert leases == sorted([f"{fullname}-certs", f"{fullname}-certs-audit", f"{fullname}-certs-serving-pod-a"])
    for kind in ("deployment", "service", "job", "role", "rolebinding"):
        assert names(kind, "-n", ns) == [], kind
    assert names("configmap", "-n", ns) == ["kube-root-ca.crt"]  # every namespace has it
    assert [n for n in names("serviceaccount", "-n", ns) if n != "default"] == []
    assert not [n for n in names("clusterrole") + names("clusterrolebinding") if n.startswith(fullname)]
    # no report of dra-guard's is left: the garbage collector deleted them with their owner
    wait_for(
        "the garbage collector to delete dra-guard's reports after helm uninstall",
        lambda: (
            not names("clusterpolicyreport", "-l", "app.kubernetes.io/managed-by=dra-guard")
            and not names("policyreport", "-A", "-l", "app.kubernetes.io/managed-by=dra-guard")
        ),
        timeout=150,
        interval=1.0,
    )
    table = documented_leftovers()
    assert any("Secret `<fullname>-tls`" in row for row in table)
    assert any("Leases" in row and "-certs-audit" in row and "-certs-serving-<pod>" in row for row in table)
    assert not any("ClusterPolicyReport" in row for row in table)  # the Uninstall page says they go
    assert any("CRDs" in row for row in table) and any("namespace" in row for row in table)

    # the Uninstall page's clean-up commands remove them: `dra-guard cleanup` its reports, kubectl the rest
    commands = documented_cleanup_commands(ns)
    assert ["dra-guard", "cleanup"] in commands
    for command in commands:
        if command[0] == "dra-guard":
            out = dra_guard(cp, *command[1:])
            # nothing left to it here: it removes the reports an uninstall with --cascade orphan leaves
            assert out.returncode == 0 and "0 report(s) deleted" in out.stdout, (command, out.stdout, out.stderr)
            continue
        out = cp.kubectl("admin", *command[1:], "--wait=false", check=False)
        assert out.returncode == 0, (command, out.stderr)
    assert names("secret", "-n", ns) == [] and names("lease", "-n", ns) == []
    assert "dra-guard" not in names("clusterpolicyreport")


def test_an_enabled_pre_delete_hook_that_cannot_run_stops_the_uninstall_and_no_hooks_finishes_it(control_plane, guard, tmp_path):
    """What values.yaml and the Uninstall page say of preDelete.enabled: helm waits for the Job; here no
    kubelet can run it, so the uninstall stops (after activeDeadlineSeconds, via the Job controller)
    and `--no-hooks` finishes it with nothing left registered."""
    cp = control_plane
    release, ns = "hooked", "dra-guard-hooked"
    values = dev_values(guard, preDelete={"enabled": True, "activeDeadlineSeconds": 5})
    out = helm_ok(cp, tmp_path, "install", release, str(helm.CHART), "-n", ns, "--create-namespace", values=values)
    assert out.returncode == 0, out.stderr
    try:
        out = helm.run("uninstall", release, "-n", ns, "--timeout", "40s", env=cp.env("admin"), check=False)
        assert out.returncode != 0 and re.search(r"pre-delete|job|Job", out.stderr), out.stderr
        out = helm.run("uninstall", release, "-n", ns, "--no-hooks", env=cp.env("admin"), check=False)
        assert out.returncode == 0, out.stderr
        assert (
            cp.kubectl(
                "admin",
                "get",
                "validatingwebhookconfiguration,mutatingwebhookconfiguration",
                f"{release}-dra-guard",
                "--ignore-not-found",
                "-o",
                "name",
            ).stdout.strip()
            == ""
        )
        # the hook's Job is not left behind (delete policy hook-failed)
        deadline = time.monotonic() + 30
        while cp.kubectl("admin", "get", "job", "-n", ns, "-o", "name").stdout.strip():
            assert time.monotonic() < deadline, "the failed pre-delete Job was left behind"
            time.sleep(1)
    finally:
        remove_release(cp, release, ns)
