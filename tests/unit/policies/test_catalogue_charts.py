"""The supported drivers' RBAC (tests/drivers_catalogue.py, each at the version its header names)
installed by an RBAC manager: with its ServiceAccount declared (rbac.driverSubjects, plus
rbac.driverResources where docs/policies/supported-drivers.md says so) every object is stored and
the audit finds nothing; not declared, each refusal names the one setting that admits exactly
that grant (the driver's ServiceAccount in rbac.driverSubjects, with its resources and their API
group), and with that setting the whole chart is stored. The e2e proof on the real control plane
is tests/e2e/test_driver_catalogue.py; the NVIDIA chart whole is tests/unit/policies/test_real_charts.py."""

from __future__ import annotations

import copy
import re

import pytest

from tests.drivers_catalogue import CatalogueDriver, catalogue, intel_gaudi
from tests.rbac_charts import NVIDIA_DAEMON_BINDING, nvidia_dra_driver_gpu
from tests.unit.policies.test_real_charts import daemon_exception, install, refused
from webhook.config import from_mapping
from webhook.policies import exceptions, rbac

CLUSTER_SCOPED = ("ClusterRole", "ClusterRoleBinding")


def as_sent(objects):
    """The RBAC objects of a chart as the apiserver sends them to admission: a cluster-scoped
    object's metadata.namespace (some vendor manifests set it) is dropped before admission, as
    it is before storage."""
    out = []
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            continue
        obj = copy.deepcopy(obj)
        if obj["kind"] in CLUSTER_SCOPED:
            obj["metadata"].pop("namespace", None)
        out.append(obj)
    return out


def declared(entry: CatalogueDriver, *, driver_resources: bool = True):
    """dra-guard's config with `entry` declared as supported-drivers.md says for its chart."""
    extra = (
        {"driverResources": ["resourceslices", *entry.driver_resources]} if driver_resources and entry.driver_resources else {}
    )
    return from_mapping({"rbac": {"extraDriverSubjects": {"serviceAccounts": [entry.service_account]}, **extra}})


def no_empty_name(message: str) -> None:
    assert not re.search(r"\[\]|\(\)|  | ;| ,|: \.|\{\}", message), message


ENTRIES = catalogue()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.key)
def test_a_declared_driver_is_stored_whole_and_the_audit_finds_nothing(entry):
    """Its ResourceSlice write and (example, CPU, network, memory, SR-IOV, TPU drivers) its
    ResourceClaim status write, a claim-allocation power drivers in rbac.driverSubjects may hold."""
    config = declared(entry)
    decisions, index = install(as_sent(entry.objects), config)
    assert not refused(decisions), {n: [f.message for f in d.findings] for n, d in refused(decisions).items()}
    assert list(rbac.audit(index, config.rbac)) == []


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.key)
def test_a_driver_not_declared_is_told_of_driver_subjects_for_exactly_its_service_account(entry):
    objects = as_sent(entry.objects)
    bad = refused(install(objects, from_mapping(None))[0])
    [binding] = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert list(bad) == [f"ClusterRoleBinding {binding['metadata']['name']}"]
    [finding] = next(iter(bad.values())).findings
    message = finding.message
    no_empty_name(message)
    assert f"config.rbac.extraDriverSubjects.serviceAccounts: [{entry.service_account}]" in message
    assert "exception" not in message and "rbac.adminSubjects" not in message
    # every refused resource is named with its API group
    assert all(r in message for r in finding.details["resources"]), message
    assert "(resource.k8s.io)" in message
    if entry.driver_resources:
        assert f"config.rbac.driverResources: [{', '.join(sorted(('resourceslices', *entry.driver_resources)))}]" in message
    else:
        assert "rbac.driverResources" not in message
    # the setting it names admits the chart whole
    decisions, _ = install(objects, declared(entry))
    assert not refused(decisions)


def test_intel_gaudi_declared_without_driver_resources_is_told_of_devicetaintrules_only():
    """Its manifest's ClusterRole creates DeviceTaintRules (admin-only by default): the one
    setting that admits it is rbac.driverResources with devicetaintrules added."""
    entry = intel_gaudi()
    bad = refused(install(as_sent(entry.objects), declared(entry, driver_resources=False))[0])
    assert list(bad) == ["ClusterRoleBinding intel-gaudi-resource-driver-role-binding"]
    [finding] = next(iter(bad.values())).findings
    assert finding.details["resources"] == ["devicetaintrules"]
    message = finding.message
    no_empty_name(message)
    assert "only cluster admins may write devicetaintrules (resource.k8s.io)" in message
    assert "add devicetaintrules to rbac.driverResources" in message
    assert "config.rbac.driverResources: [devicetaintrules, resourceslices]" in message
    assert "exception" not in message


def test_a_cluster_role_binding_as_the_vendor_writes_it_with_a_namespace_is_judged_as_sent():
    """The manifests of Intel, SR-IOV, TPU and the example driver set metadata.namespace on their
    ClusterRole and ClusterRoleBinding; the apiserver drops it before admission, so the
    ClusterRoleBinding is judged as one (refused for a ServiceAccount not declared)."""
    entry = intel_gaudi()
    assert any(o["kind"] == "ClusterRoleBinding" and o["metadata"].get("namespace") for o in entry.objects)
    assert refused(install(as_sent(entry.objects), from_mapping(None))[0])


NVIDIA_CD_NS = "nvidia-compute-domain"


def test_nvidia_compute_domains_alone_needs_the_same_settings_as_the_whole_chart():
    """The chart with GPU allocation off renders the same RBAC (the kubelet plugin's, the
    controller's, the ComputeDomain daemon's): its three ServiceAccounts declared, refused only
    the daemon's cluster-wide pods patch, with the rbac exception for exactly that binding."""
    sas = [
        f"{NVIDIA_CD_NS}:dra-driver-nvidia-gpu-service-account-kubeletplugin",
        f"{NVIDIA_CD_NS}:dra-driver-nvidia-gpu-service-account-controller",
        f"{NVIDIA_CD_NS}:compute-domain-daemon-service-account",
    ]
    base = {"rbac": {"extraDriverSubjects": {"serviceAccounts": sas}}}
    bad = refused(install(nvidia_dra_driver_gpu(NVIDIA_CD_NS), from_mapping(base))[0])
    assert list(bad) == [f"ClusterRoleBinding {NVIDIA_DAEMON_BINDING}"]
    [finding] = bad[f"ClusterRoleBinding {NVIDIA_DAEMON_BINDING}"].findings
    no_empty_name(finding.message)
    assert "only cluster admins may hold pods (core)" in finding.message
    assert f"subjects: {{serviceAccounts: [{NVIDIA_CD_NS}:compute-domain-daemon-service-account]}}, resources: [pods]" in (
        finding.message
    )
    config = from_mapping({**base, "exceptions": [daemon_exception(NVIDIA_CD_NS)]})
    decisions, index = install(nvidia_dra_driver_gpu(NVIDIA_CD_NS), config)
    assert not refused(decisions)
    assert [f for f in rbac.audit(index, config.rbac) if not exceptions.covering(f, config.exceptions)] == []
