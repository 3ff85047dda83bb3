"""Before/after: two versions of dra-guard side by side on one filled cluster, runs interleaved.

    python -m bench.compare --before 1d8c498            # that commit vs the working tree
    python -m bench.compare --before v1 --after v2 --rounds 5 --out bench/results/unreleased/compare-500.json
    python -m bench.compare --before v1 --before v2 --after v3   # three versions; ratios to the first

Each version is checked out into a temporary git worktree (the working tree itself for the
default --after), and both servers run at once against the same apiserver filled by
bench/fill.py, so the cluster, the caches and the machine's state are the same for both. Per
policy endpoint and the no-op floor (/validate/noop with the RBAC endpoint's bodies: TLS, HTTP,
the front, Flask, no policy), `--rounds` constant-rate runs alternate between the versions
(before, after, then after, before, ...). Reported per endpoint and version: CPU seconds per 1,000 reviews and
p50/p99 (median over the rounds), and each worker's RSS at /readyz and after the runs, which is
where a change to the caches shows. The measurement harness is this tree's; only the server's
code differs. Exit code 0, or 1 on an error.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench import endpoints, fill
from bench.common import RESULTS, machine, proc_status, write_json
from bench.main import control_plane, log
from bench.stats import spread

REPO = pathlib.Path(__file__).resolve().parents[1]
FLOOR = "/validate/noop"
#: URL path -> the endpoint's name in the results: the policies' and the floor's
ENDPOINTS = {**endpoints.ENDPOINTS, FLOOR: "noop"}


def paths(scale: fill.Scale) -> dict[str, list[tuple[dict[str, Any], bool]]]:
    """URL path -> (AdmissionReview, expected allowed) of each endpoint compared, the floor last."""
    bodies = endpoints.bodies(scale)
    return {**bodies, FLOOR: endpoints.as_floor(bodies["/validate/rbac"])}


def checkout(ref: str, folder: pathlib.Path) -> pathlib.Path:
    """A detached git worktree of `ref` in `folder`. Raises CalledProcessError for an unknown ref."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(folder), ref], check=True)
    return folder


def compare(
    trees: dict[str, pathlib.Path], *, scale: fill.Scale, rounds: int, rate: float, seconds: float, workdir: pathlib.Path
) -> dict[str, Any]:
    """Run the interleaved comparison of the server code in `trees` (name -> source folder)."""
    from tests.e2e.guard import Guard

    out: dict[str, Any] = {"rate": rate, "seconds": seconds, "rounds": rounds, "runs": [], "rss_mib": {}}
    cp = control_plane(workdir / "cluster")
    guards: dict[str, Any] = {}
    here = os.getcwd()
    try:
        log(f"filling the apiserver ({cp.url})")
        fill.fill(cp, scale, log=log)
        servers = {}
        for name, tree in trees.items():
            os.chdir(tree)  # `python -m webhook.cli` imports the package from the current folder
            guard = Guard(cp, workdir / name)
            guard.start(mode="enforce")
            guards[name] = guard
            servers[name] = endpoints.Server(guard.proc.proc.pid, guard.url, guard.proc.ca_file)
        os.chdir(here)
        time.sleep(2)

        def rss(at: str) -> None:
            for name, server in servers.items():
                status = proc_status(server.worker)
                out["rss_mib"].setdefault(name, {})[at] = round(status["rss_bytes"] / 2**20, 1)

        rss("ready")
        for path, reviews in paths(scale).items():
            endpoint = ENDPOINTS[path]
            for server in servers.values():
                endpoints.run_rate(server, path, reviews, rate=200, seconds=3, workdir=workdir / "vegeta")  # warm-up
            for r in range(rounds):
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    run = endpoints.run_rate(servers[name], path, reviews, rate=rate, seconds=seconds, workdir=workdir / "vegeta")
                    run.update(version=name, endpoint=endpoint, round=r)
                    out["runs"].append(run)
                    tail = run["tail"]
                    log(
                        f"  {endpoint:10} {name:7} p50 {run['p50']:.3f}  p99 {run['p99']:.2f} ms  "
                        f"cpu {run['cpu_s_per_1000']:.3f} s/1000  slow {tail['slow']} in {tail['slow_seconds']} s  "
                        f"gc>5ms {tail['gc_over_5ms']}  load {tail['load_average_before']}-{tail['load_average_after']}"
                    )
        rss("after the runs")
    finally:
        os.chdir(here)
        for guard in guards.values():
            guard.stop()
        cp.stop()
    out["summary"] = {
        endpoint: {
            name: {
                key: spread(r[key] for r in out["runs"] if r["endpoint"] == endpoint and r["version"] == name)
                for key in ("cpu_s_per_1000", "p50", "p99")
            }
            for name in trees
        }
        for endpoint in ENDPOINTS.values()
    }
    return out


