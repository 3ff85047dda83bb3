"""dra-guard's reports on the real control plane, with the real report CRDs' structure (the chart's
files): both report APIs (wgpolicyk8s.io and openreports.io) with category and resources naming
real objects by apiVersion and uid, no result against an object that does not exist (this control
plane runs kube-controller-manager as a process, not a Pod), a role created after its binding is
not "unresolved", and `dra-guard cleanup` / the chart's pre-delete hook removing the reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.builders import binding, cluster_role, rule, subject
from tests.chart import helm
from tests.e2e import objects
from tests.e2e.kube import apply_objects, dra_guard
from webhook.config import from_mapping
from webhook.kube.client import api_client
from webhook.kube.lists import MAX_SINGLE_ROLE_READS, stream_audit_cluster
from webhook.kube.pages import RateLimiter
from webhook.model.facts import StaticFacts
from webhook.serve.audit_child import audit_cluster

pytestmark = pytest.mark.e2e

#: (plural, namespaced) of each report resource, by report API
REPORTS = {
    "wgpolicyk8s.io": (("clusterpolicyreports", False), ("policyreports", True)),
    "openreports.io": (("clusterreports.openreports.io", False), ("reports.openreports.io", True)),
}

FINDINGS = objects.manifests(
    cluster_role("e2e-reports-writer", [rule(["resourceslices"], ["create"])]),
    binding("e2e-reports-devs", "e2e-reports-writer", [subject("Group", "devs")]),
    # edit in kube-system: a namespaced finding, so a namespaced report
    binding("e2e-reports-edit", "edit", [subject("User", "alice")], kind="RoleBinding", namespace="kube-system"),
)


@pytest.fixture
def report_crds(report_crds_established):
    """The session's control plane with the report CRDs Established (tests/e2e/conftest.py)."""
    return report_crds_established


def get_json(cp, *args: str) -> Any:
    return json.loads(cp.kubectl("admin", "get", *args, "-o", "json").stdout)


def ours(cp, plural: str, namespaced: bool) -> list[dict[str, Any]]:
    scope = ["-A"] if namespaced else []
    return get_json(cp, plural, *scope, "-l", "app.kubernetes.io/managed-by=dra-guard")["items"]


def uid_of(cp, kind: str, namespace: str, name: str) -> str:
    args = ["-n", namespace] if namespace else []
    out = cp.kubectl("admin", "get", kind, name, *args, "-o", "jsonpath={.metadata.uid}", check=False)
    return out.stdout if out.returncode == 0 else ""


def cli(cp, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    return dra_guard(cp, *args, user=user)


def write_both(cp) -> None:
    """The periodic audit's code (its process's audit_cluster) with reportFormat both, as admin."""
    client = api_client(str(cp.kubeconfig("admin")), timeout_seconds=10)
    audit_cluster(client, from_mapping({"audit": {"reportFormat": "both"}}))


def test_reports_in_both_apis_name_only_real_objects_by_api_version_and_uid(report_crds):
    cp = report_crds
    cp.kubectl("admin", "apply", "-f", "-", input=FINDINGS)
    try:
        write_both(cp)
        binding_uid = uid_of(cp, "clusterrolebinding", "", "e2e-reports-devs")
        edit_uid = uid_of(cp, "rolebinding", "kube-system", "e2e-reports-edit")
        assert binding_uid and edit_uid
        for group, kinds in REPORTS.items():
            reports = [r for plural, namespaced in kinds for r in ours(cp, plural, namespaced)]
            assert {r["apiVersion"].split("/")[0] for r in reports} == {group}
            results = [res for r in reports for res in r.get("results") or []]
            assert results and all(res.get("category") for res in results), group
            devs = [res for res in results if res.get("resources", [{}])[0].get("name") == "e2e-reports-devs"]
            assert [res["resources"] for res in devs] == [
                [
                    {
                        "apiVersion": "rbac.authorization.k8s.io/v1",
                        "kind": "ClusterRoleBinding",
                        "name": "e2e-reports-devs",
                        "uid": binding_uid,
                    }
                ]
            ], group
            assert devs[0]["result"] == "fail" and devs[0]["category"] == "DRA access control"
            kube_system = next(r for r in reports if r["metadata"].get("namespace") == "kube-system")
            edit = [res for res in kube_system["results"] if res["resources"][0]["name"] == "e2e-reports-edit"]
            assert edit and edit[0]["resources"][0]["uid"] == edit_uid
            # every object a result names exists, with that uid: never the kube-controller-manager
            # Pod this control plane does not have (its finding is scope-less, subject in properties)
            for res in results:
                for ref in res.get("resources", []):
                    assert ref.get("uid") and uid_of(cp, ref["kind"], ref.get("namespace", ""), ref["name"]) == ref["uid"], ref
            unknown = [res for res in results if res.get("rule") == "controller-manager-qps-unknown"]
            assert unknown and "resources" not in unknown[0]
            assert unknown[0]["properties"]["subject"] == "Pod kube-system/kube-controller-manager"
            if group == "openreports.io":
                assert all(r["source"] == "dra-guard" for r in reports)  # kept by the real CRD's schema
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=FINDINGS, check=False)
        cli(cp, "admin", "cleanup")


