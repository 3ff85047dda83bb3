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
            "claim not allocated",
            [
                pod("consumer", "node-a"),
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
    objs = [pod("consumer", "node-a")] + [claim(f"c{i:02}") for i in range(13)]
    msg = decide(index_with(*objs)).findings[0].message
    assert "work/c09" in msg and "work/c10" not in msg and "and 3 more" in msg


def test_delete_guard_is_off_by_default_and_lets_the_daemonset_controller_through():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    req = eviction_request("gpu-driver-a", operation="DELETE")
    assert decide(idx, req).allowed  # off by default
    cfg = from_mapping({"eviction": {"guardDeletes": True}}).eviction
    assert not eviction.review(req, index=idx, config=cfg).allowed
    req["userInfo"]["username"] = "system:serviceaccount:kube-system:daemon-set-controller"
    assert eviction.review(req, index=idx, config=cfg).allowed


def test_delete_guard_lets_the_kubelets_final_delete_of_a_terminating_pod_through():
    """The kubelet deletes a pod for good once its containers stopped; the pod's leaving was decided
    when its deletion began, so refusing that DELETE would only leave it Terminating."""
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    cfg = from_mapping({"eviction": {"guardDeletes": True}}).eviction
    req = eviction_request("gpu-driver-a", operation="DELETE")
    req["userInfo"]["username"] = "system:node:node-a"
    req["oldObject"] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-driver-a", "namespace": "gpu"}}
    assert not eviction.review(req, index=idx, config=cfg).allowed  # a first DELETE is judged
    req["oldObject"]["metadata"]["deletionTimestamp"] = "2026-12-01T12:00:00Z"
    assert eviction.review(req, index=idx, config=cfg).allowed


def test_index_deletes_and_relists():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    idx.delete_claim("work", "gpu")
    assert decide(idx).allowed
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
