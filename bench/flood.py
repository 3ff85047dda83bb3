"""Flood figures (issue 21): how a dra-guard worker answers forged, heavy and parallel reviews, as
ratios to the floor (`POST /validate/noop`) measured in the same run on the same server.

    python -m bench.flood [--code DIR] [--seconds 15] [--out bench/results/flood.json]

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
* parallel: 200 compliant ClusterRoleBinding reviews at once, each on a new TLS connection (like
  the apiserver opening connections under a burst): the slowest answer as a multiple of the floor,
  and answers over 3 s or missing.
* overload: RBAC reviews offered at twice what one worker sustains (vegeta): how many were judged
  in time, shed with the overload answer, answered after the 3 s timeout, or not answered.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from tests.builders import binding, cluster_role, eviction_request, review, rule, subject  # noqa: E402

TIMEOUT = 3.0  # the chart's webhook timeoutSeconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(work: pathlib.Path, code: pathlib.Path | None) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    env = {**os.environ}
    if code is not None:
        env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    log = open(work / "serve.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "serve", "--self-signed", str(work / "tls"),
                             "--no-cluster", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(code or work), start_new_session=True)
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

    eviction = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "request": eviction_request("gpu-driver-x")}).encode()
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
    return {"evictions": len(answers), "flood_reviews_sent": sent[0],
            "eviction_median_s": statistics.median(done) if done else None, "eviction_max_s": max(done) if done else None,
            "eviction_over_timeout": sum(1 for a in answers if a is None or a > TIMEOUT)}


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
    return {"reviews": count, "answered": len(done), "slowest_s": max(done) if done else None,
            "median_s": statistics.median(done) if done else None,
            "over_timeout_or_missing": sum(1 for a in answers if a is None or a > TIMEOUT)}


def overload(url: str, ca: str, work: pathlib.Path, *, seconds: float, factor: float,
             rate: float = 0) -> dict[str, Any]:
    """RBAC reviews at `factor` times the rate one worker sustains, estimated as 1 / the median of
    sequential RBAC reviews (one thread's round trip: an upper bound of the worker's cost per
    review, so the real capacity is higher), with vegeta over keep-alive HTTPS for `seconds`."""
    from bench.common import Target, attack

    s = session(ca)
    body = json.dumps(review(binding("ok", "view", [subject("Group", "g")]))).encode()
    per_review = statistics.median(t for t in (timed_post(s, url + "/validate/rbac", body) for _ in range(300)) if t)
    rate = rate or round(factor / per_review)
    (work / "rbac.json").write_bytes(body)
    result = attack([Target(url=url + "/validate/rbac", body=work / "rbac.json")], rate=rate, seconds=seconds,
                    workdir=work / "vegeta", ca_file=pathlib.Path(ca), keep_bodies=True, timeout=10, http2=False)
    judged = shed = late = missing = 0
    for code, latency, answer in zip(result.codes, result.latencies_ms, result.bodies, strict=True):
        if code != 200:
            missing += 1
        elif latency > TIMEOUT * 1000:
            late += 1
        elif b"did not judge" in answer:
            shed += 1
        else:
            judged += 1
    answered = sorted(lat for code, lat in zip(result.codes, result.latencies_ms, strict=True) if code == 200)
    return {"per_review_s": per_review, "offered_per_s": rate, "requests": result.requests,
            "judged_in_time": judged, "shed_with_overload_answer": shed, "answered_after_timeout": late,
            "no_answer": missing, "errors": result.errors[:3],
            "answer_p50_s": answered[len(answered) // 2] / 1000 if answered else None,
            "answer_p99_s": answered[int(len(answered) * 0.99)] / 1000 if answered else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=pathlib.Path, help="run webhook/ and certs/ from this folder (before)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each flood, seconds")
    parser.add_argument("--out", type=pathlib.Path, help="write the figures as JSON here")
    parser.add_argument("--overload-factor", type=float, default=2.0,
                        help="overload: offered rate as a multiple of 1 / a sequential review's time")
    parser.add_argument("--overload-rate", type=float, default=0, help="overload: this rate (reviews/s) instead")
    parser.add_argument("--only", choices=("", "heavy", "forged", "parallel", "overload"), default="",
                        help="run one scenario (and the floor)")
    args = parser.parse_args(argv)
    heavy = cluster_role("heavy", [rule(["resourceslices"], ["create"])], aggregation=[{"matchExpressions": [
        {"key": "k", "operator": "In", "values": [f"value-{i:07d}" for i in range(420_000)]}]}])
    forged = cluster_role("forged", [rule(["resourceslices"], ["create"])])
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        results: dict[str, Any] = {"code": str(args.code or "this checkout")}
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
            if args.only in ("", "overload"):
                results["overload"] = overload(url, ca, work, seconds=args.seconds, factor=args.overload_factor,
                                               rate=args.overload_rate)
        finally:
            proc.terminate()
            proc.wait(30)
    for part in ("heavy", "forged", "parallel", "overload"):
        for key in list(results.get(part, ())):
            if key.endswith("_s") and not key.endswith("_per_s") and results[part][key] is not None:
                results[part][key.replace("_s", "_x_floor")] = round(results[part][key] / unit, 1)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
