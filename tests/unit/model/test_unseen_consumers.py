"""Every consumer of a claim holds its driver: pods that list no claim (DRA extended resources),
consumers that are not pods (PodGroups, unknown resources), and claims whose allocation selects
nodes by label. The same ClaimIndex serves admission, drain-plan and the audit."""

from __future__ import annotations

import pytest

from tests.builders import claim, driver_daemonset, eviction_request, index_with, node_object, pod
from webhook import drainplan
from webhook.config import from_mapping
from webhook.model.claims import pod_is_relevant
from webhook.model.nodes import read_selector, selects
from webhook.model.slim import audit_view
from webhook.policies import eviction

CONFIG = from_mapping(None)
RACK = "topology.example.com/rack"
PODGROUP = ("scheduling.k8s.io", "podgroups", "train")


def allowed(idx, driver_pod="gpu-driver-a"):
    return eviction.review(eviction_request(driver_pod), index=idx, config=CONFIG.eviction).allowed


def message(idx, driver_pod="gpu-driver-a"):
    return eviction.review(eviction_request(driver_pod), index=idx, config=CONFIG.eviction).findings[0].message


# ---------------------------------------------------------------- extended-resource pods
def test_a_pod_whose_claim_the_scheduler_made_for_its_extended_resource_is_kept():
    consumer = pod("consumer", "node-a", extended="consumer-extended-resources-x7k2p")
    assert "resourceClaims" not in consumer["spec"]
    assert pod_is_relevant(consumer)
    kept = audit_view(consumer)  # what `audit --cluster` keeps of it is still kept by the index
    assert kept is not None and pod_is_relevant(kept)
    assert not pod_is_relevant(pod("web", "node-a", claims=()))


def test_an_extended_resource_pod_holds_a_claim_usable_anywhere_on_its_node():
    idx = index_with(pod("consumer", "node-a", extended="fabric"), claim("fabric", node=None))
    assert not allowed(idx)
    assert "work/fabric -> pod work/consumer" in message(idx)
    assert allowed(idx, "gpu-driver-b")


def test_drain_plan_names_the_extended_resource_pod_first():
    objs = [
        driver_daemonset(name="gpu-driver", namespace="gpu"),
        pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"),
        pod("consumer", "node-a", extended="fabric"),
        claim("fabric", node=None),
    ]
    result = drainplan.plan(drainplan.build_index(objs, CONFIG), "node-a")
    assert result["evictFirst"] == ["work/consumer"] and result["ready"] is False


# ---------------------------------------------------------------- consumers that are not pods
@pytest.mark.parametrize(
    "consumer, shown",
    [
        (PODGROUP, "work/train (podgroups.scheduling.k8s.io)"),
        (("", "widgets", "w"), "work/w (widgets)"),
        (("example.com", "pods", "p"), "work/p (pods.example.com)"),  # not core pods
    ],
)
def test_a_consumer_that_is_not_a_pod_holds_a_node_local_claim(consumer, shown):
    idx = index_with(claim("gpu", reserved=(), consumers=(consumer,)))
    assert not allowed(idx)
    assert shown in message(idx)
    assert allowed(idx, "gpu-driver-b")


def test_a_consumer_that_is_not_a_pod_holds_a_claim_usable_anywhere_on_every_node():
    idx = index_with(claim("net", node=None, reserved=(), consumers=(PODGROUP,)))
    assert not allowed(idx) and not allowed(idx, "gpu-driver-b")
    assert idx.claim_drivers_on("node-z") == {"gpu.example.com"}
    idx.delete_claim("work", "net")
    assert allowed(idx) and allowed(idx, "gpu-driver-b") and not idx.claim_drivers_on("node-z")


