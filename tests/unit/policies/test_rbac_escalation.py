"""Escalation powers, sensitive namespaces, bootstrap defaults and dra-guard's own RBAC,
as pure functions (the e2e proof per path is tests/e2e/test_escalation.py)."""

from __future__ import annotations

import pytest

from tests.builders import binding, cluster_role, rbac_exception, review, rule, subject
from webhook.config import from_mapping
from webhook.model.powers import power_grants
from webhook.policies import rbac

CONFIG = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": ["dra-system:driver"]}}}).rbac
ALICE = [subject("User", "alice")]
CHECKS = CONFIG.escalation_checks


def powers(rules, **kw):
    return {
        (g.resource, g.verb, g.namespaced)
        for g in power_grants(rules, role="r", write_verbs=CONFIG.write_verbs, checks=kw.pop("checks", CHECKS), **kw)
    }


def decide(obj, objects=(), config=CONFIG, **kw):
    return rbac.review(review(obj, **kw)["request"], index=rbac.RbacIndex.from_objects(objects), config=config)


def role_in(ns, name, rules):
    return {**cluster_role(name, rules), "kind": "Role", "metadata": {"name": name, "namespace": ns}}


# ------------------------------------------------------------------ the powers found in rules
@pytest.mark.parametrize(
    "name, rules, expected",
    [
        ("impersonate groups", [rule(["groups"], ["impersonate"], groups=[""])], {("impersonate:groups", "impersonate", False)}),
        (
            "impersonate sa (namespaced)",
            [rule(["serviceaccounts"], ["impersonate"], groups=[""])],
            {("impersonate:serviceaccounts", "impersonate", True)},
        ),
        (
            "impersonate uids",
            [rule(["uids"], ["impersonate"], groups=["authentication.k8s.io"])],
            {("impersonate:uids", "impersonate", False)},
        ),
        (
            "webhook write",
            [rule(["validatingwebhookconfigurations"], ["patch"], groups=["admissionregistration.k8s.io"])],
            {("validatingwebhookconfigurations", "patch", False)},
        ),
        (
            "webhook read only",
            [rule(["validatingwebhookconfigurations"], ["get", "list"], groups=["admissionregistration.k8s.io"])],
            set(),
        ),
        ("token", [rule(["serviceaccounts/token"], ["create"], groups=[""])], {("serviceaccounts/token", "create", True)}),
        ("exec via */exec", [rule(["*/exec"], ["get"], groups=[""])], {("pods/exec", "get", True)}),
        ("deployments", [rule(["deployments"], ["update", "get"], groups=["apps"])], {("deployments", "update", True)}),
        # a Job's pod template is immutable: patching one (cluster-autoscaler does, everywhere) runs nothing new
        ("jobs patch", [rule(["jobs"], ["get", "patch", "update"], groups=["batch"])], set()),
        ("jobs create", [rule(["jobs"], ["create", "patch"], groups=["batch"])], {("jobs", "create", True)}),
        ("cronjobs patch", [rule(["cronjobs"], ["patch"], groups=["batch"])], {("cronjobs", "patch", True)}),
        ("secrets read", [rule(["secrets"], ["list"], groups=[""])], {("secrets", "list", True)}),
        ("nodes/proxy", [rule(["nodes/proxy"], ["get"], groups=[""])], {("nodes/proxy", "get", False)}),
        (
            "csr approval",
            [rule(["certificatesigningrequests/approval"], ["update"], groups=["certificates.k8s.io"])],
            {("certificatesigningrequests/approval", "update", False)},
        ),
        ("pods read only", [rule(["pods", "pods/log"], ["get", "list", "watch"], groups=[""])], set()),
        ("namespaces/status", [rule(["namespaces/status"], ["update"], groups=[""])], {("namespaces/status", "update", False)}),
        (
            "namespaces/finalize",
            [rule(["namespaces/finalize"], ["update"], groups=[""])],
            {("namespaces/finalize", "update", False)},
        ),
        ("namespaces read", [rule(["namespaces", "namespaces/status"], ["get", "list"], groups=[""])], set()),
        (
            "resourceclaims/binding",
            [rule(["resourceclaims/binding"], ["patch"])],
            {("resourceclaims/binding", "patch", True)},
        ),
        (
            "resourceclaims/status",
            [rule(["resourceclaims", "resourceclaims/status"], ["update", "get"])],
            {("resourceclaims/status", "update", True)},
        ),
        (
            "resourceclaims write (a workload's)",
            [rule(["resourceclaims", "resourceclaimtemplates"], ["create", "update"])],
            set(),
        ),
        ("resourceclaims/driver", [rule(["resourceclaims/driver"], ["associated-node:update"])], set()),
        ("configmaps read", [rule(["configmaps"], ["get"], groups=[""])], set()),
    ],
)
def test_power_grants(name, rules, expected):
    assert powers(rules) == expected, name


