"""Soak test: a real `dra-guard serve` under a steady mixed load, watched for errors and leaks.

The load is vegeta (built from the Go module proxy into ~/.cache/dra-guard/bin/vegeta by
`python -m tests.e2e.binaries` or this script) over HTTPS with keep-alive, like the kube-apiserver:
RBAC, DaemonSet (probe patch) and eviction reviews in equal parts. Every `--sample` seconds the
worker process's RSS, open file descriptors and threads are read from /proc.

    python -m bench soak --rate 500 --duration 600 --out bench/results/unreleased/soak.json

Pass criteria (issue 8): zero non-200 answers; RSS growth after warm-up (the first minute) < 5%;
no file-descriptor or thread growth. Exit 0 when they hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

from bench.common import RESULTS, machine, vegeta, worker_pid
from bench.common import proc_status as proc_stats
from tests.builders import (
    binding,
    driver_daemonset,
    eviction_request,
    review,
    subject,
)
from tests.serve import DraGuardProcess


def bodies(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """Realistic AdmissionReview bodies, one per endpoint."""
    ds = review(binding("x", "y", []))
    ds["request"].update(
        kind={"group": "apps", "version": "v1", "kind": "DaemonSet"},
        resource={"group": "apps", "version": "v1", "resource": "daemonsets"},
        object=driver_daemonset(),
    )
    out = {
        "/validate/rbac": review(binding("team-gpu", "gpu-slice-editor", [subject("Group", "team-a")])),
        "/mutate/daemonsets": ds,
        "/validate/evictions": {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": eviction_request("some-pod", "default"),
        },
    }
    paths = {}
    for path, body in out.items():
        file = folder / (path.strip("/").replace("/", "-") + ".json")
        file.write_text(json.dumps(body))
        paths[path] = file
    return paths


def main(argv: list[str] | None = None) -> int:
    """Run the soak; 0 when its pass criteria hold, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=500, help="requests per second (default: %(default)s)")
    parser.add_argument("--duration", type=int, default=600, help="seconds (default: %(default)s)")
    parser.add_argument("--sample", type=int, default=10, help="seconds between process samples")
    parser.add_argument("--warmup", type=int, default=60, help="seconds before RSS growth is measured")
    parser.add_argument("--out", default=str(RESULTS / "soak.json"), help="where the JSON result goes")
    args = parser.parse_args(argv)

    work = pathlib.Path(tempfile.mkdtemp(prefix="dra-guard-soak-"))
    server = DraGuardProcess(work / "server", "--no-cluster")
    server.wait("/readyz")
    pid = worker_pid(server.proc.pid)
    targets = work / "targets.txt"
    targets.write_text(
        "\n".join(f"POST {server.url}{path}\nContent-Type: application/json\n@{file}\n" for path, file in bodies(work).items())
    )
    results = work / "results.bin"
    attack = subprocess.Popen(
        [
            vegeta(),
            "attack",
            f"-rate={args.rate}/s",
            f"-duration={args.duration}s",
            f"-targets={targets}",
            f"-root-certs={server.ca_file}",
            "-keepalive=true",
            f"-output={results}",
            "-timeout=3s",
        ]
    )
    samples = []
    started = time.monotonic()
    try:
        while attack.poll() is None:
            samples.append({"t": round(time.monotonic() - started, 1), **proc_stats(pid)})
            time.sleep(args.sample)
        samples.append({"t": round(time.monotonic() - started, 1), **proc_stats(pid)})
    finally:
        if attack.poll() is None:
            attack.terminate()
        server.stop()
    report = json.loads(
        subprocess.run([vegeta(), "report", "-type=json", str(results)], capture_output=True, text=True, check=True).stdout
    )
    after_warmup = [s for s in samples if s["t"] >= args.warmup] or samples
    base, last = after_warmup[0], samples[-1]
    growth = (last["rss_bytes"] - base["rss_bytes"]) / base["rss_bytes"]
    result = {
        "rate": args.rate,
        "duration_s": args.duration,
        "requests": report["requests"],
        "success_ratio": report["success"],
        "status_codes": report["status_codes"],
        "errors": report["errors"][:10],
        "latency_ms": {k: round(report["latencies"][k] / 1e6, 2) for k in ("50th", "95th", "99th", "max")},
        "throughput_rps": round(report["throughput"], 1),
        "rss_after_warmup_mib": round(base["rss_bytes"] / 2**20, 1),
        "rss_end_mib": round(last["rss_bytes"] / 2**20, 1),
        "rss_growth_after_warmup": round(growth, 4),
        "fds": [base["fds"], last["fds"]],
        "threads": [base["threads"], last["threads"]],
        "samples": samples,
        "machine": machine(),
    }
    ok = report["success"] == 1.0 and growth < 0.05 and last["fds"] <= base["fds"] + 5 and last["threads"] <= base["threads"]
    result["pass"] = ok
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
