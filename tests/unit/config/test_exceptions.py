"""Exceptions an admin owns (config key `exceptions`): validation at load, matching, expiry, and
what admission and audits do with them."""

from __future__ import annotations

import base64
import datetime
import json

import pytest

from tests.builders import binding, cluster_role, driver_daemonset, finding, rbac_exception, review, rule, subject
from webhook.config import ConfigError, from_mapping
from webhook.config.schema import config_schema
from webhook.kube.state import ClusterState
from webhook.policies import exceptions
from webhook.policies.decision import Decision, Finding
from webhook.serve.app import create_app

NOW = datetime.datetime.now(datetime.UTC)


def stamp(days: float) -> str:
    return (NOW + datetime.timedelta(days=days)).isoformat().replace("+00:00", "Z")


def rbac_entry(**overrides):
    return rbac_exception(**{"expires": stamp(30), **overrides})


def probes_entry(**overrides):
    entry = {
        "policy": "probes",
        "kind": "DaemonSet",
        "namespace": "gpu",
        "name": "gpu-driver",
        "reason": "no health endpoint before 1.4",
        "owner": "team-gpu",
        "expires": stamp(30),
    }
    return {**entry, **overrides}


def config_with(*entries, **extra):
    return from_mapping({"exceptions": list(entries), **extra})


# ------------------------------------------------------------------ validation at load
def test_a_valid_entry_reads_back_with_an_aware_expiry():
    offset = (NOW + datetime.timedelta(days=30)).astimezone(datetime.timezone(datetime.timedelta(hours=2)))
    (e,) = config_with(rbac_entry(expires=offset.isoformat())).exceptions
    assert e.ref == "rbac ClusterRoleBinding team-gpu"
    assert (
        e.expires == offset
        and e.expires.utcoffset() == datetime.timedelta(0)
        and e.role_ref == "slice-writer"
        and e.resources == {"resourceslices"}
    )


