"""Memory of dra-guard's caches at a given scale, without a cluster (issue 19, item 2's profile).

Builds the indexes a worker keeps (webhook.model.rbac_index.RbacIndex, claim_index.ClaimIndex with
its SliceIndex) from objects shaped like bench/envelope.py's (the same generators), fed as the
informers feed them (a stream, one object at a time), and reports what tracemalloc counts as
allocated by the indexes per cache and per entry, plus the top allocation sites. Memory only:
CPU load on the machine does not change these figures.

    python -m bench index-memory                      # the envelope: 50k roles, 5k nodes, 100k pods
    python -m bench index-memory --roles 5000 --nodes 1000 --claims 10000
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

from bench import envelope, fill
from bench.common import machine
from webhook.config import from_mapping
from webhook.model.claim_index import ClaimIndex
from webhook.model.rbac_index import RbacIndex

# a kubectl-applied object carries its whole last-applied configuration as an annotation
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _applied(obj: dict[str, Any]) -> dict[str, Any]:
    """obj as the apiserver returns a kubectl-applied object: uid, resourceVersion, the
    last-applied annotation (managedFields left out: dra-guard never keeps them)."""
    meta = obj.setdefault("metadata", {})
    meta["uid"] = "0d2c9f1e-5b7a-4c3e-9f8d-2a1b3c4d5e6f"
    meta["resourceVersion"] = "123456"
    meta["creationTimestamp"] = "2026-11-30T10:00:00Z"
    meta.setdefault("annotations", {})[LAST_APPLIED] = json.dumps(obj, separators=(",", ":"))
    return parsed(obj)


def parsed(obj: dict[str, Any]) -> dict[str, Any]:
    """obj as an informer gets it: decoded from the API's JSON (fresh strings and lists, nothing shared)."""
    return dict(json.loads(json.dumps(obj)))


def rbac_objects(roles: int) -> Iterator[dict[str, Any]]:
    """ClusterRoles and ClusterRoleBindings as bench/fill.py makes them, kubectl-applied."""
    for i in range(roles):
        yield _applied({**fill.cluster_role(i), "kind": "ClusterRole"})
    for i in range(roles):
        yield _applied({**fill.cluster_role_binding(i), "kind": "ClusterRoleBinding"})


def pods(nodes: int, claims: int) -> Iterator[dict[str, Any]]:
    """Driver pods (one per node) and consumer pods (one per claim), as the apiserver lists them."""
    ds_uid = "11111111-2222-4333-8444-555555555555"
    for i in range(nodes):
        pod = fill.driver_pod(i, ds_uid)
        pod["metadata"]["uid"] = f"00000000-0000-4000-9000-{i:012d}"
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        yield parsed(pod)
    for i in range(claims):
        pod = envelope.consumer_pod(i, nodes)
        pod["metadata"]["uid"] = f"00000000-0000-4000-8000-{i:012d}"
        pod["status"] = {"phase": "Pending"}
        yield parsed(pod)


def claims(nodes: int, count: int) -> Iterator[dict[str, Any]]:
    """Allocated ResourceClaims reserved for their consumer pods."""
    for i in range(count):
        obj = envelope.claim(i)
        obj.update(envelope.claim_status(i, nodes, f"00000000-0000-4000-8000-{i:012d}"))
        yield parsed(obj)


def measure(roles: int, nodes: int, count: int) -> dict[str, Any]:
    """tracemalloc bytes held by each index after it is filled, and per entry."""
    out: dict[str, Any] = {"scale": {"roles": roles, "nodes": nodes, "claims": count}}
    tracemalloc.start(6)
    gc.collect()
    base = tracemalloc.take_snapshot()
    rbac = RbacIndex()
    for obj in rbac_objects(roles):
        (rbac.upsert_role if obj["kind"] == "ClusterRole" else rbac.upsert_binding)(obj)
    gc.collect()
    after_rbac = tracemalloc.get_traced_memory()[0]
    idx = ClaimIndex(from_mapping(None).detection)
    idx.replace_pods(pods(nodes, count))
    gc.collect()
    after_pods = tracemalloc.get_traced_memory()[0]
    idx.replace_claims(claims(nodes, count))
    idx.slices.replace(parsed(fill.resource_slice(i)) for i in range(nodes))
    gc.collect()
    after_claims = tracemalloc.get_traced_memory()[0]
    snapshot = tracemalloc.take_snapshot()
    start = sum(s.size for s in base.statistics("filename"))
    rbac_bytes = after_rbac - start
    out["rbac_mib"] = round(rbac_bytes / 2**20, 1)
    out["rbac_bytes_per_object"] = round(rbac_bytes / max(2 * roles, 1))
    out["pods_mib"] = round((after_pods - after_rbac) / 2**20, 1)
    out["pods_bytes_per_pod"] = round((after_pods - after_rbac) / max(nodes + count, 1))
    out["claims_and_slices_mib"] = round((after_claims - after_pods) / 2**20, 1)
    out["claims_bytes_per_claim"] = round((after_claims - after_pods) / max(count, 1))
    out["total_mib"] = round((after_claims - start) / 2**20, 1)
    out["top"] = [
        f"{stat.size / 2**20:.1f} MiB {stat.traceback.format()[-1].strip()}" for stat in snapshot.compare_to(base, "lineno")[:8]
    ]
    tracemalloc.stop()
    assert idx.sizes()["pods"] == nodes + count and rbac.sizes()["clusterroles"] == roles  # everything was kept
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roles", type=int, default=envelope.ENVELOPE.roles)
    parser.add_argument("--nodes", type=int, default=envelope.ENVELOPE.nodes)
    parser.add_argument("--claims", type=int, default=envelope.ENVELOPE.claims)
    args = parser.parse_args(argv)
    print(json.dumps({**measure(args.roles, args.nodes, args.claims), "machine": machine()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
