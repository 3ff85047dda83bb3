"""An RBAC refusal names the narrowest setting that would accept the grant: rbac.driverResources for
a driver that needs an admin-only DRA resource (Intel's Gaudi driver creates DeviceTaintRules),
rbac.driverSubjects for a driver not yet configured; rbac.adminSubjects, which lifts every check,
only when nothing narrower would do."""

from __future__ import annotations

import datetime

import yaml

from tests.builders import binding, cluster_role, review, rule, subject
from tests.drivers_catalogue import intel_gaudi_rbac
from webhook.audit import load
from webhook.config import from_mapping
from webhook.model.facts import build_facts
from webhook.policies import exceptions, rbac
from webhook.policies.rbac_violations import MESSAGE_BUDGET

GAUDI_SA = "intel-gaudi-resource-driver:intel-gaudi-resource-driver-service-account"


def gaudi():
    """Intel's Gaudi RBAC as the apiserver stores it (and dra-guard's manifest reader reads it): the
    metadata.namespace its manifest sets on the ClusterRole and ClusterRoleBinding dropped."""
    return [load.as_stored(o) for o in intel_gaudi_rbac()]


def judge(objects, config):
    """The admission decision on the ClusterRoleBinding among `objects`, the roles already indexed."""
    roles = [o for o in objects if o["kind"] == "ClusterRole"]
    [crb] = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    return rbac.review(review(crb)["request"], index=rbac.RbacIndex.from_objects(roles), config=config.rbac)


def test_gaudi_as_a_driver_is_told_to_add_devicetaintrules_to_driver_resources():
    config = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [GAUDI_SA]}}})
    decision = judge(gaudi(), config)
    assert not decision.allowed
    [finding] = decision.findings
    assert finding.details["resources"] == ["devicetaintrules"]  # ResourceSlice write is a driver's
    assert "add devicetaintrules to rbac.driverResources (drivers may then write it" in finding.message
    assert "config.rbac.driverResources: [devicetaintrules, resourceslices]" in finding.message
    assert "rbac.adminSubjects" not in finding.message  # it would lift every escalation check
    # the advice works: the same binding with the setting it names is accepted, offline too
    widened = from_mapping(
        {"rbac": {"driverSubjects": {"serviceAccounts": [GAUDI_SA]}, "driverResources": ["resourceslices", "devicetaintrules"]}}
    )
    assert judge(gaudi(), widened).allowed
    assert list(rbac.audit(build_facts(gaudi(), widened).rbac, widened.rbac)) == []
    [audited] = rbac.audit(build_facts(gaudi(), config).rbac, config.rbac)
    assert "rbac.driverResources" in audited.message


def test_gaudi_not_yet_a_driver_is_told_of_driver_subjects_and_driver_resources():
    decision = judge(gaudi(), from_mapping(None))
    [finding] = decision.findings
    assert "add the subject to rbac.driverSubjects" in finding.message
    assert "add devicetaintrules to rbac.driverResources" in finding.message


def exception_for(finding, subjects, resources):
    """The config entry the message tells the admin to add (its YAML in the message, made a dict)."""
    return {
        "exceptions": [
            {
                "policy": "rbac",
                "kind": finding.details["bindingNamespace"] and "RoleBinding" or "ClusterRoleBinding",
                **({"namespace": finding.details["bindingNamespace"]} if finding.details["bindingNamespace"] else {}),
                "name": finding.details["binding"],
                "roleRef": finding.details["roleRef"],
                "subjects": subjects,
                "resources": resources,
                "reason": "r",
                "owner": "o",
                "expires": "2027-06-30T00:00:00Z",
            }
        ]
    }


def test_a_driver_with_a_cluster_wide_controller_power_is_told_of_the_exception_that_admits_exactly_it():
    """ResourceSlice write with DaemonSet write through a ClusterRoleBinding: a driver holds
    DaemonSet write only through a RoleBinding in its own namespace, so driverSubjects would not
    admit it; the message names the exception pinned to this binding, and that exception does."""
    role = cluster_role(
        "gpu-driver",
        [rule(["resourceslices"], ["create", "update"]), rule(["daemonsets"], ["create", "update"], groups=["apps"])],
    )
    crb = binding("gpu-driver", "gpu-driver", [subject("ServiceAccount", "driver", "gpu")])
    [finding] = judge([role, crb], from_mapping(None)).findings
    assert "resourceslices (resource.k8s.io), daemonsets (apps)" in finding.message
    # the entry as it reads in a message over MESSAGE_BUDGET: its placeholders said in words
    assert (
        "rbac exception (config.exceptions) {policy: rbac, kind: ClusterRoleBinding, name: gpu-driver, "
        "roleRef: gpu-driver, subjects: {serviceAccounts: [gpu:driver]}, resources: [daemonsets, resourceslices]} "
        "with reason, owner, expires"
    ) in finding.message
    assert len(finding.message) <= MESSAGE_BUDGET + 100, finding.message
    assert "rbac.adminSubjects" not in finding.message and "rbac.driverResources" not in finding.message
    admitted = from_mapping(exception_for(finding, {"serviceAccounts": ["gpu:driver"]}, ["daemonsets", "resourceslices"]))
    decision = judge([role, crb], admitted)
    excepted, used, _ = exceptions.admit(decision, admitted.exceptions, now=datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC))
    assert excepted.allowed and used


