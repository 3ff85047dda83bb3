"""The RBAC guard as a pure function: grants, subjects, aggregation, UPDATE, break-glass."""

from __future__ import annotations

import time

import pytest

from tests.builders import binding, cluster_role, review, rule, subject
from webhook.config import from_mapping
from webhook.model import rbac as rbac_model
from webhook.policies import rbac

CONFIG = from_mapping(
    {
        "rbac": {
            "adminSubjects": {"groups": ["system:masters", "system:authenticated"], "users": ["root-admin"]},
            "driverSubjects": {"serviceAccounts": ["dra-system:driver"]},
        },
    }
).rbac

WILDCARD = rule(["*"], ["*"], groups=["*"])


def decide(obj, *, index=None, **kw):
    index = index or rbac.RbacIndex()
    return rbac.review(review(obj, **kw)["request"], index=index, config=CONFIG)


def index_of(*objects):
    return rbac.RbacIndex.from_objects(objects)


# ------------------------------------------------------------------ protected grants
@pytest.mark.parametrize(
    "name, rules, expected",
    [
        ("wildcard everything", [WILDCARD], {("deviceclasses", "*"), ("devicetaintrules", "*"), ("resourceslices", "*")}),
        ("patch resourceslices", [rule(["resourceslices"], ["get", "patch"])], {("resourceslices", "patch")}),
        ("read only", [rule(["resourceslices", "deviceclasses"], ["get", "list", "watch"])], set()),
        ("core group is not a wildcard", [rule(["resourceslices"], ["create"], groups=[""])], set()),
        ("other group", [rule(["resourceslices"], ["create"], groups=["example.com"])], set()),
        (
            "resource wildcard in DRA group",
            [rule(["*"], ["delete"])],
            {("deviceclasses", "delete"), ("devicetaintrules", "delete"), ("resourceslices", "delete")},
        ),
        ("subresource counts", [rule(["deviceclasses/status"], ["update"])], {("deviceclasses", "update")}),
        (
            "resourceNames still grants",
            [rule(["deviceclasses"], ["update"], resourceNames=["gpu"])],
            {("deviceclasses", "update")},
        ),
        ("claims are not protected", [rule(["resourceclaims", "resourceclaimtemplates"], ["*"])], set()),
        ("nonResourceURLs ignored", [{"nonResourceURLs": ["/metrics"], "verbs": ["*"]}], set()),
        ("missing keys", [{}, {"apiGroups": ["*"]}, {"verbs": ["*"]}, None, "junk"], set()),
        ("wrong types", [{"apiGroups": "*", "resources": "*", "verbs": "*"}], set()),
        ("deletecollection", [rule(["resourceslices"], ["deletecollection"])], {("resourceslices", "deletecollection")}),
    ],
)
def test_protected_grants(name, rules, expected):
    got = {(g.resource, g.verb) for g in rbac_model.protected_grants(rules, CONFIG, role="r")}
    assert got == expected, name


def test_protected_grants_tolerates_non_list_rules():
    assert rbac_model.protected_grants(None, CONFIG, role="r") == []
    assert rbac_model.protected_grants({"a": 1}, CONFIG, role="r") == []


def test_configured_verbs_and_resources_are_used():
    # a newer apiserver's admin kind: listed in adminOnlyResources, then drivers may be let write it
    cfg = from_mapping(
        {
            "rbac": {
                "writeVerbs": ["approve"],
                "adminOnlyResources": ["newkinds"],
                "driverResources": ["resourceslices", "newkinds"],
            }
        }
    ).rbac
    grants = rbac_model.protected_grants([rule(["newkinds"], ["approve", "create"])], cfg, role="r")
    assert [(g.resource, g.verb) for g in grants] == [("newkinds", "approve")]


# ------------------------------------------------------------------ ClusterRoleBinding
def test_wildcard_binding_to_group_is_refused_and_names_it():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    d = decide(binding("team-gpu", "everything", [subject("Group", "team-a")]), index=idx)
    assert not d.allowed
    assert d.findings[0].code == 403
    assert "team-a" in d.findings[0].message
    assert "ClusterRole everything" in d.findings[0].message
    assert "team-gpu" in d.findings[0].message


def test_read_only_binding_is_allowed():
    idx = index_of(cluster_role("viewer", [rule(["resourceslices"], ["get", "list", "watch"])]))
    assert decide(binding("v", "viewer", [subject("Group", "team-a")]), index=idx).allowed


