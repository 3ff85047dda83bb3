"""`dra-guard drain-plan NODE`: what a drain of NODE must wait for, in the order it must go.

The check the source page asks custom drain logic to make ("drain the DRA driver last"): for each
DRA driver pod on the node, the ResourceClaims still allocated to its driver there and reserved by
pods that have not finished. Same ClaimIndex and rules as the eviction policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.config import Config
from webhook.model import attribution
from webhook.model.claim_index import ClaimIndex
from webhook.model.facts import build_facts


def build_index(objects: Iterable[Mapping[str, Any]], config: Config) -> ClaimIndex:
    """The ClaimIndex of listed objects (ClusterRoles/Bindings, DaemonSets, Pods, ResourceClaims):
    webhook.model.facts.build_facts(...).claims."""
    return build_facts(objects, config).claims


def plan(index: ClaimIndex, node: str) -> dict[str, Any]:
    """The drain plan of `node` as a JSON-ready dict.

    {"node", "driverPods": [{"namespace", "name", "driver" (names joined by ","), "drivers": [{"name",
    "learnedFrom"}], "daemonset", "protected", "canEvictNow", "readyPeer", "heldBy": [{"claim", "pods"}]}],
    "evictFirst": [pods holding claims], "ready": bool}. The same rules as the eviction policy
    (webhook.model.attribution.need).
    """
    drivers = []
    first: list[str] = []
    for pod, driver in index.driver_pods_on(node):
        needed = attribution.need(index, pod, driver)
        holds = list(dict.fromkeys(h for _, h in needed.holds)) if needed.held else []
        drivers.append(
            {
                "namespace": pod.namespace,
                "name": pod.name,
                "driver": ",".join(n for n, _ in needed.names) or "unknown",
                "drivers": [{"name": n, "learnedFrom": how} for n, how in needed.names],
                "daemonset": pod.daemonset,
                "protected": driver.protects,
                "canEvictNow": not holds,
                "readyPeer": needed.peer,
                "heldBy": [{"claim": h.claim, "pods": list(h.pods)} for h in holds],
            }
        )
        for h in holds:
            first.extend(p for p in h.pods if p not in first)
    return {"node": node, "driverPods": drivers, "evictFirst": first, "ready": all(d["canEvictNow"] for d in drivers)}


def render_text(result: Mapping[str, Any]) -> str:
    """A human-readable drain plan."""
    node = result["node"]
    if not result["driverPods"]:
        return f"Node {node}: no DRA driver pods; nothing to order.\n"
    lines = [f"Node {node}: {len(result['driverPods'])} DRA driver pod(s)."]
    if result["evictFirst"]:
        lines.append("1. Evict (or wait for) these pods first; they hold ResourceClaims the drivers must un-prepare:")
        lines += [f"     {p}" for p in result["evictFirst"]]
        lines.append("2. Then the DRA driver pods, once their claims are released:")
    else:
        lines.append("The DRA driver pods can be evicted now (no claim on this node still needs them):")
    for d in result["driverPods"]:
        state = "can go now" if d["canEvictNow"] else f"held by {len(d['heldBy'])} claim(s)"
        if d.get("readyPeer"):
            state += f" (Ready pod {d['readyPeer']} of the same DaemonSet takes over)"
        lines.append(f"     {d['namespace']}/{d['name']} (driver {d['driver']}): {state}")
        for n in d["drivers"]:
            lines.append(f"         {n['name']}: learned from {n['learnedFrom']}")
        for h in d["heldBy"]:
            lines.append(f"         {h['claim']} -> {', '.join(h['pods'])}")
    return "\n".join(lines) + "\n"


def render_json(result: Mapping[str, Any]) -> str:
    """The plan as indented JSON."""
    return json.dumps(result, indent=2) + "\n"
