"""How long a relist at the envelope stalls the other threads of a worker (issue 19, item 2's
profile for "p99 within 20 ms while a relist runs"), without a cluster.

Fills the indexes a worker keeps (RbacIndex, ClaimIndex) at the envelope from objects shaped like
bench/envelope.py's, then relists every one of them as the informers do (JSON pages of 500 decoded
one at a time, webhook.kube.informer.settle_page after each, release_free_memory at the end) while
a probe thread does what a review does between its I/O: sleeps 1 ms, then takes the RBAC and the
claims index locks. Reports the probe's extra delay (p50/p99/p99.9/max, ms), the collector's pauses
by generation, and the relist's seconds. CPU-bound: run it on a quiet machine.

    python -m bench.relist_pauses                 # the envelope, as the informers relist
    python -m bench.relist_pauses --no-settle     # without settle_page() per page (as before issue 19's fix)
    python -m bench.relist_pauses --switch-interval 0.001   # threads switched every 1 ms

A 1 ms switch interval cut the probe's p50 from 5.2 to 1.2 ms here, but made the real server's
tail worse at the envelope (bench/RESULTS.md): the worker keeps the interpreter's default.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import envelope, index_memory  # noqa: E402
from webhook.config import from_mapping  # noqa: E402
from webhook.kube.informer import release_free_memory, settle_page  # noqa: E402
from webhook.model.claim_index import ClaimIndex  # noqa: E402
from webhook.model.rbac_index import RbacIndex  # noqa: E402


def pages(objects: Iterable[dict[str, Any]], size: int = 500) -> list[bytes]:
    """`objects` as the JSON bodies of LIST pages of `size` items."""
    out, page = [], []
    for obj in objects:
        page.append(obj)
        if len(page) == size:
            out.append(json.dumps({"metadata": {}, "items": page}).encode())
            page = []
    if page:
        out.append(json.dumps({"metadata": {}, "items": page}).encode())
    return out


def stream(bodies: list[bytes], settle: bool) -> Iterator[dict[str, Any]]:
    """The items of `bodies` decoded page by page, as webhook.kube.pages.Pages yields them."""
    for body in bodies:
        items = json.loads(body)["items"]
        yield from items
        del items
        if settle:
            settle_page()


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, in ms (values in seconds)."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2) if ordered else 0.0


def measure(roles: int, nodes: int, claims: int, *, switch_interval: float, settle: bool) -> dict[str, Any]:
    """Fill, relist everything once with the probe running; the figures as a dict."""
    bodies = {
        "pods": pages(index_memory.pods(nodes, claims)),
        "resourceclaims": pages(index_memory.claims(nodes, claims)),
    }
    rbac_objects = list(index_memory.rbac_objects(roles))
    bodies["clusterroles"] = pages(o for o in rbac_objects if o["kind"] == "ClusterRole")
    bodies["clusterrolebindings"] = pages(o for o in rbac_objects if o["kind"] == "ClusterRoleBinding")
    del rbac_objects
    rbac, idx = RbacIndex(), ClaimIndex(from_mapping(None).detection)
    relists = {
        "pods": idx.replace_pods,
        "resourceclaims": idx.replace_claims,
        "clusterroles": rbac.replace_roles,
        "clusterrolebindings": rbac.replace_bindings,
    }
    for name, replace in relists.items():  # the first list, as at start-up
        replace(stream(bodies[name], settle))
    release_free_memory() if settle else None

    pauses: dict[int, list[float]] = {}
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            pauses.setdefault(info["generation"], []).append(time.perf_counter() - started[0])

    delays: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            time.sleep(0.001)
            with rbac._lock:
                pass
            with idx._lock:
                pass
            delays.append(time.perf_counter() - t0 - 0.001)

    default_interval = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    gc.callbacks.append(on_gc)
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    seconds: dict[str, float] = {}
    try:
        for name, replace in relists.items():
            t0 = time.perf_counter()
            replace(stream(bodies[name], settle))
            seconds[name] = round(time.perf_counter() - t0, 2)
        if settle:
            release_free_memory()
    finally:
        done.set()
        thread.join()
        gc.callbacks.remove(on_gc)
        sys.setswitchinterval(default_interval)
    return {
        "scale": {"roles": roles, "nodes": nodes, "claims": claims},
        "switch_interval_s": switch_interval,
        "settle_each_page": settle,
        "relist_seconds": seconds,
        "probe_delay_ms": {
            "n": len(delays),
            "p50": percentile(delays, 0.5),
            "p99": percentile(delays, 0.99),
            "p99.9": percentile(delays, 0.999),
            "max": percentile(delays, 1.0),
        },
        "gc_pauses_ms": {
            f"gen{g}": {"n": len(v), "max": percentile(v, 1.0), "total": round(sum(v) * 1000, 1)}
            for g, v in sorted(pauses.items())
        },
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roles", type=int, default=envelope.ENVELOPE.roles)
    parser.add_argument("--nodes", type=int, default=envelope.ENVELOPE.nodes)
    parser.add_argument("--claims", type=int, default=envelope.ENVELOPE.claims)
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=sys.getswitchinterval(),
        help="the interpreter's thread switch interval, seconds (default: the interpreter's, as in the worker)",
    )
    parser.add_argument("--no-settle", action="store_true", help="no settle_page() per page (the collector as before)")
    args = parser.parse_args(argv)
    print(
        json.dumps(
            measure(args.roles, args.nodes, args.claims, switch_interval=args.switch_interval, settle=not args.no_settle),
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
