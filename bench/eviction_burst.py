"""A burst of evictions sized to real demand, with and without dra-guard, on one real control plane.

A Karpenter consolidation of 500 of 5,000 nodes sends ~15,000 evictions at up to 200/s, of which
a few hundred concern DRA drivers. This bench sends `evictions` Evictions at once (`workers`
concurrent clients, like a drain tool's parallel evictions) across `namespaces` namespaces, one of
them the declared driver's, whose pod still has a reserved claim; it measures how long the
evictions of the other pods take with dra-guard's webhook configuration registered and without any
(interleaved rounds on the same apiserver), and how many driver pods were evicted (must be 0).

Used by tests/e2e/test_fail_closed.py (one round each, driver safety asserted) and on its own:
``python -m bench.eviction_burst --rounds 3`` writes bench/results/unreleased/eviction-burst.json; the
figures are in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import requests

from bench.common import RESULTS, machine

#: the node every burst pod is bound to (no kubelet: Evictions with gracePeriodSeconds 0 delete at once)
NODE = "burst-node"
DRIVER = "burst.example.com"
DRIVER_NAMESPACE = "burst-driver"
DRIVER_DS = "burst-driver"
WORK = "burst-work"


def dra_objects() -> list[dict[str, Any]]:
    """A DeviceClass, the node's ResourceSlice, the consumers' namespace and claim template."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "burst-gpu"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-gpu"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(4)],
            },
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORK}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpu", "namespace": WORK},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "burst-gpu"}}]}}},
        },
    ]


def consumer(name: str) -> dict[str, Any]:
    """A pod on NODE with a claim from the template (the scheduler allocates and reserves it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORK},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [{"name": "c", "image": "registry.example/app:v1", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def driver_pods(cp: Any) -> list[tuple[str, str]]:
    """(namespace, name) of the driver DaemonSet's pods on NODE that are not terminating (the burst's
    own pods in the driver's namespace are not the DaemonSet's)."""
    pods = cp.session("admin").get(f"{cp.url}/api/v1/namespaces/{DRIVER_NAMESPACE}/pods", timeout=10).json()
    return [
        (DRIVER_NAMESPACE, p["metadata"]["name"])
        for p in pods.get("items", [])
        if p["spec"].get("nodeName") == NODE
        and not p["metadata"].get("deletionTimestamp")
        and any(o.get("kind") == "DaemonSet" and o.get("name") == DRIVER_DS for o in p["metadata"].get("ownerReferences") or [])
    ]


def reserved_claims(cp: Any) -> list[str]:
    """Names of the consumers' ResourceClaims that are reserved."""
    claims = cp.session("admin").get(f"{cp.url}/apis/resource.k8s.io/v1/namespaces/{WORK}/resourceclaims", timeout=10).json()
    return [c["metadata"]["name"] for c in claims.get("items", []) if (c.get("status") or {}).get("reservedFor")]


def prepare(cp: Any, guard: Any, namespaces: int, *, wait: Callable[[str, Callable[[], Any], float], Any]) -> list[str]:
    """The scenario on control plane `cp`: NODE with one DRA device pool, the driver DaemonSet
    (declared in dra-guard's drivers.declared) placed there, a consumer whose claim is reserved on
    NODE, and `namespaces` namespaces for burst pods (the driver's included); dra-guard (`guard`, a
    tests.e2e.guard.Guard) started and registered. wait(what, fn, timeout) polls fn until truthy.
    Returns the namespaces' names."""
    from tests.builders import driver_daemonset
    from tests.e2e.cluster import fake_node

    session = cp.session("admin")
    r = session.post(f"{cp.url}/api/v1/nodes", json=fake_node(NODE), timeout=10)
    if r.status_code not in (201, 409):
        r.raise_for_status()
    cp.kubectl("admin", "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": dra_objects()}))
    guard.start(mode="enforce", declared=((DRIVER_NAMESPACE, DRIVER_DS),))
    guard.register()
    ds = driver_daemonset(name=DRIVER_DS, namespace=DRIVER_NAMESPACE, plugin_subdir=DRIVER)
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    cp.kubectl("admin", "apply", "-f", "-", input=json.dumps(ds))
    cp.kubectl("admin", "apply", "-f", "-", input=json.dumps(consumer("consumer")))
    wait("the driver pod on the node", lambda: driver_pods(cp), 60)
    wait("the consumer's claim reserved", lambda: reserved_claims(cp), 60)
    names = [DRIVER_NAMESPACE] + [f"burst-{i:02d}" for i in range(namespaces - 1)]
    for ns in names[1:]:
        r = session.post(
            f"{cp.url}/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, timeout=10
        )
        if r.status_code not in (201, 409):
            r.raise_for_status()
    return names


def burst_pods(namespaces: Sequence[str], total: int, *, prefix: str) -> list[tuple[str, str]]:
    """`total` (namespace, pod name) pairs spread round-robin over `namespaces`."""
    return [(namespaces[i % len(namespaces)], f"{prefix}-{i:05d}") for i in range(total)]


