"""Drain order as a pure function over the ClaimIndex (issue acceptance 1-4)."""

from __future__ import annotations

import pytest

from tests.builders import claim, driver_daemonset, eviction_request, index_with, pod
from webhook.config import from_mapping
from webhook.policies import eviction

CONFIG = from_mapping(None)


def decide(idx, req=None, **kw):
    return eviction.review(req or eviction_request("gpu-driver-a"), index=idx, config=CONFIG.eviction, **kw)


def test_driver_pod_held_by_a_running_consumer_is_refused_with_429():
    d = decide(index_with(pod("consumer", "node-a"), claim("gpu")))
    assert not d.allowed
    f = d.findings[0]
    assert (f.code, f.reason) == (429, "TooManyRequests")
    assert "work/gpu -> pod work/consumer" in f.message and "node-a" in f.message


def test_terminating_consumer_still_holds_the_driver():
    d = decide(index_with(pod("consumer", "node-a", terminating=True), claim("gpu")))
    assert not d.allowed and "(Terminating)" in d.findings[0].message


@pytest.mark.parametrize(
    "name, objects",
    [
        ("consumer finished, reservedFor empty", [pod("consumer", "node-a", phase="Succeeded"), claim("gpu", reserved=())]),
        ("consumer finished, reservedFor not yet cleaned", [pod("consumer", "node-a", phase="Failed"), claim("gpu")]),
        ("claim on node-b", [pod("consumer", "node-b"), claim("gpu", node="node-b")]),
        ("claim of another driver", [pod("consumer", "node-a"), claim("gpu", driver="net.example.com")]),
        (
            "claim not allocated, its pod finished",
            [
                pod("consumer", "node-a", phase="Succeeded"),
                {"kind": "ResourceClaim", "metadata": {"name": "gpu", "namespace": "work"}, "status": {}},
            ],
        ),
    ],
)
def test_allowed_cases(name, objects):
    assert decide(index_with(*objects)).allowed, name


def test_network_attached_claim_follows_the_reserving_pods_node():
    idx = index_with(claim("net", node=None, reserved=("consumer",)))
    assert decide(idx).allowed  # consumer not seen yet: node unknown
    idx.upsert_pod(pod("consumer", "node-a"))
    assert not decide(idx).allowed
    idx.upsert_pod(pod("consumer", "node-b"))  # (a new pod of the same name elsewhere)
    assert decide(idx).allowed
    assert not decide(idx, eviction_request("gpu-driver-b")).allowed


def test_ordinary_pod_is_allowed():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    assert decide(idx, eviction_request("consumer", namespace="work")).allowed
    assert decide(idx, eviction_request("never-seen", namespace="x")).allowed


def test_non_driver_daemonset_pod_is_allowed():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    idx.upsert_daemonset(driver_daemonset(name="csi", namespace="gpu", cdi=False, plugin_subdir="csi.example.com"))
    idx.upsert_pod(pod("csi-a", "node-a", namespace="gpu", ds="csi"))
    assert decide(idx, eviction_request("csi-a")).allowed


