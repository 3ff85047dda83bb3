"""Scale scenario of issue 9 (c): the scheduler with and without dra-guard registered.

The source page's DRA scale test on a real control plane (tests/e2e/cluster.py: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler, both controllers with
``--kube-api-qps=75 --kube-api-burst=150``; no kubelet, so pods are bound but never run):

* 100 fake Nodes, one ResourceSlice each (driver gpu.example.com, 8 devices: 800 in all), a
  DeviceClass, a ResourceClaimTemplate, and a DRA driver DaemonSet (namespace dra-system) whose
  pods land on every node;
* 720 long-lived pods, then 80 short-lived pods churned 10 times (create 80, wait until bound,
  delete them with gracePeriodSeconds=0, wait until they and their claims are gone), every pod
  with a ResourceClaim from the template, created at 10 pods/s (paced on a monotonic clock).

Each variant runs on a fresh control plane; "with" starts `dra-guard serve` (enforce mode) and
registers it through the chart's webhook configurations before the DaemonSet and the pods are
created. Measured per run: the scheduler SLI (``scheduler_pod_scheduling_sli_duration_seconds``,
p50/p99 from the bucket deltas over the workload, linear interpolation inside a bucket as
Prometheus' histogram_quantile does), pod start-up as far as it exists without a kubelet (client
create call -> watch event with spec.nodeName set; also -> claim created by kcm and -> claim
allocated by the scheduler), wall time, pods left unscheduled, CPU seconds per component, and with
dra-guard its API requests (audit log, by verb) and peak RSS.

    python -m bench scale --repeats 1 --out bench/results/unreleased/scale.json
    python -m bench scale --nodes 10 --long-lived 40 --churned 10 --rounds 2 --out /tmp/scale-smoke.json

Target (issue 9): scheduler SLI p99 with dra-guard / without <= 1.05. Exit code 0 when every run
completed with all pods bound, 1 otherwise (the ratio is a figure, not a pass/fail criterion).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import requests
import urllib3

from bench import common, stats

REPO = pathlib.Path(__file__).resolve().parents[1]

SLI_METRIC = "scheduler_pod_scheduling_sli_duration_seconds"
ATTEMPTS_METRIC = "scheduler_schedule_attempts_total"
DRIVER = "gpu.example.com"
DEVICE_CLASS = "scale-gpu"
NAMESPACE = "scale"
DRIVER_NAMESPACE = "dra-system"
DRIVER_DS = "gpu-driver"
DEVICES_PER_NODE = 8
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


# ---------------------------------------------------------------------- pure helpers


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: [(metric name, {label: value}, value)].

    Comments and lines that do not parse are skipped; "+Inf"/"-Inf"/"NaN" become floats.
    """
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2) or "")}
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), labels, value))
    return out


def histogram(samples: Iterable[tuple[str, dict[str, str], float]], name: str) -> dict[str, Any]:
    """One histogram from parse_prometheus() samples, summed over its other labels (e.g. the SLI's
    ``attempts``): {"buckets": {upper bound (float, inf for +Inf): cumulative count}, "sum": s, "count": n}.
    Empty buckets and zeros when the metric is absent (the scheduler only exports it once observed)."""
    buckets: dict[float, float] = collections.defaultdict(float)
    total = count = 0.0
    for metric, labels, value in samples:
        if metric == f"{name}_bucket":
            buckets[float(labels["le"])] += value
        elif metric == f"{name}_sum":
            total += value
        elif metric == f"{name}_count":
            count += value
    return {"buckets": dict(sorted(buckets.items())), "sum": total, "count": count}


def counter_by(samples: Iterable[tuple[str, dict[str, str], float]], name: str, label: str) -> dict[str, float]:
    """A counter's values summed by one label: {label value: total}."""
    out: dict[str, float] = collections.defaultdict(float)
    for metric, labels, value in samples:
        if metric == name:
            out[labels.get(label, "")] += value
    return dict(out)