def test_impersonation_limited_to_harmless_names_is_no_power():
    limited = [rule(["groups"], ["impersonate"], groups=[""], resourceNames=["team-b"])]
    assert powers(limited, privileged_name=lambda kind, n: n == "system:masters") == set()
    masters = [rule(["groups"], ["impersonate"], groups=[""], resourceNames=["team-b", "system:masters"])]
    assert powers(masters, privileged_name=lambda kind, n: n == "system:masters")


def test_checks_switch_families_off():
    assert powers([rule(["groups"], ["impersonate"], groups=[""])], checks=frozenset({"admission"})) == set()


def test_bind_on_a_named_powerful_role_is_a_power_bind_on_all_is_not():
    named = [rule(["clusterroles"], ["bind"], groups=["rbac.authorization.k8s.io"], resourceNames=["cluster-admin"])]
    assert powers(named, role_grants=lambda n: n == "cluster-admin") == {("clusterroles:bind-escalate", "bind", False)}
    everything = [rule(["clusterroles"], ["bind"], groups=["rbac.authorization.k8s.io"])]
    assert powers(everything, role_grants=lambda n: True) == set()


# ------------------------------------------------------------------ bindings
def test_path1_impersonating_system_masters_is_refused():
    imp = cluster_role("imp", [rule(["groups"], ["impersonate"], groups=[""], resourceNames=["system:masters"])])
    d = decide(binding("b", "imp", ALICE), [imp])
    assert not d.allowed and "impersonate:groups" in d.findings[0].message


@pytest.mark.parametrize("namespace, allowed", [("kube-system", False), ("dra-system", False), ("team-a", True)])
def test_path2_3_edit_like_rolebinding_is_refused_in_sensitive_namespaces_only(namespace, allowed):
    edit = cluster_role("edit-like", [rule(["pods"], ["create"], groups=[""])])
    d = decide(binding("b", "edit-like", ALICE, kind="RoleBinding", namespace=namespace), [edit])
    assert d.allowed is allowed
    if not allowed:
        assert f"RoleBinding {namespace}/b" in d.findings[0].message and "pods" in d.findings[0].message


def test_role_in_kube_system_is_judged_against_its_rolebindings():
    rb = binding("b", "tokens", ALICE, kind="RoleBinding", namespace="kube-system", role_kind="Role")
    d = decide(role_in("kube-system", "tokens", [rule(["serviceaccounts/token"], ["create"], groups=[""])]), [rb])
    assert not d.allowed and "serviceaccounts/token" in d.findings[0].message


def test_cluster_role_with_a_power_is_judged_against_rolebindings_in_sensitive_namespaces():
    rb = binding("b", "pods", ALICE, kind="RoleBinding", namespace="kube-system")
    d = decide(cluster_role("pods", [rule(["pods"], ["create"], groups=[""])]), [rb])
    assert not d.allowed


def test_dra_write_through_a_rolebinding_grants_nothing():
    slices = cluster_role("slices", [rule(["resourceslices"], ["create"])])
    assert decide(binding("b", "slices", ALICE, kind="RoleBinding", namespace="kube-system"), [slices]).allowed


def test_driver_may_hold_workload_powers_in_its_own_namespace_only_but_not_impersonation():
    """A driver's controllers may run workloads where the driver lives (a RoleBinding in its own
    namespace); the same powers through a ClusterRoleBinding reach kube-system's tokens and are
    refused like anyone's."""
    sa = [subject("ServiceAccount", "driver", "dra-system")]
    slices = cluster_role("slices", [rule(["resourceslices"], ["create"])])
    ctrl = cluster_role(
        "ctrl",
        [
            rule(["daemonsets"], ["create"], groups=["apps"]),
            rule(["pods"], ["create", "patch"], groups=[""]),
            rule(["serviceaccounts/token"], ["create"], groups=[""]),
        ],
    )
    assert decide(binding("b", "slices", sa), [slices]).allowed
    assert decide(binding("b", "ctrl", sa, kind="RoleBinding", namespace="dra-system"), [ctrl]).allowed
    cluster_wide = decide(binding("b", "ctrl", sa), [ctrl])
    assert not cluster_wide.allowed and "serviceaccounts/token" in cluster_wide.findings[0].message
    assert not decide(binding("b", "ctrl", sa, kind="RoleBinding", namespace="kube-system"), [ctrl]).allowed
    imp = cluster_role("imp", [rule(["users"], ["impersonate"], groups=[""])])
    assert not decide(binding("b", "imp", sa), [imp]).allowed


