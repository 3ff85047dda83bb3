"""The caches at the scalability envelope: sizes reported, relists and RBAC events that do
not hold reviews up, compact entries, lookups that do not scan every binding."""

from __future__ import annotations

from tests.builders import binding, claim, cluster_role, index_with, pod, subject
from webhook.model.rbac_index import RbacIndex


def test_rbac_index_counts_cluster_scoped_and_namespaced_objects_apart():
    role_in_ns = {**cluster_role("r"), "kind": "Role", "metadata": {"name": "r", "namespace": "team-a"}}
    idx = RbacIndex.from_objects(
        [
            cluster_role("a"),
            cluster_role("b"),
            role_in_ns,
            binding("x", "a", [subject("User", "u")]),
            binding("y", "r", [subject("User", "u")], kind="RoleBinding", namespace="team-a", role_kind="Role"),
            binding("z", "r", [subject("User", "u")], kind="RoleBinding", namespace="team-b", role_kind="Role"),
        ]
    )
    assert idx.sizes() == {"clusterroles": 2, "roles": 1, "clusterrolebindings": 1, "rolebindings": 2}
    idx.delete_binding("z", "team-b")
    assert idx.sizes()["rolebindings"] == 1


def test_claim_index_counts_only_the_pods_it_keeps():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"), pod("web", "node-a", claims=()))  # no claim, no DaemonSet: not kept
    assert idx.sizes() == {"daemonsets": 1, "pods": 3, "resourceclaims": 1, "resourceslices": 0, "nodes": 0}
    idx.delete_claim("work", "gpu")
    assert idx.sizes()["resourceclaims"] == 0


