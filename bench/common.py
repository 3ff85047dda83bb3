"""What every benchmark shares: the vegeta load generator, /proc readings, the machine, JSON output.

The statistics (percentiles, summaries, spreads) are bench/stats.py.

vegeta (github.com/tsenart/vegeta, built from the Go module proxy on first use into
~/.cache/dra-guard/bin/vegeta) speaks HTTPS with keep-alive, as the kube-apiserver does to a
webhook. `attack()` runs it at a constant rate and returns every request's latency and status.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import io
import json
import math
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.stats import latency_summary

VEGETA_MODULE = "github.com/tsenart/vegeta/v12@v12.12.0"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: where a run writes by default: results are kept per release (bench/RESULTS.md, "Where the
#: results are"); what is measured on main after the last release goes to "unreleased", which the
#: release renames to its version (docs/releasing.md)
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "unreleased"


def cache_dir() -> pathlib.Path:
    """Where built tools are kept: $DRA_GUARD_CACHE or ~/.cache/dra-guard (as tests/e2e/binaries.py)."""
    return pathlib.Path(os.environ.get("DRA_GUARD_CACHE") or pathlib.Path.home() / ".cache" / "dra-guard")


def vegeta() -> str:
    """Path of the vegeta binary, built with `go install` into the cache on first use.

    Raises SystemExit naming the problem when Go is missing.
    """
    folder = cache_dir() / "bin" / "vegeta"
    binary = folder / "vegeta"
    if not binary.exists():
        if shutil.which("go") is None:
            sys.exit("Go is needed to build vegeta (the load generator): install Go 1.22 or newer")
        subprocess.run(["go", "install", VEGETA_MODULE], check=True, env={**os.environ, "GOBIN": str(folder), "CGO_ENABLED": "0"})
    return str(binary)


@dataclasses.dataclass
class Target:
    """One request vegeta sends: method, URL, headers, body file."""

    url: str
    body: pathlib.Path
    headers: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"Content-Type": "application/json"})
    method: str = "POST"

    def render(self) -> str:
        """The target in vegeta's HTTP format."""
        lines = [f"{self.method} {self.url}", *(f"{k}: {v}" for k, v in self.headers.items()), f"@{self.body}"]
        return "\n".join(lines) + "\n"


@dataclasses.dataclass
class Attack:
    """The results of one vegeta attack.

    latencies_ms: per request, in order sent; codes: HTTP status per request (0 = no answer);
    errors: distinct error strings (at most 10); bodies: response bodies (bytes) when asked for;
    rate: requested requests/s; seconds: the attack's duration; throughput: answered 2xx per second;
    sent_s: per request, when vegeta sent it, seconds after the first was sent.
    """

    rate: float
    seconds: float
    latencies_ms: list[float]
    codes: list[int]
    errors: list[str]
    bodies: list[bytes]
    sent_s: list[float] = dataclasses.field(default_factory=list)

    def behind_schedule_s(self) -> float:
        """How far the last requests were sent behind vegeta's schedule (request i at i / rate s), in
        seconds (0.0 when on time or unknown): a load generator short of CPU offers less than asked,
        later, and a figure measured "at 2x" is then not."""
        if not self.sent_s or not self.rate:
            return 0.0
        return max(0.0, max(sent - index / self.rate for index, sent in enumerate(self.sent_s)))

    def sent_per_s(self) -> float | None:
        """The rate vegeta did send at (requests / seconds from the first sent to the last); None
        when unknown."""
        return len(self.sent_s) / max(self.sent_s[-1], 1e-9) if self.sent_s else None

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)

    @property
    def ok(self) -> int:
        return sum(1 for c in self.codes if 200 <= c < 300)

    @property
    def success(self) -> float:
        return self.ok / self.requests if self.requests else 0.0

    def summary(self) -> dict[str, Any]:
        """p50/p99/p99.9/max latency (ms), success ratio and counts, as a JSON-ready dict."""
        return {
            "rate": self.rate,
            "requests": self.requests,
            "success": round(self.success, 5),
            **{k: round(v, 3) for k, v in latency_summary(self.latencies_ms).items()},
            "errors": self.errors,
        }