def test_yaml_unquoted_timestamp_is_read_too():
    import yaml

    when = (NOW + datetime.timedelta(days=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = yaml.safe_load(f"exceptions:\n- {json.dumps(probes_entry(expires='X'))}".replace('"X"', when))
    assert isinstance(doc["exceptions"][0]["expires"], datetime.datetime)
    assert from_mapping(doc).exceptions[0].live(NOW)


@pytest.mark.parametrize(
    "entry, message",
    [
        (rbac_entry(expires=None), "exceptions[0].expires: required"),
        (rbac_entry(expires="2026-12-31"), "exceptions[0].expires: 2026-12-31 is a date; give a date-time such as"),
        (rbac_entry(expires="2026-12-31T00:00:00"), "exceptions[0].expires: 2026-12-31T00:00:00 has no time zone"),
        (rbac_entry(expires="next tuesday"), "exceptions[0].expires: 'next tuesday' is not an RFC 3339 date-time"),
        (rbac_entry(expires=stamp(400)), "is more than 366 days ahead; exceptions are reviewed at least once a year"),
        (rbac_entry(owner=""), "exceptions[0].owner: required"),
        (rbac_entry(reason=None), "exceptions[0].reason: required"),
        (rbac_entry(policy=None), "exceptions[0].policy: required"),
        (
            rbac_entry(policy="eviction", kind="DaemonSet", namespace="gpu"),
            "exceptions[0].policy: the eviction policy is never excepted",
        ),
        (rbac_entry(kind="ClusterRole"), "exceptions[0].kind: must be one of ClusterRoleBinding, RoleBinding, DaemonSet"),
        (
            rbac_entry(kind="DaemonSet", namespace="gpu"),
            "exceptions[0].kind: a rbac exception names a ClusterRoleBinding or RoleBinding",
        ),
        (probes_entry(kind="RoleBinding"), "exceptions[0].kind: a probes exception names a DaemonSet"),
        (rbac_entry(kind="RoleBinding"), "exceptions[0].namespace: required for a RoleBinding"),
        (rbac_entry(namespace="gpu"), "exceptions[0].namespace: a ClusterRoleBinding has no namespace"),
        (probes_entry(namespace="GPU"), "exceptions[0].namespace: 'GPU' must be a namespace name"),
        (probes_entry(name="gpu_driver"), "exceptions[0].name: 'gpu_driver' must be a DaemonSet name"),
        (rbac_entry(roleRef=None), "exceptions[0].roleRef: required for an rbac exception"),
        (rbac_entry(subjects={}), "exceptions[0].subjects: required for an rbac exception"),
        (rbac_entry(resources=[]), "exceptions[0].resources: required for an rbac exception"),
        (probes_entry(resources=["resourceslices"]), "exceptions[0].resources: only rbac exceptions take resources"),
        (rbac_entry(subjects={"serviceAccounts": ["gpu:*"]}), "exceptions[0].subjects.serviceAccounts: gpu:* is a pattern"),
        (rbac_entry(subjects={"groups": ["system:authenticated"]}), "exceptions[0].subjects.groups: system:authenticated"),
        (rbac_entry(bogus=1), "exceptions[0].bogus: unknown key"),
    ],
)
def test_a_bad_entry_stops_start_up_naming_its_key(entry, message):
    with pytest.raises(ConfigError) as err:
        config_with(entry)
    assert message in str(err.value), str(err.value)


def test_every_bad_entry_is_reported_at_once_and_a_bad_key_skips_only_its_own_entrys_cross_checks():
    """A bad expires must not reach the cross-checks (which compare it with the horizon); the
    cross-check errors of the other entries are still reported."""
    with pytest.raises(ConfigError) as err:
        config_with(
            rbac_entry(expires="next tuesday"),
            rbac_entry(policy="eviction", kind="DaemonSet", namespace="gpu", name="other"),
            rbac_entry(kind="RoleBinding", name="third"),
        )
    problems = err.value.problems
    assert [p.split(":", 1)[0] for p in problems] == [
        "exceptions[0].expires",
        "exceptions[1].policy",
        "exceptions[2].namespace",
    ], problems


def test_two_entries_for_one_object_and_policy_are_refused():
    with pytest.raises(
        ConfigError,
        match=r"^exceptions\[1\]: rbac ClusterRoleBinding team-gpu is already excepted by "
        r"exceptions\[0\]",
    ):
        config_with(rbac_entry(), rbac_entry(owner="someone else"))


def test_the_chart_schema_takes_an_entry_and_refuses_one_without_expiry():
    from tests.unit.config.test_config_schema import validate

    assert validate({"exceptions": [rbac_entry()]}, config_schema(chart=True)) == []
    without = {k: v for k, v in rbac_entry().items() if k != "expires"}
    assert validate({"exceptions": [without]}, config_schema(chart=True)) == ["/exceptions/0/expires: required"]


# ------------------------------------------------------------------ matching
def rbac_finding(**overrides):
    base = {
        "policy": "rbac",
        "kind": "ClusterRoleBinding",
        "name": "team-gpu",
        "check": "rbac-write",
        "message": "ClusterRoleBinding team-gpu grants write.",
        "summary": "dra-guard: Group team-a would get resourceslices",
        "details": {"subject": "Group team-a", "roleRef": "slice-writer", "resources": ["resourceslices"]},
    }
    details = {**base["details"], **overrides.pop("details", {})}
    return Finding(**{**base, **overrides, "details": details})


@pytest.mark.parametrize(
    "finding, covered",
    [
        (rbac_finding(), True),
        (rbac_finding(name="team-gpu-2"), False),  # exact names only
        (rbac_finding(kind="RoleBinding", namespace="kube-system"), False),
        (rbac_finding(check="guard-own-rbac"), False),  # dra-guard's own RBAC is never excepted
        (rbac_finding(details={"subject": "Group team-b"}), False),  # another subject
        (rbac_finding(details={"subject": "User team-a"}), False),  # a User is not the Group
        (rbac_finding(details={"roleRef": "everything"}), False),  # another role
        (rbac_finding(details={"resources": ["deviceclasses", "resourceslices"]}), False),  # more than reviewed
        (rbac_finding(policy="probes"), False),
    ],
)
def test_an_exception_covers_only_what_it_names(finding, covered):
    (e,) = config_with(rbac_entry()).exceptions
    assert exceptions.covers(e, finding) is covered


def test_expiry_is_the_instant_named():
    (e,) = config_with(rbac_entry(expires=stamp(1))).exceptions
    assert e.live(e.expires - datetime.timedelta(seconds=1)) and not e.live(e.expires)


# ------------------------------------------------------------------ admission decisions (pure)
def test_a_live_exception_lets_the_refusal_through_with_a_warning_and_annotation():
    (e,) = config_with(rbac_entry()).exceptions
    decision, used, expired = exceptions.admit(Decision(findings=(rbac_finding(),)), [e], now=NOW)
    assert decision.allowed and used == [e] and expired == []
    (f,) = decision.findings
    assert f.skipped and f.exception["owner"] == "team-gpu" and f.exception["ref"] == e.ref
    assert "allowed by exception rbac ClusterRoleBinding team-gpu (owner team-gpu, expires" in f.summary
    assert "team-gpu" in decision.audit_annotations["exception"]


def test_an_expired_exception_refuses_as_before_and_says_so():
    (e,) = config_with(rbac_entry(expires=stamp(1))).exceptions
    later = e.expires + datetime.timedelta(minutes=1)
    decision, used, expired = exceptions.admit(Decision(findings=(rbac_finding(),)), [e], now=later)
    assert not decision.allowed and used == [] and expired == [e]
    assert "expired at" in decision.findings[0].message and "exception" not in decision.audit_annotations


def test_a_probes_exception_drops_the_patch():
    (e,) = config_with(probes_entry()).exceptions
    f = finding(
        policy="probes",
        kind="DaemonSet",
        namespace="gpu",
        name="gpu-driver",
        check="missing-liveness-probe",
        enforced=False,
        fixed_by_patch=True,
    )
    patch = ({"op": "add", "path": "/x", "value": 1},)
    decision, _, _ = exceptions.admit(Decision(findings=(f,), patch=patch), [e], now=NOW)
    assert decision.patch == () and not decision.findings[0].fixed_by_patch
    other = Finding(**{**f.__dict__, "name": "other-driver"})
    kept, _, _ = exceptions.admit(Decision(findings=(other,), patch=patch), [e], now=NOW)
    assert kept.patch == patch


# ------------------------------------------------------------------ audits (pure)
def test_audit_results_skip_under_a_live_exception_and_report_an_expired_one():
    live, gone = config_with(rbac_entry(), probes_entry(expires=stamp(1))).exceptions
    probe = finding(
        policy="probes", kind="DaemonSet", namespace="gpu", name="gpu-driver", check="no-healthcheck-port", enforced=False
    )
    later = NOW + datetime.timedelta(days=2)
    out = exceptions.apply([(rbac_finding(), "enforce"), (probe, "enforce")], [live, gone], now=later)
    assert [(f.check, f.skipped) for f, _ in out] == [
        ("rbac-write", True),
        ("no-healthcheck-port", False),
        ("exception-expired", False),
    ]
    assert out[2][0].name == "gpu-driver" and "owner team-gpu" in out[2][0].message


# ------------------------------------------------------------------ through the app (AdmissionReview in and out)
SLICE_WRITER = cluster_role("slice-writer", [rule(["resourceslices"], ["create", "update"])])
TEAM_GPU = binding("team-gpu", "slice-writer", [subject("Group", "team-a")])


def client_for(*entries, mode="enforce"):
    state = ClusterState(None)
    state.rbac.upsert_role(SLICE_WRITER)
    return create_app(config=config_with(*entries, mode=mode), cluster=state).test_client()


def answer(client, body, path="/validate/rbac"):
    return client.post(path, data=json.dumps(body), content_type="application/json").get_json()["response"]


def test_the_binding_refused_without_an_exception_is_admitted_with_one():
    assert answer(client_for(), review(TEAM_GPU))["allowed"] is False
    resp = answer(client_for(rbac_entry()), review(TEAM_GPU))
    assert resp["allowed"] is True
    assert any("allowed by exception rbac ClusterRoleBinding team-gpu (owner team-gpu" in w for w in resp["warnings"])
    assert "vendor tool" in resp["auditAnnotations"]["exception"]


def test_the_exception_does_not_stretch_to_another_subject_in_the_same_binding():
    widened = binding("team-gpu", "slice-writer", [subject("Group", "team-a"), subject("Group", "team-b")])
    resp = answer(client_for(rbac_entry()), review(widened))
    assert resp["allowed"] is False and "team-b" in resp["status"]["message"]


def test_an_expired_exception_is_refused_again_at_admission():
    resp = answer(client_for(rbac_entry(expires=stamp(-1))), review(TEAM_GPU))
    assert resp["allowed"] is False and "expired at" in resp["status"]["message"]


def test_a_probes_exception_leaves_the_driver_unpatched():
    body = review(binding("x", "y", []))
    body["request"].update(
        kind={"group": "apps", "version": "v1", "kind": "DaemonSet"},
        resource={"group": "apps", "version": "v1", "resource": "daemonsets"},
        object=driver_daemonset(),
    )
    patched = answer(client_for(), body, path="/mutate/daemonsets")
    assert json.loads(base64.b64decode(patched["patch"]))
    resp = answer(client_for(probes_entry()), body, path="/mutate/daemonsets")
    assert resp["allowed"] is True and "patch" not in resp
    assert any("allowed by exception probes DaemonSet gpu/gpu-driver" in w for w in resp["warnings"])


def test_a_binding_admitted_by_an_exception_stays_in_the_pending_record():
    """The RBAC guard drops what it refuses from its pending record; admitted after all, the binding
    must be there for a concurrent review of its role (webhook.model.pending)."""
    state = ClusterState(None)
    state.rbac.upsert_role(SLICE_WRITER)
    client = create_app(config=config_with(rbac_entry()), cluster=state).test_client()
    assert answer(client, review(TEAM_GPU, dry_run=True))["allowed"] is True
    assert state.rbac.pending.bindings_of("slice-writer") == []  # a dry run leaves nothing behind
    assert answer(client, review(TEAM_GPU))["allowed"] is True
    assert [b["metadata"]["name"] for b in state.rbac.pending.bindings_of("slice-writer")] == ["team-gpu"]
