"""Each admission endpoint of a real `dra-guard serve`, driven by vegeta, caches filled from a real apiserver.

For every endpoint (and the no-op floor /validate/noop in the same server) `measure()` records:
p50/p99/p99.9 at fixed rates (500 and 1,000 requests/s by default), the highest rate whose p99
stays <= 10 ms with every request answered 2xx (a step-up search, then bisection), CPU seconds
per 1,000 reviews (the gunicorn worker's user+system time over the fixed-rate runs), and whether
each answer is the one expected (a mix of allowed and refused reviews per endpoint, checked on
every response of one run). `server_figures()` adds the worker's peak RSS, the cache sync time
and the API requests dra-guard made while under load (read from the apiserver's audit log).

The bodies are the AdmissionReviews the kube-apiserver sends, naming objects that exist in the
filled cluster (bench/fill.py): a binding of an ordinary ClusterRole, a binding of the
ResourceSlice writer to a team (refused), a RoleBinding, a new ordinary ClusterRole; a driver
DaemonSet without a probe (patched) and an ordinary DaemonSet; the eviction of a driver pod
whose node holds claims (refused, 429), of an ordinary pod, and of a driver pod on a node whose
claims are gone.
"""

from __future__ import annotations

import collections
import json
import math
import os
import pathlib
import resource
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from bench import fill
from bench.common import Attack, Target, attack, cpu_seconds, proc_status, worker_pid

#: policy endpoint path -> short name used in the results
ENDPOINTS = {"/validate/rbac": "rbac", "/mutate/daemonsets": "daemonsets", "/validate/evictions": "evictions"}
P99_LIMIT_MS = 10.0
SLOW_MS = 5.0  # a review slower than this counts in a run's tail evidence (tail_evidence)
#: seconds of rest after an overloading throughput search, before the next endpoint's floor run
#: (without it the floor's first p99 carried the previous search's backlog: 50-600 ms)
SETTLE_SECONDS = 10.0