@pytest.mark.parametrize("api", ["policy/v1", "policy/v1beta1"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_eviction_versions_and_dry_run_same_answer(api, dry_run):
    d = decide(index_with(pod("consumer", "node-a"), claim("gpu")), eviction_request("gpu-driver-a", api=api, dry_run=dry_run))
    assert not d.allowed and d.findings[0].code == 429


@pytest.mark.parametrize("api", ["resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"])
def test_claim_api_versions(api):
    assert not decide(index_with(pod("consumer", "node-a"), claim("gpu", api=api))).allowed


def test_unsynced_caches_answer_429_retry():
    d = decide(index_with(), synced=(False, "caches not synced: resourceclaims"))
    assert not d.allowed and d.findings[0].code == 429 and "retry" in d.findings[0].message


def test_at_most_ten_claims_are_listed():
    objs = [pod("consumer", "node-a", claims=tuple(f"c{i:02}" for i in range(13)))] + [claim(f"c{i:02}") for i in range(13)]
    msg = decide(index_with(*objs)).findings[0].message
    assert "work/c09" in msg and "work/c10" not in msg and "and 3 more" in msg


DS_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"


def delete_request(name="gpu-driver-a", *, user="admin", generation="1", collection=False, **meta):
    """A DELETE review of pod gpu/`name` (oldObject: the DaemonSet's pod, label
    pod-template-generation `generation`); `collection`: as each pod of a deletecollection is
    reviewed, with no request name."""
    req = eviction_request(name, operation="DELETE")
    req["userInfo"]["username"] = user
    old = pod(name, "node-a", namespace="gpu", ds="gpu-driver")
    old["metadata"]["labels"] = {"pod-template-generation": generation}
    old["metadata"].update(meta)
    req["oldObject"], req["object"] = old, None
    if collection:
        del req["name"]
    return req


def node(name="node-a", *, labels=None, taints=()):
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": [dict(zip(("key", "value", "effect"), t, strict=True)) for t in taints]},
    }


def rolled_index(*, generation="2", node_selector=None, tolerations=None, objects=()):
    """index_with a held driver pod on node-a, its DaemonSet at template generation `generation`."""
    idx = index_with(pod("consumer", "node-a"), claim("gpu"), *objects)
    ds = driver_daemonset(name="gpu-driver", namespace="gpu")
    ds["metadata"]["annotations"] = {"deprecated.daemonset.template.generation": generation}
    if node_selector is not None:
        ds["spec"]["template"]["spec"]["nodeSelector"] = node_selector
    if tolerations is not None:
        ds["spec"]["template"]["spec"]["tolerations"] = tolerations
    idx.upsert_daemonset(ds)
    return idx


def test_delete_of_a_held_driver_pod_is_refused_by_default():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    d = decide(idx, delete_request())
    assert not d.allowed and d.findings[0].code == 429
    assert "delete those pods first" in d.findings[0].message
    off = from_mapping({"eviction": {"guardDeletes": False}}).eviction
    assert eviction.review(delete_request(), index=idx, config=off).allowed


def test_each_pod_of_a_deletecollection_is_judged_by_its_old_object():
    """A deletecollection's per-pod reviews carry no request name: the pod is oldObject."""
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    d = decide(idx, delete_request(collection=True))
    assert not d.allowed and "gpu/gpu-driver-a" in d.findings[0].message
    assert decide(idx, delete_request("gpu-driver-b", collection=True)).allowed  # node-b holds nothing


@pytest.mark.parametrize(
    "meta, phase",
    [({"deletionTimestamp": "2026-12-01T12:00:00Z"}, "Running"), ({}, "Succeeded"), ({}, "Failed")],
    ids=["terminating (the kubelet's final DELETE)", "succeeded", "failed"],
)
def test_delete_of_a_pod_already_stopped_is_allowed(meta, phase):
    """Its leaving was decided before; refusing it would only keep a stopped pod."""
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    req = delete_request(user="system:node:node-a", **meta)
    req["oldObject"]["status"]["phase"] = phase
    assert decide(idx, req).allowed


def test_the_garbage_collectors_delete_is_allowed():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    assert decide(idx, delete_request(user="system:serviceaccount:kube-system:generic-garbage-collector")).allowed


def test_a_rolling_update_that_brings_the_pod_back_is_allowed_with_a_warning():
    idx = rolled_index(objects=[node()])
    d = decide(idx, delete_request(user=DS_CONTROLLER, generation="1"))
    assert d.allowed and "rolling update" in d.warnings[0] and "maxSurge 1" in d.warnings[0], d.warnings
    # anyone else's DELETE of the same pod is refused
    assert not decide(idx, delete_request(user="admin", generation="1")).allowed


def test_the_daemonset_controllers_delete_of_a_current_pod_is_refused():
    idx = rolled_index(generation="1", objects=[node()])
    d = decide(idx, delete_request(user=DS_CONTROLLER, generation="1"))
    assert not d.allowed and "current template" in d.findings[0].message


@pytest.mark.parametrize(
    "selector, taints, tolerations, why",
    [
        ({"gpu": "yes"}, (), None, "nodeSelector"),
        (None, (("ToBeDeletedByClusterAutoscaler", "1", "NoSchedule"),), None, "ToBeDeletedByClusterAutoscaler=1:NoSchedule"),
        (None, (("maintenance", "", "NoExecute"),), None, "maintenance:NoExecute"),
    ],
)
def test_a_rolling_update_that_brings_no_pod_back_is_refused(selector, taints, tolerations, why):
    """The DaemonSet controller creates the new pod only where NodeShouldRunDaemonPod says so."""
    idx = rolled_index(node_selector=selector, tolerations=tolerations, objects=[node(taints=taints)])
    d = decide(idx, delete_request(user=DS_CONTROLLER, generation="1"))
    assert not d.allowed and why in d.findings[0].message and "no new pod" in d.findings[0].message


def test_taints_the_daemonset_tolerates_or_adds_itself_do_not_stop_a_rolling_update():
    taints = (("node.kubernetes.io/unschedulable", "", "NoSchedule"), ("ToBeDeletedByClusterAutoscaler", "1", "NoSchedule"))
    idx = rolled_index(tolerations=[{"operator": "Exists"}], objects=[node(taints=taints)])
    assert decide(idx, delete_request(user=DS_CONTROLLER, generation="1")).allowed
    idx = rolled_index(objects=[node(taints=taints[:1])])  # cordoned: daemon pods tolerate it
    assert decide(idx, delete_request(user=DS_CONTROLLER, generation="1")).allowed


def test_a_rolling_update_on_a_node_dra_guard_does_not_know_is_refused():
    idx = rolled_index()
    assert not decide(idx, delete_request(user=DS_CONTROLLER, generation="1")).allowed


def test_index_deletes_and_relists():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    idx.delete_claim("work", "gpu")
    assert "missing or not allocated" in decide(idx).findings[0].message  # the running consumer still references it
    idx.replace_claims([claim("gpu", reserved=())])
    assert "no longer reserved for its pod" in decide(idx).findings[0].message
    idx.delete_pod("work", "consumer")
    assert decide(idx).allowed
    idx.upsert_pod(pod("consumer", "node-a"))
    idx.replace_claims([claim("gpu")])
    assert not decide(idx).allowed
    idx.delete_pod("gpu", "gpu-driver-a")
    assert decide(idx).allowed
    idx.replace_pods(
        [
            pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"),
            pod("consumer", "node-a"),
            pod("unrelated", "node-a", claims=()),
        ]
    )
    assert not decide(idx).allowed
    assert idx.counts() == {
        "pods": 2,
        "daemonsets": 1,
        "drivers": 1,
        "claims": 1,
        "resourceslices": 0,
        "nodes": 0,
    }  # the unrelated pod is not kept


def test_malformed_requests_do_not_crash():
    idx = index_with()
    for req in (
        {},
        {"operation": "CREATE", "resource": "pods"},
        {"operation": "CREATE", "subResource": "eviction", "resource": {"resource": "pods"}, "name": None},
    ):
        assert decide(idx, req).allowed


def test_drain_plan_lists_what_holds_each_driver():
    from webhook import drainplan
    from webhook.config import from_mapping as fm

    objs = [
        driver_daemonset(name="gpu-driver", namespace="gpu"),
        pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"),
        pod("consumer", "node-a"),
        claim("gpu"),
    ]
    result = drainplan.plan(drainplan.build_index(objs, fm(None)), "node-a")
    assert result["ready"] is False and result["evictFirst"] == ["work/consumer"]
    assert result["driverPods"][0]["heldBy"] == [{"claim": "work/gpu", "pods": ["work/consumer"]}]
    assert "gpu-driver-a" in drainplan.render_text(result)
    empty = drainplan.plan(drainplan.build_index(objs, fm(None)), "node-b")
    assert empty["ready"] is True and "no DRA driver pods" in drainplan.render_text(empty)


def test_the_driver_evictions_metric_says_refused_only_when_the_eviction_was_refused():
    """In warn and audit mode the rule's refusal lets the eviction through: counted as would-refuse.
    The policy says what to count (a Tally); the admission layer counts it."""
    import types

    from prometheus_client import REGISTRY

    from webhook import admission

    def count(decision):
        return (
            REGISTRY.get_sample_value("dra_guard_driver_evictions_total", {"driver": "gpu.example.com", "decision": decision})
            or 0.0
        )

    for mode, label in (("enforce", "refused"), ("warn", "would-refuse"), ("audit", "would-refuse")):
        idx = index_with(pod("consumer", "node-a"), claim("gpu"))
        before = {d: count(d) for d in ("refused", "would-refuse")}
        config = from_mapping({"policies": {"eviction": {"mode": mode}}})
        facts = types.SimpleNamespace(claims=idx, fresh=lambda age: (True, ""))  # the two members admit() reads
        request = eviction_request("gpu-driver-a")
        tally = eviction.account(request, eviction.admit(request, facts, config), facts, mode=config.policy("eviction").mode)
        assert tally.driver_evictions == (("gpu.example.com", label),), mode
        assert tally.blocking_claims == (("node-a", 1),), mode
        admission.record_tally(tally)
        after = {d: count(d) for d in ("refused", "would-refuse")}
        assert after[label] == before[label] + 1, (mode, before, after)
        other = "refused" if label == "would-refuse" else "would-refuse"
        assert after[other] == before[other], (mode, before, after)
    assert REGISTRY.get_sample_value("dra_guard_blocking_claims", {"node": "node-a"}) == 1


# ------------------------------------------------------------------ held by what the node holds


def container_states(p, state):
    p["status"]["containerStatuses"] = [{"name": "c", "state": {state: {}}}]
    return p


@pytest.mark.parametrize(
    "claim_now, why",
    [
        (None, "missing or not allocated"),
        ({"kind": "ResourceClaim", "metadata": {"name": "gpu", "namespace": "work"}, "status": {}}, "missing or not allocated"),
        (claim("gpu", reserved=()), "no longer reserved for its pod"),
    ],
    ids=["claim deleted", "allocation emptied", "reservation emptied"],
)
def test_a_claim_taken_away_under_a_running_pod_still_holds_the_driver(claim_now, why):
    """The kubelet keeps the devices prepared until the pod stops, whatever the claim object says."""
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    if claim_now is None:
        idx.delete_claim("work", "gpu")
    else:
        idx.upsert_claim(claim_now)
    d = decide(idx)
    assert not d.allowed and d.findings[0].code == 429
    assert f"work/gpu ({why}, still referenced) -> pod work/consumer" in d.findings[0].message
    assert decide(idx, eviction_request("gpu-driver-b")).allowed  # only the node the pod runs on


def test_an_extended_resource_claim_taken_away_still_holds_the_driver():
    idx = index_with(pod("trainer", "node-a", extended="trainer-gpu-x"), claim("trainer-gpu-x", reserved=("trainer",)))
    assert not decide(idx).allowed
    idx.delete_claim("work", "trainer-gpu-x")
    assert "work/trainer-gpu-x (missing or not allocated" in decide(idx).findings[0].message


def test_a_claim_made_from_a_template_is_known_by_the_pods_status():
    consumer = pod("consumer", "node-a", claims=())
    consumer["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}]
    consumer["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "consumer-gpu-abcde"}]
    idx = index_with(consumer)
    assert "work/consumer-gpu-abcde (missing or not allocated" in decide(idx).findings[0].message


def test_a_terminal_phase_next_to_a_running_container_is_not_trusted():
    """The kubelet writes Succeeded/Failed only once every container stopped; a pods/status
    writer who sets it on a running pod does not release the driver."""
    idx = index_with(container_states(pod("consumer", "node-a", phase="Succeeded"), "running"), claim("gpu"))
    assert not decide(idx).allowed
    idx.upsert_pod(container_states(pod("consumer", "node-a", phase="Succeeded"), "terminated"))
    assert decide(idx).allowed