@pytest.mark.parametrize(
    "rules, power",
    [
        ([rule(["apiservices"], ["patch"], groups=["apiregistration.k8s.io"])], "apiservices"),
        ([rule(["flowschemas"], ["create"], groups=["flowcontrol.apiserver.k8s.io"])], "flowschemas"),
        (
            [rule(["prioritylevelconfigurations"], ["update"], groups=["flowcontrol.apiserver.k8s.io"])],
            "prioritylevelconfigurations",
        ),
        (
            [rule(["certificatesigningrequests/nodeclient"], ["create"], groups=["certificates.k8s.io"])],
            "certificatesigningrequests/nodeclient",
        ),
        (
            [rule(["certificatesigningrequests/selfnodeclient"], ["create"], groups=["certificates.k8s.io"])],
            "certificatesigningrequests/selfnodeclient",
        ),
        ([rule(["*/nodeclient"], ["create"], groups=["certificates.k8s.io"])], "certificatesigningrequests/nodeclient"),
        ([rule(["pods"], ["patch"], groups=[""])], "pods"),
        ([rule(["namespaces"], ["update"], groups=[""])], "namespaces"),
    ],
)
def test_powers_over_the_api_around_rbac_are_refused_cluster_wide(rules, power):
    """APIService redirects, API Priority and Fairness, kubelet client CSRs, pod mutation and the
    namespace admin-access label: each lets a non-admin act as, or switch off, a DRA writer."""
    d = decide(binding("b", "r", ALICE), [cluster_role("r", rules)])
    assert not d.allowed and power in d.findings[0].details["resources"], d
    # reading them is no power
    reads = [{**r, "verbs": ["get", "list", "watch"]} for r in rules]
    assert decide(binding("b", "r", ALICE), [cluster_role("r", reads)]).allowed


@pytest.mark.parametrize(
    "resource, group",
    [("endpointslices", "discovery.k8s.io"), ("services", "")],
)
def test_where_reviews_go_is_a_power_in_its_own_namespace_only(resource, group):
    role = cluster_role("r", [rule([resource], ["create", "update"], groups=[group])])
    everywhere = decide(binding("b", "r", ALICE), [role])  # a ClusterRoleBinding reaches dra-guard's namespace
    assert not everywhere.allowed and resource in everywhere.findings[0].details["resources"]
    assert decide(binding("b", "r", ALICE, kind="RoleBinding", namespace="team-a"), [role]).allowed


def test_endpoints_write_everywhere_is_no_power():
    """cluster-autoscaler's chart creates and patches Endpoints everywhere: dra-guard's own Service
    has a selector, so its Endpoints route nothing (the apiserver reads the ClusterIP or the
    EndpointSlices, and selector Services' Endpoints are never mirrored into EndpointSlices)."""
    role = cluster_role("eps", [rule(["endpoints"], ["create", "patch", "update"], groups=[""])])
    assert decide(binding("b", "eps", ALICE), [role]).allowed


def test_lease_write_everywhere_is_no_power_denial_of_service_only():
    """Leader election (cluster-autoscaler: leases create, get/update by name; NVIDIA's controller:
    get/create/update) through a ClusterRoleBinding reaches dra-guard's namespace, where holding its
    Leases stops the periodic audit and forged eviction records hold a pod for a minute at most: the
    threat model rates that a denial of service (row 22), not worth refusing every controller chart."""
    role = cluster_role("elect", [rule(["leases"], ["get", "create", "update", "delete"], groups=["coordination.k8s.io"])])
    assert decide(binding("b", "elect", ALICE), [role]).allowed
    assert list(rbac.audit(rbac.RbacIndex.from_objects([role, binding("b", "elect", ALICE)]), CONFIG)) == []
    # a RoleBinding in dra-guard's own namespace is still the admins' alone (guard-own-rbac)
    own = binding("b", "elect", ALICE, kind="RoleBinding", namespace="dra-guard")
    assert not decide(own, [role]).allowed


def test_path8_device_taint_rules_are_admin_only():
    taints = cluster_role("t", [rule(["devicetaintrules"], ["create"])])
    assert not decide(binding("b", "t", [subject("ServiceAccount", "driver", "dra-system")]), [taints]).allowed