@pytest.mark.parametrize("resource, allowed", [("resourceslices", True), ("deviceclasses", False)])
def test_driver_service_account_may_write_slices_only(resource, allowed):
    idx = index_of(cluster_role("driver", [rule([resource], ["create", "update"])]))
    d = decide(binding("drv", "driver", [subject("ServiceAccount", "driver", "dra-system")]), index=idx)
    assert d.allowed is allowed


def test_driver_namespace_wildcard_and_user_form_of_service_account():
    cfg = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": ["gpu:*"]}}}).rbac
    idx = index_of(cluster_role("driver", [rule(["resourceslices"], ["create"])]))
    for subj in (subject("ServiceAccount", "anything", "gpu"), subject("User", "system:serviceaccount:gpu:plugin")):
        req = review(binding("b", "driver", [subj]))["request"]
        assert rbac.review(req, index=idx, config=cfg).allowed, subj
    req = review(binding("b", "driver", [subject("ServiceAccount", "x", "other")]))["request"]
    assert not rbac.review(req, index=idx, config=cfg).allowed


@pytest.mark.parametrize(
    "subj",
    [
        subject("Group", "system:authenticated"),  # listed as admin in CONFIG, still never trusted
        subject("Group", "system:unauthenticated"),
        subject("Group", "system:serviceaccounts"),
        subject("Group", "system:serviceaccounts:kube-system"),
        subject("User", "system:anonymous"),
    ],
)
def test_never_privileged_identities_are_refused_even_if_configured(subj):
    idx = index_of(cluster_role("slices", [rule(["resourceslices"], ["patch"])]))
    assert not decide(binding("b", "slices", [subj]), index=idx).allowed


def test_admins_may_write_everything():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    d = decide(binding("b", "everything", [subject("Group", "system:masters"), subject("User", "root-admin")]), index=idx)
    assert d.allowed


def test_every_subject_is_checked():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    d = decide(
        binding(
            "b",
            "everything",
            [subject("Group", "system:masters"), subject("User", "mallory"), subject("ServiceAccount", "ci", "build")],
        ),
        index=idx,
    )
    assert {f.details["subject"] for f in d.findings} == {"User mallory", "ServiceAccount build/ci"}


def test_missing_role_is_allowed_with_a_warning():
    d = decide(binding("early", "not-yet", [subject("Group", "team-a")]))
    assert d.allowed
    assert any("not-yet" in w for w in d.warnings)


def test_rolebinding_to_a_wide_clusterrole_outside_sensitive_namespaces_is_judged_for_device_allocation_only():
    # a RoleBinding grants no cluster-scoped write and, outside the sensitive namespaces, no
    # namespaced power that matters but device allocation (claims are namespaced, devices are not)
    rb = binding("ns-admin", "everything", [subject("Group", "team-a")], kind="RoleBinding", namespace="team-a")
    d = decide(rb, index=index_of(cluster_role("everything", [WILDCARD])))
    assert not d.allowed and "resourceclaims/binding" in d.findings[0].message
    # without allocation (write on pods, secrets, workloads): allowed at once, without a warning
    ns_admin = cluster_role(
        "ns-admin", [rule(["pods", "secrets"], ["*"], groups=[""]), rule(["deployments"], ["*"], groups=["apps"])]
    )
    d = decide(dict(rb, roleRef=dict(rb["roleRef"], name="ns-admin")), index=index_of(ns_admin))
    assert d.allowed and not d.warnings


def test_delete_is_never_refused():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    b = binding("team-gpu", "everything", [subject("Group", "team-a")])
    assert decide(None, old=b, operation="DELETE", index=idx).allowed


def test_malformed_objects_do_not_crash():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    for obj in (
        {"kind": "ClusterRoleBinding"},
        {"kind": "ClusterRoleBinding", "roleRef": "x", "subjects": "y"},
        {"kind": "ClusterRoleBinding", "roleRef": {"name": "everything"}, "subjects": [None, {"kind": 3}]},
        {"kind": "ClusterRole", "rules": [None], "metadata": None},
    ):
        assert decide(obj, index=idx).allowed, obj