def attack(
    targets: Sequence[Target],
    *,
    rate: float,
    seconds: float,
    workdir: pathlib.Path,
    ca_file: pathlib.Path | None = None,
    keep_bodies: bool = False,
    timeout: float = 5.0,
    http2: bool = True,
    max_workers: int = 0,
    max_connections: int = 0,
    idle_connections: int = 0,
    before_decoding: Callable[[], None] | None = None,
) -> Attack:
    """Run vegeta at `rate` requests/s for `seconds`, round-robin over `targets`, keep-alive on.

    ca_file: the CA to verify the server with. rate 0 with max_workers N: as fast as N clients
    each waiting for its answer (a closed loop: the server's capacity). max_connections: at most
    this many connections (else a new one whenever none is idle, as Go's and so the apiserver's
    client does). idle_connections: at most this many idle connections kept (vegeta -connections,
    Go's MaxIdleConnsPerHost: a connection answered while as many are idle is closed; 0: vegeta's
    10,000). before_decoding: called once vegeta's attack has ended, before its results are decoded
    (that costs CPU seconds: a measurement still running on the same machine waits for it first).
    Returns an Attack. Raises CalledProcessError when
    vegeta itself fails (not when requests fail: those are in Attack.codes/errors).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    targets_file = workdir / "targets.txt"
    targets_file.write_text("\n".join(t.render() for t in targets))
    results = workdir / "results.bin"
    argv = [
        vegeta(),
        "attack",
        f"-rate={rate:g}/s",
        f"-duration={seconds:g}s",
        f"-targets={targets_file}",
        "-keepalive=true",
        f"-timeout={timeout:g}s",
        f"-output={results}",
        f"-http2={str(http2).lower()}",
        "-max-body=-1" if keep_bodies else "-max-body=0",
    ]
    if max_workers:
        argv += [f"-workers={max_workers}", f"-max-workers={max_workers}"]
    if max_connections:
        argv.append(f"-max-connections={max_connections}")
    if idle_connections:
        argv.append(f"-connections={idle_connections}")
    if ca_file is not None:
        argv.append(f"-root-certs={ca_file}")
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    if before_decoding is not None:
        before_decoding()
    encoded = subprocess.run([vegeta(), "encode", "--to=csv", str(results)], check=True, capture_output=True).stdout
    latencies, codes, errors, bodies, sent = [], [], [], [], []
    rows = sorted(csv.reader(io.StringIO(encoded.decode())), key=lambda r: int(r[8]))  # by sequence number
    first = int(rows[0][0]) if rows else 0  # unix nanoseconds
    for row in rows:
        sent.append((int(row[0]) - first) / 1e9)
        codes.append(int(row[1]))
        latencies.append(int(row[2]) / 1e6)
        if row[5] and row[5] not in errors and len(errors) < 10:
            errors.append(row[5])
        if keep_bodies:
            bodies.append(base64.b64decode(row[6]))
    results.unlink()
    return Attack(rate=rate, seconds=seconds, latencies_ms=latencies, codes=codes, errors=errors, bodies=bodies, sent_s=sent)


def scrape_metrics(url: str, ca_file: pathlib.Path | str, *, timeout: float = 10.0, retry_for: float = 5.0) -> str:
    """GET `url`/metrics of a dra-guard server over TLS (its CA in `ca_file`): the Prometheus text.

    The event-loop front resets a new connection to the webhook port while its worker is overloaded
    and for 1 s after (docs/reliability.md), and the benchmarks' servers have no probe port: the
    first scrape right after a load run can meet that reset. A reset or refused connection is tried
    again every 0.2 s for `retry_for` seconds, as Prometheus' next scrape would; then its
    requests.ConnectionError is raised. Other errors (a timeout, a non-2xx answer) are raised at once.
    """
    import requests

    deadline = time.monotonic() + retry_for
    with requests.Session() as sess:
        sess.trust_env = False
        while True:
            try:
                resp = sess.get(url + "/metrics", verify=str(ca_file), timeout=timeout)
                resp.raise_for_status()
                return resp.text
            except requests.ConnectionError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat fields 14 and 15)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def proc_status(pid: int) -> dict[str, int]:
    """RSS and peak RSS (bytes), threads and open fds of a process, from /proc."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
        "peak_rss_bytes": int(fields["VmHWM"].split()[0]) * 1024,
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def cpu_snapshot() -> dict[int, tuple[str, float]]:
    """Every process's name (comm) and CPU seconds so far (user + system), from /proc; and, under
    negative keys, the machine's idle and steal seconds (all CPUs: /proc/stat) and this process's
    reaped children's CPU seconds (the load generator's runs that have ended)."""
    tick = os.sysconf("SC_CLK_TCK")
    machine_line = pathlib.Path("/proc/stat").read_text().splitlines()[0].split()
    times = os.times()
    out = {
        -1: ("machine idle", int(machine_line[4]) / tick),
        -2: ("machine steal", int(machine_line[8]) / tick),
        -3: ("ended children of the bench (vegeta)", times.children_user + times.children_system),
    }
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = pathlib.Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            comm, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
            out[int(entry)] = (comm, (int(rest[11]) + int(rest[12])) / tick)
    return out


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of process `pid` so far (/proc):
    threads that wait on one another (the GIL, locks, queues) switch more per unit of work."""
    total = 0
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
    return total


def cpu_used(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], names: dict[int, str] | None = None, top: int = 6
) -> dict[str, float]:
    """CPU seconds each process used between two cpu_snapshot()s (processes alive at both), summed
    by name (`names` overrides comm for given pids), the `top` largest first; then the machine's
    idle and steal seconds and the bench's ended children's CPU seconds over the same window."""
    used: dict[str, float] = {}
    for pid, (comm, seconds) in after.items():
        if pid in before and pid >= 0:
            label = (names or {}).get(pid, comm)
            used[label] = used.get(label, 0.0) + seconds - before[pid][1]
    machine = {comm: round(seconds - before[pid][1], 1) for pid, (comm, seconds) in after.items() if pid < 0}
    return {**{k: round(v, 1) for k, v in sorted(used.items(), key=lambda kv: -kv[1])[:top] if v > 0}, **machine}


#: machine-wide TCP counters (Linux /proc/net/netstat, TcpExt) that show connections waiting unseen:
#: SYNs dropped because a listen socket's accept queue was full, and the clients' SYN retries
KERNEL_TCP_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPSynRetrans")


def kernel_tcp_counters(text: str | None = None) -> dict[str, int]:
    """KERNEL_TCP_COUNTERS from /proc/net/netstat (or its `text`): name -> value since boot; {} where
    unreadable. Machine-wide: take differences over a window in which nothing else runs."""
    if text is None:
        try:
            text = pathlib.Path("/proc/net/netstat").read_text()
        except OSError:
            return {}
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return {name: int(table[name]) for name in KERNEL_TCP_COUNTERS if name in table}
    return {}


def kernel_tcp_since(before: Mapping[str, int]) -> dict[str, int]:
    """KERNEL_TCP_COUNTERS now minus `before` (an earlier kernel_tcp_counters())."""
    return {name: value - before.get(name, 0) for name, value in kernel_tcp_counters().items()}


def worker_pid(master: int) -> int:
    """The first child of a gunicorn master: its (only, with workers=1) worker."""
    children = pathlib.Path(f"/proc/{master}/task/{master}/children").read_text().split()
    if not children:
        raise RuntimeError(f"gunicorn master {master} has no worker")
    return int(children[0])


def pin(pid: int, cpus: set[int]) -> list[int]:
    """Restrict every thread of process `pid` and of its descendants to `cpus` (sched_setaffinity
    per thread: Linux applies an affinity to one thread; threads and processes started later
    inherit it from the one that starts them). Returns the pids pinned. Raises OSError when the
    kernel refuses (a CPU not in this machine's set)."""
    pinned, pending = [], [pid]
    while pending:
        current = pending.pop()
        for task in pathlib.Path(f"/proc/{current}/task").iterdir():
            os.sched_setaffinity(int(task.name), cpus)
            children = (task / "children").read_text().split()
            pending.extend(int(child) for child in children)
        pinned.append(current)
    return pinned


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU model and count, memory, kernel, Python."""
    cpu = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = int(
            next(line for line in pathlib.Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")).split()[
                1
            ]
        )
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def write_json(path: pathlib.Path, data: Any) -> None:
    """Write `data` as indented JSON (NaN as null) to path, creating folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(data), indent=2) + "\n")


def _nan_to_none(data: Any) -> Any:
    if isinstance(data, float) and math.isnan(data):
        return None
    if isinstance(data, dict):
        return {k: _nan_to_none(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_nan_to_none(v) for v in data]
    return data