class CreatesRoleOnceRolesAreListed(RateLimiter):
    """The audit's rate limiter, which also creates ClusterRole `role` once the ClusterRoles have
    been listed (the audit's next request): the role exists in the cluster before the bindings are
    listed, but not in the audit's listing of roles."""

    def __init__(self, cp, facts: StaticFacts, role: dict[str, Any]) -> None:
        super().__init__(qps=1000, burst=1000)
        self.cp, self.facts, self.role, self.created = cp, facts, role, False

    def wait(self) -> None:
        if not self.created and self.facts.rbac.role("cluster-admin") is not None:
            apply_objects(self.cp, self.role)
            self.created = True
        super().wait()


def clusterrole_lists() -> float:
    """LIST requests for clusterroles this process has made (dra_guard_kube_api_requests_total)."""
    value = REGISTRY.get_sample_value("dra_guard_kube_api_requests_total", {"verb": "list", "resource": "clusterroles"})
    return value or 0.0


@pytest.mark.parametrize("dangling", [1, MAX_SINGLE_ROLE_READS + 4], ids=["one-missing-role", "many-missing-roles"])
def test_a_role_created_after_its_binding_was_listed_is_not_unresolved(control_plane, dangling):
    """A role created after its binding was listed is read before the binding is called unresolved:
    one LIST by name per missing role, or, past MAX_SINGLE_ROLE_READS missing roles (bindings left
    behind by deleted roles), one more listing of the roles instead of a request per role."""
    cp = control_plane
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "e2e-late-role"},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create"]}],
    }
    bindings = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "subjects": [{"kind": "Group", "name": "late", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "ClusterRole", "name": ref, "apiGroup": "rbac.authorization.k8s.io"},
            }
            for name, ref in [
                ("e2e-late-binding", "e2e-late-role"),
                *((f"e2e-dangling-binding-{i}", f"e2e-never-created-{i}") for i in range(dangling)),
            ]
        ],
    }
    cp.kubectl("admin", "delete", "clusterrole", "e2e-late-role", "--ignore-not-found")
    apply_objects(cp, bindings)
    try:
        from webhook import audit

        config = from_mapping(None)
        client = api_client(str(cp.kubeconfig("admin")), timeout_seconds=10)
        facts = StaticFacts(config)
        limiter = CreatesRoleOnceRolesAreListed(cp, facts, role)
        lists_before = clusterrole_lists()
        streamed = stream_audit_cluster(client, facts, limiter=limiter)
        lists = clusterrole_lists() - lists_before
        assert limiter.created  # the role came after the roles' listing
        result = audit.audit(streamed, config, online=True, facts=facts)
        by_name = {(f.name, f.check) for f, _ in result.findings}
        assert ("e2e-late-binding", "unresolved-roleref") not in by_name
        assert ("e2e-late-binding", "rbac-write") in by_name  # judged by the role read once
        for i in range(dangling):  # read once, still absent
            assert (f"e2e-dangling-binding-{i}", "unresolved-roleref") in by_name
        if dangling <= MAX_SINGLE_ROLE_READS:
            assert lists == 1 + 1 + dangling  # the listing (one page here), then one read per missing role
        else:
            assert lists == 2  # the listing, then the listing again: not a request per missing role
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=json.dumps(bindings), check=False)
        cp.kubectl("admin", "delete", "clusterrole", "e2e-late-role", "--ignore-not-found")