def test_narrowed_kube_system_admins():
    gc = cluster_role("gc", [rule(["*"], ["*"], groups=["*"])])
    assert decide(binding("b", "gc", [subject("ServiceAccount", "generic-garbage-collector", "kube-system")]), [gc]).allowed
    assert not decide(binding("b", "gc", [subject("ServiceAccount", "anything-else", "kube-system")]), [gc]).allowed


# ------------------------------------------------------------------ dra-guard's own RBAC (path 6, path 4)
def test_path6_own_cluster_role_is_changed_by_admins_only():
    own = cluster_role("dra-guard", [rule(["clusterroles"], ["list", "watch"], groups=["rbac.authorization.k8s.io"])])
    stripped = cluster_role("dra-guard", [])
    d = decide(stripped, operation="UPDATE", old=own)
    assert not d.allowed and d.findings[0].check == "guard-own-rbac"
    assert decide(stripped, operation="UPDATE", old=own, user="root", groups=["system:masters"]).allowed


def test_path4_rolebinding_in_dra_guards_namespace_is_changed_by_admins_only():
    rb = binding("b", "view", ALICE, kind="RoleBinding", namespace="dra-guard")
    assert not decide(rb).allowed
    assert decide(rb, user="root", groups=["system:masters"]).allowed


def test_dra_guards_own_service_account_may_hold_its_secrets_in_its_namespace():
    sa = [subject("ServiceAccount", "dra-guard", "dra-guard")]
    tls = role_in("dra-guard", "dra-guard", [rule(["secrets"], ["get", "create", "update"], groups=[""])])
    rb = binding("dra-guard", "dra-guard", sa, kind="RoleBinding", namespace="dra-guard", role_kind="Role")
    assert (
        decide(rb, [tls], user="root", groups=["system:masters"]).allowed
        and not decide(rb, [tls], user="root", groups=["system:masters"]).warnings
    )


# ------------------------------------------------------------------ bootstrap roles (path 7)
AUTO = {"rbac.authorization.kubernetes.io/autoupdate": "true"}


def test_path7_stripped_cluster_admin_is_judged_by_its_defaults():
    stripped = cluster_role("cluster-admin", [], annotations=AUTO)
    d = decide(binding("b", "cluster-admin", ALICE), [stripped])
    assert not d.allowed and "deviceclasses" in d.findings[0].message
    # without the autoupdate annotation the apiserver restores nothing: judged as it is
    assert decide(binding("b", "cluster-admin", ALICE), [cluster_role("cluster-admin", [])]).allowed


def test_path7_stripped_edit_aggregation_is_restored():
    edit = cluster_role("edit", [], annotations=AUTO)  # aggregationRule removed
    member = cluster_role(
        "system:aggregate-to-edit", [], labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"}, annotations=AUTO
    )  # rules stripped too
    d = decide(binding("b", "edit", ALICE, kind="RoleBinding", namespace="kube-system"), [edit, member])
    assert not d.allowed


# ------------------------------------------------------------------ audit (item F)
def test_audit_reports_impersonation_rolebindings_and_webhook_write():
    objects = [
        cluster_role("imp", [rule(["groups"], ["impersonate"], groups=[""])]),
        binding("b1", "imp", ALICE),
        cluster_role("edit-like", [rule(["pods"], ["create"], groups=[""])]),
        binding("b2", "edit-like", ALICE, kind="RoleBinding", namespace="kube-system"),
        binding("b3", "edit-like", ALICE, kind="RoleBinding", namespace="team-a"),
        cluster_role("vwc", [rule(["mutatingwebhookconfigurations"], ["update"], groups=["admissionregistration.k8s.io"])]),
        binding("b4", "vwc", ALICE),
    ]
    found = {(f.kind, f.namespace, f.name) for f in rbac.audit(rbac.RbacIndex.from_objects(objects), CONFIG)}
    assert found == {("ClusterRoleBinding", "", "b1"), ("RoleBinding", "kube-system", "b2"), ("ClusterRoleBinding", "", "b4")}


# ------------------------------------------------------------------ path 9: concurrent reviews in one replica
OLD = cluster_role("racy", [rule(["resourceclaims"], ["create"])])
NEW = cluster_role("racy", [rule(["deviceclasses"], ["create"])])
RACY_BINDING = binding("racy", "racy", ALICE)


