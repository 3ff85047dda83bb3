"""Admins and drivers added without dropping the defaults (rbac.extraAdminSubjects,
rbac.extraDriverSubjects), and the three spellings of a ServiceAccount in every list."""

from __future__ import annotations

import pytest

from webhook.config import KUBE_SYSTEM_CONTROLLERS, RbacConfig, from_mapping

SPELLINGS = ["ops:admin", "ops/admin", "system:serviceaccount:ops:admin"]
LISTS = ["adminSubjects", "driverSubjects", "extraAdminSubjects", "extraDriverSubjects"]


def _rbac(data: dict) -> RbacConfig:
    return from_mapping({"rbac": data}).rbac


def test_one_extra_admin_keeps_every_default_admin():
    """What `helm --set 'config.rbac.extraAdminSubjects.serviceAccounts={ops:admin}'` renders."""
    rbac = _rbac({"extraAdminSubjects": {"serviceAccounts": ["ops:admin"]}})
    defaults = RbacConfig().admin_subjects
    assert rbac.admin_subjects.service_accounts == KUBE_SYSTEM_CONTROLLERS | {"ops:admin"}
    assert rbac.admin_subjects.groups == defaults.groups and rbac.admin_subjects.users == defaults.users
    assert rbac.admin_subjects.contains(kind="ServiceAccount", namespace="ops", name="admin")
    assert rbac.admin_subjects.contains(kind="ServiceAccount", namespace="kube-system", name="job-controller")
    # the extra list is not a driver list
    assert not rbac.driver_subjects.contains(kind="ServiceAccount", namespace="ops", name="admin")


def test_setting_admin_subjects_itself_still_replaces_the_defaults():
    """The replacing list stays a way to remove a default; the extra list is the additive one."""
    rbac = _rbac({"adminSubjects": {"serviceAccounts": ["ops:admin"]}})
    assert rbac.admin_subjects.service_accounts == {"ops:admin"}


def test_extra_lists_merge_with_set_lists_of_every_kind():
    rbac = _rbac(
        {
            "adminSubjects": {"groups": ["admins"]},
            "extraAdminSubjects": {"groups": ["ops"], "users": ["alice"]},
            "driverSubjects": {"serviceAccounts": ["gpu:a"]},
            "extraDriverSubjects": {"serviceAccounts": ["gpu:b"], "users": ["drv"], "groups": ["drivers"]},
        }
    )
    assert rbac.admin_subjects.groups == {"admins", "ops"}
    assert rbac.admin_subjects.users == RbacConfig().admin_subjects.users | {"alice"}
    assert rbac.driver_subjects.service_accounts == {"gpu:a", "gpu:b"}
    assert rbac.driver_subjects.users == {"drv"} and rbac.driver_subjects.groups == {"drivers"}
    # kept apart too, for `dra-guard audit --suggest-values`
    assert rbac.extra_driver_subjects.service_accounts == {"gpu:b"}
    # the extra driver's namespace is sensitive like the listed driver's
    assert "gpu" in rbac.sensitive


def test_never_trusted_identities_in_an_extra_list_are_ignored_with_a_note():
    config = from_mapping({"rbac": {"extraAdminSubjects": {"groups": ["system:authenticated"]}}})
    assert any(line.startswith("rbac.extraAdminSubjects.groups: system:authenticated") for line in config.ignored)
    assert not config.rbac.admin_subjects.contains(kind="Group", name="system:authenticated")


@pytest.mark.parametrize("listed", LISTS)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_service_account_list_accepts_the_three_spellings(listed, spelling):
    rbac = _rbac({listed: {"serviceAccounts": [spelling]}})
    subjects = rbac.admin_subjects if "dmin" in listed else rbac.driver_subjects
    assert "ops:admin" in subjects.service_accounts  # normalised once, at load
    assert subjects.contains(kind="ServiceAccount", namespace="ops", name="admin")
    assert subjects.contains(kind="User", name="system:serviceaccount:ops:admin")
    assert not subjects.contains(kind="ServiceAccount", namespace="ops", name="other")


@pytest.mark.parametrize("spelling", ["ops:*", "ops/*", "system:serviceaccount:ops:*"])
def test_a_whole_namespace_in_each_spelling(spelling):
    rbac = _rbac({"extraDriverSubjects": {"serviceAccounts": [spelling]}})
    assert rbac.driver_subjects.service_accounts == {"ops:*"}
    assert rbac.driver_subjects.contains(kind="ServiceAccount", namespace="ops", name="anything")


@pytest.mark.parametrize("bad", ["ops", "ops:a:b", "ops/a/b", "ops:a/b", "system:serviceaccount:ops", "/a", "ops:"])
def test_other_forms_are_refused_with_the_key(bad):
    with pytest.raises(ValueError, match=r"^rbac\.extraAdminSubjects\.serviceAccounts: "):
        _rbac({"extraAdminSubjects": {"serviceAccounts": [bad]}})