def test_admin_only_grants_of_a_non_driver_still_name_the_admin_list():
    role = cluster_role("classes", [rule(["deviceclasses"], ["create"])])
    crb = binding("team-classes", "classes", [subject("Group", "team-a")])
    [finding] = judge([role, crb], from_mapping(None)).findings
    assert "only cluster admins may hold deviceclasses (resource.k8s.io)" in finding.message
    assert "rbac.adminSubjects" in finding.message and "rbac.driverSubjects" not in finding.message
    assert "subjects: {groups: [team-a]}, resources: [deviceclasses]" in finding.message


def test_a_driver_with_a_power_only_admins_may_hold_is_told_of_the_exception_not_the_admin_list():
    """Impersonation is no driver's: the one setting that admits exactly this grant is an exception
    naming both resources; adminSubjects (which lifts every check) is not offered to a ServiceAccount."""
    role = cluster_role("gaudi-plus", [rule(["devicetaintrules"], ["create"]), rule(["users"], ["impersonate"], groups=[""])])
    crb = binding(
        "gaudi-plus",
        "gaudi-plus",
        [subject("ServiceAccount", "intel-gaudi-resource-driver-service-account", "intel-gaudi-resource-driver")],
    )
    config = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [GAUDI_SA]}}})
    [finding] = judge([role, crb], config).findings
    assert "only cluster admins may hold devicetaintrules (resource.k8s.io), impersonate:users (core)" in finding.message
    assert "resources: [devicetaintrules, impersonate:users]" in finding.message
    assert "rbac.adminSubjects" not in finding.message


def test_the_gaudi_manifest_read_from_a_file_is_judged_as_the_stored_objects():
    """Intel's Gaudi manifest sets metadata.namespace on its ClusterRole and ClusterRoleBinding;
    the apiserver ignores it, and so does `dra-guard audit -f`: read verbatim from a file they are
    one ClusterRole and one ClusterRoleBinding, and the DeviceTaintRule grant is found and named
    with the setting that accepts it."""
    verbatim = intel_gaudi_rbac()
    assert all(o["metadata"].get("namespace") for o in verbatim)  # the vendor's quirk, kept verbatim
    read = load.Manifests()
    load.read_text("gaudi.yaml", yaml.safe_dump_all(verbatim), read)
    assert not read.problems
    index = rbac.RbacIndex.from_objects(read.objects)
    assert index.sizes() == {"clusterroles": 1, "roles": 0, "clusterrolebindings": 1, "rolebindings": 0}
    config = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [GAUDI_SA]}}})
    decision = judge(read.objects, config)
    assert not decision.allowed and not decision.warnings
    [audited] = rbac.audit(build_facts(read.objects, config).rbac, config.rbac)
    assert audited.kind == "ClusterRoleBinding" and not audited.namespace
    assert "add devicetaintrules to rbac.driverResources" in audited.message


def test_a_role_change_is_told_an_admin_makes_it_an_exception_covers_only_the_binding():
    """An exception covers a binding, never a role: the refusal of a role update that widens a
    bound role says a cluster admin makes the change, and names the binding's exception."""
    old = cluster_role("ctrl", [rule(["pods"], ["get"], groups=[""])])
    new = cluster_role("ctrl", [rule(["pods"], ["get", "patch"], groups=[""])])
    crb = binding("ctrl", "ctrl", [subject("ServiceAccount", "ctrl", "tools")])
    index = rbac.RbacIndex.from_objects([old, crb])
    [finding] = rbac.review(
        review(new, operation="UPDATE", old=old)["request"], index=index, config=from_mapping(None).rbac
    ).findings
    assert finding.kind == "ClusterRole"
    assert "have a cluster admin make this change (an exception covers a binding, never a role" in finding.message
    assert "kind: ClusterRoleBinding, name: ctrl, roleRef: ctrl, subjects: {serviceAccounts: [tools:ctrl]}" in finding.message