# ------------------------------------------------------------------ UPDATE
def test_update_adding_a_subject_is_refused_only_for_the_new_subject():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    old = binding("b", "everything", [subject("Group", "team-a")])
    new = binding("b", "everything", [subject("Group", "team-a"), subject("Group", "team-b")])
    d = decide(new, old=old, operation="UPDATE", index=idx)
    assert [f.details["subject"] for f in d.findings] == ["Group team-b"]


@pytest.mark.parametrize("change", ["remove-subject", "metadata-only", "remove-finalizers"])
def test_update_of_already_noncompliant_object_is_allowed_with_warning(change):
    idx = index_of(cluster_role("everything", [WILDCARD]))
    old = binding("b", "everything", [subject("Group", "team-a"), subject("Group", "team-b")])
    old["metadata"]["finalizers"] = ["example.com/keep"]
    new = binding("b", "everything", [subject("Group", "team-a"), subject("Group", "team-b")])
    if change == "remove-subject":
        new["subjects"] = new["subjects"][:1]
    elif change == "metadata-only":
        new["metadata"]["labels"] = {"team": "a"}
        new["metadata"]["finalizers"] = ["example.com/keep"]
    d = decide(new, old=old, operation="UPDATE", index=idx)
    assert d.allowed
    assert d.warnings


def test_cluster_role_update_adding_a_verb_is_refused():
    b = binding("b", "slices", [subject("Group", "team-a")])
    old = cluster_role("slices", [rule(["resourceslices"], ["patch"])])
    new = cluster_role("slices", [rule(["resourceslices"], ["patch", "delete"])])
    idx = index_of(old, b)
    d = decide(new, old=old, operation="UPDATE", index=idx)
    assert not d.allowed
    assert d.findings[0].details["verbs"] == ["delete"]


# ------------------------------------------------------------------ ClusterRole and aggregation
EDIT = cluster_role(
    "edit",
    [],
    labels={"rbac.authorization.k8s.io/aggregate-to-admin": "true"},
    aggregation=[{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}],
)
ADMIN = cluster_role("admin", [], aggregation=[{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}}])


def test_role_labelled_into_bound_edit_is_refused():
    idx = index_of(EDIT, binding("devs-edit", "edit", [subject("Group", "devs")]))
    member = cluster_role(
        "slice-patcher", [rule(["resourceslices"], ["patch"])], labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    )
    d = decide(member, index=idx)
    assert not d.allowed
    assert "devs" in d.findings[0].message and "devs-edit" in d.findings[0].message


def test_aggregation_is_transitive():
    idx = index_of(EDIT, ADMIN, binding("ops-admin", "admin", [subject("Group", "ops")]))
    member = cluster_role(
        "slice-patcher", [rule(["resourceslices"], ["patch"])], labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    )
    d = decide(member, index=idx)
    assert [f.details["binding"] for f in d.findings] == ["ops-admin"]


def test_unbound_role_with_grants_is_allowed():
    assert decide(cluster_role("lonely", [WILDCARD]), index=index_of(EDIT)).allowed


def test_role_created_after_its_binding_is_refused():
    idx = index_of(binding("early", "later", [subject("Group", "team-a")]))
    assert not decide(cluster_role("later", [rule(["deviceclasses"], ["create"])]), index=idx).allowed


def test_binding_to_aggregating_role_sees_member_grants():
    member = cluster_role(
        "m", [rule(["deviceclasses"], ["update"])], labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    )
    idx = index_of(EDIT, member)
    d = decide(binding("devs-edit", "edit", [subject("Group", "devs")]), index=idx)
    assert not d.allowed
    assert d.findings[0].details["roles"] == ["m"]


def test_aggregation_controller_update_is_warned_not_refused():
    member = cluster_role(
        "m", [rule(["resourceslices"], ["patch"])], labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    )
    idx = index_of(EDIT, member, binding("devs-edit", "edit", [subject("Group", "devs")]))
    new_edit = cluster_role(
        "edit",
        [rule(["resourceslices"], ["patch"])],
        labels=EDIT["metadata"]["labels"],
        aggregation=EDIT["aggregationRule"]["clusterRoleSelectors"],
    )
    # the index's edit already sees member m; compare against an old edit without the rule
    d = decide(
        new_edit,
        old=EDIT,
        operation="UPDATE",
        index=index_of(EDIT, binding("devs-edit", "edit", [subject("Group", "devs")])),
        user="system:serviceaccount:kube-system:clusterrole-aggregation-controller",
    )
    assert d.allowed and d.warnings
    assert idx.role("m") is not None