def histogram_delta(after: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """after - before for two histogram() results of the same process (bucket by bucket)."""
    bounds = sorted(set(after["buckets"]) | set(before["buckets"]))
    return {
        "buckets": {b: after["buckets"].get(b, 0.0) - before["buckets"].get(b, 0.0) for b in bounds},
        "sum": after["sum"] - before["sum"],
        "count": after["count"] - before["count"],
    }


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile (q in [0, 1]) of a cumulative histogram {upper bound: count}, like
    Prometheus' histogram_quantile(): find the bucket holding rank q*total and interpolate linearly
    between its lower bound (the previous bucket's upper bound, 0 for the first) and its upper bound.
    A rank in the +Inf bucket returns the highest finite bound. None when the histogram is empty.
    The result is in the unit of the bounds (seconds for the scheduler SLI)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    items = sorted(buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    total = items[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in items:
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        if not math.isinf(bound):
            prev_bound = bound
        prev_count = count
    return prev_bound


class Pacer:
    """Paces calls at `rate` per second on an absolute schedule: call i is due at start + i/rate
    (start = the clock at the first wait()), so slow calls do not make the schedule drift; a late
    caller is not made to sleep and catches up.

    wait() sleeps until the next call is due and returns how late (seconds, >= 0) it was.
    `clock`/`sleep` are injectable for tests.
    """

    def __init__(
        self, rate: float, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate = rate
        self.clock = clock
        self.sleep = sleep
        self.start: float | None = None
        self.calls = 0

    def due(self, i: int) -> float:
        """Clock time at which call i (0-based) is due; needs start (set by the first wait())."""
        assert self.start is not None
        return self.start + i / self.rate

    def wait(self) -> float:
        now = self.clock()
        if self.start is None:
            self.start = now
        target = self.due(self.calls)
        self.calls += 1
        if now < target:
            self.sleep(target - now)
            return 0.0
        return now - target


# ---------------------------------------------------------------------- manifests


def resource_slice(node: str, devices: int = DEVICES_PER_NODE) -> dict[str, Any]:
    """A ResourceSlice publishing `devices` devices of DRIVER on `node` (its own pool)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
        },
    }


def workload_pod(name: str, kind: str, round_: int | None = None) -> dict[str, Any]:
    """A pod with one ResourceClaim from the template "gpu", tolerating every taint."""
    from tests.e2e.cluster import TOLERATE_ALL

    labels = {"app": "scale", "kind": kind}
    if round_ is not None:
        labels["round"] = str(round_)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "tolerations": TOLERATE_ALL,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [{"name": "c", "image": "registry.example/app:v1", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def cluster_objects() -> list[dict[str, Any]]:
    """DeviceClass, the workload and driver namespaces, the ResourceClaimTemplate, the driver's ServiceAccount."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "driver", "namespace": DRIVER_NAMESPACE}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpu", "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}},
        },
    ]


def driver_ds() -> dict[str, Any]:
    """The DRA driver DaemonSet (dra-example-driver's shape) in DRIVER_NAMESPACE, ServiceAccount
    "driver" (a driver subject in tests.e2e.guard's config), tolerating every taint."""
    from tests.builders import driver_daemonset
    from tests.e2e.cluster import TOLERATE_ALL

    ds = driver_daemonset(name=DRIVER_DS, namespace=DRIVER_NAMESPACE, sa="driver")
    ds["spec"]["template"]["spec"]["tolerations"] = TOLERATE_ALL
    return ds


# ---------------------------------------------------------------------- watching


class Tracker:
    """Times (time.monotonic(), seconds) of what happens to the workload's pods and claims, fed by
    two watches on NAMESPACE and by the creator. All access under `cond`."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        #: pod name -> {"created", "create_request", "bound", "node", "deleted"}
        self.pods: dict[str, dict[str, Any]] = {}
        #: claim name -> {"pod", "added", "allocated", "deleted"}
        self.claims: dict[str, dict[str, Any]] = {}
        self.watch_restarts = collections.Counter()

    def creating(self, name: str, t: float) -> None:
        with self.cond:
            self.pods.setdefault(name, {})["created"] = t

    def created(self, name: str, request_seconds: float) -> None:
        with self.cond:
            self.pods.setdefault(name, {})["create_request"] = request_seconds

    def on_pod(self, kind: str, pod: Mapping[str, Any], t: float) -> None:
        name = pod["metadata"]["name"]
        with self.cond:
            rec = self.pods.setdefault(name, {})
            node = (pod.get("spec") or {}).get("nodeName")
            if node and "bound" not in rec:
                rec["bound"], rec["node"] = t, node
            if kind == "DELETED":
                rec["deleted"] = t
            self.cond.notify_all()

    def on_claim(self, kind: str, claim: Mapping[str, Any], t: float) -> None:
        meta = claim["metadata"]
        with self.cond:
            rec = self.claims.setdefault(meta["name"], {})
            rec.setdefault("added", t)
            owner = next((o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"), None)
            if owner:
                rec["pod"] = owner
            if (claim.get("status") or {}).get("allocation") and "allocated" not in rec:
                rec["allocated"] = t
            if kind == "DELETED":
                rec["deleted"] = t
            self.cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait (up to `timeout` s) until predicate() holds; it is called with the lock held."""
        with self.cond:
            return self.cond.wait_for(predicate, timeout=timeout)

    def startup(self, names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """Per-pod start-up summaries (seconds): create->bound, create->claim created, create->claim
        allocated, and the create request itself, over `names` (default every pod)."""
        with self.cond:
            by_pod = {c["pod"]: c for c in self.claims.values() if "pod" in c}
            recs = [(n, self.pods[n]) for n in (names if names is not None else list(self.pods)) if n in self.pods]
            out: dict[str, list[float]] = {
                "create_to_bound": [],
                "create_to_claim_created": [],
                "create_to_claim_allocated": [],
                "create_request": [],
            }
            for name, rec in recs:
                if "created" not in rec:
                    continue
                if "bound" in rec:
                    out["create_to_bound"].append(rec["bound"] - rec["created"])
                if "create_request" in rec:
                    out["create_request"].append(rec["create_request"])
                claim = by_pod.get(name)
                if claim and "added" in claim:
                    out["create_to_claim_created"].append(claim["added"] - rec["created"])
                if claim and "allocated" in claim:
                    out["create_to_claim_allocated"].append(claim["allocated"] - rec["created"])
        return {k: stats.summary(v, interpolate=True) for k, v in out.items()}


class Watch(threading.Thread):
    """LIST then WATCH a collection URL in a thread, calling handler(type, object, monotonic time)
    for each object listed ("SYNC") and each event. Re-watches when the server ends the watch and
    re-lists on 410 Gone. stop() ends it."""

    def __init__(
        self,
        session: requests.Session,
        url: str,
        handler: Callable[[str, Mapping[str, Any], float], None],
        name: str,
        restarts: collections.Counter,
    ) -> None:
        super().__init__(name=f"watch-{name}", daemon=True)
        self.session, self.url, self.handler, self.restarts = session, url, handler, restarts
        self.key = name
        self._stopping = threading.Event()
        self.synced = threading.Event()
        self.error: BaseException | None = None

    def _list(self) -> str:
        resp = self.session.get(self.url, timeout=60)
        resp.raise_for_status()
        body = resp.json()
        t = time.monotonic()
        for item in body.get("items") or []:
            self.handler("SYNC", item, t)
        return body["metadata"]["resourceVersion"]

    def run(self) -> None:
        try:
            rv = self._list()
            self.synced.set()
            while not self._stopping.is_set():
                try:
                    params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
                    with self.session.get(self.url, params=params, stream=True, timeout=(10, 90)) as resp:
                        resp.raise_for_status()
                        for line in resp.iter_lines(chunk_size=None):
                            if not line:
                                continue
                            t = time.monotonic()
                            event = json.loads(line)
                            if event["type"] == "ERROR":
                                self.restarts[f"{self.key}-relist"] += 1
                                rv = self._list()
                                break
                            rv = event["object"]["metadata"]["resourceVersion"]
                            if event["type"] != "BOOKMARK":
                                self.handler(event["type"], event["object"], t)
                            if self._stopping.is_set():
                                return
                    self.restarts[self.key] += 1
                except (requests.RequestException, ValueError):
                    if self._stopping.is_set():
                        return
                    self.restarts[f"{self.key}-error"] += 1
                    time.sleep(0.5)
        except BaseException as exc:  # surfaced by run_scenario
            self.error = exc
            self.synced.set()

    def stop(self) -> None:
        self._stopping.set()
        self.session.close()


# ---------------------------------------------------------------------- processes


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """GET url/metrics without a token over the component's self-signed TLS; parsed samples."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        with requests.Session() as sess:
            sess.trust_env = False
            resp = sess.get(f"{url}/metrics", verify=False, timeout=10)
    resp.raise_for_status()
    return parse_prometheus(resp.text)


def cpu_seconds(pid: int) -> float | None:
    """user+system CPU seconds of process `pid` (bench.common.cpu_seconds), None if it is gone."""
    try:
        return common.cpu_seconds(pid)
    except OSError:
        return None


def machine_cpu_times() -> dict[str, float]:
    """CPU seconds the whole machine spent since boot, all CPUs together (from /proc/stat):
    {"user_system" (user+nice+system: what processes' utime+stime add up to), "irq" (irq+softirq,
    e.g. the loopback traffic of the cluster), "steal" (taken by the hypervisor)}."""
    fields = pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return {"user_system": (user + nice + system) / tick, "irq": (irq + softirq) / tick, "steal": steal / tick}


def self_cpu_seconds() -> float:
    """user+system CPU seconds of this process (the bench's own watches and creates)."""
    t = os.times()
    return t.user + t.system


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc/<pid>/task/*/children)."""
    out: list[int] = []
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def component_pids(cp: Any, guard: Any | None) -> dict[str, int]:
    """pid of each control-plane process (and the dra-guard master and its children)."""
    pids = {}
    for name in COMPONENTS:
        proc = cp._procs.get(name)  # the harness keeps them private; read-only use
        if proc is not None and proc.popen is not None:
            pids[name] = proc.popen.pid
    if guard is not None and guard.proc is not None:
        master = guard.proc.proc.pid
        pids["dra-guard"] = master
        for i, child in enumerate(children(master)):
            pids[f"dra-guard-worker-{i}"] = child
    return pids


# ---------------------------------------------------------------------- the scenario


def _post(sess: requests.Session, url: str, body: Mapping[str, Any], ok: tuple[int, ...] = (200, 201)) -> None:
    resp = sess.post(url, json=body, timeout=30)
    if resp.status_code not in ok:
        raise RuntimeError(f"POST {url} -> {resp.status_code}: {resp.text[:500]}")


def _wait_poll(what: str, probe: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not probe():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return time.monotonic() - started


def _stdout_log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_scenario(
    workdir: pathlib.Path,
    *,
    with_guard: bool,
    nodes: int = 100,
    long_lived: int = 720,
    churned: int = 80,
    churn_rounds: int = 10,
    qps: float = 10.0,
    bind_timeout: float = 180.0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the scale scenario once on a fresh ControlPlane in `workdir` (must be empty or missing).

    Args:
        with_guard: start dra-guard (enforce) and register it before the DaemonSet and pods exist.
        nodes: fake Nodes, each with a ResourceSlice of DEVICES_PER_NODE devices.
        long_lived: pods created first and kept. churned: pods per churn round. churn_rounds: rounds.
        qps: pod creations per second (an absolute schedule per phase -- the long-lived pods, each
            churn round -- see Pacer).
        bind_timeout: seconds to wait for the long-lived pods, and for each round, to be bound
            (and for each round's pods and claims to be gone).
        log: progress lines go here (default: stdout with a timestamp).

    Returns a JSON-able dict; times in seconds, sizes in bytes. Keys: "with_guard", "params",
    "wall_seconds", "setup_seconds", "workload_seconds", "pods_created", "pods_bound",
    "pods_unbound" (names never bound, from the watch), "pods_unbound_by_list" (pods without a
    node in a LIST at the end), "rounds" (per churn round), "scheduler_sli" ({"count",
    "mean", "p50", "p99", "buckets" (delta, {bound: cumulative count})}), "schedule_attempts"
    (delta by result), "pod_startup" (Tracker.startup() over every workload pod, plus
    "long_lived"/"churned" splits), "pacing", "cpu_seconds" (delta over the workload, per
    process), "machine_cpu" ({"user_system_seconds", "irq_seconds", "steal_seconds",
    "bench_process_seconds", "other_seconds" (user+system CPU of processes outside the
    scenario: noise), "cores"}), "watch_restarts" and, with dra-guard,
    "guard" ({"api_requests": {verb: n}, "api_requests_by_resource",
    "api_requests_during_workload", "peak_rss_bytes", "processes"}).
    An exception stops the run (everything started is stopped) and propagates.
    """
    from tests.e2e import binaries
    from tests.e2e.cluster import ControlPlane, fake_node

    _log = log or _stdout_log
    started = time.monotonic()
    workdir = pathlib.Path(workdir)
    cp = ControlPlane(
        workdir / "cluster",
        controllers=True,
        audit_log=True,
        bin_dir=binaries.build_control_plane(),
        tools_dir=binaries.client_tools_dir(),
    )
    guard = None
    watches: list[Watch] = []
    result: dict[str, Any] = {
        "with_guard": with_guard,
        "params": {
            "nodes": nodes,
            "long_lived": long_lived,
            "churned": churned,
            "churn_rounds": churn_rounds,
            "qps": qps,
            "devices_per_node": DEVICES_PER_NODE,
        },
    }
    try:
        cp.start()
        sess = cp.session("admin")
        api = cp.url
        _log(f"control plane up ({'with' if with_guard else 'without'} dra-guard), {nodes} nodes ...")
        names = [f"scale-node-{i:03d}" for i in range(nodes)]
        for name in names:
            _post(sess, f"{api}/api/v1/nodes", fake_node(name))
        for name in names:
            _post(sess, f"{api}/apis/resource.k8s.io/v1/resourceslices", resource_slice(name))
        cp.kubectl(
            "admin", "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_objects()})
        )
        if with_guard:
            from tests.e2e.guard import Guard

            t = time.monotonic()
            guard = Guard(cp, workdir / "dra-guard")
            guard.start(mode="enforce", declared=((DRIVER_NAMESPACE, DRIVER_DS),))
            guard.register()
            result["guard_start_seconds"] = time.monotonic() - t
            _log(f"dra-guard started and registered in {result['guard_start_seconds']:.1f} s")
        cp.kubectl("admin", "apply", "-f", "-", input=json.dumps(driver_ds()))

        def driver_pods_bound() -> bool:
            items = sess.get(f"{api}/api/v1/namespaces/{DRIVER_NAMESPACE}/pods", timeout=30).json()["items"]
            return len({p["spec"].get("nodeName") for p in items if p["spec"].get("nodeName")}) >= nodes

        result["driver_pods_seconds"] = _wait_poll("the driver DaemonSet's pods on every node", driver_pods_bound, 180)
        _log(f"driver pods bound on {nodes} nodes in {result['driver_pods_seconds']:.1f} s")

        tracker = Tracker()
        for key, path, handler in (
            ("pods", f"/api/v1/namespaces/{NAMESPACE}/pods", tracker.on_pod),
            ("claims", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", tracker.on_claim),
        ):
            w = Watch(cp.session("admin"), api + path, handler, key, tracker.watch_restarts)
            w.start()
            watches.append(w)
        for w in watches:
            w.synced.wait(30)
            if w.error:
                raise w.error

        pids = component_pids(cp, guard)
        cpu_before = {k: cpu_seconds(p) for k, p in pids.items()}
        machine_before, self_before = machine_cpu_times(), self_cpu_seconds()
        sched_before = scrape(cp.scheduler_url)
        result["setup_seconds"] = time.monotonic() - started
        workload_wall = time.time()
        workload_start = time.monotonic()

        # one schedule per phase (the long-lived pods, each churn round): the waits between rounds
        # are not caught up with a burst at the start of the next round
        pacer = Pacer(qps)
        lags: list[float] = []
        pods_url = f"{api}/api/v1/namespaces/{NAMESPACE}/pods"

        def create(name: str, kind: str, round_: int | None = None) -> None:
            body = workload_pod(name, kind, round_)
            lags.append(pacer.wait())
            t0 = time.monotonic()
            tracker.creating(name, t0)
            _post(sess, pods_url, body)
            tracker.created(name, time.monotonic() - t0)

        def bound(group: Sequence[str]) -> Callable[[], bool]:
            return lambda: all("bound" in tracker.pods.get(n, {}) for n in group)

        long_names = [f"long-{i:04d}" for i in range(long_lived)]
        for name in long_names:
            create(name, "long")
        _log(f"{long_lived} long-lived pods created in {time.monotonic() - workload_start:.1f} s")
        if not tracker.wait_until(bound(long_names), bind_timeout):
            _log("not every long-lived pod was bound in time")
        rounds = []
        churn_names: list[str] = []
        for r in range(churn_rounds):
            t_round = time.monotonic()
            group = [f"churn-{r:02d}-{i:03d}" for i in range(churned)]
            churn_names += group
            pacer = Pacer(qps)
            for name in group:
                create(name, "churn", r)
            t_created = time.monotonic()
            ok = tracker.wait_until(bound(group), bind_timeout)
            t_bound = time.monotonic()
            with tracker.cond:
                unbound = [n for n in group if "bound" not in tracker.pods.get(n, {})]
            resp = sess.delete(
                pods_url,
                params={"labelSelector": f"app=scale,kind=churn,round={r}"},
                json={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                timeout=60,
            )
            resp.raise_for_status()

            def gone(group: Sequence[str] = group) -> bool:
                pods_gone = all("deleted" in tracker.pods.get(n, {}) for n in group)
                members = set(group)
                claims_gone = all("deleted" in c for c in tracker.claims.values() if c.get("pod") in members)
                return pods_gone and claims_gone

            cleaned = tracker.wait_until(gone, bind_timeout)
            rounds.append(
                {
                    "round": r,
                    "create_seconds": t_created - t_round,
                    "bind_wait_seconds": t_bound - t_created,
                    "all_bound": ok,
                    "unbound": unbound,
                    "cleanup_seconds": time.monotonic() - t_bound,
                    "cleaned_up": cleaned,
                }
            )
            _log(
                f"churn round {r}: created {t_created - t_round:.1f} s, bound +{t_bound - t_created:.1f} s, "
                f"gone +{time.monotonic() - t_bound:.1f} s{'' if ok else f', {len(unbound)} UNBOUND'}"
                f"{'' if cleaned else ', NOT CLEANED UP'}"
            )
        workload_seconds = time.monotonic() - workload_start
        # cross-check of the watch: pods still without a node according to a LIST
        listed = sess.get(pods_url, timeout=60).json()["items"]
        result["pods_unbound_by_list"] = sorted(p["metadata"]["name"] for p in listed if not p["spec"].get("nodeName"))
        time.sleep(1.0)  # let the last SLI observations land
        sched_after = scrape(cp.scheduler_url)
        cpu_after = {k: cpu_seconds(p) for k, p in pids.items()}
        own = self_cpu_seconds() - self_before
        machine = {k: v - machine_before[k] for k, v in machine_cpu_times().items()}
        workload_wall_end = time.time()

        sli = histogram_delta(histogram(sched_after, SLI_METRIC), histogram(sched_before, SLI_METRIC))
        before_attempts = counter_by(sched_before, ATTEMPTS_METRIC, "result")
        attempts = {k: v - before_attempts.get(k, 0.0) for k, v in counter_by(sched_after, ATTEMPTS_METRIC, "result").items()}
        with tracker.cond:
            unbound_long = [n for n in long_names if "bound" not in tracker.pods.get(n, {})]
            created = sum(1 for rec in tracker.pods.values() if "created" in rec)
            bound_count = sum(1 for n in long_names + churn_names if "bound" in tracker.pods.get(n, {}))
        result.update(
            {
                "workload_seconds": workload_seconds,
                "pods_created": created,
                "pods_bound": bound_count,
                "pods_unbound": unbound_long + [n for rd in rounds for n in rd["unbound"]],
                "rounds": rounds,
                "scheduler_sli": {
                    "count": sli["count"],
                    "mean": stats.ratio(sli["sum"], sli["count"]),
                    "p50": histogram_quantile(0.50, sli["buckets"]),
                    "p99": histogram_quantile(0.99, sli["buckets"]),
                    "buckets": {("+Inf" if math.isinf(b) else repr(b)): c for b, c in sli["buckets"].items()},
                },
                "schedule_attempts": attempts,
                "pod_startup": {
                    "all": tracker.startup(long_names + churn_names),
                    "long_lived": tracker.startup(long_names),
                    "churned": tracker.startup(churn_names),
                },
                "pacing": {
                    "target_qps": qps,
                    "creates": len(lags),
                    "max_lag_seconds": max(lags, default=0.0),
                    "late_creates": sum(1 for v in lags if v > 0.05),
                },
                "cpu_seconds": {
                    k: (cpu_after[k] - cpu_before[k]) if cpu_after.get(k) is not None and cpu_before.get(k) is not None else None
                    for k in pids
                },
                "watch_restarts": dict(tracker.watch_restarts),
            }
        )
        # anything else on the machine competes for the same cores: the user+system CPU time of
        # the machine over the workload minus that of the cluster, dra-guard and this process
        # (kubectl/helm are not run during the workload). A large value means a noisy run.
        ours = own + sum(v for v in result["cpu_seconds"].values() if v is not None)
        other = machine["user_system"] - ours
        result["machine_cpu"] = {
            "user_system_seconds": machine["user_system"],
            "irq_seconds": machine["irq"],
            "steal_seconds": machine["steal"],
            "bench_process_seconds": own,
            "other_seconds": other,
            "cores": os.cpu_count(),
        }
        if other > 0.05 * workload_seconds * (os.cpu_count() or 1):
            _log(f"WARNING: {other:.1f} CPU s used by other processes during the workload: a noisy run")
        if guard is not None:
            result["guard"] = guard_figures(cp, guard, workload_wall, workload_wall_end)
        for w in watches:
            if w.error:
                raise w.error
    finally:
        for w in watches:
            w.stop()
        try:
            if guard is not None:
                guard.stop()
        finally:
            cp.stop()
    result["wall_seconds"] = time.monotonic() - started
    return result


def guard_figures(cp: Any, guard: Any, window_start: float, window_end: float) -> dict[str, Any]:
    """dra-guard's API requests from the audit log (one per auditID of user dra-guard, so open
    watches count: all of them by verb and by verb+resource, and those received inside
    [window_start, window_end] wall-clock seconds) and the peak RSS (VmHWM, bytes) of its master and worker processes."""
    import datetime as dt

    time.sleep(0.5)  # audit events may land just after the response
    # one request = one auditID: a watch still open has only its ResponseStarted event
    events = list({ev["auditID"]: ev for ev in cp.audit_events(user="dra-guard", stage=None)}.values())
    by_verb: collections.Counter[str] = collections.Counter()
    by_resource: collections.Counter[str] = collections.Counter()
    during: collections.Counter[str] = collections.Counter()
    for ev in events:
        ref = ev.get("objectRef")
        if ref:
            resource = "/".join(x for x in (ref.get("apiGroup") or "core", ref.get("resource"), ref.get("subresource")) if x)
        else:  # a non-resource URL (discovery, /version)
            resource = ev.get("requestURI", "?").split("?")[0]
        by_verb[ev["verb"]] += 1
        by_resource[f"{ev['verb']} {resource}"] += 1
        received = dt.datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if window_start <= received <= window_end:
            during[f"{ev['verb']} {resource}"] += 1
    master = guard.proc.proc.pid
    procs = {"master": common.proc_status(master)}
    for i, child in enumerate(children(master)):
        procs[f"worker-{i}"] = common.proc_status(child)
    workers = [v["peak_rss_bytes"] for k, v in procs.items() if k.startswith("worker")]
    return {
        "api_requests": dict(by_verb),
        "api_requests_by_resource": dict(sorted(by_resource.items())),
        "api_requests_during_workload": dict(sorted(during.items())),
        "peak_rss_bytes": max(workers) if workers else procs["master"]["peak_rss_bytes"],
        "processes": procs,
    }


# ---------------------------------------------------------------------- repeats and report

#: (label, path into a run's result) of the figures aggregated over repeats
FIGURES: list[tuple[str, tuple[str, ...]]] = [
    ("scheduler_sli_p99_s", ("scheduler_sli", "p99")),
    ("scheduler_sli_p50_s", ("scheduler_sli", "p50")),
    ("scheduler_sli_mean_s", ("scheduler_sli", "mean")),
    ("create_to_bound_p50_s", ("pod_startup", "all", "create_to_bound", "p50")),
    ("create_to_bound_p99_s", ("pod_startup", "all", "create_to_bound", "p99")),
    ("create_to_bound_max_s", ("pod_startup", "all", "create_to_bound", "max")),
    ("create_to_claim_allocated_p99_s", ("pod_startup", "all", "create_to_claim_allocated", "p99")),
    ("create_request_p99_s", ("pod_startup", "all", "create_request", "p99")),
    ("workload_s", ("workload_seconds",)),
    ("wall_s", ("wall_seconds",)),
    ("apiserver_cpu_s", ("cpu_seconds", "kube-apiserver")),
    ("scheduler_cpu_s", ("cpu_seconds", "kube-scheduler")),
    ("kcm_cpu_s", ("cpu_seconds", "kube-controller-manager")),
    ("dra_guard_worker_cpu_s", ("cpu_seconds", "dra-guard-worker-0")),
    ("other_processes_cpu_s", ("machine_cpu", "other_seconds")),
]


def _dig(obj: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    return obj


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median/min/max of FIGURES per variant over completed runs, and with/without ratios: of the
    medians, and per repeat (runs paired by their "repeat" key)."""
    out: dict[str, Any] = {}
    for variant, flag in (("without", False), ("with", True)):
        ok = [r for r in runs if r.get("with_guard") is flag and "error" not in r]
        out[variant] = {"runs": len(ok), **{label: stats.median_min_max(_dig(r, path) for r in ok) for label, path in FIGURES}}
    out["ratio_with_over_without"] = {
        label: stats.ratio(out["with"][label]["median"], out["without"][label]["median"]) for label, _ in FIGURES
    }
    pairs = collections.defaultdict(dict)
    for r in runs:
        if "error" not in r:
            pairs[r.get("repeat")]["with" if r["with_guard"] else "without"] = r
    per_repeat = [
        stats.ratio(_dig(p["with"], ("scheduler_sli", "p99")), _dig(p["without"], ("scheduler_sli", "p99")))
        for p in pairs.values()
        if "with" in p and "without" in p
    ]
    out["sli_p99_ratio_per_repeat"] = per_repeat
    out["sli_p99_ratio"] = stats.median_min_max(per_repeat)
    return out


def source_state() -> dict[str, Any]:
    """The git commit of the checkout and its uncommitted files (dra-guard runs from the working
    tree, so they are part of what was measured); empty values when git is unavailable."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "uncommitted": [line[3:] for line in git("status", "--porcelain").splitlines() if line.strip()],
    }


#: the scale of a quick smoke run (`python -m bench suite --quick`, or run(quick=True)): checks the harness, not speed
QUICK = {"nodes": 10, "long_lived": 40, "churned": 10, "churn_rounds": 2}


def run(
    *,
    repeats: int = 1,
    out: pathlib.Path | None = None,
    workdir: pathlib.Path | None = None,
    keep: bool = False,
    quick: bool = False,
    log: Callable[[str], None] | None = None,
    **scenario: Any,
) -> dict[str, Any]:
    """`repeats` pairs of run_scenario() without and with dra-guard (order alternating: without
    first on even repeats, with first on odd ones), each on a fresh control plane in a folder
    under `workdir` (default a temporary folder); a run's folder is deleted after it succeeded
    unless `keep`. `quick` applies QUICK to the scenario arguments not given; `log` receives
    progress lines (default stdout). `scenario`: run_scenario()'s keyword arguments.

    Writes the JSON report to `out` (if given) after every run, so a crash keeps what was
    measured, and returns it: {"machine", "source", "params", "target", "method", "runs",
    "summary" (aggregate()), "sli_p99_ratio" ({"median", "min", "max"} of the per-repeat ratios),
    "report_lines" (Markdown, report_markdown())}. A run that raises is recorded as {"error": ...}.
    """
    _log = log or _stdout_log
    if quick:
        scenario = {**QUICK, **scenario}
    base = pathlib.Path(workdir) if workdir else pathlib.Path(tempfile.mkdtemp(prefix="dra-guard-scale-"))
    report: dict[str, Any] = {
        "machine": common.machine(),
        "source": source_state(),
        "params": {"repeats": repeats, "quick": quick, **scenario},
        "target": "scheduler SLI p99 with dra-guard / without <= 1.05",
        "method": "SLI quantiles: Prometheus-style linear interpolation inside the bucket of "
        f"{SLI_METRIC} deltas (bounds 0.01 s * 2^k, so coarse); pod start-up: client create call "
        "(monotonic clock) to the watch event with spec.nodeName / the claim's status.allocation",
        "runs": [],
    }
    try:
        for rep in range(repeats):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for with_guard in order:
                folder = base / f"r{rep}-{'with' if with_guard else 'without'}"
                try:
                    res = run_scenario(folder, with_guard=with_guard, log=_log, **scenario)
                except Exception as exc:  # recorded, the other runs still go
                    _log(f"scale run failed (files in {folder}): {type(exc).__name__}: {exc}")
                    res = {"with_guard": with_guard, "error": f"{type(exc).__name__}: {exc}"[:4000]}
                res["repeat"] = rep
                report["runs"].append(res)
                report["summary"] = aggregate(report["runs"])
                report["sli_p99_ratio"] = report["summary"]["sli_p99_ratio"]
                report["report_lines"] = report_markdown(report)
                if out is not None:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(report, indent=2) + "\n")
                if not keep and "error" not in res:
                    shutil.rmtree(folder, ignore_errors=True)
    finally:
        if not keep and not workdir:
            shutil.rmtree(base, ignore_errors=True)
    return report


def report_markdown(report: Mapping[str, Any]) -> list[str]:
    """Markdown lines for run()'s report: the parameters, a table of FIGURES (median [min, max]
    without and with dra-guard, ratio of the medians) and per-run notes (pods left unbound,
    scheduling attempts, dra-guard's API requests and peak RSS)."""
    s, p = report["summary"], report["params"]
    cell = lambda m: f"{_fmt(m['median'])} [{_fmt(m['min'])}, {_fmt(m['max'])}]"  # noqa: E731
    lines = [
        f"{p.get('nodes', 100)} nodes x {DEVICES_PER_NODE} devices, {p.get('long_lived', 720)} long-lived pods, "
        f"{p.get('churned', 80)} pods churned {p.get('churn_rounds', 10)} times, {p.get('qps', 10.0)} creates/s; "
        f"{s['without']['runs']} run(s) without and {s['with']['runs']} with dra-guard; median [min, max].",
        "",
        "| figure | without dra-guard | with dra-guard | ratio |",
        "|---|---|---|---|",
    ]
    for label, _ in FIGURES:
        r = s["ratio_with_over_without"][label]
        lines.append(
            f"| {label} | {cell(s['without'][label])} | {cell(s['with'][label])} | {'n/a' if r is None else f'{r:.3f}'} |"
        )
    lines += [
        "",
        f"Scheduler SLI p99 with/without per repeat: "
        f"{', '.join(f'{x:.3f}' for x in s['sli_p99_ratio_per_repeat']) or 'n/a'} (target <= 1.05).",
        "",
    ]
    for r in report["runs"]:
        tag = f"- repeat {r['repeat']} {'with' if r['with_guard'] else 'without'} dra-guard"
        if "error" in r:
            lines.append(f"{tag}: ERROR {r['error'][:300]}")
            continue
        unbound = sorted(set(r["pods_unbound"]) | set(r.get("pods_unbound_by_list", [])))
        line = (
            f"{tag}: {r['pods_bound']}/{r['pods_created']} pods bound, {len(unbound)} left unbound, "
            f"SLI n={r['scheduler_sli']['count']:.0f}, scheduling attempts "
            f"{ {k: int(v) for k, v in r['schedule_attempts'].items()} }"
        )
        if "guard" in r:
            g = r["guard"]
            line += (
                f"; dra-guard API requests {g['api_requests']} ({sum(g['api_requests_during_workload'].values())} "
                f"during the workload), peak RSS {g['peak_rss_bytes'] / 2**20:.1f} MiB"
            )
        lines.append(line)
    return lines


def _fmt(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f} ms" if unit == "s" and v < 1 else f"{v:.2f} {unit}"


def summary_text(report: Mapping[str, Any]) -> str:
    """A short human summary of run()'s report (its Markdown lines)."""
    return "\n".join(report.get("report_lines") or ["no run completed"])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bench scale``; exit 0 when every run completed with all pods bound."""
    parser = argparse.ArgumentParser(
        prog="python -m bench scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs, without and with dra-guard (default: %(default)s)")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=common.RESULTS / "scale.json",
        help="where the JSON report goes (default: %(default)s)",
    )
    parser.add_argument("--nodes", type=int, default=100, help="fake nodes (default: %(default)s)")
    parser.add_argument("--long-lived", type=int, default=720, help="long-lived pods (default: %(default)s)")
    parser.add_argument("--churned", type=int, default=80, help="pods per churn round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=10, help="churn rounds (default: %(default)s)")
    parser.add_argument("--qps", type=float, default=10.0, help="pod creations per second (default: %(default)s)")
    parser.add_argument(
        "--bind-timeout", type=float, default=180.0, help="seconds to wait for pods to be bound / gone (default: %(default)s)"
    )
    parser.add_argument(
        "--workdir", type=pathlib.Path, default=None, help="folder for the runs' control planes (default: a temporary folder)"
    )
    parser.add_argument("--keep", action="store_true", help="keep each run's folder (logs, audit log)")
    args = parser.parse_args(argv)
    if args.nodes * DEVICES_PER_NODE < args.long_lived + args.churned:
        parser.error(f"{args.nodes} nodes x {DEVICES_PER_NODE} devices cannot hold {args.long_lived}+{args.churned} pods")
    report = run(
        repeats=args.repeats,
        out=args.out,
        workdir=args.workdir,
        keep=args.keep,
        nodes=args.nodes,
        long_lived=args.long_lived,
        churned=args.churned,
        churn_rounds=args.rounds,
        qps=args.qps,
        bind_timeout=args.bind_timeout,
    )
    print(summary_text(report))
    print(f"report: {args.out}")
    ok = all("error" not in r and not r["pods_unbound"] and not r["pods_unbound_by_list"] for r in report["runs"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