def test_binding_judged_while_the_role_update_is_judged_sees_the_pending_role():
    index = rbac.RbacIndex.from_objects([OLD])
    got = {}

    def meanwhile():  # the binding review runs while the role review is between record and read
        got["binding"] = rbac.review(review(RACY_BINDING)["request"], index=index, config=CONFIG)
        return None

    got["role"] = rbac.review(
        review(NEW, operation="UPDATE", old=OLD)["request"], index=index, config=CONFIG, refresh_bindings=meanwhile
    )
    assert not (got["role"].allowed and got["binding"].allowed)
    assert not got["binding"].allowed and "deviceclasses" in got["binding"].findings[0].message


def test_role_update_judged_while_the_binding_is_judged_sees_the_pending_binding():
    index = rbac.RbacIndex()  # the role is not cached yet: the binding review asks fetch_role
    got = {}

    def fetch(name):
        got["role"] = rbac.review(review(NEW, operation="UPDATE", old=OLD)["request"], index=index, config=CONFIG)
        return OLD

    got["binding"] = rbac.review(review(RACY_BINDING)["request"], index=index, config=CONFIG, fetch_role=fetch)
    assert not (got["role"].allowed and got["binding"].allowed)
    assert not got["role"].allowed and "racy" in got["role"].findings[0].message


def test_a_refused_or_dry_run_review_leaves_nothing_pending():
    index = rbac.RbacIndex.from_objects([NEW])
    assert not rbac.review(review(RACY_BINDING)["request"], index=index, config=CONFIG).allowed
    assert index.pending.bindings_of("racy") == []
    harmless = binding("h", "racy", [subject("User", "root")])
    assert rbac.review(
        review(harmless, dry_run=True, user="root", groups=["system:masters"])["request"],
        index=rbac.RbacIndex.from_objects([OLD]),
        config=CONFIG,
    ).allowed
    idx = rbac.RbacIndex.from_objects([OLD])
    rbac.review(review(harmless, dry_run=True)["request"], index=idx, config=CONFIG)
    assert idx.pending.bindings_of("racy") == []
    rbac.review(review(harmless)["request"], index=idx, config=CONFIG)
    assert len(idx.pending.bindings_of("racy")) == 1
    idx.upsert_binding(harmless)  # the watch delivers it
    assert idx.pending.bindings_of("racy") == []


# ------------------------------------------------------------------ subresources: the admin-access label and claim allocation
@pytest.mark.parametrize(
    "resource, power",
    [
        ("namespaces/status", "namespaces/status"),
        ("namespaces/finalize", "namespaces/finalize"),
        ("resourceclaims/binding", "resourceclaims/binding"),
        ("resourceclaims/status", "resourceclaims/status"),
    ],
)
def test_subresource_powers_are_refused_cluster_wide_and_reported(resource, power):
    group = "" if resource.startswith("namespaces") else "resource.k8s.io"
    role = cluster_role("side-door", [rule([resource], ["update", "patch"], groups=[group])])
    d = decide(binding("side-door", "side-door", ALICE), [role])
    assert not d.allowed and power in d.findings[0].message
    found = list(rbac.audit(rbac.RbacIndex.from_objects([role, binding("side-door", "side-door", ALICE)]), CONFIG))
    assert [f.name for f in found] == ["side-door"] and power in found[0].message
    in_team_a = binding("side-door", "side-door", ALICE, kind="RoleBinding", namespace="team-a")
    if resource.startswith("namespaces"):
        # a RoleBinding outside the sensitive namespaces grants no cluster-scoped power
        assert decide(in_team_a, [role]).allowed
    else:
        # claims are namespaced, the devices are the cluster's: allocation matters in every namespace
        d = decide(in_team_a, [role])
        assert not d.allowed and power in d.findings[0].message
        found = list(rbac.audit(rbac.RbacIndex.from_objects([role, in_team_a]), CONFIG))
        assert [(f.kind, f.namespace, f.name) for f in found] == [("RoleBinding", "team-a", "side-door")]