# ---------------------------------------------------------------- claims selected by node labels
@pytest.mark.parametrize(
    "op, values, labels, expected",
    [
        ("In", ("r1",), {RACK: "r1"}, True),
        ("In", ("r1",), {}, False),
        ("NotIn", ("r1",), {RACK: "r2"}, True),
        ("NotIn", ("r1",), {}, True),
        ("NotIn", ("r1",), {RACK: "r1"}, False),
        ("Exists", (), {RACK: ""}, True),
        ("DoesNotExist", (), {RACK: "r1"}, False),
        ("Gt", ("3",), {RACK: "4"}, True),
        ("Lt", ("3",), {RACK: "4"}, False),
        ("Gt", ("3",), {RACK: "x"}, False),
        ("Sideways", ("r1",), {RACK: "r1"}, False),
    ],
)
def test_node_selector_requirements(op, values, labels, expected):
    selector = read_selector(
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": RACK, "operator": op, "values": list(values)}]}]}
    )
    assert selects(selector, "n", labels) is expected


def test_terms_are_ored_requirements_anded_and_a_term_without_requirements_selects_nothing():
    selector = read_selector(
        {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": RACK, "operator": "In", "values": ["r1"]},
                        {"key": "zone", "operator": "In", "values": ["z"]},
                    ]
                },
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n9"]}]},
                {},
            ]
        }
    )
    assert selects(selector, "n1", {RACK: "r1", "zone": "z"}) and selects(selector, "n9", {})
    assert not selects(selector, "n1", {RACK: "r1"})


def test_a_label_selected_claim_is_held_where_its_reserving_pod_runs():
    idx = index_with(
        node_object("node-a", {RACK: "r1"}),
        node_object("node-b", {RACK: "r1"}),
        pod("consumer", "node-a"),
        claim("rack", labels={RACK: "r1"}),
    )
    assert not allowed(idx) and allowed(idx, "gpu-driver-b")


def test_a_label_selected_claim_of_a_consumer_that_is_not_a_pod_holds_every_selected_node():
    idx = index_with(
        node_object("node-a", {RACK: "r1"}),
        node_object("node-b", {RACK: "r2"}),
        claim("rack", labels={RACK: "r1"}, reserved=(), consumers=(PODGROUP,)),
    )
    assert not allowed(idx) and allowed(idx, "gpu-driver-b")
    idx.nodes.upsert(node_object("node-b", {RACK: "r1"}))  # relabelled into the rack
    assert not allowed(idx, "gpu-driver-b")
    idx.nodes.replace([node_object("node-a", {RACK: "r2"}), node_object("node-b", {RACK: "r1"})])
    assert allowed(idx) and not allowed(idx, "gpu-driver-b")
    idx.nodes.delete("node-b")
    assert allowed(idx, "gpu-driver-b")


def test_a_selector_with_a_term_not_limited_by_name_is_judged_by_labels():
    c = claim("mixed", reserved=(), consumers=(PODGROUP,))
    c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"].append(
        {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["r1"]}]}
    )
    idx = index_with(node_object("node-a"), node_object("node-b", {RACK: "r1"}), c)
    assert not allowed(idx) and not allowed(idx, "gpu-driver-b")


def test_claims_relisted_while_nodes_are_known_are_placed_by_label():
    idx = index_with(node_object("node-b", {RACK: "r1"}))
    idx.replace_claims([claim("rack", labels={RACK: "r1"}, reserved=(), consumers=(PODGROUP,))])
    assert allowed(idx) and not allowed(idx, "gpu-driver-b")


def test_drain_plan_and_audit_objects_place_label_selected_claims_by_the_node_given():
    objs = [
        driver_daemonset(name="gpu-driver", namespace="gpu"),
        pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"),
        node_object("node-a", {RACK: "r1"}),
        claim("rack", labels={RACK: "r1"}, reserved=(), consumers=(PODGROUP,)),
    ]
    result = drainplan.plan(drainplan.build_index(objs, CONFIG), "node-a")
    assert result["evictFirst"] == ["work/train (podgroups.scheduling.k8s.io)"]
    assert result["driverPods"][0]["heldBy"] == [{"claim": "work/rack", "pods": ["work/train (podgroups.scheduling.k8s.io)"]}]
