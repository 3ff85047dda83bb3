"""A drain asks the API only about its node, however big the cluster is (bench/drain_requests.py, small).

The same drain (a fake node, its declared DRA driver and 3 consumers with reserved claims,
`dra-guard drain NODE --evict-drivers` as a ServiceAccount of its own) twice on the session's
control plane: before and after 1,000 pods on 10 other nodes and 100 claims in other namespaces
are added. The drain's requests are read from the apiserver's audit log.
"""

from __future__ import annotations

from bench import drain_requests
from tests.e2e.kube import wait_for

#: how many requests the drains in the two clusters may differ by: two rounds of the small
#: scenario (a GET of the Node, a watch, a list of its ResourceSlices and a GET per claim: 3 + 3
#: each), which a busier apiserver may cost; asking about each of the 1,000 other pods, or each of
#: the 100 other claims, would add at least 100
SLACK = 12


def test_a_drain_asks_about_its_node_only_whatever_the_cluster_holds(control_plane, tmp_path):
    cp = control_plane
    shared = drain_requests.prepare(cp, tmp_path)

    def wait(what, fn, timeout):
        return wait_for(what, fn, timeout=timeout)

    try:
        small = drain_requests.drain_once(cp, shared, "drain-req-small", 3, wait=wait, timeout=60)
        drain_requests.fill(cp, other_pods=1000, other_nodes=10, other_claims=100)
        big = drain_requests.drain_once(cp, shared, "drain-req-big", 3, wait=wait, timeout=60)
    finally:
        drain_requests.unfill(cp)
        drain_requests.unprepare(cp)
    for run in (small, big):
        assert run["exit"] == 0, run["output"]
        # every list or watch of pods, claims and slices is limited to the node by field selector
        assert run["unscoped"] == [], run["unscoped"]
        assert run["by_kind"].get("list resourceclaims", 0) == 0, run["by_kind"]
        # what a drain must have done, so that the counts are of a real drain: 3 consumers and the driver evicted
        assert run["by_kind"]["create pods/eviction"] >= 4, run["by_kind"]
    assert abs(big["requests"] - small["requests"]) <= SLACK, (small["by_kind"], big["by_kind"])
    # the same things asked about (the node, its pods by selector, its claims and pods by name)
    assert abs(big["targets"] - small["targets"]) <= 2, (small, big)