@pytest.mark.parametrize(
    "selector, labels, matches",
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {"a": "1"}, False),
    ],
)
def test_selector_matches(selector, labels, matches):
    assert rbac_model.selector_matches(selector, labels) is matches


# ------------------------------------------------------------------ break-glass
GLASS = {rbac.BREAK_GLASS_ANNOTATION: "INC-42 vendor debugging"}


def test_break_glass_honoured_for_admin_and_recorded():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    d = decide(
        binding("b", "everything", [subject("Group", "team-a")], annotations=GLASS),
        index=idx,
        user="root-admin",
        groups=["system:authenticated"],
    )
    assert d.allowed
    assert "INC-42" in d.audit_annotations["break-glass"]


def test_break_glass_ignored_for_non_admin():
    idx = index_of(cluster_role("everything", [WILDCARD]))
    d = decide(binding("b", "everything", [subject("Group", "team-a")], annotations=GLASS), index=idx, user="alice")
    assert not d.allowed
    assert "only when a cluster admin" in d.findings[0].message


# ------------------------------------------------------------------ audit and index
def test_audit_reports_each_offending_binding_subject_once():
    idx = index_of(
        cluster_role("everything", [WILDCARD]),
        cluster_role("viewer", [rule(["resourceslices"], ["get"])]),
        binding("bad", "everything", [subject("Group", "team-a"), subject("Group", "system:masters")]),
        binding("fine", "viewer", [subject("Group", "team-a")]),
        binding("glass", "everything", [subject("Group", "team-b")], annotations=GLASS),
    )
    findings = list(rbac.audit(idx, CONFIG))
    assert [(f.name, f.details["subject"]) for f in findings] == [("bad", "Group team-a")]


def test_index_updates_and_deletes():
    idx = rbac.RbacIndex()
    idx.upsert_binding(binding("b", "r1", []))
    idx.upsert_binding(binding("b", "r2", []))  # roleRef changed (recreated): old reverse entry gone
    assert idx.bindings_of("r1") == [] and len(idx.bindings_of("r2")) == 1
    idx.delete_binding("b")
    idx.delete_binding("never-existed")
    assert idx.bindings_of("r2") == []
    idx.upsert_role(cluster_role("r", [WILDCARD]))
    assert idx.effective_grants(idx.role("r"), CONFIG)
    idx.upsert_role(cluster_role("r", []))
    assert idx.effective_grants(idx.role("r"), CONFIG) == ()  # memo invalidated
    idx.replace_roles([])
    assert idx.role("r") is None


# ------------------------------------------------------------------ regressions found by adversarial testing
DRA_ADMIN = cluster_role("dra-admin", [], aggregation=[{"matchLabels": {"example.com/aggregate-to-dra": "true"}}])
DC_WRITER = cluster_role("dc-writer", [rule(["deviceclasses"], ["create"])], labels={"example.com/aggregate-to-dra": "true"})


def test_aggregation_label_added_to_an_aggregating_role_is_refused():
    idx = index_of(EDIT, DRA_ADMIN, DC_WRITER, binding("devs-edit", "edit", [subject("Group", "devs")]))
    new = cluster_role(
        "dra-admin",
        [],
        labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"},
        aggregation=DRA_ADMIN["aggregationRule"]["clusterRoleSelectors"],
    )
    d = decide(
        new,
        old=DRA_ADMIN,
        operation="UPDATE",
        index=idx,
        user="system:serviceaccount:kube-system:clusterrole-aggregation-controller",
    )
    assert not d.allowed and "Group devs" in d.findings[0].message


def test_rules_added_to_an_aggregating_role_by_someone_else_are_refused():
    idx = index_of(EDIT, binding("devs-edit", "edit", [subject("Group", "devs")]))
    new = cluster_role(
        "edit",
        [rule(["deviceclasses"], ["create"])],
        labels=EDIT["metadata"]["labels"],
        aggregation=EDIT["aggregationRule"]["clusterRoleSelectors"],
    )
    assert not decide(new, old=EDIT, operation="UPDATE", index=idx, user="alice").allowed
    assert decide(new, old=EDIT, operation="UPDATE", index=idx, user="system:kube-controller-manager").allowed