def _pool(fn: Callable[[tuple[str, str]], Any], items: Sequence[tuple[str, str]], workers: int) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def create_pods(session: Any, url: str, pods: Sequence[tuple[str, str]], *, node: str = NODE, workers: int = 8) -> None:
    """Create plain pods bound to `node` (spec.nodeName: no scheduling), `workers` at a time.
    Raises RuntimeError naming the first pod the apiserver refused."""

    def create(item: tuple[str, str]) -> None:
        ns, name = item
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "registry.example/app:v1"}],
            },
        }
        r = session.post(f"{url}/api/v1/namespaces/{ns}/pods", json=body, timeout=30)
        if r.status_code not in (200, 201, 409):
            raise RuntimeError(f"creating pod {ns}/{name}: HTTP {r.status_code} {r.text[:300]}")

    _pool(create, pods, workers)


def evict_all(
    session: Any, url: str, pods: Sequence[tuple[str, str]], *, workers: int = 32
) -> tuple[float, dict[tuple[str, str], int]]:
    """Evict every pod at once (`workers` concurrent requests, gracePeriodSeconds 0); returns
    (seconds from the first request to the last answer, HTTP status by pod)."""

    def evict(item: tuple[str, str]) -> tuple[tuple[str, str], int]:
        ns, name = item
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"gracePeriodSeconds": 0},
        }
        return item, session.post(f"{url}/api/v1/namespaces/{ns}/pods/{name}/eviction", json=body, timeout=60).status_code

    started = time.monotonic()
    answers = _pool(evict, pods, workers)
    return time.monotonic() - started, dict(answers)


def run(
    cp: Any,
    guard: Any,
    *,
    driver_pods: Callable[[], list[tuple[str, str]]],
    namespaces: Sequence[str],
    evictions: int = 1500,
    rounds: int = 1,
    workers: int = 32,
) -> dict[str, Any]:
    """Interleaved rounds of a burst without dra-guard's webhook configurations (unregistered) and
    with them (registered, `guard` serving). Each round creates `evictions` pods over `namespaces`
    (the driver's among them) and evicts them all at once; rounds with dra-guard also evict every
    pod of driver_pods() (its (namespace, name) pairs) in the same burst.

    Returns {"without": [seconds...], "with": [seconds...], "ratio": median with / median without,
    "driver_evicted": driver pods answered 2xx, "driver_statuses": [...], "others_failed": non-2xx
    answers to other pods}.
    """
    session = cp.session("admin")
    session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=workers))
    out: dict[str, Any] = {
        "without": [],
        "with": [],
        "driver_evicted": 0,
        "driver_statuses": [],
        "others_failed": 0,
        "evictions": evictions,
        "namespaces": len(namespaces),
        "workers": workers,
    }
    for i in range(rounds):
        for registered in (False, True):
            if registered:
                guard.register()
            else:
                guard.unregister()
            pods = burst_pods(namespaces, evictions, prefix=f"burst-{i}-{int(registered)}")
            create_pods(session, cp.url, pods)
            drivers = driver_pods() if registered else []
            seconds, answers = evict_all(session, cp.url, list(drivers) + pods, workers=workers)
            out["with" if registered else "without"].append(seconds)
            for pod in drivers:
                out["driver_statuses"].append(answers[pod])
                out["driver_evicted"] += answers[pod] in (200, 201)
            out["others_failed"] += sum(1 for pod in pods if answers[pod] not in (200, 201))
    out["ratio"] = statistics.median(out["with"]) / statistics.median(out["without"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Start a control plane, dra-guard (one declared driver with a reserved claim) and run()."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.eviction_burst", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds without/with dra-guard (default 3)")
    parser.add_argument("--evictions", type=int, default=1500, help="evictions per burst (default 1500)")
    parser.add_argument("--namespaces", type=int, default=50, help="namespaces they spread over (default 50)")
    parser.add_argument("--out", default=str(RESULTS / "eviction-burst.json"))
    args = parser.parse_args(argv)
    import tempfile

    from tests.e2e import binaries
    from tests.e2e.cluster import ControlPlane
    from tests.e2e.guard import Guard
    from tests.e2e.kube import wait_for

    with (
        tempfile.TemporaryDirectory(prefix="dra-guard-burst-") as tmp,
        ControlPlane(
            pathlib.Path(tmp) / "cp",
            controllers=True,
            bin_dir=binaries.build_control_plane(),
            tools_dir=binaries.client_tools_dir(),
        ) as cp,
    ):
        guard = Guard(cp, pathlib.Path(tmp) / "guard")
        try:
            namespaces = prepare(cp, guard, args.namespaces, wait=lambda what, fn, t: wait_for(what, fn, timeout=t))
            result = run(
                cp,
                guard,
                driver_pods=lambda: driver_pods(cp),
                namespaces=namespaces,
                evictions=args.evictions,
                rounds=args.rounds,
            )
        finally:
            guard.stop()
    result["machine"] = machine()
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["driver_evicted"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