def test_a_role_or_a_wide_clusterrole_that_allocates_devices_is_refused_in_any_namespace():
    """A Role's own rules, a RoleBinding of cluster-admin, and a Role widened after its binding:
    each would let a tenant write a claim's allocation in its namespace (another tenant's device)."""
    tenant = [subject("Group", "team-a")]
    own = role_in("team-a", "claims", [rule(["*"], ["*"])])
    rb = binding("claims", "claims", tenant, kind="RoleBinding", namespace="team-a", role_kind="Role")
    d = decide(rb, [own])
    assert not d.allowed and "resourceclaims/binding" in d.findings[0].message
    wide = cluster_role("cluster-admin", [rule(["*"], ["*"], groups=["*"])])
    d = decide(binding("team-admin", "cluster-admin", tenant, kind="RoleBinding", namespace="team-a"), [wide])
    assert not d.allowed and "resourceclaims/status" in d.findings[0].message
    # the role is widened after its binding: the role's update is what is refused
    narrow = dict(own, rules=[rule(["resourceclaims", "resourceclaimtemplates"], ["*"])])
    assert decide(rb, [narrow]).allowed
    d = decide(own, [narrow, rb], old=narrow, operation="UPDATE")
    assert not d.allowed and "resourceclaims/binding" in d.findings[0].message
    # what a workload operator needs (the page) stays allowed, as does the built-in admin role
    assert decide(narrow, [rb]).allowed


def test_claim_allocation_is_the_drivers_and_the_control_planes():
    """Drivers (rbac.driverSubjects) write their claims' status; the scheduler and the
    resource-claim controller are admins by default (their bootstrap roles hold both)."""
    role = cluster_role("alloc", [rule(["resourceclaims/status", "resourceclaims/binding"], ["update", "patch"])])
    driver = [subject("ServiceAccount", "driver", namespace="dra-system")]
    assert decide(binding("alloc", "alloc", driver), [role]).allowed
    for who in (
        [subject("User", "system:kube-scheduler")],
        [subject("ServiceAccount", "resource-claim-controller", namespace="kube-system")],
    ):
        assert decide(binding("alloc", "alloc", who), [role]).allowed, who
    vcluster = [subject("ServiceAccount", "vc-tenant", namespace="tenant-a")]
    d = decide(binding("alloc", "alloc", vcluster), [role])
    assert not d.allowed and "resourceclaims/binding" in d.findings[0].message


# ------------------------------------------------------------------ sensitive: wherever a ServiceAccount may write DRA objects
WRITERS = from_mapping(
    {
        "rbac": {"driverSubjects": {"serviceAccounts": ["dra-system:driver"]}},
        "drivers": {"declared": [{"namespace": "gpu-driver", "name": "plugin"}]},
        "exceptions": [
            rbac_exception(
                name="gpu-inventory",
                subjects={"serviceAccounts": ["system:serviceaccount:gpu-tools:inventory"]},
                expires="2027-06-30T00:00:00Z",
            ),
            {
                "policy": "probes",
                "kind": "DaemonSet",
                "namespace": "legacy",
                "name": "d",
                "reason": "r",
                "owner": "o",
                "expires": "2027-06-30T00:00:00Z",
            },
        ],
    }
).rbac


@pytest.mark.parametrize("namespace", ["gpu-tools", "gpu-driver", "dra-system", "kube-system"])
def test_token_minting_where_a_dra_writer_runs_is_refused_and_reported(namespace):
    tokens = role_in(namespace, "tokens", [rule(["serviceaccounts/token"], ["create"], groups=[""])])
    rb = binding("t", "tokens", ALICE, kind="RoleBinding", namespace=namespace, role_kind="Role")
    d = decide(rb, [tokens], config=WRITERS)
    assert not d.allowed and "serviceaccounts/token" in d.findings[0].message
    assert [f.name for f in rbac.audit(rbac.RbacIndex.from_objects([tokens, rb]), WRITERS)] == ["t"]


def test_a_probes_exception_or_an_ordinary_namespace_is_not_sensitive():
    for namespace in ("legacy", "team-a"):
        tokens = role_in(namespace, "tokens", [rule(["serviceaccounts/token"], ["create"], groups=[""])])
        rb = binding("t", "tokens", ALICE, kind="RoleBinding", namespace=namespace, role_kind="Role")
        assert decide(rb, [tokens], config=WRITERS).allowed, namespace


# ------------------------------------------------------------------ forged reviews: what a review says only adds restrictions
MASTERS = [subject("Group", "system:masters")]


def test_a_forged_binding_review_never_hides_the_cached_binding():
    """The forged sequence: a CREATE of an existing ClusterRoleBinding (alice -> racy) naming only
    system:masters is allowed (it grants nothing to a non-admin) and recorded as pending; the real
    widening of `racy` must still be judged against the cached binding of alice."""
    index = rbac.RbacIndex.from_objects([OLD, RACY_BINDING])
    forged = binding("racy", "racy", MASTERS)
    assert rbac.review(review(forged)["request"], index=index, config=CONFIG).allowed
    assert len(index.pending.bindings_of("racy")) == 1
    widened = rbac.review(review(NEW, operation="UPDATE", old=OLD)["request"], index=index, config=CONFIG)
    assert not widened.allowed and "User alice" in widened.findings[0].message
    assert len(widened.findings) == 1  # the cached binding is judged once, the forged one grants nothing


