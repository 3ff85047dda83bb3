"""What the chart's webhook configurations never send to dra-guard.

dra-guard is registered with the configurations `helm template` renders for namespace "dra-guard"
(tests/e2e/guard.py). Nothing dra-guard or the cluster needs to start may depend on it:
- objects in dra-guard's own namespace never reach it (namespaceSelector): a DRA driver DaemonSet
  there gets no probe, an eviction there is not reviewed; kube-system's DaemonSets and evictions
  do reach it (some DRA drivers install there), with failurePolicy Ignore;
- RBAC writes by the ClusterRole aggregation controller never reach it (matchConditions by user
  name; ClusterRoleBindings are cluster-scoped, where a namespaceSelector does nothing): a binding
  dra-guard would refuse is stored. Any other kube-system ServiceAccount is reviewed; the admins
  of config.rbac.adminSubjects are not sent (matchConditions).
Each case is checked against a control that is sent, and against dra-guard's own /metrics.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.builders import driver_daemonset
from tests.e2e.guard import NAMESPACE, Guard
from tests.e2e.kube import apply_objects
from tests.scrape import metric, scrape

SLICE_WRITER = json.dumps(
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "e2e-exempt-slice-writer"},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create", "patch"]}],
    }
)


def binding(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "subjects": [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "ClusterRole", "name": "e2e-exempt-slice-writer", "apiGroup": "rbac.authorization.k8s.io"},
        }
    )


def reviews(guard: Guard, policy: str) -> float:
    """Reviews dra-guard answered for `policy` so far (sum of dra_guard_admission_requests_total)."""
    return metric(scrape(guard.proc), "dra_guard_admission_requests_total", policy=policy, default=0.0)


@pytest.fixture(scope="module")
def guard(control_plane, start_guard):
    cp = control_plane
    # pods named like the DaemonSets' (<name>-<suffix>) are the declared drivers' as far as the
    # chart's fail-closed eviction webhook can tell (namespace and name prefix)
    g = start_guard(
        namespaces=(NAMESPACE, "gpu", "work"), mode="enforce", declared=(("work", "e2e-exempt"), ("kube-system", "e2e-ks"))
    )
    cp.kubectl("admin", "apply", "-f", "-", input=SLICE_WRITER)
    try:
        yield g
    finally:
        g.stop()
        cp.kubectl("admin", "delete", "clusterrole", "e2e-exempt-slice-writer", "--ignore-not-found")


def stored_probe(cp, namespace: str, name: str):
    ds = json.loads(cp.kubectl("admin", "get", "daemonset", "-n", namespace, name, "-o", "json").stdout)
    return ds["spec"]["template"]["spec"]["containers"][0].get("livenessProbe")


def test_driver_daemonset_in_dra_guards_own_namespace_is_never_sent(control_plane, guard):
    cp = control_plane
    before = reviews(guard, "probes")
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(driver_daemonset(name="e2e-own-ns-driver", namespace=NAMESPACE)))
    try:
        assert stored_probe(cp, NAMESPACE, "e2e-own-ns-driver") is None
        assert reviews(guard, "probes") == before
        # control: the same driver in another namespace is sent, and patched
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(driver_daemonset(name="e2e-own-ns-driver", namespace="gpu")))
        assert stored_probe(cp, "gpu", "e2e-own-ns-driver")["grpc"]["port"] == 51515
        assert reviews(guard, "probes") == before + 1
    finally:
        for ns in (NAMESPACE, "gpu"):
            cp.kubectl("admin", "delete", "daemonset", "-n", ns, "e2e-own-ns-driver", "--ignore-not-found", "--wait=false")


def test_eviction_in_dra_guards_own_namespace_is_never_sent(control_plane, guard):
    cp = control_plane

    def evict(namespace: str) -> int:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "e2e-exempt-pod", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "registry.example/app:v1"}]},
        }
        apply_objects(cp, pod)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "e2e-exempt-pod", "namespace": namespace},
            "deleteOptions": {"gracePeriodSeconds": 0},
        }
        return (
            cp.session("admin")
            .post(f"{cp.url}/api/v1/namespaces/{namespace}/pods/e2e-exempt-pod/eviction", json=body, timeout=10)
            .status_code
        )

    before = reviews(guard, "eviction")
    assert evict(NAMESPACE) in (200, 201)
    assert reviews(guard, "eviction") == before
    assert evict("work") in (200, 201)  # control: a declared driver's pod name there: reviewed (no claim: allowed)
    assert reviews(guard, "eviction") == before + 1


def test_rbac_write_by_the_aggregation_controller_is_never_sent(control_plane, guard):
    cp = control_plane
    other_sa = "system:serviceaccount:kube-system:x"
    aggregator = "system:serviceaccount:kube-system:clusterrole-aggregation-controller"
    # both may manage RBAC like alice and are in no admin group: only the user name keeps the
    # aggregation controller out of the RBAC webhook (not its namespace)
    grant = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-exempt-sa-manages-rbac"},
        "subjects": [{"kind": "User", "name": who, "apiGroup": "rbac.authorization.k8s.io"} for who in (other_sa, aggregator)],
        "roleRef": {"kind": "ClusterRole", "name": "e2e-rbac-manager", "apiGroup": "rbac.authorization.k8s.io"},
    }
    apply_objects(cp, grant)
    # control: the same binding by alice (an RBAC manager, not an admin) is sent and refused
    refused = cp.kubectl("alice", "create", "-f", "-", input=binding("e2e-exempt-by-alice"), check=False)
    assert refused.returncode != 0 and 'admission webhook "rbac.dra-guard.io" denied the request' in refused.stderr
    try:
        # another kube-system ServiceAccount is reviewed (acting as one is no way around)
        other = cp.kubectl(
            "admin",
            "create",
            "-f",
            "-",
            f"--as={other_sa}",
            "--as-group=system:authenticated",
            input=binding("e2e-exempt-by-kube-system"),
            check=False,
        )
        assert other.returncode != 0 and 'admission webhook "rbac.dra-guard.io" denied the request' in other.stderr
        before = reviews(guard, "rbac")
        out = cp.kubectl(
            "admin",
            "create",
            "-f",
            "-",
            f"--as={aggregator}",
            "--as-group=system:authenticated",
            input=binding("e2e-exempt-by-kube-system"),
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert "Warning" not in out.stderr
        assert cp.kubectl("admin", "get", "clusterrolebinding", "e2e-exempt-by-kube-system", "-o", "name").stdout.strip()
        assert reviews(guard, "rbac") == before
    finally:
        cp.kubectl(
            "admin",
            "delete",
            "clusterrolebinding",
            "e2e-exempt-by-kube-system",
            "e2e-exempt-by-alice",
            "e2e-exempt-sa-manages-rbac",
            "--ignore-not-found",
        )


def test_rbac_write_by_an_admin_is_never_sent(control_plane, guard):
    """The admins of config.rbac.adminSubjects (system:masters here) are left out by the chart's
    matchConditions: their writes are never reviewed, a non-admin's still are."""
    cp = control_plane
    before = reviews(guard, "rbac")
    try:
        out = cp.kubectl("admin", "create", "-f", "-", input=binding("e2e-exempt-by-admin"), check=False)
        assert out.returncode == 0, out.stderr
        assert reviews(guard, "rbac") == before
        refused = cp.kubectl("alice", "create", "-f", "-", input=binding("e2e-exempt-by-alice-2"), check=False)
        assert refused.returncode != 0 and "dra-guard" in refused.stderr
        assert reviews(guard, "rbac") == before + 1
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-exempt-by-admin", "e2e-exempt-by-alice-2", "--ignore-not-found")


