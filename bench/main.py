"""`python -m bench suite`: the endpoint, apiserver and scale benchmarks, JSON results and a report.

    bench/run                              # builds the binaries and vegeta, then: python -m bench suite
    python -m bench suite                  # everything, 3 repeats (about 35 min on 2 cores)
    python -m bench suite --quick          # a 2-minute smoke at a small scale: checks the harness, not speed
    python -m bench suite --only endpoints # endpoints | apiserver | scale | envelope, comma-separated
    python -m bench suite --only envelope  # today's scale and the 5,000-node envelope (~45 min)

Parts (each on its own real control plane, tests/e2e/cluster.py):

* endpoints -- every admission endpoint of a real `dra-guard serve` (the chart's production
  settings: 1 gunicorn worker, 8 threads, TLS) under vegeta, caches filled from the apiserver
  (bench/fill.py: 5,000 ClusterRoles and ClusterRoleBindings, 1,000 nodes' ResourceSlices,
  10,000 allocated ResourceClaims, 1,000 driver pods), side by side with the no-op floor
  /validate/noop in the same server (bench/endpoints.py);
* apiserver -- the same ClusterRole creates through the kube-apiserver with no admission, a
  ValidatingAdmissionPolicy, a no-op webhook and dra-guard (bench/apiserver.py);
* scale -- the source page's scale scenario, scheduler SLI with and without dra-guard
  (bench/scale.py);
* envelope -- (only when asked for: `--only envelope`) dra-guard at Kubernetes' scalability
  envelope, 5,000 nodes, 100,000 pods with allocated claims, 50,000 ClusterRoles and bindings,
  side by side with today's scale: ready time, RSS, API bytes listed at start, p50/p99 at 500/s,
  p99 while every cache relists, `audit --cluster` time and RSS (bench/envelope.py).

Results: bench/results/unreleased/bench.json (every run) and report.md beside it (medians with min and
max over the repeats, ratios, targets met or missed). bench/RESULTS.md is the reviewed write-up.
Exit code 0 when the runs completed (targets missed are findings, not failures), 1 on an error.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

from bench import apiserver, endpoints, fill
from bench.common import RESULTS, machine, proc_status, write_json
from bench.stats import spread

PARTS = ("endpoints", "apiserver", "scale")
OPT_IN_PARTS = ("envelope",)  # not in the default run: it takes about 45 minutes on its own


def log(message: str) -> None:
    """Progress on stdout with a timestamp."""
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def _now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def control_plane(workdir: pathlib.Path, *, controllers: bool = False):
    """A started ControlPlane with the audit log on (to count dra-guard's API requests)."""
    from tests.e2e import binaries
    from tests.e2e.cluster import ControlPlane

    cp = ControlPlane(
        workdir,
        controllers=controllers,
        audit_log=True,
        bin_dir=binaries.build_control_plane(),
        tools_dir=binaries.client_tools_dir(),
    )
    cp.start()
    return cp


def run_endpoints_and_apiserver(workdir: pathlib.Path, args: argparse.Namespace) -> dict[str, Any]:
    """Fill a cluster, start dra-guard, measure its endpoints (`args.repeats` times), then the
    apiserver comparison. Returns the JSON-ready results."""
    from tests.e2e.guard import Guard

    scale = args.scale
    out: dict[str, Any] = {
        "scale": {
            "roles": scale.roles,
            "bindings": scale.roles,
            "resource_slices": scale.nodes,
            "claims": scale.claims,
            "driver_pods": scale.driver_pods,
        }
    }
    cp = control_plane(workdir / "cluster")
    guard = None
    try:
        log(f"filling the apiserver ({cp.url})")
        out["fill"] = fill.fill(cp, scale, log=log)
        guard = Guard(cp, workdir / "dra-guard")
        started = time.monotonic()
        guard.start(mode="enforce")
        out["ready_seconds"] = round(time.monotonic() - started, 2)
        assert guard.proc is not None
        out["ready_rss_mib"] = round(proc_status(endpoints.worker_pid(guard.proc.proc.pid))["rss_bytes"] / 2**20, 1)
        out["cache_sync"] = endpoints.sync_seconds(guard.proc.log_file.read_text(errors="replace"))
        log(
            f"dra-guard ready {out['ready_seconds']} s after start; caches: "
            + ", ".join(f"{k} {v['objects']} in {v['seconds']:.2f} s" for k, v in out["cache_sync"].items())
        )
        assert guard.proc is not None
        server = endpoints.Server(guard.proc.proc.pid, guard.url, guard.proc.ca_file)
        if "endpoints" in args.only:
            time.sleep(1.0)  # let the watches settle before "since"
            since = _now_rfc3339()
            gc_before = server.gc_collections()
            out["endpoints"] = []
            for repeat in range(args.repeats):
                log(f"  endpoints, repeat {repeat + 1}/{args.repeats}")
                out["endpoints"].append(
                    endpoints.measure(
                        server,
                        scale,
                        workdir=workdir / "vegeta",
                        rates=args.rates,
                        seconds=args.seconds,
                        search_seconds=args.search_seconds,
                        search=not args.no_search,
                        warmup_seconds=args.warmup_seconds,
                        log=log,
                    )
                )
            time.sleep(1.5)  # the audit backend writes the last events
            out["api_requests_during_load"] = endpoints.api_requests(cp.audit_events("dra-guard", stage=None), since)
            out["server"] = endpoints.server_figures(server)
            gc_after = server.gc_collections()
            out["server"]["gc_collections_during_load"] = {g: gc_after[g] - gc_before.get(g, 0) for g in gc_after}
            log(
                f"  dra-guard API requests during the load: {out['api_requests_during_load'] or 'none'}; "
                f"peak RSS {out['server']['peak_rss_mib']} MiB"
            )
            out["protected_role"] = endpoints.measure_protected_role(
                server,
                audit_events=lambda: cp.audit_events("dra-guard", stage=None),
                workdir=workdir / "protected-role",
                seconds=args.seconds,
            )
            pr = out["protected_role"]
            log(
                f"  ClusterRole granting ResourceSlice write (reads the bindings): p50 {pr['p50']:.1f} p99 {pr['p99']:.1f} ms, "
                f"{pr['api_requests_per_review']} API requests per review"
            )
        if args.profile:
            log("  profiling the worker with py-spy")
            out["profiles"] = endpoints.profile(server, scale, out_dir=args.out, workdir=workdir / "profile", log=log)
        if "apiserver" in args.only:
            log("  ClusterRole creates through the apiserver")
            out["apiserver"] = apiserver.measure(
                cp,
                guard,
                workdir=workdir / "apiserver",
                repeats=args.repeats,
                rate=args.api_rate,
                seconds=args.api_seconds,
                warmup_seconds=args.warmup_seconds,
                log=log,
            )
    finally:
        if guard is not None:
            guard.stop()
        cp.stop()
    return out


def run_scale(workdir: pathlib.Path, args: argparse.Namespace) -> dict[str, Any]:
    """The source page's scale scenario, with and without dra-guard (bench/scale.py)."""
    from bench import scale

    return scale.run(workdir=workdir / "scale", repeats=args.repeats, quick=args.quick, log=log)


# ---------------------------------------------------------------------- report


def _fmt(s: dict[str, float], digits: int = 2) -> str:
    if not s.get("n"):
        return "n/a"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _ok(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "**missed**")


def report(results: dict[str, Any]) -> str:
    """The Markdown report of `results` (the JSON main() writes): medians (min-max) over repeats."""
    lines = [
        f"# dra-guard benchmark report ({results['started']})",
        "",
        f"Machine: {results['machine']['cpu']}, {results['machine']['cpus']} CPUs, "
        f"{results['machine']['memory_gib']} GiB, Linux {results['machine']['kernel']}, "
        f"Python {results['machine']['python']}.",
        "",
        f"Command: `{results['command']}`; repeats: {results['repeats']}. Figures are median (min-max) over the repeats.",
        "",
    ]
    ep = results.get("endpoints_part") or {}
    targets: list[tuple[str, str, bool | None]] = []
    if ep.get("endpoints"):
        runs = ep["endpoints"]
        rates = list(runs[0]["rbac"]["rates"])
        sc = ep["scale"]
        lines += [
            "## Admission endpoints (direct, vegeta over HTTPS keep-alive)",
            "",
            f"Cached: {sc['roles']} ClusterRoles and {sc['bindings']} ClusterRoleBindings (plus the bootstrap ones), "
            f"{sc['resource_slices']} nodes' ResourceSlices, {sc['claims']} allocated ResourceClaims, "
            f"{sc['driver_pods']} driver pods.",
            "",
            f"Start-up: dra-guard ready {ep['ready_seconds']} s after the process started (to /readyz 200); "
            "cache sync: "
            + ", ".join(f"{k} {v['objects']} objects in {v['seconds']:.2f} s" for k, v in ep["cache_sync"].items())
            + ".",
            "",
            "The floor is /validate/noop in the same server with the same bodies, run just before.",
            "",
            "| endpoint | rate/s | p50 ms | p99 ms | p99.9 ms | CPU s / 1,000 | floor p50 / p99 ms | p50 / floor | max rps (p99 <= 10 ms) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in endpoints.ENDPOINTS.values():
            maxes = spread(r[name]["max"]["max_rps"] for r in runs if "max" in r[name])
            for rate in rates:
                get = lambda key, part="rates", name=name, rate=rate: spread(r[name][part][rate][key] for r in runs)  # noqa: E731
                ratio = spread(r[name]["rates"][rate]["p50"] / r[name]["floor"][rate]["p50"] for r in runs)
                lines.append(
                    f"| {name} | {rate} | {_fmt(get('p50'))} | {_fmt(get('p99'))} | {_fmt(get('p99.9'))} | "
                    f"{_fmt(get('cpu_s_per_1000'), 3)} | {_fmt(get('p50', 'floor'))} / {_fmt(get('p99', 'floor'))} | "
                    f"{_fmt(ratio)} | {_fmt(maxes, 0) if rate == rates[0] else ''} |"
                )
        noop_max = spread(r["noop"]["max"]["max_rps"] for r in runs if "noop" in r)
        if noop_max["n"]:
            lines.append(f"| noop (floor) | | | | | | | | {_fmt(noop_max, 0)} |")
        steady = max((r[n].get("peak_rss_mib_steady", 0) for r in runs for n in endpoints.ENDPOINTS.values()), default=0)
        first = next(iter(endpoints.ENDPOINTS.values()))
        at_first_rate = runs[0][first]["rates"][rates[0]].get("peak_rss_mib")
        wrong = sum(r[n]["answers"]["wrong"] for r in runs for n in endpoints.ENDPOINTS.values())
        checked = sum(r[n]["answers"]["checked"] for r in runs for n in endpoints.ENDPOINTS.values())
        lines += [
            "",
            f"Answers checked against the expected decision (first rate, every response): {checked}, wrong: {wrong}.",
            f"Kubernetes API requests dra-guard made during the load: {ep.get('api_requests_during_load') or 'none'}.",
            f"Worker RSS: {ep.get('ready_rss_mib')} MiB when ready, peak {at_first_rate} MiB after the first run "
            f"({first} at {rates[0]}/s), {steady} MiB through the fixed-rate runs, {ep['server']['peak_rss_mib']} MiB at the end "
            f"(after the throughput searches, which overload the server; RSS at the end {ep['server']['rss_mib']} MiB); "
            f"garbage collections during the load by generation: {ep['server'].get('gc_collections_during_load')}.",
            "",
        ]
        pr = ep.get("protected_role")
        if pr:
            lines += [
                f"The rare RBAC review that reads the API (a new ClusterRole granting ResourceSlice write; the "
                f"guard LISTs every ClusterRoleBinding first) at {pr['rate']:g}/s: p50 {pr['p50']:.1f} ms, "
                f"p99 {pr['p99']:.1f} ms, {pr['api_requests_per_review']} API requests per review "
                f"({pr['api_requests'] or 'none'}); answers wrong: {pr['answers']['wrong']}.",
                "",
            ]
        top = str(max(int(r) for r in rates))
        for name in endpoints.ENDPOINTS.values():
            p99 = spread(r[name]["rates"][top]["p99"] for r in runs)["median"]
            targets.append((f"{name}: p99 <= 5 ms at {top}/s", f"{p99:.2f} ms", None if top != "1000" else p99 <= 5))
            cost = spread(r[name]["rates"][top]["p50"] / r[name]["floor"][top]["p50"] - 1 for r in runs)["median"]
            targets.append((f"{name}: policy cost <= 25% over the floor (p50 at {top}/s)", f"{cost:+.0%}", cost <= 0.25))
        calls = ep.get("api_requests_during_load") or {}
        targets.append(
            (
                "zero API requests per review",
                f"{endpoints.per_review_requests(calls)} during the load "
                f"(all requests: {', '.join(f'{v} {k}' for k, v in calls.items()) or 'none'})",
                endpoints.per_review_requests(calls) == 0,
            )
        )
        if at_first_rate is not None:
            targets.append(
                (
                    f"peak RSS <= 150 MiB per worker (caches filled, {first} at {rates[0]}/s)",
                    f"{at_first_rate} MiB",
                    at_first_rate <= 150,
                )
            )
        targets.append(("peak RSS <= 150 MiB per worker (through the fixed rates)", f"{steady} MiB", steady <= 150))
        targets.append(
            (
                "peak RSS <= 150 MiB per worker (after overload)",
                f"{ep['server']['peak_rss_mib']} MiB",
                ep["server"]["peak_rss_mib"] <= 150,
            )
        )
    if ep.get("apiserver"):
        api = ep["apiserver"]
        by = {v: [r for r in api["runs"] if r["variant"] == v] for v in apiserver.VARIANTS}
        lines += [
            "## ClusterRole creates through the kube-apiserver",
            "",
            f"vegeta at {api['rate']}/s for {api['seconds']} s per variant and repeat, as the cluster admin.",
            "",
            "| variant | p50 ms | p99 ms | added p50 over none, ms |",
            "|---|---|---|---|",
        ]
        none_p50 = {r["repeat"]: r["p50"] for r in by["none"]}
        added: dict[str, dict[str, float]] = {}
        for variant, runs_ in by.items():
            added[variant] = spread(r["p50"] - none_p50[r["repeat"]] for r in runs_ if r["repeat"] in none_p50)
            lines.append(
                f"| {variant} | {_fmt(spread(r['p50'] for r in runs_))} | {_fmt(spread(r['p99'] for r in runs_))} | "
                f"{_fmt(added[variant]) if variant != 'none' else ''} |"
            )
        dg, vap = added["dra-guard"]["median"], added["vap"]["median"]
        targets.append(("dra-guard adds <= 2 ms median to a create", f"{dg:+.2f} ms", dg <= 2))
        targets.append(("dra-guard's added latency within 2x the VAP's", f"{dg:+.2f} vs {vap:+.2f} ms", dg <= 2 * max(vap, 0.0)))
        lines.append("")
    env = results.get("envelope_part")
    if env:
        from bench import envelope

        lines += ["## The scalability envelope (issue 19)", "", *envelope.report_lines(env), ""]
    sc = results.get("scale_part")
    if sc:
        lines += ["## The source page's scale scenario", ""] + list(sc.get("report_lines", [])) + [""]
        ratio = sc.get("sli_p99_ratio", {}).get("median")
        targets.append(
            (
                "scheduler SLI p99 with / without dra-guard <= 1.05",
                f"{ratio:.3f}" if ratio else "n/a",
                None if ratio is None else ratio <= 1.05,
            )
        )
    if targets:
        lines += ["## Targets", "", "| target | reached | |", "|---|---|---|"]
        lines += [f"| {name} | {value} | {_ok(met)} |" for name, value, met in targets]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench suite", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help="comma-separated parts to run: endpoints, apiserver, scale, envelope (default: all but envelope)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeat each measurement N times (default: %(default)s)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 repeat, small scale, short attacks, no throughput search"
    )
    parser.add_argument("--seconds", type=float, default=15, help="seconds per fixed-rate attack (default: %(default)s)")
    parser.add_argument("--search-seconds", type=float, default=8, help="seconds per step of the throughput search")
    parser.add_argument("--no-search", action="store_true", help="skip the maximum-throughput search")
    parser.add_argument("--api-rate", type=float, default=50, help="creates/s through the apiserver (default: %(default)s)")
    parser.add_argument("--api-seconds", type=float, default=15, help="seconds per apiserver variant (default: %(default)s)")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=RESULTS,
        help="folder for bench.json and report.md (default: bench/results/unreleased)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also sample the worker with py-spy at 500/s per endpoint and floor: flame graphs "
        "(profile-*.svg) and collapsed stacks (profile-*.txt) in --out",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (clusters' logs, vegeta files)")
    args = parser.parse_args(argv)
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in args.only if p not in PARTS + OPT_IN_PARTS]
    if unknown:
        parser.error(f"--only: unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS + OPT_IN_PARTS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    args.scale = fill.Scale()
    args.rates = (500.0, 1000.0)
    args.warmup_seconds = 2.0  # the uncounted attack before each endpoint's and each apiserver variant's runs
    if args.quick:
        # the smoke checks the harness, not speed: 3 s at 200/s is still 600 checked answers per
        # endpoint; 20 creates per apiserver variant show each variant in effect; 1 s warm-ups
        args.repeats, args.scale, args.rates = 1, fill.Scale(roles=300, nodes=50, claims=500), (200.0,)
        args.seconds, args.no_search, args.api_seconds, args.api_rate = 3, True, 1, 20
        args.warmup_seconds = 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for; write results and report; return the exit code."""
    args = parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="dra-guard-bench-"))
    results: dict[str, Any] = {
        "started": _now_rfc3339(),
        "machine": machine(),
        "repeats": args.repeats,
        "command": "python -m bench suite " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    ok = False
    try:
        if {"endpoints", "apiserver"} & set(args.only):
            results["endpoints_part"] = run_endpoints_and_apiserver(work, args)
        if "scale" in args.only:
            results["scale_part"] = run_scale(work, args)
        if "envelope" in args.only:
            from bench import envelope

            scales = [envelope.SMOKE] if args.quick else [envelope.TODAY, envelope.ENVELOPE]
            results["envelope_part"] = {
                s.name: envelope.run_scale(s, work / "envelope" / s.name, rate=500.0, seconds=args.seconds) for s in scales
            }
        ok = True
    except Exception as exc:  # report what failed and where the logs are, then exit 1
        log(f"error: {type(exc).__name__}: {exc}")
        log(f"logs kept in {work}")
        args.keep = True
    finally:
        results["finished"] = _now_rfc3339()
        name = "bench-quick" if args.quick else "bench"
        write_json(args.out / f"{name}.json", results)
        if ok:
            (args.out / f"{'report-quick' if args.quick else 'report'}.md").write_text(report(results))
            log(
                f"results: {args.out / (name + '.json')}, report: {args.out / ('report-quick.md' if args.quick else 'report.md')}"
            )
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