def test_a_forged_role_review_never_hides_the_cached_role():
    """A forged UPDATE of a bound role to nothing, then the real binding of alice to it: the cached
    role's DeviceClass write still counts."""
    index = rbac.RbacIndex.from_objects([NEW])
    emptied = cluster_role("racy", [])
    assert rbac.review(review(emptied, operation="UPDATE", old=NEW)["request"], index=index, config=CONFIG).allowed
    refused = rbac.review(review(RACY_BINDING)["request"], index=index, config=CONFIG)
    assert not refused.allowed and "deviceclasses" in refused.findings[0].message


def test_a_refused_forged_review_drops_only_its_own_pending_record():
    """Two versions of one binding pending: the real one (alice, allowed while the role granted
    nothing) and a forged one refused a moment later; the refusal must not take the real one with it."""
    index = rbac.RbacIndex.from_objects([OLD])
    assert rbac.review(review(RACY_BINDING)["request"], index=index, config=CONFIG).allowed
    index.upsert_role(NEW)  # the role widened (by an exempt writer) before the binding reached the watch
    forged = binding("racy", "racy", [subject("User", "mallory")])
    assert not rbac.review(review(forged)["request"], index=index, config=CONFIG).allowed
    assert [b["subjects"] for b in index.pending.bindings_of("racy")] == [ALICE]


def test_dra_guards_own_cluster_role_in_self_mode_is_no_violation():
    """The chart's ClusterRole in self certificate mode: get/patch on its own webhook configurations."""
    own = cluster_role(
        "dra-guard",
        [
            rule(
                ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                ["get", "patch"],
                groups=["admissionregistration.k8s.io"],
                resourceNames=["dra-guard"],
            )
        ],
    )
    crb = binding("dra-guard", "dra-guard", [subject("ServiceAccount", "dra-guard", "dra-guard")])
    assert list(rbac.audit(rbac.RbacIndex.from_objects([own, crb]), CONFIG)) == []
    other = binding("x", "dra-guard", [subject("ServiceAccount", "dra-guard", "elsewhere")])
    assert list(rbac.audit(rbac.RbacIndex.from_objects([own, other]), CONFIG))


# ------------------------------------------------------------------ item 6: the audit reports every grant-shaped path
AUTO_ANN = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
PATH_GRANTS = {
    "path1 impersonate": ([cluster_role("imp", [rule(["users"], ["impersonate"], groups=[""])])], binding("p1", "imp", ALICE)),
    "path2 kube-system edit": (
        [cluster_role("pods-w", [rule(["pods"], ["create"], groups=[""])])],
        binding("p2", "pods-w", ALICE, kind="RoleBinding", namespace="kube-system"),
    ),
    "path3 driver namespace": (
        [cluster_role("tok", [rule(["serviceaccounts/token"], ["create"], groups=[""])])],
        binding("p3", "tok", ALICE, kind="RoleBinding", namespace="dra-system"),
    ),
    "path4 dra-guard namespace": (
        [cluster_role("cm-w", [rule(["secrets"], ["get"], groups=[""])])],
        binding("p4", "cm-w", ALICE, kind="RoleBinding", namespace="dra-guard"),
    ),
    "path5 admission configuration": (
        [cluster_role("adm", [rule(["validatingadmissionpolicybindings"], ["create"], groups=["admissionregistration.k8s.io"])])],
        binding("p5", "adm", ALICE),
    ),
    "path7 stripped cluster-admin": (
        [cluster_role("cluster-admin", [], annotations=AUTO_ANN)],
        binding("p7", "cluster-admin", ALICE),
    ),
    "path8 DeviceTaintRule": ([cluster_role("taint", [rule(["devicetaintrules"], ["create"])])], binding("p8", "taint", ALICE)),
    "path10 exec cluster-wide": (
        [cluster_role("exec", [rule(["pods/exec"], ["create"], groups=[""])])],
        binding("p10", "exec", ALICE),
    ),
    "path11 nodes/proxy": ([cluster_role("np", [rule(["nodes/proxy"], ["get"], groups=[""])])], binding("p11", "np", ALICE)),
    "path12 bind a powerful role": (
        [
            cluster_role("imp", [rule(["groups"], ["impersonate"], groups=[""])]),
            cluster_role(
                "binder", [rule(["clusterroles"], ["bind"], groups=["rbac.authorization.k8s.io"], resourceNames=["imp"])]
            ),
        ],
        binding("p12", "binder", ALICE),
    ),
}


