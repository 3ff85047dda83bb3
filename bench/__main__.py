"""`python -m bench <subcommand> [options]`: the measurements bench/RESULTS.md reports, one each.

Run from the repository's root inside its venv (`pip install -c constraints.txt -e '.[test,bench]'`);
`python -m bench <subcommand> --help` gives a subcommand's options. Each subcommand is one module of
bench/ and its `main(argv)`; `python -m bench.<module>` runs the same code (the issues' acceptance
commands use `python -m bench.compare` and `python -m bench.eviction_burst`). The ones that start a
control plane need its binaries and vegeta built first: `bench/run` builds them and then runs
`suite`. Exit codes are the subcommand's (0 when it completed; bench/RESULTS.md says which figures
are targets and which only findings), 2 for an unknown subcommand.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module of bench/, what it measures: the line `python -m bench --help` prints)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "suite": ("bench.main", "endpoints, through the apiserver, scale (and --only envelope): bench/run's runs and report"),
    "compare": (
        "bench.compare",
        "two or more versions side by side on one filled cluster: CPU per review, p50/p99 (each endpoint and the no-op floor), RSS",
    ),
    "profile": ("bench.profile", "where one review's CPU goes on the real server (py-spy), by component, per endpoint"),
    "recovery": ("bench.recovery", "one worker at 2x its capacity: goodput, late answers, recovery after the overload"),
    "flood": ("bench.flood", "forged, heavy and parallel reviews, bursts and overload, as ratios to the floor"),
    "eviction-burst": ("bench.eviction_burst", "1,500 evictions at once with and without dra-guard; driver pods evicted"),
    "drain-requests": (
        "bench.drain_requests",
        "API requests of `dra-guard drain` per node size, with and without the rest of the cluster",
    ),
    "envelope": ("bench.envelope", "the scalability envelope (5,000 nodes) beside today's scale: ready, RSS, p99, audit"),
    "scale": ("bench.scale", "the scheduler SLI with and without dra-guard (the DRA scale scenario)"),
    "soak": ("bench.soak", "a steady mixed load for minutes: errors, RSS, fd and thread growth"),
    "audit-yaml": ("bench.audit_yaml", "`dra-guard audit -f` on a large manifest against the bare YAML parse"),
    "index-memory": ("bench.index_memory", "memory of the caches per object at a given scale (no cluster)"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in SUBCOMMANDS.items()]
    return "usage: python -m bench <subcommand> [options]\n\nsubcommands:\n" + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand argv[0] with the rest of argv; its exit code, or 2 (usage on stderr)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr, end="")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"python -m bench: unknown subcommand {name!r}\n\n{usage()}", file=sys.stderr, end="")
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    if argv is None:  # from the command line: argparse's prog for the modules that do not set one
        sys.argv[0] = f"python -m bench {name}"
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main())
