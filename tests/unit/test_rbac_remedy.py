"""An RBAC refusal names the narrowest setting that would accept the grant: rbac.driverResources for
a driver that needs an admin-only DRA resource (Intel's Gaudi driver creates DeviceTaintRules),
rbac.driverSubjects for a driver not yet configured; rbac.adminSubjects, which lifts every check,
only when nothing narrower would do."""
from __future__ import annotations

from tests.builders import binding, cluster_role, review, rule, subject
from tests.drivers_catalogue import intel_gaudi_rbac
from webhook.config import from_mapping
from webhook.model.facts import build_facts
from webhook.policies import rbac

GAUDI_SA = "intel-gaudi-resource-driver:intel-gaudi-resource-driver"


def judge(objects, config):
    """The admission decision on the ClusterRoleBinding among `objects`, the roles already indexed."""
    roles = [o for o in objects if o["kind"] == "ClusterRole"]
    [crb] = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    return rbac.review(review(crb)["request"], index=rbac.RbacIndex.from_objects(roles), config=config.rbac)


def test_gaudi_as_a_driver_is_told_to_add_devicetaintrules_to_driver_resources():
    config = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [GAUDI_SA]}}})
    decision = judge(intel_gaudi_rbac(), config)
    assert not decision.allowed
    [finding] = decision.findings
    assert finding.details["resources"] == ["devicetaintrules"]  # ResourceSlice write is a driver's
    assert "add devicetaintrules to rbac.driverResources (drivers may then write it" in finding.message
    assert "config.rbac.driverResources: [devicetaintrules, resourceslices]" in finding.message
    assert "rbac.adminSubjects" not in finding.message  # it would lift every escalation check
    # the advice works: the same binding with the setting it names is accepted, offline too
    widened = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [GAUDI_SA]},
                                     "driverResources": ["resourceslices", "devicetaintrules"]}})
    assert judge(intel_gaudi_rbac(), widened).allowed
    assert list(rbac.audit(build_facts(intel_gaudi_rbac(), widened).rbac, widened.rbac)) == []
    [audited] = rbac.audit(build_facts(intel_gaudi_rbac(), config).rbac, config.rbac)
    assert "rbac.driverResources" in audited.message


def test_gaudi_not_yet_a_driver_is_told_of_driver_subjects_and_driver_resources():
    decision = judge(intel_gaudi_rbac(), from_mapping(None))
    [finding] = decision.findings
    assert "add the subject to rbac.driverSubjects" in finding.message
    assert "add devicetaintrules to rbac.driverResources" in finding.message


def test_a_driver_with_its_own_controllers_is_told_of_driver_subjects():
    """ResourceSlice write with DaemonSet write (a driver that runs controllers of its own): both
    are what driverSubjects may hold, so that is the setting named, not only the admin list."""
    role = cluster_role("gpu-driver", [rule(["resourceslices"], ["create", "update"]),
                                      rule(["daemonsets"], ["create", "update"], groups=["apps"])])
    crb = binding("gpu-driver", "gpu-driver", [subject("ServiceAccount", "driver", "gpu")])
    [finding] = judge([role, crb], from_mapping(None)).findings
    assert "add the subject to rbac.driverSubjects" in finding.message
    assert "rbac.driverResources" not in finding.message


def test_admin_only_grants_of_a_non_driver_still_name_the_admin_list():
    role = cluster_role("classes", [rule(["deviceclasses"], ["create"])])
    crb = binding("team-classes", "classes", [subject("Group", "team-a")])
    [finding] = judge([role, crb], from_mapping(None)).findings
    assert "only cluster admins may hold deviceclasses" in finding.message
    assert "rbac.adminSubjects" in finding.message and "rbac.driverSubjects" not in finding.message


def test_a_driver_with_a_power_only_admins_may_hold_is_told_both():
    """Impersonation is no driver's: adminSubjects is the only setting; the DeviceTaintRule part
    alone would need only driverResources, and the message says so."""
    role = cluster_role("gaudi-plus", [rule(["devicetaintrules"], ["create"]),
                                      rule(["users"], ["impersonate"], groups=[""])])
    crb = binding("gaudi-plus", "gaudi-plus", [subject("ServiceAccount", "intel-gaudi-resource-driver",
                                                       "intel-gaudi-resource-driver")])
    config = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [GAUDI_SA]}}})
    [finding] = judge([role, crb], config).findings
    assert "only cluster admins may hold impersonate:users" in finding.message
    assert "rbac.adminSubjects" in finding.message
    assert "devicetaintrules alone: add devicetaintrules to rbac.driverResources" in finding.message
