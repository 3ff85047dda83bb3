"""The charts people install (tests/rbac_charts.py: NVIDIA's DRA driver chart under its new name
with its three ServiceAccounts declared as drivers, cluster-autoscaler, Karpenter), created object
by object by an RBAC manager (alice) through the real apiserver and dra-guard in enforce mode with
the chart's webhooks: each object is stored, or refused with a message naming the exception that
admits exactly that grant (cluster-autoscaler is stored whole); with that exception in dra-guard's
config the refused binding is stored."""

from __future__ import annotations

import json

import pytest

from tests import rbac_charts as charts

DENIED = 'admission webhook "rbac.dra-guard.io" denied the request'
EXCEPTION = f"""exceptions:
  - policy: rbac
    kind: ClusterRoleBinding
    name: {charts.NVIDIA_DAEMON_BINDING}
    roleRef: compute-domain-daemon-role
    subjects: {{serviceAccounts: ["{charts.NVIDIA_NS}:compute-domain-daemon-service-account"]}}
    resources: [pods]
    reason: ComputeDomain daemons patch their own pods
    owner: e2e
    expires: "2027-06-30T00:00:00Z"
"""


def ref(obj):
    ns = obj["metadata"].get("namespace")
    return f"{obj['kind']} {ns + '/' if ns else ''}{obj['metadata']['name']}"


@pytest.fixture(scope="module")
def guard(control_plane, start_guard):
    cp = control_plane
    g = start_guard(namespaces=(charts.NVIDIA_NS,), mode="enforce", driver_service_accounts=charts.NVIDIA_SERVICE_ACCOUNTS)
    try:
        yield g
    finally:
        g.stop()
        for obj in [*charts.nvidia_dra_driver_gpu(), *charts.cluster_autoscaler(), *charts.karpenter()]:
            ns = obj["metadata"].get("namespace")
            cp.kubectl(
                "admin", "delete", obj["kind"].lower(), obj["metadata"]["name"], *(["-n", ns] if ns else []), "--ignore-not-found"
            )


def install(cp, objects):
    """Each object created as alice (ServiceAccounts by the admin), in helm's order: {ref: stderr}
    of the refused ones."""
    refused = {}
    for obj in objects:
        user = "admin" if obj["kind"] == "ServiceAccount" else "alice"
        out = cp.kubectl(user, "create", "-f", "-", input=json.dumps(obj), check=False)
        if out.returncode != 0:
            assert DENIED in out.stderr, out.stderr
            refused[ref(obj)] = out.stderr
    return refused


def test_the_charts_install_but_for_one_grant_each_named_with_its_exception(control_plane, guard):
    cp = control_plane
    refused = install(cp, charts.nvidia_dra_driver_gpu())
    assert list(refused) == [f"ClusterRoleBinding {charts.NVIDIA_DAEMON_BINDING}"], refused
    message = refused[f"ClusterRoleBinding {charts.NVIDIA_DAEMON_BINDING}"]
    assert "only cluster admins may hold pods (core)" in message
    assert (
        f"subjects: {{serviceAccounts: [{charts.NVIDIA_NS}:compute-domain-daemon-service-account]}}, resources: [pods]" in message
    ), message
    assert "rbac.driverResources" not in message and ": ;" not in message and "add  to" not in message
    assert install(cp, charts.cluster_autoscaler()) == {}
    refused = install(cp, charts.karpenter())
    # with DRA drivers running (the NVIDIA driver ServiceAccounts above), Karpenter's cluster-wide
    # pods delete reaches their namespaces: it can take a driver off its node (webhook.model.powers
    # DRIVER_NAMESPACE_POWERS); its kube-system RoleBinding reads Secrets there
    assert sorted(refused) == ["ClusterRoleBinding karpenter-core", "RoleBinding kube-system/karpenter"], refused
    assert "resources: [pods:delete]" in refused["ClusterRoleBinding karpenter-core"], refused
    assert "resources: [secrets]" in refused["RoleBinding kube-system/karpenter"]
    # the setting named admits that binding
    guard.start(mode="enforce", driver_service_accounts=charts.NVIDIA_SERVICE_ACCOUNTS, extra_config=EXCEPTION)
    [daemon] = [o for o in charts.nvidia_dra_driver_gpu() if o["metadata"]["name"] == charts.NVIDIA_DAEMON_BINDING]
    out = cp.kubectl("alice", "create", "-f", "-", input=json.dumps(daemon), check=False)
    assert out.returncode == 0 and "allowed by exception" in out.stderr, out.stderr
