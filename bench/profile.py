"""Where one review's CPU goes, end to end on the real server: `python -m bench profile`.

A `dra-guard serve --self-signed --no-cluster` (one gunicorn worker, the event-loop front, TLS),
driven by vegeta over keep-alive HTTPS at a constant `--rate` per endpoint (the apiserver's way),
while py-spy samples the worker (`--gil`: the thread holding the GIL, at `--sample-rate` Hz, so
the samples are where the worker's Python CPU goes; py-spy cannot tell a thread waiting in C from
one working, and its --native stacks are not available here, so C code shows as the Python frame
that called it: the TLS record and the socket write of an answer are in the front's
`Connection._answer`, the TLS read in the loop's frames). Each sample is given to ONE
component: the innermost frame of its stack that belongs to one of COMPONENTS (so a json.loads
called by the admission code counts as "json", Flask calling a policy counts as "policy"). Also
measured per endpoint: the worker's CPU seconds per 1,000 reviews (/proc), beside the no-op
route's (the floor: TLS, HTTP, the front, Flask, an empty answer).

    python -m bench profile                                 # every endpoint, 300/s, 12 s each
    python -m bench profile --paths /validate/evictions --rate 500 --seconds 20
    python -m bench profile --code ../other-checkout        # the server from another tree

Writes bench/results/unreleased/profile.json (shares and CPU per 1,000 reviews per endpoint) and
the collapsed stacks beside it (profile-<endpoint>.txt: py-spy's raw format, for flame graphs).
Needs py-spy (`pip install -c constraints.txt -e '.[bench]'`) and vegeta (built on first use).
No cluster: the caches are empty, so a review's policy work is its cheapest path (the eviction of
a pod of no declared driver, a binding granting nothing, a DaemonSet that is no driver); the
share of the rest is the server's. Exit code 0, 2 when py-spy is missing.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench.common import RESULTS, Target, attack, cpu_seconds, machine, worker_pid, write_json
from bench.flood import overload_bodies, start

#: component -> substrings of a py-spy frame ("function (file:line)") that belong to it, tried
#: from a sample's innermost frame outwards; the first frame that matches names the component
COMPONENTS: dict[str, tuple[str, ...]] = {
    "json": ("json/decoder.py", "json/encoder.py", "json/__init__.py", "orjson", "msgspec"),
    "tls": ("ssl.py", "sslproto.py", "_ssl"),
    "logging": ("logging/__init__.py", "webhook/logs.py", "pythonjsonlogger"),
    "metrics": ("prometheus_client",),
    "policy": ("webhook/policies/", "webhook/model/"),
    "admission": ("webhook/admission.py", "webhook/config/"),
    "flask/werkzeug": ("flask/", "werkzeug/"),
    "wsgi bridge": ("serve/front/wsgi.py",),
    "lanes and threads": ("serve/lanes.py", "concurrent/futures", "threading.py", "queue.py"),
    "http parsing": ("httptools", "serve/front/http1.py"),
    "front": ("serve/front/",),
    "event loop": ("asyncio/", "selectors.py"),
    "server app": ("webhook/serve/",),
}
OTHER = "other"
ENDPOINTS = ("/validate/evictions", "/validate/rbac", "/mutate/daemonsets")
FLOOR = "/validate/noop"


def component(stack: str) -> str:
    """The component of one collapsed stack ("thread;frame;...;frame", outermost first)."""
    for frame in reversed(stack.split(";")):
        for name, marks in COMPONENTS.items():
            if any(mark in frame for mark in marks):
                return name
    return OTHER


def shares(collapsed: str) -> dict[str, Any]:
    """{"samples": N, "shares": {component: fraction of the samples}} of py-spy's raw output
    (`stack count` lines), components in COMPONENTS order, then OTHER."""
    counts = dict.fromkeys([*COMPONENTS, OTHER], 0)
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        counts[component(stack)] += int(count)
        total += int(count)
    return {"samples": total, "shares": {k: round(v / total, 3) if total else 0.0 for k, v in counts.items()}}


def py_spy() -> str:
    """Path of py-spy; SystemExit(2) naming how to install it."""
    found = shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy")
    if not pathlib.Path(found).exists():
        print("bench profile needs py-spy: pip install -c constraints.txt -e '.[bench]'", file=sys.stderr)
        raise SystemExit(2)
    return found


def profile_path(
    url: str, ca: str, pid: int, path: str, body: bytes, work: pathlib.Path, *, rate: float, seconds: float, sample_rate: int
) -> dict[str, Any]:
    """One endpoint: vegeta at `rate` for `seconds` while py-spy samples worker `pid`; the figures
    of the module docstring and the collapsed stacks (key "collapsed")."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "body.json").write_bytes(body)
    targets = [Target(url=url + path, body=work / "body.json")]
    attack(targets, rate=rate, seconds=2, workdir=work / "warm", ca_file=pathlib.Path(ca), http2=False)
    raw = work / "stacks.txt"
    spy = subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--duration", f"{int(seconds)}", "--rate", str(sample_rate)]
        + ["--nonblocking", "--gil", "--threads", "--format", "raw", "--output", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # py-spy attached before the load starts
    before = cpu_seconds(pid)
    run = attack(targets, rate=rate, seconds=seconds, workdir=work / "run", ca_file=pathlib.Path(ca), http2=False)
    used = cpu_seconds(pid) - before
    spy.wait(timeout=seconds + 30)
    collapsed = raw.read_text() if raw.exists() else ""
    ok = sum(1 for c in run.codes if c == 200)
    return {
        "rate": rate,
        "seconds": seconds,
        "answered_200": ok,
        "sent": len(run.codes),
        "cpu_s_per_1000": round(used / max(1, ok) * 1000, 3),
        "p50_ms": round(sorted(run.latencies_ms)[len(run.latencies_ms) // 2], 3) if run.latencies_ms else None,
        **shares(collapsed),
        "collapsed": collapsed,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    """A Markdown table: one row per endpoint, its CPU per 1,000 reviews and each component's share."""
    names = [*COMPONENTS, OTHER]
    head = "| endpoint | CPU s / 1,000 | " + " | ".join(names) + " |"
    rows = [head, "|" + "---|" * (len(names) + 2)]
    for path, r in results.items():
        cells = " | ".join(f"{r['shares'][n] * 100:.0f}%" for n in names)
        rows.append(f"| {path} | {r['cpu_s_per_1000']} | {cells} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=",".join((FLOOR, *ENDPOINTS)), help="endpoints, comma-separated")
    parser.add_argument("--rate", type=float, default=300, help="reviews/s of each run (default: 300)")
    parser.add_argument("--seconds", type=float, default=12, help="seconds sampled per endpoint (default: 12)")
    parser.add_argument("--sample-rate", type=int, default=250, help="py-spy samples/s (default: 250)")
    parser.add_argument("--code", type=pathlib.Path, help="serve the code of this checkout (default: this one)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "profile.json")
    args = parser.parse_args(argv)
    py_spy()
    bodies = {p: b for p, (b, _) in overload_bodies().items()}
    bodies[FLOOR] = bodies["/validate/rbac"]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in bodies]
    if unknown:
        parser.error(f"unknown endpoint(s) {', '.join(unknown)}; known: {', '.join(bodies)}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dra-guard-profile-") as tmp:
        work = pathlib.Path(tmp)
        proc, url, ca = start(work, args.code)
        try:
            pid = worker_pid(proc.pid)
            for path in paths:
                print(f"profiling {path} at {args.rate:g}/s for {args.seconds:g} s", file=sys.stderr)
                results[path] = profile_path(
                    url,
                    ca,
                    pid,
                    path,
                    bodies[path],
                    work / path.strip("/").replace("/", "-"),
                    rate=args.rate,
                    seconds=args.seconds,
                    sample_rate=args.sample_rate,
                )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for path, r in results.items():
        (args.out.parent / f"profile-{path.strip('/').replace('/', '-')}.txt").write_text(r.pop("collapsed"))
    write_json(args.out, {"machine": machine(), "results": results})
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
