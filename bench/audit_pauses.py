"""How long the periodic audit at the envelope stalls the other threads of a worker (issue 19's open
finding), without a cluster.

Fills an RbacIndex with the envelope's ClusterRoles and ClusterRoleBindings (bench/index_memory.py's
generators, as the informers would), then runs the cluster audit over it (webhook.audit.run.audit
with those indexes as facts, as the in-server periodic audit does over the worker's caches) while a
probe thread sleeps 1 ms in a loop and records how late it wakes. With --watchdog, a faulthandler
dump of every thread is written to stderr whenever the probe has not run for that many seconds:
the stack of whatever held the interpreter then. In the server at the envelope the same audit took
6.6 s and the no-op floor waited up to 3.7 s (bench/RESULTS.md); here it takes ~4 s and delays
the probe at most ~0.13 s (p99 15 ms): the server's longer stall is not explained by the audit alone.

    python -m bench.audit_pauses
    python -m bench.audit_pauses --roles 5000 --watchdog 0.2
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import pathlib
import sys
import threading
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import envelope, index_memory  # noqa: E402
from bench.relist_pauses import percentile  # noqa: E402
from webhook.audit.run import audit  # noqa: E402
from webhook.config import from_mapping  # noqa: E402
from webhook.kube.informer import release_free_memory  # noqa: E402
from webhook.model.facts import StaticFacts  # noqa: E402


def measure(roles: int, *, watchdog: float = 0.0) -> dict[str, Any]:
    """Fill, freeze (as the informers do after a list), audit with the probe running; figures as a dict."""
    config = from_mapping(None)
    facts = StaticFacts(config)
    objects = list(index_memory.rbac_objects(roles))
    facts.rbac.replace_roles(o for o in objects if o["kind"] == "ClusterRole")
    facts.rbac.replace_bindings(o for o in objects if o["kind"] == "ClusterRoleBinding")
    del objects
    release_free_memory()
    judged = [{"kind": "ClusterRoleBinding", **b} for b in facts.rbac.bindings()]
    delays: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            if watchdog:
                faulthandler.dump_traceback_later(watchdog, file=sys.stderr)
            t0 = time.perf_counter()
            time.sleep(0.001)
            delays.append(time.perf_counter() - t0 - 0.001)
        if watchdog:
            faulthandler.cancel_dump_traceback_later()

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    try:
        result = audit(judged, config, served_versions=["v1"], online=True, facts=facts)
    finally:
        seconds = time.perf_counter() - t0
        done.set()
        thread.join()
    return {
        "scale": {"roles": roles},
        "audit_seconds": round(seconds, 2),
        "findings": len(result.findings),
        "probe_delay_ms": {
            "n": len(delays),
            "p50": percentile(delays, 0.5),
            "p99": percentile(delays, 0.99),
            "max": percentile(delays, 1.0),
        },
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roles", type=int, default=envelope.ENVELOPE.roles)
    parser.add_argument(
        "--watchdog",
        type=float,
        default=0.0,
        help="dump every thread's stack when the probe has not run for this many seconds (0: off)",
    )
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.roles, watchdog=args.watchdog), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