def _review(request: dict[str, Any]) -> dict[str, Any]:
    request = {
        "uid": str(uuid.uuid4()),
        "userInfo": {"username": "alice", "groups": ["team-a", "system:authenticated"]},
        "dryRun": False,
        **request,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _rbac_request(obj: dict[str, Any], plural: str) -> dict[str, Any]:
    gvk = {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": obj["kind"]}
    gvr = {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": plural}
    return {
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "operation": "CREATE",
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"].get("namespace", ""),
        "object": obj,
    }


def rbac_bodies(scale: fill.Scale) -> list[tuple[dict[str, Any], bool]]:
    """(AdmissionReview, expected allowed) for the RBAC endpoint: 3 allowed, 1 refused."""
    # a role with read-only rules (index divisible by 4): since issue 16 cluster-wide write on Jobs,
    # Deployments or Services is an escalation power, refused like DRA write
    ordinary = fill.cluster_role_binding(scale.roles // 2 // 4 * 4)
    ordinary["metadata"] = {"name": "bench-new-binding"}
    writer = fill.cluster_role_binding(1)
    writer["metadata"] = {"name": "bench-team-slices"}
    writer["subjects"] = [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}]
    writer["roleRef"]["name"] = fill.SLICE_WRITER_ROLE
    role_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "bench-rolebinding", "namespace": fill.WORK_NAMESPACE},
        "subjects": [{"kind": "Group", "name": "team-b", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench-role-00007"},
    }
    role = fill.cluster_role(3)
    role["metadata"] = {"name": "bench-new-role"}
    return [
        (_review(_rbac_request(ordinary, "clusterrolebindings")), True),
        (_review(_rbac_request(writer, "clusterrolebindings")), False),
        (_review(_rbac_request(role_binding, "rolebindings")), True),
        (_review(_rbac_request(role, "clusterroles")), True),
    ]


def daemonset_bodies() -> list[tuple[dict[str, Any], bool]]:
    """(AdmissionReview, expected allowed) for the DaemonSet endpoint: a driver without a probe
    (allowed with a patch) and an ordinary DaemonSet (allowed, no patch)."""
    gvk = {"group": "apps", "version": "v1", "kind": "DaemonSet"}
    gvr = {"group": "apps", "version": "v1", "resource": "daemonsets"}
    driver = fill.driver_daemonset()
    driver["metadata"]["name"] = "gpu-driver-v2"
    plain = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "node-exporter", "namespace": "monitoring"},
        "spec": {
            "selector": {"matchLabels": {"app": "node-exporter"}},
            "template": {
                "metadata": {"labels": {"app": "node-exporter"}},
                "spec": {
                    "containers": [
                        {
                            "name": "exporter",
                            "image": "quay.io/prometheus/node-exporter:v1.8.2",
                            "ports": [{"containerPort": 9100}],
                        }
                    ]
                },
            },
        },
    }
    out = []
    for obj in (driver, plain):
        out.append(
            (
                _review(
                    {
                        "kind": gvk,
                        "resource": gvr,
                        "requestKind": gvk,
                        "requestResource": gvr,
                        "operation": "CREATE",
                        "name": obj["metadata"]["name"],
                        "namespace": obj["metadata"]["namespace"],
                        "object": obj,
                    }
                ),
                True,
            )
        )
    return out


def eviction_bodies(scale: fill.Scale) -> list[tuple[dict[str, Any], bool]]:
    """(AdmissionReview, expected allowed) for the eviction endpoint: the driver pod of a node
    holding claims (refused), an ordinary pod, and a driver pod on a node without claims when
    there are more nodes than claims (else a second held driver pod)."""

    def request(namespace: str, name: str) -> dict[str, Any]:
        return {
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "name": name,
            "namespace": namespace,
            "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}},
        }

    held = fill.driver_pod_name(scale.nodes // 3)
    free = scale.claims < scale.nodes
    other = fill.driver_pod_name(scale.nodes - 1)
    return [
        (_review(request(fill.DRIVER_NAMESPACE, held)), False),
        (_review(request(fill.WORK_NAMESPACE, "web-7d9f8-abcde")), True),
        (_review(request(fill.DRIVER_NAMESPACE, other)), free),
    ]


def bodies(scale: fill.Scale) -> dict[str, list[tuple[dict[str, Any], bool]]]:
    """policy endpoint path -> [(AdmissionReview dict, expected allowed)]."""
    return {
        "/validate/rbac": rbac_bodies(scale),
        "/mutate/daemonsets": daemonset_bodies(),
        "/validate/evictions": eviction_bodies(scale),
    }


def as_floor(reviews: list[tuple[dict[str, Any], bool]]) -> list[tuple[dict[str, Any], bool]]:
    """The same bodies for /validate/noop, which allows every one."""
    return [(body, True) for body, _ in reviews]


def targets(url: str, path: str, reviews: list[tuple[dict[str, Any], bool]], folder: pathlib.Path) -> list[Target]:
    """vegeta targets, one body file per review."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (body, _) in enumerate(reviews):
        file = folder / f"{path.strip('/').replace('/', '-')}-{i}.json"
        file.write_text(json.dumps(body))
        out.append(Target(url=url + path, body=file))
    return out


def check_answers(result: Attack, reviews: list[tuple[dict[str, Any], bool]]) -> dict[str, Any]:
    """Compare every response body with the expected decision of its review (found by the
    request uid the answer echoes).

    Returns {"checked", "wrong", "example"}: wrong counts answers whose `allowed` differs, and
    answers that are not AdmissionReviews of a known uid.
    """
    expected = {body["request"]["uid"]: allowed for body, allowed in reviews}
    wrong, example = 0, None
    for body in result.bodies:
        try:
            response = json.loads(body)["response"]
            ok = response["allowed"] is expected[response["uid"]]
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            wrong += 1
            example = example or body[:300].decode(errors="replace")
    return {"checked": len(result.bodies), "wrong": wrong, "example": example}


class Server:
    """The dra-guard process under test: its worker pid and CPU readings."""

    def __init__(self, master_pid: int, url: str, ca_file: pathlib.Path) -> None:
        self.master = master_pid
        self.worker = worker_pid(master_pid)
        self.url = url
        self.ca_file = ca_file

    def cpu(self) -> float:
        """CPU seconds of the worker and the master so far."""
        return cpu_seconds(self.worker) + cpu_seconds(self.master)

    def metrics_text(self) -> str:
        """GET /metrics on a new connection, again while it is reset: a worker overloaded within
        the last second resets new connections to the webhook port (webhook.serve.front.listeners)."""
        import requests

        for attempt in range(20):
            try:
                with requests.Session() as sess:
                    sess.trust_env = False
                    return sess.get(self.url + "/metrics", verify=str(self.ca_file), timeout=10).text
            except requests.ConnectionError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def gc_pauses(self) -> tuple[float, float, float]:
        """The worker's cyclic garbage collections so far: (count, seconds in all, count over 5 ms),
        from dra_guard_gc_pause_seconds on /metrics; zeros when the server does not expose it."""

        from tests.scrape import metric

        text = self.metrics_text()
        count = metric(text, "dra_guard_gc_pause_seconds_count", default=0.0)
        within = metric(text, 'dra_guard_gc_pause_seconds_bucket{le="0.005"}', default=0.0)
        return count, metric(text, "dra_guard_gc_pause_seconds_sum", default=0.0), count - within

    def gc_collections(self) -> dict[str, float]:
        """The worker's garbage collections so far by generation (python_gc_collections_total,
        prometheus-client's default collector, from /metrics)."""

        text = self.metrics_text()
        out = {}
        for line in text.splitlines():
            if line.startswith("python_gc_collections_total{"):
                gen = line.split('generation="', 1)[1].split('"', 1)[0]
                out[gen] = float(line.rsplit(" ", 1)[1])
        return out


def run_rate(
    server: Server,
    path: str,
    reviews: list[tuple[dict[str, Any], bool]],
    *,
    rate: float,
    seconds: float,
    workdir: pathlib.Path,
    check: bool = False,
) -> dict[str, Any]:
    """One constant-rate attack on `path`: latency summary, CPU s per 1,000 reviews, answers checked,
    and what explains a tail (`tail`: tail_evidence())."""
    tgts = targets(server.url, path, reviews, workdir / "bodies")
    gc_before = server.gc_pauses()
    children_before, load_before = children_cpu_seconds(), os.getloadavg()[0]
    cpu_before = server.cpu()
    result = attack(tgts, rate=rate, seconds=seconds, workdir=workdir, ca_file=server.ca_file, keep_bodies=check)
    cpu_used = server.cpu() - cpu_before
    vegeta_used = children_cpu_seconds() - children_before
    gc_after = server.gc_pauses()
    out = result.summary()
    out["cpu_s_per_1000"] = round(cpu_used / max(result.requests, 1) * 1000, 4)
    out["tail"] = tail_evidence(result.latencies_ms, rate)
    out["tail"].update(
        worker_cpu_s=round(cpu_used, 2),
        vegeta_cpu_s=round(vegeta_used, 2),
        gc_collections=int(gc_after[0] - gc_before[0]),
        gc_pause_ms=round((gc_after[1] - gc_before[1]) * 1000, 1),
        gc_over_5ms=int(gc_after[2] - gc_before[2]),
        # the machine's 1-minute load average: other processes (the apiserver, other sessions)
        # wanting its cores; /proc/stat is not trusted here (it counts fewer busy seconds than
        # this run's own processes used on this machine)
        load_average_before=round(load_before, 2),
        load_average_after=round(os.getloadavg()[0], 2),
    )
    status = proc_status(server.worker)
    out["rss_mib"] = round(status["rss_bytes"] / 2**20, 1)
    out["peak_rss_mib"] = round(status["peak_rss_bytes"] / 2**20, 1)
    out["throughput"] = round(result.ok / seconds, 1)
    if check:
        out["answers"] = check_answers(result, reviews)
    return out


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's waited-for children (vegeta runs) so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tail_evidence(latencies_ms: list[float], rate: float, slow_ms: float = SLOW_MS) -> dict[str, Any]:
    """Where the slow requests of a constant-rate run were: `slow` (over `slow_ms` ms), the
    1-second windows of sending that held any (`slow_seconds`, of `seconds`), and the share of them
    in the worst 100 ms window (`slow_in_worst_100ms`). A stall of the worker (a collection, the
    machine's cores taken by another process) puts most in one window; queueing at a high load
    spreads them over many. Request i was sent at i / rate s (vegeta's constant pacing)."""
    slow = [i for i, ms in enumerate(latencies_ms) if ms > slow_ms]
    windows = collections.Counter(int(i / rate * 10) for i in slow)
    return {
        "slow_ms": slow_ms,
        "slow": len(slow),
        "slow_seconds": len({int(i / rate) for i in slow}),
        "seconds": math.ceil(len(latencies_ms) / rate) if rate else 0,
        "slow_in_worst_100ms": round(max(windows.values()) / len(slow), 3) if slow else 0.0,
    }


def passes(run: Mapping[str, Any], rate: float) -> bool:
    """Whether a run at `rate` held: every request 2xx, p99 <= 10 ms, and vegeta kept the rate."""
    return run["success"] == 1.0 and run["p99"] <= P99_LIMIT_MS and run["throughput"] >= 0.95 * rate


def max_throughput(
    server: Server,
    path: str,
    reviews: list[tuple[dict[str, Any], bool]],
    *,
    workdir: pathlib.Path,
    seconds: float,
    start: float = 500,
    step: float = 500,
    limit: float = 6000,
    bisect_steps: int = 2,
) -> dict[str, Any]:
    """The highest constant rate (requests/s) at which `passes()` holds: step up from `start` by
    `step` until a rate fails (or `limit`), then bisect `bisect_steps` times between the last good
    and the first bad rate. A rate fails when two runs in a row miss (one stall on a shared
    machine is not the capacity; the fixed-rate runs report such tails). Returns {"max_rps",
    "p99_at_max", "tried": [(rate, p99, success)]}."""
    tried = []

    def holds(rate: float) -> dict[str, Any] | None:
        for _ in range(2):
            run = run_rate(server, path, reviews, rate=rate, seconds=seconds, workdir=workdir)
            tried.append((rate, run["p99"], run["success"]))
            if passes(run, rate):
                return run
            time.sleep(1)  # let the backlog drain before the second try
        return None

    good, bad, good_run = 0.0, None, None
    rate = start
    while rate <= limit:
        run = holds(rate)
        if run is None:
            bad = rate
            break
        good, good_run = rate, run
        rate += step
    for _ in range(bisect_steps if bad is not None else 0):
        mid = round((good + bad) / 2 / 50) * 50
        if mid in (good, bad):
            break
        run = holds(mid)
        if run is not None:
            good, good_run = mid, run
        else:
            bad = mid
    return {"max_rps": good, "p99_at_max": good_run["p99"] if good_run else None, "tried": tried}


def measure(
    server: Server,
    scale: fill.Scale,
    *,
    workdir: pathlib.Path,
    rates: tuple[float, ...] = (500, 1000),
    seconds: float = 15,
    search_seconds: float = 8,
    search: bool = True,
    warmup_seconds: float = 2,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every policy endpoint at every rate (after a `warmup_seconds` run at 200/s that is not
    counted), each run right after the floor (/validate/noop with
    the same bodies, so the ratio compares the same bytes), then the throughput search (the floor's
    with the RBAC bodies). Returns {endpoint name: {"rates": {rate: run}, "floor": {rate: run},
    "answers": ..., "max": ...}, "noop": {"max": ...}} with runs as run_rate() returns them."""
    out: dict[str, Any] = {}
    for path, reviews in bodies(scale).items():
        name = ENDPOINTS[path]
        floor_reviews = as_floor(reviews)
        run_rate(server, path, reviews, rate=200, seconds=warmup_seconds, workdir=workdir / name)  # warm-up: connections, caches
        figures: dict[str, Any] = {"rates": {}, "floor": {}}
        for i, rate in enumerate(rates):
            floor = run_rate(server, "/validate/noop", floor_reviews, rate=rate, seconds=seconds, workdir=workdir / name)
            figures["floor"][str(int(rate))] = floor
            run = run_rate(server, path, reviews, rate=rate, seconds=seconds, workdir=workdir / name, check=i == 0)
            figures["rates"][str(int(rate))] = run
            log(
                f"    {name:10} {rate:>5.0f}/s  p50 {run['p50']:.2f}  p99 {run['p99']:.2f}  p99.9 {run['p99.9']:.2f} ms"
                f"  ok {run['success']:.4f}  cpu {run['cpu_s_per_1000']:.3f} s/1000"
                f"  (floor p50 {floor['p50']:.2f}  p99 {floor['p99']:.2f} ms)"
            )
            if "answers" in run:
                figures["answers"] = run.pop("answers")
        figures["peak_rss_mib_steady"] = round(proc_status(server.worker)["peak_rss_bytes"] / 2**20, 1)
        if search:
            figures["max"] = max_throughput(server, path, reviews, workdir=workdir / name, seconds=search_seconds)
            log(f"    {name:10} max {figures['max']['max_rps']:.0f}/s with p99 <= {P99_LIMIT_MS:g} ms")
            time.sleep(SETTLE_SECONDS)  # the search ends overloaded: let its backlog and connections go
        out[name] = figures
    if search:
        floor_reviews = as_floor(bodies(scale)["/validate/rbac"])
        out["noop"] = {
            "max": max_throughput(server, "/validate/noop", floor_reviews, workdir=workdir / "noop", seconds=search_seconds)
        }
        log(f"    {'noop':10} max {out['noop']['max']['max_rps']:.0f}/s with p99 <= {P99_LIMIT_MS:g} ms")
    return out


def server_figures(server: Server) -> dict[str, Any]:
    """The worker's RSS now and at peak (MiB), threads, fds."""
    status = proc_status(server.worker)
    return {
        "rss_mib": round(status["rss_bytes"] / 2**20, 1),
        "peak_rss_mib": round(status["peak_rss_bytes"] / 2**20, 1),
        "threads": status["threads"],
        "fds": status["fds"],
    }


def sync_seconds(log_text: str) -> dict[str, Any]:
    """Per cache {objects, seconds} from the server log's "cache synced" lines (the last per cache)."""
    out: dict[str, Any] = {}
    for line in log_text.splitlines():
        if line.startswith("{") and '"cache synced"' in line:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            out[entry["cache"]] = {"objects": entry["objects"], "seconds": entry["seconds"]}
    return out


def api_requests(audit_events: list[dict[str, Any]], since: str) -> dict[str, int]:
    """Count requests ("verb resource" -> n, e.g. "watch pods", "get leases") in audit events
    (ResponseComplete or ResponseStarted, one per request) received at or after `since` (RFC 3339
    micro time, as the audit log writes it)."""
    seen: dict[str, str] = {}
    for event in audit_events:
        if event.get("requestReceivedTimestamp", "") >= since:
            resource = (event.get("objectRef") or {}).get("resource") or event.get("requestURI", "?").split("?")[0]
            seen[event["auditID"]] = f"{event.get('verb', '?')} {resource}"
    counts: dict[str, int] = {}
    for key in seen.values():
        counts[key] = counts.get(key, 0) + 1
    return counts


def per_review_requests(counts: Mapping[str, int]) -> int:
    """Requests in `counts` (api_requests()) that a review could have caused: everything but
    watches (renewed by the informers on their own), Leases (the periodic audit's and the
    certificate writer's coordination) and APIServices (the check that the API is the real one),
    each on their own clocks."""
    return sum(n for key, n in counts.items() if not key.startswith("watch ") and not key.endswith((" leases", " apiservices")))


def profile(
    server: Server,
    scale: fill.Scale,
    *,
    out_dir: pathlib.Path,
    workdir: pathlib.Path,
    rate: float = 500,
    seconds: float = 12,
    log: Callable[[str], None] = print,
) -> dict[str, str]:
    """Sample the worker with py-spy (only while it holds the GIL, so CPU, not waiting) during one
    run of each endpoint and its floor at `rate`. Writes <name>.svg (flame graph) and <name>.txt
    (collapsed stacks) per run into out_dir; returns {run name: svg path}. Raises SystemExit when
    py-spy is missing (pip install -e '.[bench]')."""
    import shutil
    import subprocess

    if shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy: pip install -e '.[bench]'")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for path, reviews in bodies(scale).items():
        name = ENDPOINTS[path]
        for target, rv, label in ((path, reviews, name), ("/validate/noop", as_floor(reviews), f"{name}-floor")):
            run_rate(server, target, rv, rate=200, seconds=2, workdir=workdir / label)
            for fmt, suffix in (("flamegraph", "svg"), ("raw", "txt")):
                spy = subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "--pid",
                        str(server.worker),
                        "--duration",
                        f"{seconds:g}",
                        "--rate",
                        "200",
                        "--gil",
                        "--nonblocking",
                        "--format",
                        fmt,
                        "--output",
                        str(out_dir / f"profile-{label}.{suffix}"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                run_rate(server, target, rv, rate=rate, seconds=seconds, workdir=workdir / label)
                spy.wait()
            written[label] = str(out_dir / f"profile-{label}.svg")
            log(f"    profiled {label}: {written[label]}")
    return written


def protected_role_bodies() -> list[tuple[dict[str, Any], bool]]:
    """A new ClusterRole that grants ResourceSlice write (bound to nobody yet: allowed). The RBAC
    guard reads every ClusterRoleBinding from the API before judging such a role (a binding created
    a moment earlier may not have reached its watch), at most once per
    cluster.bindingRefreshIntervalSeconds: the one review that makes API requests."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "bench-new-slice-writer"},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create", "update", "delete"]}],
    }
    return [(_review(_rbac_request(role, "clusterroles")), True)]


def measure_protected_role(
    server: Server,
    *,
    audit_events: Callable[[], list[dict[str, Any]]],
    workdir: pathlib.Path,
    rate: float = 2,
    seconds: float = 10,
) -> dict[str, Any]:
    """The rare RBAC review that reads the API: latency at a low `rate`, and the API requests it
    made per review (from the audit log, via `audit_events()`, dra-guard's events)."""
    import datetime

    reviews = protected_role_bodies()
    since = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    run = run_rate(server, "/validate/rbac", reviews, rate=rate, seconds=seconds, workdir=workdir, check=True)
    time.sleep(1.5)  # the audit backend writes the last events
    calls = api_requests(audit_events(), since)
    run["api_requests"] = calls
    run["api_requests_per_review"] = round(per_review_requests(calls) / max(run["requests"], 1), 2)
    return run
