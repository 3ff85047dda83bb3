"""The charts people install (tests/rbac_charts.py: NVIDIA's DRA driver under its new name,
cluster-autoscaler, Karpenter) installed by an RBAC manager: each object is stored, or refused with
a message naming the one documented setting that admits exactly that grant, and with that setting
the whole chart is stored. The e2e proof on the real control plane is
tests/e2e/test_real_charts.py."""

from __future__ import annotations

import datetime
import re

import pytest

from tests.builders import review
from tests.rbac_charts import (
    NVIDIA_DAEMON_BINDING,
    NVIDIA_NS,
    NVIDIA_SERVICE_ACCOUNTS,
    cluster_autoscaler,
    karpenter,
    nvidia_dra_driver_gpu,
)
from webhook.config import from_mapping
from webhook.policies import exceptions, rbac

NOW = datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC)
NVIDIA = {"rbac": {"extraDriverSubjects": {"serviceAccounts": list(NVIDIA_SERVICE_ACCOUNTS)}}}


def install(objects, config):
    """Each RBAC object as alice (an RBAC manager) creates it, in helm's order: {name: Decision}
    ("Kind ns/name"), every allowed one stored in the index before the next is judged."""
    index = rbac.RbacIndex()
    out = {}
    for obj in objects:
        if obj["kind"] == "ServiceAccount":
            continue
        decision = rbac.review(review(obj)["request"], index=index, config=config.rbac)
        decision, _, _ = exceptions.admit(decision, config.exceptions, now=NOW)
        ns = obj["metadata"].get("namespace")
        out[f"{obj['kind']} {ns + '/' if ns else ''}{obj['metadata']['name']}"] = decision
        if decision.allowed:
            index.upsert(obj)
    return out, index


def refused(decisions):
    return {name: d for name, d in decisions.items() if not d.allowed}


def daemon_exception(namespace=NVIDIA_NS):
    return {
        "policy": "rbac",
        "kind": "ClusterRoleBinding",
        "name": NVIDIA_DAEMON_BINDING,
        "roleRef": "compute-domain-daemon-role",
        "subjects": {"serviceAccounts": [f"{namespace}:compute-domain-daemon-service-account"]},
        "resources": ["pods"],
        "reason": "ComputeDomain daemons patch their own pods' labels",
        "owner": "team-gpu",
        "expires": "2027-06-30T00:00:00Z",
    }


def test_nvidia_with_its_drivers_declared_is_refused_only_the_daemons_cluster_wide_pods_patch():
    decisions, _ = install(nvidia_dra_driver_gpu(), from_mapping(NVIDIA))
    bad = refused(decisions)
    assert list(bad) == [f"ClusterRoleBinding {NVIDIA_DAEMON_BINDING}"]
    [finding] = bad[f"ClusterRoleBinding {NVIDIA_DAEMON_BINDING}"].findings
    assert finding.details["resources"] == ["pods"]
    message = finding.message
    assert "only cluster admins may hold pods (core)" in message
    # the full wording or, the names being long, the compact one
    assert re.search(r"only through a RoleBinding in (their own namespace \()?dra-driver-nvidia-gpu\)", message), message
    assert (
        "{policy: rbac, kind: ClusterRoleBinding, name: compute-domain-daemon-role-binding, roleRef: compute-domain-daemon-role, "
        "subjects: {serviceAccounts: [dra-driver-nvidia-gpu:compute-domain-daemon-service-account]}, resources: [pods]"
    ) in message
    assert "rbac.driverResources" not in message and "rbac.adminSubjects" not in message
    # the setting it names admits the chart, whole, and nothing else
    with_exception = from_mapping({**NVIDIA, "exceptions": [daemon_exception()]})
    decisions, index = install(nvidia_dra_driver_gpu(), with_exception)
    assert not refused(decisions)
    assert [f.name for f in rbac.audit(index, with_exception.rbac) if not exceptions.covering(f, with_exception.exceptions)] == []


def test_nvidia_not_declared_is_told_of_driver_subjects_for_its_kubelet_plugin():
    bad = refused(install(nvidia_dra_driver_gpu(), from_mapping(None))[0])
    plugin = bad["ClusterRoleBinding dra-driver-nvidia-gpu-clusterrole-binding-kubeletplugin"].findings[0].message
    assert (
        "config.rbac.extraDriverSubjects.serviceAccounts: [dra-driver-nvidia-gpu:dra-driver-nvidia-gpu-service-account-kubeletplugin]"
        in plugin
    )


def test_cluster_autoscaler_is_stored_whole():
    """Its leader-election Lease create (a denial of service at most), its Job patches (a Job's pod
    template is immutable) and its Endpoints write everywhere (dra-guard's Service has a selector:
    its Endpoints route nothing) are no powers; nothing else it holds is one."""
    decisions, index = install(cluster_autoscaler(), from_mapping(None))
    assert not refused(decisions) and len(decisions) == 4
    assert list(rbac.audit(index, from_mapping(None).rbac)) == []


def test_karpenter_in_kube_system_is_refused_only_reading_its_secrets():
    decisions, _ = install(karpenter(), from_mapping(None))
    bad = refused(decisions)
    assert list(bad) == ["RoleBinding kube-system/karpenter"]
    [finding] = bad["RoleBinding kube-system/karpenter"].findings
    assert finding.details["resources"] == ["secrets"]
    assert "only cluster admins may hold secrets (core)" in finding.message
    assert "{policy: rbac, kind: RoleBinding, namespace: kube-system, name: karpenter, roleRef: karpenter" in finding.message


@pytest.mark.parametrize("chart", [nvidia_dra_driver_gpu, cluster_autoscaler, karpenter])
def test_every_refusal_names_exactly_its_resources_and_subject(chart):
    for name, decision in refused(install(chart(), from_mapping(NVIDIA))[0]).items():
        for f in decision.findings:
            assert f"resources: [{', '.join(f.details['resources'])}]" in f.message, name
            kind, _, who = f.details["subject"].partition(" ")
            assert who.replace("/", ":") in f.message, name