def test_role_missing_from_the_cache_is_fetched():
    fetched = []

    def fetch(name):
        fetched.append(name)
        return cluster_role(name, [WILDCARD]) if name == "just-created" else None

    req = review(binding("b", "just-created", [subject("Group", "team-a")]))["request"]
    assert not rbac.review(req, index=rbac.RbacIndex(), config=CONFIG, fetch_role=fetch).allowed
    req = review(binding("b", "never", [subject("Group", "team-a")]))["request"]
    assert rbac.review(req, index=rbac.RbacIndex(), config=CONFIG, fetch_role=fetch).allowed
    assert fetched == ["just-created", "never"]


def test_stale_caches_refuse_in_enforce_and_say_why():
    req = review(binding("b", "viewer", [subject("Group", "team-a")]))["request"]
    d = rbac.review(req, index=rbac.RbacIndex(), config=CONFIG, synced=(False, "caches not synced: clusterroles"))
    assert not d.allowed and d.findings[0].code == 503 and "not synced: clusterroles" in d.findings[0].message
    # a RoleBinding outside the sensitive namespaces whose role grants nothing known is no RBAC
    # decision to wait for (its role's creation is judged against it)
    rb = review(binding("b", "viewer", [subject("Group", "a")], kind="RoleBinding", namespace="n"))["request"]
    assert rbac.review(rb, index=rbac.RbacIndex(), config=CONFIG, synced=(False, "x")).allowed
    gone = review(None, old=binding("b", "viewer", []), operation="DELETE")["request"]
    assert rbac.review(gone, index=rbac.RbacIndex(), config=CONFIG, synced=(False, "x")).allowed


def test_role_with_protected_grants_reads_bindings_the_watch_has_not_delivered():
    idx = rbac.RbacIndex()
    calls = []

    def refresh():
        calls.append(1)
        idx.upsert_binding(binding("just-made", "later", [subject("Group", "team-a")]))

    req = review(cluster_role("later", [rule(["deviceclasses"], ["create"])]))["request"]
    d = rbac.review(req, index=idx, config=CONFIG, refresh_bindings=refresh)
    assert not d.allowed and "just-made" in d.findings[0].message and calls == [1]
    harmless = review(cluster_role("viewer", [rule(["deviceclasses"], ["get"])]))["request"]
    assert rbac.review(harmless, index=idx, config=CONFIG, refresh_bindings=refresh).allowed and calls == [1]


def test_a_partial_binding_read_is_judged_from_the_index_and_says_so():
    idx = rbac.RbacIndex()
    idx.upsert_binding(binding("cached", "later", [subject("Group", "team-a")]))
    note = "ClusterRoleBindings judged from the watch cache: reading them did not finish within 2 s"
    req = review(cluster_role("later", [rule(["resourceslices"], ["update"])]))["request"]
    d = rbac.review(req, index=idx, config=CONFIG, refresh_bindings=lambda: note)
    assert not d.allowed and "cached" in d.findings[0].message
    assert d.warnings == (f"dra-guard: {note}",)
    unbound = review(cluster_role("nobody-binds-it", [rule(["resourceslices"], ["update"])]))["request"]
    d = rbac.review(unbound, index=idx, config=CONFIG, refresh_bindings=lambda: note)
    assert d.allowed and d.warnings == (f"dra-guard: {note}",)


def test_a_flood_of_reviews_cannot_grow_the_pending_records_without_bound(monkeypatch):
    """Anyone who reaches the webhook port can send reviews: past max_records the RBAC review is
    not judged (503, the apiserver retries) instead of recording more, and records that expired
    make room again."""
    from webhook.model.pending import Pending

    idx = rbac.RbacIndex()
    idx.pending = Pending(ttl=30.0, max_records=3)
    role = cluster_role("r", [rule(["resourceclaims"], ["get"])])
    for n in range(3):
        assert decide(dict(role, metadata={"name": f"r{n}"}), index=idx).allowed
    d = decide(dict(role, metadata={"name": "r3"}), index=idx)
    assert not d.allowed and d.findings[0].code == 503 and d.findings[0].check == "pending-full"
    assert len(idx.pending) == 3
    later = time.monotonic() + 31  # the records' ttl passed without their watch events
    monkeypatch.setattr("webhook.model.pending.time.monotonic", lambda: later)
    assert decide(dict(role, metadata={"name": "r4"}), index=idx).allowed
    assert len(idx.pending) == 1
