"""bench/drain_requests.py's counting of audit events (no cluster): what counts as asking about more
than the node, and the request kinds."""

from __future__ import annotations

from bench import drain_requests


def event(verb: str, uri: str, resource: str = "", *, namespace: str = "", name: str = "", sub: str = "") -> dict:
    ref = {k: v for k, v in {"resource": resource, "namespace": namespace, "name": name, "subresource": sub}.items() if v}
    return {"verb": verb, "requestURI": uri, **({"objectRef": ref} if ref else {})}


NODE_PODS = event("list", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&limit=500", "pods")
NODE_WATCH = event("watch", "/api/v1/pods?allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dnode-a&watch=true", "pods")
CLAIM = event("get", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c-1", "resourceclaims", namespace="ns", name="c-1")


def test_only_lists_and_watches_limited_to_the_node_are_scoped():
    assert drain_requests.unscoped([NODE_PODS, NODE_WATCH, CLAIM], "node-a") == []
    every_pod = event("list", "/api/v1/pods?limit=500", "pods")
    other_node = event("watch", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-b&watch=true", "pods")
    a_namespace = event("list", "/api/v1/namespaces/ns/pods", "pods", namespace="ns")
    claims = event("list", "/apis/resource.k8s.io/v1/resourceclaims", "resourceclaims")
    by_label = event("list", "/api/v1/pods?labelSelector=app%3Dx", "pods")
    slices = event("list", "/apis/resource.k8s.io/v1/resourceslices", "resourceslices")
    node_slices = event("list", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-a", "resourceslices")
    assert drain_requests.unscoped([node_slices], "node-a") == []
    assert drain_requests.unscoped([every_pod, other_node, a_namespace, claims, by_label, slices], "node-a") == [
        "list /api/v1/pods?limit=500",
        "watch /api/v1/pods?fieldSelector=spec.nodeName%3Dnode-b&watch=true",
        "list /api/v1/namespaces/ns/pods",
        "list /apis/resource.k8s.io/v1/resourceclaims",
        "list /api/v1/pods?labelSelector=app%3Dx",
        "list /apis/resource.k8s.io/v1/resourceslices",
    ]


def test_request_kinds_and_targets():
    eviction = event("create", "/api/v1/namespaces/ns/pods/p/eviction", "pods", namespace="ns", name="p", sub="eviction")
    discovery = event("get", "/apis")
    assert [drain_requests.request_kind(e) for e in (NODE_PODS, eviction, discovery)] == [
        "list pods",
        "create pods/eviction",
        "get discovery",
    ]
    # the same claim read twice and the same selector listed and watched: one target per verb and object
    assert drain_requests.targets([CLAIM, CLAIM, NODE_PODS, NODE_WATCH, NODE_WATCH]) == {
        ("get", "resourceclaims", "ns", "c-1"),
        ("list", "pods", "", "spec.nodeName=node-a"),
        ("watch", "pods", "", "spec.nodeName=node-a"),
    }