@pytest.mark.parametrize("path", sorted(PATH_GRANTS))
def test_the_audit_reports_every_grant_shaped_path(path):
    """What admission refuses for paths 1-5, 7, 8, 10-12, `audit --cluster` and
    the periodic audit (both rbac.audit over the cached objects) report when it is found stored
    (made in warn/audit mode, before dra-guard was installed, or by an admin). Paths 6 and 9 are
    about who writes and when: admission and the watch re-judging (tests/unit/kube/test_rbac_drift.py)."""
    roles, bound = PATH_GRANTS[path]
    found = {(f.kind, f.namespace, f.name) for f in rbac.audit(rbac.RbacIndex.from_objects([*roles, bound]), CONFIG)}
    meta = bound["metadata"]
    assert (bound["kind"], meta.get("namespace", ""), meta["name"]) in found, path
    team = {**bound, "metadata": {**meta, "namespace": "team-a"}} if bound["kind"] == "RoleBinding" else None
    if team is not None:  # the same RoleBinding outside a sensitive namespace is no finding
        found = {(f.kind, f.namespace, f.name) for f in rbac.audit(rbac.RbacIndex.from_objects([*roles, team]), CONFIG)}
        assert ("RoleBinding", "team-a", meta["name"]) not in found, path


@pytest.mark.parametrize(
    "power, rules",
    [
        ("apiservices", [rule(["apiservices"], ["update"], groups=["apiregistration.k8s.io"])]),
        ("flowschemas", [rule(["flowschemas"], ["patch"], groups=["flowcontrol.apiserver.k8s.io"])]),
        (
            "certificatesigningrequests/nodeclient",
            [rule(["certificatesigningrequests/nodeclient"], ["create"], groups=["certificates.k8s.io"])],
        ),
        ("pods", [rule(["pods"], ["update"], groups=[""])]),
        ("namespaces", [rule(["namespaces"], ["patch"], groups=[""])]),
        ("endpointslices", [rule(["endpointslices"], ["create"], groups=["discovery.k8s.io"])]),
    ],
)
def test_audit_of_files_reports_each_power_around_rbac(tmp_path, capsys, power, rules):
    """`dra-guard audit -f` over a ClusterRole and its ClusterRoleBinding, as a chart would ship them."""
    import json

    import yaml

    from webhook.cli import main

    docs = [cluster_role("r", rules), binding("b", "r", ALICE)]
    (tmp_path / "rbac.yaml").write_text(yaml.safe_dump_all(docs))
    code = main(["audit", "-f", str(tmp_path / "rbac.yaml"), "-o", "json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert code == 1 and any(f["check"] == "rbac-write" and power in f["message"] for f in findings), findings


def test_pods_delete_is_a_power_in_a_declared_drivers_namespace():
    """DELETE or deletecollection of a driver's pods takes it off its node (refused at admission
    while claims need it, eviction.guardDeletes): granting it in a declared driver's namespace,
    or cluster-wide, is an escalation power like pods patch; elsewhere a RoleBinding is fine."""
    assert powers([rule(["pods"], ["delete", "deletecollection"], groups=[""])]) == {
        ("pods:delete", "delete", True),
        ("pods:delete", "deletecollection", True),
    }
    config = from_mapping({"drivers": {"declared": [{"namespace": "gpu", "name": "gpu-driver"}]}}).rbac
    assert "gpu" in config.sensitive
    deleter = cluster_role("deleter", [rule(["pods"], ["delete"], groups=[""])])
    refused = decide(binding("b", "deleter", ALICE, kind="RoleBinding", namespace="gpu"), [deleter], config=config)
    assert not refused.allowed and "pods" in refused.findings[0].message
    assert decide(binding("b", "deleter", ALICE, kind="RoleBinding", namespace="team-a"), [deleter], config=config).allowed
    assert not decide(binding("b", "deleter", ALICE), [deleter], config=config).allowed  # cluster-wide
    # other sensitive namespaces, and a cluster with no declared driver: an autoscaler's everyday right
    assert decide(binding("b", "deleter", ALICE, kind="RoleBinding", namespace="kube-system"), [deleter], config=config).allowed
    assert decide(binding("b", "deleter", ALICE), [deleter], config=from_mapping(None).rbac).allowed
