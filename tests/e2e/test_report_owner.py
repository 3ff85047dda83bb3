"""dra-guard's reports are deleted by the real Kubernetes garbage collector (kube-controller-manager
of the session's control plane) once the ClusterRole they name as their owner is deleted, as
`helm uninstall` deletes the release's; written without an owner (none configured, or the configured
one unreadable) they stay. The reports are written by the periodic audit's own code (audit_cluster)
in both report APIs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.kube import apply_objects, wait_for
from tests.e2e.test_reports import FINDINGS, REPORTS, cli, ours, uid_of
from webhook.config import from_mapping
from webhook.kube.client import api_client
from webhook.serve.audit_child import audit_cluster

pytestmark = pytest.mark.e2e

OWNER = "e2e-report-owner"
#: the garbage collector picks up a newly established CRD at its next discovery sync (30 s), then
#: deletes within seconds: a bound well above both
GC_SECONDS = 150.0


@pytest.fixture
def report_crds(report_crds_established):
    cp = report_crds_established
    cp.kubectl("admin", "apply", "-f", "-", input=FINDINGS)  # a namespaced finding: kube-system's reports
    try:
        yield cp
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=FINDINGS, check=False)
        cp.kubectl("admin", "delete", "clusterrole", OWNER, "--ignore-not-found")
        cli(cp, "admin", "cleanup")


def audit(cp, owner: str | None) -> dict[str, Any]:
    """The periodic audit's code with reportFormat both, the reports' owner `owner` (None: none
    configured), as admin: its summary."""
    client = api_client(str(cp.kubeconfig("admin")), timeout_seconds=10)
    settings: dict[str, Any] = {"reportFormat": "both"}
    if owner is not None:
        settings["reportOwnerClusterRole"] = owner
    return audit_cluster(client, from_mapping({"audit": settings}))


def all_ours(cp) -> dict[tuple[str, str], dict[str, Any]]:
    """dra-guard's reports of both APIs by (plural, namespace/name)."""
    return {
        (plural, f"{r['metadata'].get('namespace', '')}/{r['metadata']['name']}"): r
        for kinds in REPORTS.values()
        for plural, namespaced in kinds
        for r in ours(cp, plural, namespaced)
    }


def create_owner(cp) -> str:
    apply_objects(
        cp, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": OWNER}, "rules": []}
    )
    uid = uid_of(cp, "clusterrole", "", OWNER)
    assert uid
    return uid


def test_reports_are_deleted_by_the_garbage_collector_once_their_owner_is(report_crds):
    cp = report_crds
    # written first without an owner (an older dra-guard): the next write gives the same objects one
    summary = audit(cp, None)
    assert "audit.reportOwnerClusterRole" in summary["reportOwnerProblem"]
    before = all_ours(cp)
    assert {p for p, _ in before} == {p for kinds in REPORTS.values() for p, _ in kinds}, before.keys()
    assert ("policyreports", "kube-system/dra-guard") in before
    assert not [k for k, r in before.items() if r["metadata"].get("ownerReferences")]

    uid = create_owner(cp)
    assert audit(cp, OWNER)["reportOwnerProblem"] == ""
    owned = all_ours(cp)
    assert owned.keys() == before.keys()
    expected = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "name": OWNER,
            "uid": uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    for key, report in owned.items():
        assert report["metadata"]["ownerReferences"] == expected, key
        assert report["metadata"]["uid"] == before[key]["metadata"]["uid"], key  # updated in place, not recreated

    cp.kubectl("admin", "delete", "clusterrole", OWNER)
    wait_for(
        "the garbage collector to delete dra-guard's reports of both APIs",
        lambda: not all_ours(cp),
        timeout=GC_SECONDS,
        interval=1.0,
    )


def canaries(uid: str) -> list[dict[str, Any]]:
    """One report of each report resource, not dra-guard's, owned by ClusterRole OWNER of `uid`:
    their deletion shows the garbage collector has handled the owner's deletion for every resource."""
    ref = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": OWNER, "uid": uid}]
    out = []
    for version, kinds in (
        ("wgpolicyk8s.io/v1alpha2", ("ClusterPolicyReport", "PolicyReport")),
        ("openreports.io/v1alpha1", ("ClusterReport", "Report")),
    ):
        for kind in kinds:
            meta: dict[str, Any] = {"name": "e2e-gc-canary", "ownerReferences": ref}
            if kind in ("PolicyReport", "Report"):
                meta["namespace"] = "kube-system"
            out.append(
                {
                    "apiVersion": version,
                    "kind": kind,
                    "metadata": meta,
                    "summary": {"pass": 0},
                    "results": [],
                    **({"source": "e2e"} if version.startswith("openreports") else {}),
                }
            )
    return out


def canaries_left(cp) -> list[str]:
    left = []
    for plural, namespaced in (p for kinds in REPORTS.values() for p in kinds):
        scope = ["-n", "kube-system"] if namespaced else []
        out = cp.kubectl("admin", "get", plural, "e2e-gc-canary", *scope, "--ignore-not-found", "-o", "name").stdout
        left += out.split()
    return left


def test_reports_without_an_owner_are_written_and_stay(report_crds):
    cp = report_crds
    # configured but unreadable (no such ClusterRole): written all the same, without an owner
    summary = audit(cp, "e2e-no-such-role")
    assert "cannot read ClusterRole e2e-no-such-role: 404" in summary["reportOwnerProblem"], summary
    # none configured (dra-guard outside the chart): written without an owner
    summary = audit(cp, None)
    assert "no owner configured" in summary["reportOwnerProblem"]
    written = all_ours(cp)
    assert ("reports.openreports.io", "kube-system/dra-guard") in written
    assert not [k for k, r in written.items() if r["metadata"].get("ownerReferences")]

    uid = create_owner(cp)
    apply_objects(cp, *canaries(uid))
    assert len(canaries_left(cp)) == 4
    cp.kubectl("admin", "delete", "clusterrole", OWNER)
    wait_for(
        "the garbage collector to delete the owned canary reports",
        lambda: not canaries_left(cp),
        timeout=GC_SECONDS,
        interval=1.0,
    )
    # the garbage collector has handled that deletion in every report resource: dra-guard's stay
    assert {k: r["metadata"]["uid"] for k, r in all_ours(cp).items()} == {k: r["metadata"]["uid"] for k, r in written.items()}
