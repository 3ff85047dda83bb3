"""What a policy UI reads in dra-guard's reports (pure): messages never cut mid-word, results[].category,
resources[] with apiVersion and uid, no result against an object that was not read, and the
wgpolicyk8s.io and openreports.io forms."""

from __future__ import annotations

import pytest

from tests.builders import binding, cluster_role, finding, rule, subject
from webhook import audit
from webhook.audit import reports
from webhook.config import from_mapping
from webhook.kube import reports as kube_reports
from webhook.policies import controlplane

WORDS = " ".join(f"word{i:04d}" for i in range(400))  # 3,599 characters, words of 8


@pytest.mark.parametrize("limit", [20, 64, 1024])
def test_a_long_text_is_cut_at_a_word_with_an_ellipsis(limit):
    out = reports.cut(WORDS, limit)
    assert len(out) <= limit and out.endswith("…")
    kept = out[:-1]
    assert WORDS.startswith(kept) and WORDS[len(kept)] == " "  # the next character starts a new word
    assert kept.split(" ")[-1] == WORDS.split(" ")[len(kept.split(" ")) - 1]  # the last word is whole


def test_a_text_within_the_limit_stays_whole_and_one_long_token_is_cut_where_it_must():
    assert reports.cut("short text", 1024) == "short text"
    assert reports.cut("x" * 30, 10) == "x" * 9 + "…"
    assert reports.cut("ends at a word, more", 16) == "ends at a word…"  # no dangling comma


def test_a_long_message_keeps_its_whole_text_in_properties():
    r = audit.policy_reports([(finding(WORDS), "enforce")], refs={("ClusterRoleBinding", "", "b"): {}}, now=1)
    [result] = r[0]["results"]
    assert len(result["message"]) <= reports.MESSAGE_LIMIT and result["message"].endswith("…")
    assert result["properties"]["message"] == WORDS
    assert all(isinstance(v, str) for v in result["properties"].values())  # the CRDs: a map of strings
    short = audit.policy_reports([(finding("fits"), "enforce")], refs={("ClusterRoleBinding", "", "b"): {}}, now=1)
    assert short[0]["results"][0]["message"] == "fits" and "message" not in short[0]["results"][0]["properties"]


def test_the_full_text_in_properties_is_bounded_too():
    huge = WORDS * 5
    text, extra = reports.message_fields(huge)
    assert len(extra["message"]) <= reports.FULL_MESSAGE_LIMIT and extra["message"].endswith("…")


def test_results_carry_category_and_resources_with_api_version_and_uid():
    ref = {("ClusterRoleBinding", "", "b"): {"apiVersion": "rbac.authorization.k8s.io/v1", "uid": "1234-abcd"}}
    [report] = audit.policy_reports([(finding(), "enforce")], refs=ref, judged={"rbac": []}, now=1)
    [result] = report["results"]
    assert result["category"] == "DRA access control"
    assert result["resources"] == [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "name": "b", "uid": "1234-abcd"}
    ]


def test_the_audit_knows_api_version_and_uid_of_what_it_read():
    writer = cluster_role("slice-writer", [rule(["resourceslices"], ["create"])])
    bad = binding("team-a-slices", "slice-writer", [subject("Group", "team-a")])
    bad["metadata"]["uid"] = "5e1f-uid"
    result = audit.audit([writer, bad], from_mapping(None))
    assert result.refs[("ClusterRoleBinding", "", "team-a-slices")] == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "uid": "5e1f-uid",
    }


def test_a_finding_about_an_object_not_read_is_filed_scope_less_in_the_cluster_report():
    """The control plane runs outside the cluster: no kube-controller-manager Pod exists, and no
    result may name one."""
    kcm = controlplane.controller_manager([])  # "not visible": named Pod kube-system/kube-controller-manager
    assert kcm[0].kind == "Pod"
    result = audit.audit([], from_mapping(None), served_versions=["v1"], online=True)
    unknown = [f for f, _ in result.findings if f.check == "controller-manager-qps-unknown"]
    assert unknown and ("Pod", "kube-system", "kube-controller-manager") not in result.refs
    out = audit.policy_reports(result.findings, refs=result.refs, judged=result.judged, now=1)
    assert [r["kind"] for r in out] == ["ClusterPolicyReport"]  # no PolicyReport in kube-system
    filed = next(r for r in out[0]["results"] if r["rule"] == "controller-manager-qps-unknown")
    assert "resources" not in filed and filed["properties"]["subject"] == "Pod kube-system/kube-controller-manager"
    for r in out[0]["results"]:
        for res in r.get("resources", []):
            assert (res["kind"], res.get("namespace", ""), res["name"]) in result.refs


def test_scheduler_values_are_filed_against_the_object_that_shows_them():
    cm = {
        "kind": "ConfigMap",
        "metadata": {"name": "sched-config", "namespace": "kube-system"},
        "data": {"config.yaml": "kind: KubeSchedulerConfiguration\nclientConnection:\n  qps: 10\n"},
    }
    [f] = controlplane.scheduler([], [cm])
    assert (f.kind, f.namespace, f.name) == ("ConfigMap", "kube-system", "sched-config")


