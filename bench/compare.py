"""Before/after: two versions of dra-guard side by side on one filled cluster, runs interleaved.

    python -m bench.compare --before 1d8c498            # that commit vs the working tree
    python -m bench.compare --before v1 --after v2 --rounds 5 --out bench/results/compare.json

Each version is checked out into a temporary git worktree (the working tree itself for the
default --after), and both servers run at once against the same apiserver filled by
bench/fill.py, so the cluster, the caches and the machine's state are the same for both. Per
policy endpoint, `--rounds` constant-rate runs alternate between the versions (before, after,
then after, before, ...). Reported per endpoint and version: CPU seconds per 1,000 reviews and
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

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import endpoints, fill  # noqa: E402
from bench.common import machine, proc_status, spread, write_json  # noqa: E402
from bench.main import control_plane, log  # noqa: E402


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
        for path, reviews in endpoints.bodies(scale).items():
            endpoint = endpoints.ENDPOINTS[path]
            for server in servers.values():
                endpoints.run_rate(server, path, reviews, rate=200, seconds=3, workdir=workdir / "vegeta")  # warm-up
            for r in range(rounds):
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    run = endpoints.run_rate(servers[name], path, reviews, rate=rate, seconds=seconds, workdir=workdir / "vegeta")
                    run.update(version=name, endpoint=endpoint, round=r)
                    out["runs"].append(run)
                    log(
                        f"  {endpoint:10} {name:7} p50 {run['p50']:.3f}  p99 {run['p99']:.2f} ms  "
                        f"cpu {run['cpu_s_per_1000']:.3f} s/1000"
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
        for endpoint in endpoints.ENDPOINTS.values()
    }
    return out


def report(result: dict[str, Any]) -> str:
    """Markdown table of a compare() result: medians over the rounds and the after/before ratio."""
    before, after = result["versions"]
    lines = [
        f"Before: `{result['refs'][before]}`, after: `{result['refs'][after]}`; {result['rounds']} interleaved "
        f"rounds of {result['seconds']:g} s at {result['rate']:g}/s per endpoint and version.",
        "",
        "| endpoint | CPU s / 1,000 before | after | after / before | p50 ms before | after | p99 ms before | after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for endpoint, by in result["summary"].items():
        b, a = by[before], by[after]
        ratio = a["cpu_s_per_1000"]["median"] / b["cpu_s_per_1000"]["median"]
        lines.append(
            f"| {endpoint} | {b['cpu_s_per_1000']['median']:.3f} | {a['cpu_s_per_1000']['median']:.3f} | "
            f"{ratio:.2f} | {b['p50']['median']:.2f} | {a['p50']['median']:.2f} | {b['p99']['median']:.2f} | "
            f"{a['p99']['median']:.2f} |"
        )
    rss = result["rss_mib"]
    lines += ["", "| worker RSS, MiB | " + " | ".join(rss[before]) + " |", "|---|" + "---|" * len(rss[before])]
    for name in (before, after):
        lines.append(f"| {name} | " + " | ".join(f"{v:g}" for v in rss[name].values()) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.compare``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="git ref of the first version (e.g. a commit)")
    parser.add_argument("--after", default=None, help="git ref of the second version (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs per endpoint and version (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=500, help="requests/s of each run (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20, help="seconds per run (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="small cluster, 1 round of 3 s: checks the harness")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=REPO / "bench" / "results" / "compare.json",
        help="JSON result; the Markdown table goes next to it (.md)",
    )
    args = parser.parse_args(argv)
    scale = fill.Scale()
    if args.quick:
        scale, args.rounds, args.seconds, args.rate = fill.Scale(roles=300, nodes=50, claims=500), 1, 3, 200
    work = pathlib.Path(tempfile.mkdtemp(prefix="dra-guard-compare-"))
    trees: dict[str, pathlib.Path] = {}
    try:
        trees["before"] = checkout(args.before, work / "before-src")
        trees["after"] = checkout(args.after, work / "after-src") if args.after else REPO
        result = compare(trees, scale=scale, rounds=args.rounds, rate=args.rate, seconds=args.seconds, workdir=work)
        result.update(
            versions=["before", "after"], refs={"before": args.before, "after": args.after or "working tree"}, machine=machine()
        )
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
