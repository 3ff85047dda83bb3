"""Overload and recovery of `dra-guard serve`, this checkout alone or against other checkouts in
the same run: no metastable collapse means work past its deadline is dropped before it is judged,
overload answers are cheap, and once the overload ends latency is back to its no-load level.

    python -m bench recovery [--rounds 2] [--seconds 10] [--factor 2] [--path /validate/evictions]
                             [--servers .,DIR,ENGINE@DIR] [--profile DIR] [--pin]
                             [--out bench/results/unreleased/recovery.json]

Per round and server (the servers interleaved), a fresh `dra-guard serve --self-signed
--no-cluster` (1 worker, 8 threads). --servers names each one: `.` this checkout; `DIR` another
checkout's webhook/ and certs/ (`git archive <commit> webhook certs` extracted to DIR), measured in
the same rounds; `ENGINE@DIR` such a checkout from before the event-loop front became the only
engine, run with its server.engine set to ENGINE (gthread or asyncio). Every vegeta run keeps at
most 25 idle connections, as the kube-apiserver's webhook client
(bench.flood.APISERVER_IDLE_CONNECTIONS). Each round records the machine's load average before it
starts (other sessions share its cores):

* floor: 300 sequential noop reviews on one keep-alive connection: the median is the unit.
* no-load: 200 sequential reviews of the endpoint (--path), one keep-alive connection: p50, p99.
* CPU: the worker's CPU seconds per 1,000 reviews offered at CPU_RATE/s for CPU_SECONDS (vegeta,
  keep-alive), on the noop floor and on the endpoint.
* capacity: reviews/s judged with 8 closed-loop vegeta clients (bench.flood.capacity).
* overload: offered --factor x capacity for --seconds by vegeta (keep-alive, a new connection
  whenever none is idle, as the apiserver's client; offered_behind_schedule_s: how late vegeta sent
  its last requests against its schedule, offered_sent_per_s: the rate it did send at): goodput = reviews judged within the 3 s
  webhook timeout / (capacity x seconds); answers after the timeout; no answer; the server's TLS
  handshakes, dropped requests, reclaimed and refused connections over the run (its /metrics), and
  the machine's SYNs dropped at full accept queues and SYNs sent again (/proc/net/netstat).
  --profile DIR: py-spy samples the worker during the overload (DIR/<server><index>-<round>.txt: the
  collapsed stacks, and the share of samples by the functions that matter in the JSON).
* recovery: a probe sends one review every 0.1 s on its own keep-alive connection from the start
  of the overload until 10 s after its end. recovered_after_s: seconds from the end of the
  offered load until the last probe slower than 2 x the no-load p50 (+ 1 ms) got its answer:
  from then on every probe was at the no-load level. 0 when none was slower after the end.
  p50_recovered_after_s: the first whole second after the end from which the probes' median of
  every second is at most 2 x (+ 1 ms) the probe's own no-load median (probe_noload_p50_x_floor:
  the same probe for QUIET_PROBE s before the overload; requests 0.1 s apart cost more than
  back-to-back ones); None: not within the 10 s.

Every latency is also given as a ratio to the floor of the same run (`*_x_floor`): this machine's
speed varies with what else runs on it.

--pin runs the server (master and worker) on the machine's first CPU and this process, vegeta and
the probe on the others (`cpus` in the JSON). Unpinned, on a machine of 2 cores, the load generator
takes its CPU from the worker's: at 2x a capacity of ~3,000 reviews/s vegeta needs most of a core
(a TLS dial for every review that finds no idle connection), and goodput then measures the client
as much as the server. The kube-apiserver does not run on the webhook's cores; --pin measures one
worker with a core of its own in every phase, the capacity included.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import machine
from bench.flood import (
    APISERVER_IDLE_CONNECTIONS,
    TIMEOUT,
    capacity,
    classify,
    floor,
    overload_bodies,
    session,
    start,
    timed_post,
)
from bench.stats import percentile

PROBE_PERIOD = 0.1  # seconds between recovery probes
CPU_RATE, CPU_SECONDS = 200, 5.0  # reviews/s and seconds of the CPU-per-review runs
AFTER = 10.0  # seconds probed after the offered load ends
QUIET_PROBE = 3.0  # seconds probed before the overload: the probe's own no-load level
#: counters of the server's /metrics read before and after the overload
COUNTERS = (
    "dra_guard_tls_handshakes_total",
    "dra_guard_requests_dropped_total",
    "dra_guard_idle_connections_reclaimed_total",
    "dra_guard_connections_refused_total",
)
#: py-spy frames whose share of the worker's samples --profile reports (a sample counts once per
#: name found in its stack): where the CPU goes under overload
PROFILED = ("do_handshake", "ssl.py", "sslproto.py", "http1.py", "flask", "wsgi.py", "peek_review", "overload_answer", "select")


def counters(url: str, ca: str) -> dict[str, float]:
    """COUNTERS from the server's /metrics (summed over labels); {} when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = session(ca).get(url + "/metrics", timeout=TIMEOUT).text
    except Exception:  # noqa: BLE001 - a busy server's metrics are optional figures
        return {}
    found = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name] += sample.value
    return found