def report(result: dict[str, Any]) -> str:
    """Markdown table of a compare() result: per endpoint and version, the medians over the rounds
    and the CPU ratio to the first version."""
    versions = result["versions"]
    first = versions[0]
    refs = ", ".join(f"{name}: `{result['refs'][name]}`" for name in versions)
    lines = [
        f"{refs}; {result['rounds']} interleaved rounds of {result['seconds']:g} s at {result['rate']:g}/s "
        "per endpoint and version.",
        "",
        f"| endpoint | version | CPU s / 1,000 | / {first} | p50 ms | p99 ms | p99 ms min-max |",
        "|---|---|---|---|---|---|---|",
    ]
    for endpoint, by in result["summary"].items():
        base = by[first]["cpu_s_per_1000"]["median"]
        for name in versions:
            v = by[name]
            lines.append(
                f"| {endpoint} | {name} | {v['cpu_s_per_1000']['median']:.3f} | {v['cpu_s_per_1000']['median'] / base:.2f} | "
                f"{v['p50']['median']:.2f} | {v['p99']['median']:.2f} | {v['p99']['min']:.2f}-{v['p99']['max']:.2f} |"
            )
    slow = [r for r in result["runs"] if r["p99"] > endpoints.SLOW_MS]
    if slow:
        lines += [
            "",
            f"Runs with p99 over {endpoints.SLOW_MS:g} ms and what was measured during each (bench.endpoints.tail_evidence):",
            "",
            "| endpoint | version | round | p99 ms | slow reviews | in seconds (of) | in the worst 100 ms | "
            "collections > 5 ms | worker / vegeta CPU s | load average before-after |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in slow:
            t = r["tail"]
            lines.append(
                f"| {r['endpoint']} | {r['version']} | {r['round']} | {r['p99']:.1f} | {t['slow']} | "
                f"{t['slow_seconds']} ({t['seconds']}) | {t['slow_in_worst_100ms']:.0%} | {t['gc_over_5ms']} | "
                f"{t['worker_cpu_s']} / {t['vegeta_cpu_s']} | {t['load_average_before']}-{t['load_average_after']} |"
            )
    rss = result["rss_mib"]
    lines += ["", "| worker RSS, MiB | " + " | ".join(rss[first]) + " |", "|---|" + "---|" * len(rss[first])]
    for name in versions:
        lines.append(f"| {name} | " + " | ".join(f"{v:g}" for v in rss[name].values()) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench compare`` (and ``python -m bench.compare``)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", required=True, action="append", help="git ref of a version before (e.g. a commit); repeat for several"
    )
    parser.add_argument("--after", default=None, help="git ref of the second version (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs per endpoint and version (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=500, help="requests/s of each run (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20, help="seconds per run (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="small cluster, 1 round of 3 s: checks the harness")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=RESULTS / "compare.json",
        help="JSON result; the Markdown table goes next to it (.md)",
    )
    args = parser.parse_args(argv)
    scale = fill.Scale()
    if args.quick:
        scale, args.rounds, args.seconds, args.rate = fill.Scale(roles=300, nodes=50, claims=500), 1, 3, 200
    work = pathlib.Path(tempfile.mkdtemp(prefix="dra-guard-compare-"))
    trees: dict[str, pathlib.Path] = {}
    try:
        refs: dict[str, str] = {}
        for index, ref in enumerate(args.before):
            name = "before" if len(args.before) == 1 else f"before{index + 1}"
            trees[name], refs[name] = checkout(ref, work / f"{name}-src"), ref
        trees["after"] = checkout(args.after, work / "after-src") if args.after else REPO
        refs["after"] = args.after or "working tree"
        result = compare(trees, scale=scale, rounds=args.rounds, rate=args.rate, seconds=args.seconds, workdir=work)
        result.update(versions=list(trees), refs=refs, machine=machine())
        write_json(args.out, result)
        args.out.with_suffix(".md").write_text(report(result))
        log(f"results: {args.out}, {args.out.with_suffix('.md')}")
        return 0
    except (subprocess.CalledProcessError, RuntimeError, TimeoutError) as exc:
        log(f"error: {exc}")
        return 1
    finally:
        for tree in trees.values():
            if tree != REPO:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
