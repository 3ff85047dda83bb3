"""dra_guard_cache_objects (issue 19, item 3): the sizes each index reports are what it holds."""
from __future__ import annotations

from tests.builders import binding, claim, cluster_role, index_with, pod, subject
from webhook.model.rbac_index import RbacIndex


def test_rbac_index_counts_cluster_scoped_and_namespaced_objects_apart():
    role_in_ns = {**cluster_role("r"), "kind": "Role", "metadata": {"name": "r", "namespace": "team-a"}}
    idx = RbacIndex.from_objects([
        cluster_role("a"), cluster_role("b"), role_in_ns,
        binding("x", "a", [subject("User", "u")]),
        binding("y", "r", [subject("User", "u")], kind="RoleBinding", namespace="team-a", role_kind="Role"),
        binding("z", "r", [subject("User", "u")], kind="RoleBinding", namespace="team-b", role_kind="Role"),
    ])
    assert idx.sizes() == {"clusterroles": 2, "roles": 1, "clusterrolebindings": 1, "rolebindings": 2}
    idx.delete_binding("z", "team-b")
    assert idx.sizes()["rolebindings"] == 1


def test_claim_index_counts_only_the_pods_it_keeps():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"),
                     pod("web", "node-a", claims=()))  # no claim, no DaemonSet: not kept
    assert idx.sizes() == {"daemonsets": 1, "pods": 3, "resourceclaims": 1, "resourceslices": 0}
    idx.delete_claim("work", "gpu")
    assert idx.sizes()["resourceclaims"] == 0