# ------------------------------------------------------------------ no review waits on a relist
def _lock_free_during(idx, method_name, monkeypatch):
    """Call-site probe: each time ClaimIndex.<method_name> runs, record whether another thread could
    take `idx`'s lock at that moment (a review would have waited if not)."""
    import threading

    from webhook.model.claim_index import ClaimIndex

    seen = []
    original = getattr(ClaimIndex, method_name)

    def probe(self, *args, **kwargs):
        got = []
        t = threading.Thread(target=lambda: got.append(idx._lock.acquire(blocking=False)) or (got[-1] and idx._lock.release()))
        t.start()
        t.join()
        seen.append(got[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ClaimIndex, method_name, probe)
    return seen


def test_a_claims_relist_indexes_outside_the_lock_reviews_use(monkeypatch):
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    seen = _lock_free_during(idx, "_put_claim", monkeypatch)
    idx.replace_claims([claim(f"c{i}", reserved=(f"p{i}",)) for i in range(50)])
    assert len(seen) == 50 and all(seen)  # without it: indexed with the lock held (all False)
    assert idx.sizes()["resourceclaims"] == 50
    # node-local claims whose pods are not seen (yet) hold the node: the relisted ones replaced "gpu",
    # which the running consumer still references
    assert sorted(h.claim for h in idx.holds("gpu.example.com", "node-a")) == sorted(
        [f"work/c{i}" for i in range(50)] + ["work/gpu (missing or not allocated, still referenced)"]
    )


def test_a_pods_relist_indexes_outside_the_lock_and_claims_usable_anywhere_follow(monkeypatch):
    idx = index_with(claim("net", node=None, reserved=("consumer",)), pod("consumer", "node-a"))
    assert idx.claim_drivers_on("node-a")
    seen = _lock_free_during(idx, "_put_pod", monkeypatch)
    idx.replace_pods([pod("consumer", "node-b"), pod("gpu-driver-b", "node-b", namespace="gpu", ds="gpu-driver")])
    assert len(seen) == 2 and all(seen)
    assert not idx.claim_drivers_on("node-a") and idx.claim_drivers_on("node-b")  # the claim moved with its pod
    assert [pd[0].name for pd in idx.driver_pods_on("node-b")] == ["gpu-driver-b"]


# ------------------------------------------------------------------ compact entries
def test_slimmed_rbac_objects_keep_only_what_dra_guard_reads_with_shared_strings():
    import json

    from webhook.model.slim import slim_binding, slim_role

    role = cluster_role("r", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
    role["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(role),
        "rbac.authorization.kubernetes.io/autoupdate": "true",
    }
    a, b = (slim_role(json.loads(json.dumps(role))) for _ in range(2))  # two parses: distinct strings
    assert a["metadata"]["annotations"] == {"rbac.authorization.kubernetes.io/autoupdate": "true"}
    assert a["rules"] == role["rules"] and a["rules"][0]["verbs"][0] is b["rules"][0]["verbs"][0]
    crb = binding(
        "x", "r", [subject("Group", "team-a")], annotations={"dra-guard.io/allow-dra-write": "ticket 42", "note": "x" * 1000}
    )
    assert slim_binding(crb)["metadata"]["annotations"] == {"dra-guard.io/allow-dra-write": "ticket 42"}


def test_claims_of_one_driver_share_their_driver_and_node_sets():
    from webhook.model.claims import claim_info

    one, two = claim_info(claim("a")), claim_info(claim("b"))
    assert one.drivers is two.drivers and one.nodes is two.nodes
    assert not hasattr(one, "__dict__")  # slots: no per-instance dict


def test_service_account_write_is_found_through_every_subject_form_without_scanning_other_bindings(monkeypatch):
    from webhook.config import from_mapping
    from webhook.model import rbac as rbac_model

    config = from_mapping(None).rbac
    writer = cluster_role("slices", [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create"]}])
    others = [binding(f"other-{i}", "slices", [subject("ServiceAccount", f"sa-{i}", "elsewhere")]) for i in range(300)]
    forms = {
        "ServiceAccount": [subject("ServiceAccount", "driver", "dra-system")],
        "User form": [
            {"kind": "User", "name": "system:serviceaccount:dra-system:driver", "apiGroup": "rbac.authorization.k8s.io"}
        ],
        "namespace group": [subject("Group", "system:serviceaccounts:dra-system")],
        "all ServiceAccounts": [subject("Group", "system:serviceaccounts")],
    }
    for label, subjects in forms.items():
        idx = RbacIndex.from_objects([writer, *others, binding("mine", "slices", subjects)])
        calls: list[int] = []
        real = rbac_model.subjects_of
        monkeypatch.setattr(rbac_model, "subjects_of", lambda b, calls=calls, real=real: calls.append(1) or real(b))
        assert idx.service_account_may_write("dra-system", "driver", "resourceslices", config), label
        assert calls == [], label  # without it: every one of the 301 bindings was read
        monkeypatch.setattr(rbac_model, "subjects_of", real)
        assert not idx.service_account_may_write("dra-system", "other", "resourceslices", config) or label != "ServiceAccount"
    idx = RbacIndex.from_objects([writer, *others])
    assert not idx.service_account_may_write("dra-system", "driver", "resourceslices", config)
    idx.delete_binding("other-7")
    assert idx.service_account_may_write("elsewhere", "sa-8", "resourceslices", config)
    assert not idx.service_account_may_write("elsewhere", "sa-7", "resourceslices", config)


def test_redetecting_drivers_after_an_rbac_event_does_not_hold_the_claims_lock():
    import threading

    from tests.builders import driver_daemonset
    from webhook.config import from_mapping
    from webhook.model.claim_index import ClaimIndex

    free = []

    def can_write(namespace, name):  # asked while judging a DaemonSet (may scan RBAC)
        got = []
        t = threading.Thread(target=lambda: got.append(idx._lock.acquire(blocking=False)) or (got[-1] and idx._lock.release()))
        t.start()
        t.join()
        free.append(got[0])
        return True

    idx = ClaimIndex(from_mapping(None).detection, can_write)
    idx.upsert_daemonset(driver_daemonset(name="gpu-driver", namespace="gpu"))
    free.clear()
    idx.redetect()
    assert free and all(free)  # without it: judged with the lock held
    idx.upsert_pod(pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"))
    assert idx.driver_of_pod("gpu", "gpu-driver-a") is not None


# ------------------------------------------------------------------ audit --cluster within 1 GiB
def test_the_audit_keeps_only_what_it_reads_of_each_listed_object_and_finds_the_same():
    import copy

    from tests.builders import driver_daemonset
    from webhook.audit.run import run
    from webhook.config import from_mapping
    from webhook.model.slim import audit_view

    managed = [
        {"manager": "gpu-driver", "apiVersion": "resource.k8s.io/v1beta1", "operation": "Apply", "fieldsV1": {"f:spec": {}}}
    ]
    ds = {**driver_daemonset(name="gpu-driver", namespace="gpu"), "kind": "DaemonSet"}
    objects = [
        {**cluster_role("slices", [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create"]}])},
        {**binding("team-slices", "slices", [subject("Group", "team-a")]), "kind": "ClusterRoleBinding"},
        ds,
        {**pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"), "kind": "Pod"},
        {**pod("consumer", "node-a"), "kind": "Pod"},
        {**pod("web", "node-a", claims=()), "kind": "Pod"},
        {**claim("gpu"), "kind": "ResourceClaim", "spec": {"devices": {"requests": [{"name": "gpu"}]}}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "node-a-gpu", "managedFields": managed},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": "node-a",
                "pool": {"name": "node-a"},
                "devices": [{"name": "gpu-0"}] * 64,
            },
        },
        {
            "kind": "Node",
            "metadata": {"name": "node-a", "labels": {"a": "b"}, "managedFields": managed},
            "status": {"nodeInfo": {"kubeletVersion": "v1.32.1"}, "images": [{"names": ["x" * 200]}] * 50},
        },
    ]
    for obj in objects:
        obj.setdefault("metadata", {})["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{...}" * 100}
    views = [v for v in (audit_view(copy.deepcopy(o)) for o in objects) if v is not None]
    kinds = [v["kind"] for v in views]
    assert kinds.count("Pod") == 2  # "web" (no claim, no DaemonSet) dropped
    assert all("managedFields" not in v["metadata"] or v["kind"] == "ResourceSlice" for v in views)
    assert all("kubectl.kubernetes.io/last-applied-configuration" not in (v["metadata"].get("annotations") or {}) for v in views)
    sl = next(v for v in views if v["kind"] == "ResourceSlice")
    assert sl["metadata"]["managedFields"] == [{"apiVersion": "resource.k8s.io/v1beta1", "manager": "gpu-driver"}]
    assert "devices" not in sl["spec"]
    assert next(v for v in views if v["kind"] == "Node")["status"] == {"nodeInfo": {"kubeletVersion": "v1.32.1"}}
    config = from_mapping(None)

    def found(objs):
        return sorted((f.policy, f.kind, f.name, f.check) for f, _ in run(objs, config, served_versions=["v1", "v1beta1"]))

    full = found(copy.deepcopy(objects))
    assert full and found(views) == full  # the same findings from the views
    assert any(check == "dra-beta-api-in-use" for *_, check in full)


def test_after_a_list_the_caches_leave_the_garbage_collectors_view():
    """Full collections walked millions of cache entries with the GIL held (p99 786 ms at the
    envelope); after each list the informer freezes what is alive."""
    import gc

    from webhook.kube.informer import release_free_memory

    entries = [{"n": i} for i in range(1000)]
    # from nothing frozen: objects an earlier test of this process froze may be freed meanwhile
    # (a pytest-xdist worker's I/O threads run beside the test), which a difference would count
    gc.unfreeze()
    try:
        release_free_memory()
        assert gc.get_freeze_count() >= len(entries)
    finally:
        gc.unfreeze()


# ------------------------------------------------------------------ relists that do not stall reviews
def _lock_free_when_called(lock, module, name, monkeypatch):
    """Wrap module.<name>: each call records whether another thread could take `lock` at that
    moment, then runs the original."""
    import threading

    seen = []
    original = getattr(module, name)

    def probe(*args, **kwargs):
        got = []
        t = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)) or (got[-1] and lock.release()))
        t.start()
        t.join()
        seen.append(got[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, probe)
    return seen


def test_released_tables_are_emptied_entry_by_entry():
    from webhook.model.release import release_gradually

    d, s, lst, other = {i: str(i) for i in range(100)}, set(range(50)), list(range(10)), "kept"
    release_gradually(d, s, lst, other)
    assert d == {} and s == set() and lst == [] and other == "kept"


def test_a_relist_frees_the_old_tables_outside_the_lock_and_empties_them(monkeypatch):
    """Dropping 100,000 entries at once froze every thread for up to 340 ms at the envelope."""
    from webhook.model import claim_index

    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    old_pods, old_claims = idx._pods, idx._claims
    seen = _lock_free_when_called(idx._lock, claim_index, "release_gradually", monkeypatch)
    idx.replace_pods([pod("consumer", "node-b")])
    idx.replace_claims([claim("gpu2", reserved=("consumer",))])
    assert seen == [True, True]  # before: the old tables went while the swap held the lock
    assert old_pods == {} and old_claims == {}  # emptied entry by entry, not dropped at once
    assert [p.node for p in idx._pods.values()] == ["node-b"] and list(idx._claims) == [("work", "gpu2")]


def _rbac_objects(n, prefix="r"):
    return [cluster_role(f"{prefix}{i}") for i in range(n)] + [
        binding(f"{prefix}b{i}", f"{prefix}{i}", [subject("User", "u")]) for i in range(n)
    ]


def test_an_rbac_relist_slims_and_indexes_outside_the_lock(monkeypatch):
    """A relist of 50,000 ClusterRoles or ClusterRoleBindings held the RBAC lock for 200-340 ms."""
    from webhook.model import rbac_index

    idx = RbacIndex.from_objects(
        _rbac_objects(3)
        + [binding("rb", "r0", [subject("User", "v")], kind="RoleBinding", namespace="team-a", role_kind="ClusterRole")]
    )
    slimmed = _lock_free_when_called(idx._lock, rbac_index, "slim_role", monkeypatch)
    bound = _lock_free_when_called(idx._lock, rbac_index, "slim_binding", monkeypatch)
    released = _lock_free_when_called(idx._lock, rbac_index, "release_gradually", monkeypatch)
    new = _rbac_objects(5, prefix="n")
    idx.replace_roles([o for o in new if o["kind"] == "ClusterRole"])
    idx.replace_bindings([o for o in new if o["kind"] == "ClusterRoleBinding"])
    assert len(slimmed) == 5 and all(slimmed) and len(bound) == 5 and all(bound)
    assert released == [True, True]
    assert idx.sizes() == {"clusterroles": 5, "roles": 0, "clusterrolebindings": 5, "rolebindings": 1}
    # the other kind survived and is still indexed by its roleRef; the new bindings are indexed too
    assert [b["metadata"]["name"] for b in idx.role_bindings_of("r0")] == ["rb"]
    assert [b["metadata"]["name"] for b in idx.bindings_of("n3")] == ["nb3"] and idx.bindings_of("r0") == []


def test_a_relist_of_the_smaller_binding_kind_is_applied_in_place():
    """RoleBindings relisted beside many more ClusterRoleBindings: replaced in place (the lock is
    held for the RoleBindings' work only), the ClusterRoleBindings and their indexes untouched."""
    sa = subject("ServiceAccount", "drv", namespace="gpu")
    objects = (
        _rbac_objects(10)
        + [binding("sa-b", "r1", [sa])]
        + [
            binding(f"rb{i}", "r0", [subject("User", "v")], kind="RoleBinding", namespace="team-a", role_kind="ClusterRole")
            for i in range(3)
        ]
    )
    idx = RbacIndex.from_objects(objects)
    tables = idx._bindings, idx._by_role, idx._sa_reach
    idx.replace_bindings(
        [binding("rb9", "r2", [subject("User", "v")], kind="RoleBinding", namespace="team-b", role_kind="ClusterRole")],
        namespaced=True,
    )
    assert (idx._bindings, idx._by_role, idx._sa_reach) == tables and idx._bindings is tables[0]  # in place
    assert idx.sizes()["rolebindings"] == 1 and idx.sizes()["clusterrolebindings"] == 11
    assert idx.role_bindings_of("r0") == [] and [b["metadata"]["name"] for b in idx.role_bindings_of("r2")] == ["rb9"]
    assert ("sa", "gpu/drv") in idx._sa_reach  # the ServiceAccount reach of the ClusterRoleBindings is kept


def test_an_audit_over_indexes_filled_page_by_page_finds_what_the_whole_objects_find():
    """audit --cluster streams RBAC, Pods and ResourceClaims into the indexes and keeps no object
    of them (1,175 -> 700 MiB at the envelope); the files given with it still replace the
    live objects of the same key."""
    from tests.builders import driver_daemonset
    from webhook.audit.run import audit, merge
    from webhook.config import from_mapping
    from webhook.model.facts import StaticFacts, add_objects

    config = from_mapping(None)
    writer = cluster_role("slices", [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create"]}])
    live = [
        writer,
        {**binding("team-slices", "slices", [subject("Group", "team-a")]), "kind": "ClusterRoleBinding"},
        {**binding("ok", "view", [subject("Group", "team-b")]), "kind": "ClusterRoleBinding"},
        {**driver_daemonset(name="gpu-driver", namespace="gpu"), "kind": "DaemonSet"},
        {**pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"), "kind": "Pod"},
        {**pod("consumer", "node-a"), "kind": "Pod"},
        {**claim("gpu"), "kind": "ResourceClaim"},
        {"kind": "Node", "metadata": {"name": "node-a"}, "status": {"nodeInfo": {"kubeletVersion": "v1.34.0"}}},
    ]
    files = [{**binding("ok", "slices", [subject("Group", "team-b")]), "kind": "ClusterRoleBinding"}]  # now a violation

    def keyed(result):
        return sorted((f.policy, f.kind, f.name, f.check) for f, _ in result.findings)

    whole = audit(merge(files, live), config, served_versions=["v1"], online=True)
    facts = StaticFacts(config)  # as webhook.kube.lists.stream_audit_cluster fills it
    facts.rbac.replace_roles(o for o in live if o["kind"] == "ClusterRole")
    facts.rbac.replace_bindings(o for o in live if o["kind"] == "ClusterRoleBinding")
    facts.claims.replace_daemonsets(o for o in live if o["kind"] == "DaemonSet")
    facts.claims.replace_pods(o for o in live if o["kind"] == "Pod")
    facts.claims.replace_claims(o for o in live if o["kind"] == "ResourceClaim")
    kept = [o for o in live if o["kind"] in ("DaemonSet", "Node")] + [
        {"kind": "ClusterRoleBinding", **b} for b in facts.rbac.bindings()
    ]
    add_objects(facts, files)
    streamed = audit(merge(files, kept), config, served_versions=["v1"], online=True, facts=facts)
    assert keyed(streamed) == keyed(whole)
    assert ("rbac", "ClusterRoleBinding", "ok") in {k[:3] for k in keyed(whole)}  # the file's binding was judged
    assert {k: sorted(v) for k, v in streamed.judged.items()} == {k: sorted(v) for k, v in whole.judged.items()}