def test_kube_system_drivers_are_probed_and_their_evictions_reviewed(control_plane, guard):
    """The probes webhook leaves only dra-guard's own namespace out; a driver declared in
    kube-system has its pods' evictions reviewed (fail closed), and no other kube-system pod's."""
    cp = control_plane
    before = reviews(guard, "probes")
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(driver_daemonset(name="e2e-ks-driver", namespace="kube-system")))
    try:
        assert stored_probe(cp, "kube-system", "e2e-ks-driver")["grpc"]["port"] == 51515
        assert reviews(guard, "probes") == before + 1
    finally:
        cp.kubectl("admin", "delete", "daemonset", "-n", "kube-system", "e2e-ks-driver", "--ignore-not-found", "--wait=false")
    for name, sent in (("e2e-ks-pod", 1), ("e2e-other-pod", 0)):  # a declared driver's pod name, and another
        before = reviews(guard, "eviction")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"containers": [{"name": "c", "image": "registry.example/app:v1"}]},
        }
        apply_objects(cp, pod)
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": "kube-system"},
            "deleteOptions": {"gracePeriodSeconds": 0},
        }
        r = cp.session("admin").post(f"{cp.url}/api/v1/namespaces/kube-system/pods/{name}/eviction", json=body, timeout=10)
        assert r.status_code in (200, 201)
        assert reviews(guard, "eviction") == before + sent, name
    hooks = {
        w["name"]: w
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")
        for w in json.loads(cp.kubectl("admin", "get", kind, "dra-guard", "-o", "json").stdout)["webhooks"]
    }
    assert hooks["driver-evictions.dra-guard.io"]["failurePolicy"] == "Fail"
    assert "evictions.dra-guard.io" not in hooks  # the best-effort webhook for every other pod is off by default
    assert hooks["probes.dra-guard.io"]["failurePolicy"] == "Ignore"