def test_openreports_form_has_its_kinds_and_a_report_source():
    refs = {
        ("DaemonSet", "drivers", "d"): {"apiVersion": "apps/v1", "uid": "u"},
        ("ClusterRoleBinding", "", "b"): {"apiVersion": "rbac.authorization.k8s.io/v1"},
    }
    findings = [
        (finding(), "enforce"),
        (
            finding(
                kind="DaemonSet",
                namespace="drivers",
                name="d",
                policy="probes",
                check="missing-liveness-probe",
                enforced=False,
                fixed_by_patch=True,
            ),
            "enforce",
        ),
    ]
    out = audit.policy_reports(findings, refs=refs, now=1, api=audit.OPENREPORTS)
    assert [(r["apiVersion"], r["kind"]) for r in out] == [
        ("openreports.io/v1alpha1", "ClusterReport"),
        ("openreports.io/v1alpha1", "Report"),
    ]
    assert all(r["source"] == "dra-guard" for r in out)
    wg = audit.policy_reports(findings, refs=refs, now=1, api=audit.WGPOLICY)
    assert [r["kind"] for r in wg] == ["ClusterPolicyReport", "PolicyReport"] and "source" not in wg[0]
    assert wg[1]["results"] == out[1]["results"]  # the same results in both forms
    assert out[1]["results"][0]["category"] == "DRA driver health"


# ---------------------------------------------------------------- the reports' owner (garbage collection)
OWNER = kube_reports.owner_reference("dg-dra-guard", "uid-1")


def test_the_owner_reference_names_the_cluster_role_and_never_blocks_or_controls():
    assert OWNER == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "name": "dg-dra-guard",
        "uid": "uid-1",
        "controller": False,
        "blockOwnerDeletion": False,
    }


@pytest.mark.parametrize("api", [audit.WGPOLICY, audit.OPENREPORTS])
def test_every_report_carries_the_owner_and_none_without_one(api):
    refs = {("DaemonSet", "drivers", "d"): {"apiVersion": "apps/v1", "uid": "u"}}
    findings = [
        (finding(), "enforce"),
        (finding(kind="DaemonSet", namespace="drivers", name="d", policy="probes", check="missing-liveness-probe"), "enforce"),
    ]
    owned = audit.policy_reports(findings, refs=refs, now=1, api=api, owner=OWNER)
    assert [r["metadata"].get("namespace", "") for r in owned] == ["", "drivers"]  # cluster-scoped and namespaced
    assert all(r["metadata"]["ownerReferences"] == [OWNER] for r in owned)
    assert audit.empty_cluster_report(api, owner=OWNER)["metadata"]["ownerReferences"] == [OWNER]
    plain = audit.policy_reports(findings, refs=refs, now=1, api=api)
    assert all("ownerReferences" not in r["metadata"] for r in plain)
    assert "ownerReferences" not in audit.empty_cluster_report(api)["metadata"]
    assert [{**r, "metadata": {k: v for k, v in r["metadata"].items() if k != "ownerReferences"}} for r in owned] == plain


def stored(*owners: dict) -> dict:
    meta = {"name": "dra-guard", "resourceVersion": "42", **({"ownerReferences": list(owners)} if owners else {})}
    return {"metadata": meta}


def test_an_existing_report_takes_the_owner_at_its_next_write():
    [report] = audit.policy_reports([(finding(), "enforce")], refs={}, now=1, owner=OWNER)
    body = kube_reports.updated(report, stored())
    assert body["metadata"]["ownerReferences"] == [OWNER] and body["metadata"]["resourceVersion"] == "42"
    assert body["results"] == report["results"]


def test_a_replaced_cluster_roles_old_uid_is_dropped_and_other_owners_are_kept():
    old = kube_reports.owner_reference("dg-dra-guard", "uid-0")
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "uid-9"}
    [report] = audit.policy_reports([(finding(), "enforce")], refs={}, now=1, owner=OWNER)
    assert kube_reports.updated(report, stored(old, other))["metadata"]["ownerReferences"] == [OWNER, other]
    assert kube_reports.updated(report, stored(OWNER))["metadata"]["ownerReferences"] == [OWNER]  # not twice


def test_a_write_without_an_owner_keeps_the_stored_ones():
    """No owner this time (unreadable, or none configured): the stored reference stays, so one failed
    read never takes the garbage collection away; a report that never had one gets none."""
    [report] = audit.policy_reports([(finding(), "enforce")], refs={}, now=1)
    assert kube_reports.updated(report, stored(OWNER))["metadata"]["ownerReferences"] == [OWNER]
    assert "ownerReferences" not in kube_reports.updated(report, stored())["metadata"]


def test_no_owner_configured_is_no_owner_without_an_api_call():
    owner = kube_reports.ReportOwner(None, "")  # type: ignore[arg-type]  # no client: nothing may be called
    assert owner.reference() is None and "audit.reportOwnerClusterRole" in owner.problem
