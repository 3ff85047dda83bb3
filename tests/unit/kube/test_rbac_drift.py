"""RbacDrift (docs/threat-model.md, path 9): watch events re-judged; a violation admission let through is
reported once, again after it went away and came back; break-glass bindings are not reported."""

from __future__ import annotations

import datetime

from tests.builders import binding, cluster_role, rbac_exception, rule, subject
from webhook import metrics
from webhook.config import from_mapping
from webhook.kube.state import ClusterState

WRITER = cluster_role("later", [rule(["deviceclasses"], ["create"])])
EARLY = binding("early", "later", [subject("User", "alice")])


def reported():
    return metrics.RBAC_DRIFT.labels(kind="ClusterRoleBinding", action="reported")._value.get()


def test_role_created_after_its_binding_is_reported_once():
    state = ClusterState(None, config=from_mapping(None))
    before = reported()
    state._binding_event("ADDED", EARLY)  # the role does not exist yet: nothing to judge
    assert reported() == before
    state._role_event("ADDED", WRITER)
    assert reported() == before + 1
    state._role_event("MODIFIED", WRITER)  # unchanged violation: not reported again
    assert reported() == before + 1
    state._role_event("MODIFIED", cluster_role("later", [rule(["deviceclasses"], ["get"])]))  # fixed
    state._role_event("MODIFIED", WRITER)  # and back
    assert reported() == before + 2


def test_break_glass_binding_is_not_reported():
    state = ClusterState(None, config=from_mapping(None))
    before = reported()
    state._role_event("ADDED", WRITER)
    glass = binding("glass", "later", [subject("User", "alice")], annotations={"dra-guard.io/allow-dra-write": "ok"})
    state._binding_event("ADDED", glass)
    assert reported() == before


def test_rolebinding_in_kube_system_is_reported():
    state = ClusterState(None, config=from_mapping(None))
    before = metrics.RBAC_DRIFT.labels(kind="RoleBinding", action="reported")._value.get()
    state._role_event("ADDED", cluster_role("pods", [rule(["pods"], ["create"], groups=[""])]))
    state._binding_event("ADDED", binding("b", "pods", [subject("User", "alice")], kind="RoleBinding", namespace="kube-system"))
    state._binding_event("ADDED", binding("b", "pods", [subject("User", "alice")], kind="RoleBinding", namespace="team-a"))
    assert metrics.RBAC_DRIFT.labels(kind="RoleBinding", action="reported")._value.get() == before + 1


def test_a_binding_a_live_exception_covers_is_not_reported_but_an_expired_one_is():
    import datetime

    when = datetime.datetime.now(datetime.UTC)

    def config(days):
        return from_mapping(
            {
                "exceptions": [
                    rbac_exception(
                        name="early",
                        roleRef="later",
                        subjects={"users": ["alice"]},
                        resources=["deviceclasses"],
                        expires=(when + datetime.timedelta(days=days)).isoformat(),
                    )
                ]
            }
        )

    for days, reports in ((30, 0), (-1, 1)):
        state = ClusterState(None, config=config(days))
        before = reported()
        state._role_event("ADDED", WRITER)
        state._binding_event("ADDED", EARLY)
        assert reported() == before + reports, days


def test_rolebindings_where_exceptions_and_declared_drivers_run_are_reported():
    """The namespace of an rbac exception's ServiceAccount and of a declared driver are sensitive:
    token minting there is acting as an identity that writes ResourceSlices."""
    config = from_mapping(
        {
            "drivers": {"declared": [{"namespace": "gpu-driver", "name": "plugin"}]},
            "exceptions": [
                rbac_exception(
                    name="gpu-inventory",
                    subjects={"serviceAccounts": ["gpu-tools:inventory"]},
                    expires=(datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30)).isoformat(),
                )
            ],
        }
    )
    state = ClusterState(None, config=config)
    before = metrics.RBAC_DRIFT.labels(kind="RoleBinding", action="reported")._value.get()
    state._role_event("ADDED", cluster_role("tokens", [rule(["serviceaccounts/token"], ["create"], groups=[""])]))
    for ns in ("gpu-tools", "gpu-driver", "team-a"):
        state._binding_event("ADDED", binding("t", "tokens", [subject("User", "alice")], kind="RoleBinding", namespace=ns))
    assert metrics.RBAC_DRIFT.labels(kind="RoleBinding", action="reported")._value.get() == before + 2