def profile_shares(collapsed: str) -> dict[str, float]:
    """Share of py-spy's samples (its --format raw: `frame;frame;... count` lines) whose stack
    names each of PROFILED, and the samples in all."""
    total, hits = 0, dict.fromkeys(PROFILED, 0)
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        for name in PROFILED:
            if name in stack:
                hits[name] += int(count)
    return {"samples": total, **{name: round(n / total, 3) if total else 0.0 for name, n in hits.items()}}


def probe(url: str, ca: str, path: str, body: bytes, seconds: float, out: Any) -> None:
    """One review every PROBE_PERIOD s for `seconds`, in a process of its own (the bench's own work
    on vegeta's results must not slow the probe's client); sends [(monotonic time sent, latency s
    or None)] to `out` (a multiprocessing connection)."""
    s = session(ca)
    found: list[tuple[float, float | None]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sent = time.monotonic()
        latency = timed_post(s, url + path, body, timeout=TIMEOUT)
        if latency is None:
            s = session(ca)  # as the apiserver's client: a failed connection is not reused
        found.append((sent, latency))
        time.sleep(max(0.0, PROBE_PERIOD - (time.monotonic() - sent)))
    out.send(found)


def server_of(variant: str) -> tuple[str | None, pathlib.Path | None]:
    """(server.engine to set, the checkout to run) of an entry of --servers: `.` -> (None, None),
    DIR -> (None, DIR), ENGINE@DIR -> (ENGINE, DIR). Raises ValueError for ENGINE@ without a DIR."""
    if variant == ".":
        return None, None
    engine, at, code = variant.rpartition("@")
    if at and not code:
        raise ValueError(f"--servers {variant!r}: ENGINE@DIR needs a DIR")
    return engine or None, pathlib.Path(code)


def one_round(
    variant: str,
    work: pathlib.Path,
    *,
    path: str,
    seconds: float,
    factor: float,
    profile: pathlib.Path | None = None,
    server_cpus: set[int] | None = None,
) -> dict[str, Any]:
    """One round of the server `variant` (an entry of --servers: `.`, DIR or ENGINE@DIR) in `work`:
    the figures of the module docstring, latencies in seconds. server_cpus: the CPUs the server's
    processes run on (every thread pinned once it answers); None leaves them to the scheduler."""
    from bench.common import Target, attack, kernel_tcp_counters, kernel_tcp_since, pin

    engine, code = server_of(variant)
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(f"server:\n  engine: {engine}\n" if engine else "{}\n")
    load_before = [round(x, 2) for x in os.getloadavg()]
    proc, url, ca = start(work, code, config=work / "config.yaml")
    try:
        if server_cpus is not None:
            pin(proc.pid, server_cpus)
        body, shed_as = overload_bodies()[path]
        unit = floor(url, ca)
        s = session(ca)
        idle = sorted(t for t in (timed_post(s, url + path, body) for _ in range(200)) if t is not None)
        idle_p50, idle_p99 = statistics.median(idle), percentile(idle, 99)
        from bench.common import cpu_seconds, worker_pid

        pid = worker_pid(proc.pid)
        cpu_per_1000 = {}
        for name, target, payload in (("noop", "/validate/noop", body), ("endpoint", path, body)):
            (work / f"cpu-{name}.json").write_bytes(payload)
            before = cpu_seconds(pid)
            run = attack(
                [Target(url=url + target, body=work / f"cpu-{name}.json")],
                rate=CPU_RATE,
                seconds=CPU_SECONDS,
                workdir=work / f"vegeta-cpu-{name}",
                ca_file=pathlib.Path(ca),
                timeout=10,
                http2=False,
                idle_connections=APISERVER_IDLE_CONNECTIONS,
            )
            cpu_per_1000[name] = round((cpu_seconds(pid) - before) / max(1, run.ok) * 1000, 3)
        from bench.endpoints import children_cpu_seconds

        cpu_at, vegeta_at, wall_at = cpu_seconds(pid), children_cpu_seconds(), time.monotonic()
        cap = capacity(url, ca, work, path, body)
        # the share of a core the worker and vegeta had while the capacity was measured (2 cores
        # shared by both): where the load generator takes more, the worker gets less
        shares = {
            "capacity": {
                "worker": round((cpu_seconds(pid) - cpu_at) / (time.monotonic() - wall_at), 2),
                "vegeta": round((children_cpu_seconds() - vegeta_at) / (time.monotonic() - wall_at), 2),
            }
        }
        offered = round(factor * cap)
        (work / "overload.json").write_bytes(body)
        # the no-load level as the probe sees it: one review every PROBE_PERIOD s costs more than
        # back-to-back ones (the worker and the client wake from idle for each)
        quiet_out, quiet_in = multiprocessing.Pipe(duplex=False)
        quiet = multiprocessing.get_context("fork").Process(target=probe, args=(url, ca, path, body, QUIET_PROBE, quiet_in))
        quiet.start()
        spaced = sorted(lat for _, lat in quiet_out.recv() if lat is not None)
        quiet.join(TIMEOUT + 1)
        spaced_p50 = statistics.median(spaced) if spaced else idle_p50
        receive, send = multiprocessing.Pipe(duplex=False)
        prober = multiprocessing.get_context("fork").Process(target=probe, args=(url, ca, path, body, seconds + AFTER, send))
        before = counters(url, ca)
        kernel_before = kernel_tcp_counters()
        spy = None
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                [
                    shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(int(seconds)),
                    "--rate",
                    "100",
                    "--threads",
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--output",
                    str(profile / f"{work.name}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        probes: list[tuple[float, float | None]] = []
        started = time.monotonic()
        cpu_at, vegeta_at = cpu_seconds(pid), children_cpu_seconds()
        worker_overload: list[float] = []
        prober.start()
        result = attack(
            [Target(url=url + path, body=work / "overload.json")],
            rate=offered,
            seconds=seconds,
            workdir=work / "vegeta",
            ca_file=pathlib.Path(ca),
            keep_bodies=True,
            timeout=10,
            http2=False,
            idle_connections=APISERVER_IDLE_CONNECTIONS,
            # the probe first: decoding vegeta's results takes CPU seconds the server would miss
            before_decoding=lambda: (
                worker_overload.extend((cpu_seconds(pid) - cpu_at, time.monotonic() - started)),
                probes.extend(receive.recv()),
            ),
        )
        ended = started + seconds  # the last review offered; vegeta returns once every answer is in
        shares["overload"] = {
            "worker": round(worker_overload[0] / worker_overload[1], 2) if worker_overload else None,
            "vegeta": round((children_cpu_seconds() - vegeta_at) / worker_overload[1], 2) if worker_overload else None,
        }
        prober.join(TIMEOUT + 1)
        after_counters = counters(url, ca)
        kernel = kernel_tcp_since(kernel_before)
        server = {name.removeprefix("dra_guard_"): after_counters[name] - before.get(name, 0.0) for name in after_counters}
        profiled = None
        if spy is not None and profile is not None:
            spy.wait(30)
            found = profile / f"{work.name}.txt"
            profiled = profile_shares(found.read_text()) if found.exists() else None
        uid = json.loads(body)["request"]["uid"]
        answers = classify(result.codes, result.latencies_ms, result.bodies, uid=uid, shed_as=shed_as)
        threshold = 2 * idle_p50 + 0.001
        slow_after = [
            sent + (latency if latency is not None else TIMEOUT)
            for sent, latency in probes
            if sent + (latency or TIMEOUT) > ended and (latency is None or latency > threshold)
        ]
        after = [latency for sent, latency in probes if sent >= ended]
        windows = []
        for second in range(int(AFTER)):
            window = [lat for sent, lat in probes if ended + second <= sent < ended + second + 1]
            done = [lat for lat in window if lat is not None]
            windows.append(round(statistics.median(done) / unit, 1) if done else None)
        # the first whole second after the end from which every second's probe median is at the
        # no-load level (<= threshold): robust to one probe slowed by a neighbour on the machine
        spaced_threshold = 2 * spaced_p50 + 0.001
        level = [w is not None and w * unit <= spaced_threshold for w in windows]
        settled = next((second for second in range(len(level)) if all(level[second:])), None)
        return {
            "server": variant,
            "load_average_before": load_before,
            "cpus": {"server": sorted(server_cpus), "client": sorted(os.sched_getaffinity(0))} if server_cpus else None,
            "floor_median_s": unit,
            "noload_p50_s": idle_p50,
            "noload_p99_s": idle_p99,
            "noload_p50_x_floor": round(idle_p50 / unit, 2),
            "noload_p99_x_floor": round(idle_p99 / unit, 2),
            "cpu_s_per_1000": cpu_per_1000,
            "capacity_per_s": round(cap, 1),
            "offered_per_s": offered,
            # vegeta short of CPU sends late: then less than --factor x capacity was offered in time
            "offered_behind_schedule_s": round(result.behind_schedule_s(), 3),
            "offered_sent_per_s": round(sent, 1) if (sent := result.sent_per_s()) is not None else None,
            "seconds": seconds,
            "goodput": round(answers["judged_in_time"] / (cap * seconds), 3) if cap else None,
            **answers,
            "recovered_after_s": round(max(slow_after) - ended, 2) if slow_after else 0.0,
            "probes_after_end": len(after),
            "probes_after_end_unanswered": sum(1 for lat in after if lat is None),
            "probe_p50_x_floor_per_second_after_end": windows,
            "probe_noload_p50_x_floor": round(spaced_p50 / unit, 2),
            "p50_recovered_after_s": settled,
            "server_during_overload": server,
            "kernel_tcp_during_overload": kernel,
            "cpu_share_of_a_core": shares,
            # judged in time per CPU second the worker had, against the same at capacity: what the
            # overload costs the worker itself, apart from the CPU the load generator took from it
            "goodput_per_worker_cpu": (
                round(answers["judged_in_time"] / worker_overload[0] / (cap / shares["capacity"]["worker"]), 3)
                if worker_overload and worker_overload[0] and cap and shares["capacity"]["worker"]
                else None
            ),
            **({"profile_shares": profiled} if profiled is not None else {}),
        }
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--servers",
        default=".",
        help="comma-separated servers to measure, each . (this checkout), DIR (another checkout's webhook/ and "
        "certs/) or ENGINE@DIR (an older checkout, run with server.engine ENGINE)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per server")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the overload, seconds")
    parser.add_argument("--factor", type=float, default=2.0, help="offered rate as a multiple of the capacity")
    parser.add_argument("--path", default="/validate/evictions", help="the endpoint offered")
    parser.add_argument("--out", type=pathlib.Path, help="write the figures as JSON here")
    parser.add_argument("--profile", type=pathlib.Path, help="py-spy the worker during each overload into this folder")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="run the server on the first CPU and the load generator on the others (needs 2 or more CPUs)",
    )
    args = parser.parse_args(argv)
    server_cpus = None
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error(f"--pin needs 2 or more CPUs; this process may run on {cpus}")
        server_cpus = {cpus[0]}
        os.sched_setaffinity(0, set(cpus[1:]))  # vegeta and the probe are started from here: they inherit it
    runs = []
    measured_on = machine()
    with tempfile.TemporaryDirectory(prefix="dra-guard-recovery-") as tmp:
        for round_ in range(args.rounds):
            for index, variant in enumerate(args.servers.split(",")):
                engine, code = server_of(variant)
                run = one_round(
                    variant,
                    pathlib.Path(tmp) / f"{engine or (code.name if code else 'here')}{index}-{round_}",
                    path=args.path,
                    seconds=args.seconds,
                    factor=args.factor,
                    profile=args.profile,
                    server_cpus=server_cpus,
                )
                run["machine"] = measured_on
                print(json.dumps(run), flush=True)
                runs.append(run)
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
