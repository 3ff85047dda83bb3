"""Flood figures (issue 21): how a dra-guard worker answers forged, heavy and parallel reviews, as
ratios to the floor (`POST /validate/noop`) measured in the same run on the same server.

    python -m bench flood [--code DIR] [--seconds 15] [--out bench/results/unreleased/flood.json]

--code DIR runs `dra-guard serve` from another checkout's webhook/ and certs/ (e.g. a
`git archive <commit> webhook certs` extracted to DIR): the "before" figures. The server is
`dra-guard serve --self-signed --no-cluster` (1 worker, 8 threads, empty caches): the figures are
about serving, not the policies' lookups. Scenarios:

* floor: 300 sequential noop reviews on one keep-alive connection; its median is the unit.
* heavy: 6 clients send 7 MB ClusterRole reviews (an aggregationRule with 420,000 values) straight
  to the port for --seconds, while one client sends an eviction review every 0.2 s on its own
  connection: the eviction answers' median and max, as multiples of the floor, and how many took
  longer than 3 s (the webhook timeout: with failurePolicy Ignore, an eviction let through).
* forged: the same with 6 clients sending small forged RBAC reviews as fast as they can.
* parallel: 200 compliant ClusterRoleBinding reviews at once, each on a new TLS connection from
  its own Python client: the slowest answer as a multiple of the floor, and answers over 3 s or
  missing.
* burst: the same 200 at once through ONE Go http.Transport, 3 times (bench/burst, built with
  `go build`): what the kube-apiserver's webhook client does under a burst, including the
  connections it dials and then leaves idle after their TLS handshake.
* overload: per endpoint (rbac, daemonsets, evictions), its capacity measured first (8 vegeta
  clients each waiting for its answer: a closed loop), then reviews offered at --overload-factor
  (2) times it for --seconds with vegeta (keep-alive, a new connection whenever none is idle, as
  the apiserver's Go client): how many were judged in time, shed with a well-formed overload
  answer (the right uid; eviction 429, RBAC 503, DaemonSets allowed with a warning), answered
  after the 3 s timeout, or not answered.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import requests

from bench.common import machine
from bench.stats import percentile
from tests.builders import binding, cluster_role, eviction_request, review, rule, subject
from tests.serve import free_port

TIMEOUT = 3.0  # the chart's webhook timeoutSeconds
#: idle connections the kube-apiserver's webhook client keeps per webhook host: client-go's
#: transport cache sets MaxIdleConnsPerHost 25 (k8s.io/client-go/transport/cache.go,
#: idleConnsPerHost) and no MaxConnsPerHost, so under load it dials without limit and closes
#: every connection answered while 25 are idle. vegeta's -connections is that field.
APISERVER_IDLE_CONNECTIONS = 25


def start(
    work: pathlib.Path, code: pathlib.Path | None, config: pathlib.Path | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    """`dra-guard serve --self-signed --no-cluster` in `work` (from `code` when given, with the
    config file `config` when given): (the process, its URL, its CA file), once /readyz says 200."""
    port = free_port()
    env = {**os.environ}
    if code is not None:
        env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    log = open(work / "serve.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--self-signed",
            str(work / "tls"),
            "--no-cluster",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *(["--config", str(config)] if config else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(code or work),
        start_new_session=True,
    )
    url, ca = f"https://127.0.0.1:{port}", str(work / "tls" / "ca.crt")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if pathlib.Path(ca).exists() and requests.get(url + "/readyz", verify=ca, timeout=2).ok:
                return proc, url, ca
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError((work / "serve.log").read_text()[-3000:])


def session(ca: str) -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    s.verify = ca
    return s


def timed_post(s: requests.Session, url: str, body: bytes, timeout: float = 10.0) -> float | None:
    """Seconds to an HTTP 200 answer, or None (error, or no answer within `timeout`)."""
    started = time.monotonic()
    try:
        r = s.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=timeout)
    except requests.RequestException:
        return None
    return time.monotonic() - started if r.status_code == 200 else None


def floor(url: str, ca: str) -> float:
    s = session(ca)
    body = json.dumps(review(binding("floor", "view", [subject("Group", "g")]))).encode()
    times = [timed_post(s, url + "/validate/noop", body) for _ in range(300)]
    return statistics.median(t for t in times if t is not None)


def under_flood(url: str, ca: str, flood_body: bytes, *, clients: int, seconds: float) -> dict[str, Any]:
    stop = threading.Event()
    sent = [0]

    def flood() -> None:
        s = session(ca)
        while not stop.is_set():
            timed_post(s, url + "/validate/rbac", flood_body, timeout=15)
            sent[0] += 1

    eviction = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("gpu-driver-x")}
    ).encode()
    threads = [threading.Thread(target=flood, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1)
    answers: list[float | None] = []
    s = session(ca)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        answers.append(timed_post(s, url + "/validate/evictions", eviction, timeout=10))
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(20)
    done = [a for a in answers if a is not None]
    return {
        "evictions": len(answers),
        "flood_reviews_sent": sent[0],
        "eviction_median_s": statistics.median(done) if done else None,
        "eviction_max_s": max(done) if done else None,
        "eviction_over_timeout": sum(1 for a in answers if a is None or a > TIMEOUT),
    }


def parallel(url: str, ca: str, count: int = 200) -> dict[str, Any]:
    bodies = [json.dumps(review(binding(f"b{i}", "view", [subject("Group", f"g{i}")]))).encode() for i in range(count)]
    barrier = threading.Barrier(count)

    def one(body: bytes) -> float | None:
        s = session(ca)
        barrier.wait()
        return timed_post(s, url + "/validate/rbac", body, timeout=10)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(one, bodies))
    done = [a for a in answers if a is not None]
    return {
        "reviews": count,
        "answered": len(done),
        "slowest_s": max(done) if done else None,
        "median_s": statistics.median(done) if done else None,
        "over_timeout_or_missing": sum(1 for a in answers if a is None or a > TIMEOUT),
    }


def burst_tool() -> str:
    """Path of bench/burst (Go, standard library only), built into the cache on first use."""
    from bench.common import cache_dir

    binary = cache_dir() / "bin" / "burst"
    source = pathlib.Path(__file__).resolve().parent / "burst"
    if not binary.exists() or binary.stat().st_mtime < (source / "main.go").stat().st_mtime:
        subprocess.run(
            ["go", "build", "-o", str(binary), "."],
            check=True,
            cwd=source,
            env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"},
        )
    return str(binary)


def burst(url: str, ca: str, work: pathlib.Path, *, count: int = 200, rounds: int = 3) -> dict[str, Any]:
    """`count` RBAC reviews at once through one Go http.Transport, as the apiserver sends a burst
    (bench/burst: a new connection per review without an idle one, connections it did not need
    left idle after their TLS handshake), `rounds` times: per round, answers within TIMEOUT, the
    rest (late, reset, none), and the slowest."""
    (work / "burst.json").write_bytes(apiserver_order(review(binding("b", "view", [subject("Group", "g")]))))
    out = subprocess.run(
        [
            burst_tool(),
            "-url",
            url + "/validate/rbac",
            "-ca",
            ca,
            "-body",
            str(work / "burst.json"),
            "-n",
            str(count),
            "-rounds",
            str(rounds),
        ],
        check=True,
        capture_output=True,
    ).stdout
    result = []
    for answers in json.loads(out):
        in_time = [a["seconds"] for a in answers if a["status"] == 200 and a["seconds"] <= TIMEOUT]
        result.append(
            {
                "reviews": count,
                "in_time": len(in_time),
                "late_or_failed": count - len(in_time),
                "errors": sorted({a["error"].rsplit(": ", 1)[-1] for a in answers if a.get("error")})[:3],
                "slowest_s": max(a["seconds"] for a in answers),
                "median_s": statistics.median(a["seconds"] for a in answers),
            }
        )
    return {"rounds": result}


def apiserver_order(review_: dict[str, Any]) -> bytes:
    """The AdmissionReview as the kube-apiserver serializes it: kind, apiVersion, then request with
    uid first (what webhook.admission.peek_review reads without parsing the rest)."""
    request = review_["request"]
    return json.dumps(
        {"kind": "AdmissionReview", "apiVersion": review_["apiVersion"], "request": {"uid": request["uid"], **request}}
    ).encode()


def overload_bodies() -> dict[str, tuple[bytes, str]]:
    """endpoint path -> (one review as the apiserver sends it, the overload answer its policy must
    give by default: "503" deny, "warn" allowed with a warning, "429" eviction retry)."""
    from bench.endpoints import daemonset_bodies

    rbac = review(binding("ok", "view", [subject("Group", "g")]))
    daemonset = daemonset_bodies()[0][0]
    eviction = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {**eviction_request("gpu-driver-x"), "uid": "3f1c2f4e-0b4e-4a43-9d4c-7b1e6c0a9e01"},
    }
    return {
        "/validate/rbac": (apiserver_order(rbac), "503"),
        "/mutate/daemonsets": (apiserver_order(daemonset), "warn"),
        "/validate/evictions": (apiserver_order(eviction), "429"),
    }


def classify(codes: list[int], latencies_ms: list[float], bodies: list[bytes], *, uid: str, shed_as: str) -> dict[str, Any]:
    """Each answer of an overload run: judged in time, shed (the overload answer: well-formed, the
    right uid, the policy's failure mode `shed_as`) or shed wrongly, answered after TIMEOUT, or
    none (no HTTP 200: refused, reset, or no answer within the client's timeout)."""
    judged: list[float] = []
    shed: list[float] = []
    wrong = late = missing = allowed_unjudged_evictions = 0
    for code, latency, body in zip(codes, latencies_ms, bodies, strict=True):
        if code != 200:
            missing += 1
            continue
        if latency > TIMEOUT * 1000:
            late += 1
            continue
        try:
            answer = json.loads(body)
            response = answer["response"]
            ok = answer["kind"] == "AdmissionReview" and response["uid"] == uid
        except (ValueError, KeyError, TypeError):
            wrong += 1
            continue
        text = json.dumps(response)
        if "did not judge" not in text and "not applied" not in text:
            if ok:
                judged.append(latency)
            else:
                wrong += 1
            continue
        status = response.get("status") or {}
        if shed_as == "429":
            ok = ok and response["allowed"] is False and status.get("code") == 429
            allowed_unjudged_evictions += response["allowed"] is not False
        elif shed_as == "503":
            ok = ok and response["allowed"] is False and status.get("code") == 503
        else:
            ok = ok and response["allowed"] is True and bool(response.get("warnings"))
        if ok:
            shed.append(latency)
        else:
            wrong += 1

    def pct(values: list[float], q: float) -> float | None:
        return percentile(values, q) / 1000 if values else None

    return {
        "requests": len(codes),
        "judged_in_time": len(judged),
        "shed_well_formed": len(shed),
        "wrong_answers": wrong,
        "answered_after_timeout": late,
        "no_answer": missing,
        "evictions_allowed_unjudged": allowed_unjudged_evictions,
        "judged_p50_s": pct(judged, 50),
        "judged_p99_s": pct(judged, 99),
        "judged_max_s": pct(judged, 100),
        "shed_p50_s": pct(shed, 50),
        "shed_p99_s": pct(shed, 99),
        "shed_max_s": pct(shed, 100),
    }


def capacity(url: str, ca: str, work: pathlib.Path, path: str, body: bytes, *, seconds: float = 5.0, clients: int = 8) -> float:
    """Reviews per second one worker judges when `clients` callers each wait for their answer
    (vegeta, keep-alive HTTPS, a closed loop: no queue builds, nothing is shed)."""
    from bench.common import Target, attack

    (work / "capacity.json").write_bytes(body)
    result = attack(
        [Target(url=url + path, body=work / "capacity.json")],
        rate=0,
        seconds=seconds,
        workdir=work / "vegeta-capacity",
        ca_file=pathlib.Path(ca),
        timeout=10,
        http2=False,
        max_workers=clients,
    )
    return result.ok / seconds


def overload(
    url: str, ca: str, work: pathlib.Path, *, seconds: float, factor: float, rate: float = 0, paths: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Per endpoint: its capacity (capacity()), measured right before, then reviews offered at
    `factor` times it (or at `rate`) for `seconds` with vegeta over keep-alive HTTPS (new
    connections when all are busy, as the apiserver's client does), each answer classified."""
    from bench.common import Target, attack, kernel_tcp_counters, kernel_tcp_since

    out: dict[str, Any] = {}
    for path, (body, shed_as) in overload_bodies().items():
        if paths and path not in paths:
            continue
        cap = capacity(url, ca, work, path, body)
        offered = rate or round(factor * cap)
        name = path.rsplit("/", 1)[1]
        (work / f"{name}.json").write_bytes(body)
        kernel_before = kernel_tcp_counters()
        result = attack(
            [Target(url=url + path, body=work / f"{name}.json")],
            rate=offered,
            seconds=seconds,
            workdir=work / f"vegeta-{name}",
            ca_file=pathlib.Path(ca),
            keep_bodies=True,
            timeout=10,
            http2=False,
            idle_connections=APISERVER_IDLE_CONNECTIONS,
        )
        uid = json.loads(body)["request"]["uid"]
        out[name] = {
            "capacity_per_s": round(cap, 1),
            "offered_per_s": offered,
            **classify(result.codes, result.latencies_ms, result.bodies, uid=uid, shed_as=shed_as),
            "errors": result.errors[:3],
            "kernel_tcp": kernel_tcp_since(kernel_before),
        }
        time.sleep(3)  # let the queue and the connections of this run drain
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=pathlib.Path, help="run webhook/ and certs/ from this folder (before)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each flood, seconds")
    parser.add_argument("--out", type=pathlib.Path, help="write the figures as JSON here")
    parser.add_argument(
        "--overload-factor",
        type=float,
        default=2.0,
        help="overload: offered rate as a multiple of the endpoint's measured capacity",
    )
    parser.add_argument("--overload-rate", type=float, default=0, help="overload: this rate (reviews/s) instead")
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        help="overload: only this endpoint (repeatable; default: rbac, daemonsets, evictions)",
    )
    parser.add_argument(
        "--only",
        choices=("", "heavy", "forged", "parallel", "burst", "overload"),
        default="",
        help="run one scenario (and the floor)",
    )
    args = parser.parse_args(argv)
    heavy = cluster_role(
        "heavy",
        [rule(["resourceslices"], ["create"])],
        aggregation=[
            {"matchExpressions": [{"key": "k", "operator": "In", "values": [f"value-{i:07d}" for i in range(420_000)]}]}
        ],
    )
    forged = cluster_role("forged", [rule(["resourceslices"], ["create"])])
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        results: dict[str, Any] = {"code": str(args.code or "this checkout"), "machine": machine()}
        proc, url, ca = start(work, args.code)
        try:
            unit = floor(url, ca)
            results["floor_median_s"] = unit
            if args.only in ("", "heavy"):
                results["heavy"] = under_flood(url, ca, json.dumps(review(heavy)).encode(), clients=6, seconds=args.seconds)
            if args.only in ("", "forged"):
                results["forged"] = under_flood(url, ca, json.dumps(review(forged)).encode(), clients=6, seconds=args.seconds)
            if args.only in ("", "parallel"):
                results["parallel"] = parallel(url, ca)
            if args.only in ("", "burst"):
                results["burst"] = burst(url, ca, work)
            if args.only in ("", "overload"):
                results["overload"] = overload(
                    url,
                    ca,
                    work,
                    seconds=args.seconds,
                    factor=args.overload_factor,
                    rate=args.overload_rate,
                    paths=tuple(args.path),
                )
        finally:
            proc.terminate()
            proc.wait(30)
    parts = [results[p] for p in ("heavy", "forged", "parallel") if p in results]
    parts += list(results.get("overload", {}).values()) + results.get("burst", {}).get("rounds", [])
    for part in parts:
        if "capacity_per_s" in part:  # reviews judged in the floor's round-trip time: the rate as a ratio
            part["capacity_x_floor"] = round(part["capacity_per_s"] * unit, 2)
            part["offered_x_floor"] = round(part["offered_per_s"] * unit, 2)
        for key in list(part):
            if key.endswith("_s") and not key.endswith("_per_s") and part[key] is not None:
                part[key.replace("_s", "_x_floor")] = round(part[key] / unit, 1)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