def test_cleanup_deletes_dra_guards_reports_of_both_apis_and_nothing_else(report_crds):
    cp = report_crds
    foreign = {
        "apiVersion": "openreports.io/v1alpha1",
        "kind": "ClusterReport",
        "metadata": {"name": "e2e-other-tool"},
        "source": "kyverno",
        "summary": {"pass": 1},
        "results": [],
    }
    apply_objects(cp, foreign)
    cp.kubectl("admin", "apply", "-f", "-", input=FINDINGS)
    try:
        write_both(cp)
        before = {
            (p, r["metadata"].get("namespace", ""), r["metadata"]["name"])
            for kinds in REPORTS.values()
            for p, ns in kinds
            for r in ours(cp, p, ns)
        }
        assert len(before) >= 4, before  # cluster-scoped and kube-system, in each API

        # bob may not list reports: one line naming the server and the cause, exit 2, nothing deleted
        denied = cli(cp, "bob", "cleanup")
        assert denied.returncode == 2 and "Traceback" not in denied.stderr, denied.stderr
        assert len(denied.stderr.strip().splitlines()) == 1 and "403" in denied.stderr, denied.stderr

        dry = cli(cp, "admin", "cleanup", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "would delete ClusterPolicyReport dra-guard (wgpolicyk8s.io)" in dry.stdout
        assert "would delete Report kube-system/dra-guard (openreports.io)" in dry.stdout
        assert f"{len(before)} report(s) would be deleted (dry run)" in dry.stdout
        assert {
            (p, r["metadata"].get("namespace", ""), r["metadata"]["name"])
            for kinds in REPORTS.values()
            for p, ns in kinds
            for r in ours(cp, p, ns)
        } == before

        done = cli(cp, "admin", "cleanup")
        assert done.returncode == 0 and f"{len(before)} report(s) deleted" in done.stdout, done
        for kinds in REPORTS.values():
            for plural, namespaced in kinds:
                assert ours(cp, plural, namespaced) == [], plural
        assert get_json(cp, "clusterreports.openreports.io", "e2e-other-tool")["source"] == "kyverno"
        again = cli(cp, "admin", "cleanup")
        assert again.returncode == 0 and "0 report(s) deleted" in again.stdout
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=FINDINGS, check=False)
        cp.kubectl("admin", "delete", "clusterreports.openreports.io", "e2e-other-tool", "--ignore-not-found")


def test_the_charts_pre_delete_hook_deletes_the_reports_with_its_own_rbac(report_crds):
    """What the pre-delete Job runs (its args, env and ClusterRole as the chart renders them), as a
    user holding only that ClusterRole: no kubelet runs the Job here (tests/chart/test_lifecycle.py)."""
    cp = report_crds
    objs = helm.template(values={"preDelete": {"enabled": True}}, release="e2e-hook", namespace="e2e-hook")
    role = next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-pre-delete"))
    job = next(o for o in objs if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    role["metadata"] = {"name": "e2e-hook-pre-delete"}
    grant = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-hook-pre-delete"},
        "subjects": [{"kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "ClusterRole", "name": "e2e-hook-pre-delete", "apiGroup": "rbac.authorization.k8s.io"},
    }
    cp.kubectl("admin", "apply", "-f", "-", input=FINDINGS)
    apply_objects(cp, *[role, grant])
    try:
        write_both(cp)
        assert ours(cp, "clusterpolicyreports", False) and ours(cp, "reports.openreports.io", True)
        out = subprocess.run(
            [sys.executable, "-m", "webhook.cli", *container["args"], "--kubeconfig", str(cp.kubeconfig("bob"))],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert "deleted ClusterReport dra-guard (openreports.io)" in out.stdout, out.stdout
        for kinds in REPORTS.values():
            for plural, namespaced in kinds:
                assert ours(cp, plural, namespaced) == [], plural
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", "e2e-hook-pre-delete", "--ignore-not-found")
        cp.kubectl("admin", "delete", "-f", "-", input=FINDINGS, check=False)
        cli(cp, "admin", "cleanup")


def test_switching_report_format_deletes_the_reports_of_the_api_no_longer_chosen(report_crds):
    cp = report_crds
    cp.kubectl("admin", "apply", "-f", "-", input=FINDINGS)
    try:
        write_both(cp)
        assert ours(cp, "clusterpolicyreports", False) and ours(cp, "clusterreports.openreports.io", False)
        client = api_client(str(cp.kubeconfig("admin")), timeout_seconds=10)
        audit_cluster(client, from_mapping({"audit": {"reportFormat": "openreports.io"}}))
        assert ours(cp, "clusterpolicyreports", False) == [] and ours(cp, "policyreports", True) == []
        assert ours(cp, "clusterreports.openreports.io", False) and ours(cp, "reports.openreports.io", True)
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=FINDINGS, check=False)
        cli(cp, "admin", "cleanup")


def test_cli_openreports_output_is_accepted_by_the_apiserver(report_crds):
    cp = report_crds
    cp.kubectl("admin", "apply", "-f", "-", input=FINDINGS)
    try:
        out = cli(cp, "admin", "audit", "--cluster", "--no-installed-config", "-o", "openreports")
        assert out.returncode == 1 and "kind: ClusterReport" in out.stdout, out.stderr
        applied = cp.kubectl("admin", "apply", "--dry-run=server", "-o", "json", "-f", "-", input=out.stdout)
        items = json.loads(applied.stdout)["items"]
        devs = [
            res
            for r in items
            for res in r.get("results") or []
            if res.get("resources", [{}])[0].get("name") == "e2e-reports-devs"
        ]
        assert devs and devs[0]["resources"][0]["uid"] and devs[0]["category"]  # kept by the CRD's schema
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=FINDINGS, check=False)
