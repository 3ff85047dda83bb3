"""The periodic audit's own process: `python -m webhook.serve.audit_child`, started by the serving
worker (webhook.serve.periodic) once per interval, never sharing the worker's interpreter.

Why a process: at the scalability envelope the audit is ~7 s of pure-Python work. Run in a thread
of the serving worker it would hold the GIL beside the request threads, and the no-op floor's p99
would rise past the 3 s webhook timeout (3.6 s measured), so an eviction could pass through
failurePolicy Ignore during every audit. A child lists what it judges itself (streamed, as
`dra-guard audit --cluster` does), runs at a lower CPU priority (nice 10) than the worker, and
returns its memory to the system when it exits.

Protocol: the parent writes one pickled AuditRequest to the child's stdin (both run the same
code); the child writes (Cluster)PolicyReports itself and prints one JSON line on stdout: {"counts":
[[policy, mode, n], ...], "findings": n, "excepted": {"active": n, "expired": n}, "doors": {check: n}, "objects": n, "seconds": s, "peakRssMiB": m, "pid": p,
"reportOwnerProblem": why the reports carry no owner or ""},
or {"error": "..."} with exit status 3 on an API error. Its log lines go to the inherited stderr.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import json
import logging
import os
import pickle
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from webhook import audit, logs
from webhook.config import Config
from webhook.kube import client as kube_client
from webhook.kube import lists
from webhook.kube.pages import RateLimiter
from webhook.kube.reports import REPORT_APIS, ReportOwner, ReportWriter, served_report_apis
from webhook.model.facts import StaticFacts
from webhook.policies.drain_doors import DOOR_CHECKS
from webhook.policies.exceptions import EXPIRED_CHECK

#: the child's nice increment: the serving worker (nice 0) gets the CPU first when both want it
NICE = 10
#: exit status of a child whose audit failed on the Kubernetes API (its stdout says why)
API_ERROR_EXIT = 3
#: prctl(2) option: a signal the kernel sends this process when its parent thread exits
PR_SET_PDEATHSIG = 1

log = logging.getLogger("dra_guard.audit")


@dataclasses.dataclass(frozen=True)
class AuditRequest:
    """What the child needs: the worker's Config (namespace resolved), its kubeconfig path (None:
    in-cluster or $KUBECONFIG, as `serve`), the per-request API timeout (seconds) and log level."""

    config: Config
    kubeconfig: str | None
    request_timeout_seconds: float
    log_level: str = "info"


@dataclasses.dataclass(frozen=True)
class AuditSummary:
    """The child's answer: findings counted per (policy, mode) (those an exception skips left out),
    totals, the Namespaces labelled for DRA admin access, wall time (seconds), the child's peak RSS
    (MiB), its pid, the findings exceptions covered ({"active": skipped, "expired":
    exception-expired findings}), the findings per drain-door check (webhook.policies.drain_doors.
    DOOR_CHECKS: {check: n}, each check present) and why the reports it wrote carry no owner ("" when they do:
    write_reports())."""

    counts: dict[tuple[str, str], int]
    findings: int
    admin_access_namespaces: int
    objects: int
    seconds: float
    peak_rss_mib: float
    pid: int
    excepted: dict[str, int] = dataclasses.field(default_factory=dict)
    doors: dict[str, int] = dataclasses.field(default_factory=dict)
    report_owner_problem: str = ""


class AuditChildError(RuntimeError):
    """The child failed: an API error it reported, a timeout (it is killed), or a crash."""


def write_reports(client: Any, result: audit.Audit, report_format: str, owner_name: str = "") -> str:
    """Write the reports of `result` in each report API `report_format` chooses ("wgpolicyk8s.io",
    "openreports.io" or "both") that the cluster serves, an empty cluster-scoped report saying the
    audit ran; delete dra-guard's reports of a served API not chosen (left by a previous
    reportFormat). Each report names ClusterRole `owner_name` as its owner (ReportOwner: its uid
    read once for this audit, from the API, and dropped when a write fails; every audit reads it
    afresh, so a replaced ClusterRole's new uid is in the reports from the next audit on), so the
    garbage collector deletes the reports with it. Returns why the reports carry no owner ("" when they do, or when no API
    chosen is served): written without one rather than not at all.
    Raises kube_client.API_ERRORS."""
    served = served_report_apis(client)
    chosen = set(REPORT_APIS) if report_format == "both" else {report_format}
    owner = ReportOwner(client, owner_name)
    problem = ""
    for group in sorted(served):
        writer = ReportWriter(client, group)
        if group not in chosen:
            try:
                writer.delete_all()
            except kube_client.API_ERRORS as exc:  # 403 from an older chart's RBAC: never worth losing the reports written
                log.warning(
                    "cannot delete dra-guard's reports of a report API not chosen",
                    extra={"group": group, "error": kube_client.describe_error(exc)[:300]},
                )
            continue
        reference = owner.reference()
        problem = owner.problem if reference is None else ""
        reports = audit.policy_reports(result.findings, refs=result.refs, judged=result.judged, api=group, owner=reference)
        cluster_kind = REPORT_APIS[group].cluster_kind
        if not any(r["kind"] == cluster_kind for r in reports):  # an empty one says the audit ran
            reports.insert(0, audit.empty_cluster_report(group, owner=reference))
        try:
            writer.apply(reports)
        except kube_client.API_ERRORS:
            owner.forget()
            raise
    return problem


def audit_cluster(client: Any, config: Config) -> dict[str, Any]:
    """Audit the live cluster once and write dra-guard's reports (config.audit.policyReports, in
    the report API of config.audit.reportFormat when served: write_reports()): the JSON-able
    summary the child prints. RBAC, Pods and
    ResourceClaims are streamed into fresh indexes (lists.stream_audit_cluster), at
    config.audit.qps/burst. Raises kube_client.API_ERRORS on API errors."""
    started = time.monotonic()
    limiter = RateLimiter(qps=config.audit.qps, burst=config.audit.burst)
    served = kube_client.served_resource_versions(client)
    facts = StaticFacts(config)
    objects = lists.stream_audit_cluster(client, facts, served_versions=served, limiter=limiter)
    result = audit.audit(objects, config, served_versions=served, online=True, facts=facts)
    counts = collections.Counter((f.policy, mode) for f, mode in result.findings if not f.skipped)
    doors = collections.Counter(f.check for f, _ in result.findings if f.check in DOOR_CHECKS and not f.skipped)
    owner_problem = ""
    if config.audit.policy_reports:
        owner_problem = write_reports(client, result, config.audit.report_format, config.audit.report_owner_cluster_role)
    return {
        "counts": [[p, m, n] for (p, m), n in sorted(counts.items())],
        "findings": len(result.findings),
        "doors": {check: doors.get(check, 0) for check in DOOR_CHECKS},
        "adminAccessNamespaces": sum(1 for f, _ in result.findings if f.check == "admin-access-namespace"),
        "excepted": {
            "active": sum(1 for f, _ in result.findings if f.skipped),
            "expired": sum(1 for f, _ in result.findings if f.check == EXPIRED_CHECK),
        },
        "objects": len(objects),
        "seconds": round(time.monotonic() - started, 3),
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "pid": os.getpid(),
        "reportOwnerProblem": owner_problem,
    }


def _lower_priority() -> None:
    """Nice the child, ask to die with the thread that started it (Linux), and offer it first to
    the OOM killer; each best effort (other systems, restricted containers)."""
    try:
        os.nice(NICE)
    except OSError:
        pass
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def main() -> int:
    """The child's entry point: read the AuditRequest from stdin, audit, print the summary."""
    request: AuditRequest = pickle.load(sys.stdin.buffer)
    _lower_priority()
    logs.setup(request.log_level)
    try:
        client = kube_client.api_client(request.kubeconfig, timeout_seconds=request.request_timeout_seconds)
        summary = audit_cluster(client, request.config)
    except kube_client.API_ERRORS as exc:
        print(json.dumps({"error": kube_client.describe_error(exc)[:500]}), flush=True)
        return API_ERROR_EXIT
    except Exception as exc:  # a bug: its traceback in the log, one line to the parent
        log.exception("periodic audit failed in its process")
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
        return 1
    print(json.dumps(summary), flush=True)
    return 0


def run_in_child(request: AuditRequest, *, timeout_seconds: float, started: Callable[[int], None] | None = None) -> AuditSummary:
    """Run one audit in a new `python -m webhook.serve.audit_child` process and wait for it at most
    `timeout_seconds` (then it is killed); started(pid) is called once it runs. Raises
    AuditChildError with the child's reason."""
    child = subprocess.Popen([sys.executable, "-m", "webhook.serve.audit_child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if started is not None:
        started(child.pid)
    try:
        out, _ = child.communicate(pickle.dumps(request), timeout=timeout_seconds)
    except subprocess.TimeoutExpired as exc:
        child.kill()
        child.communicate()
        raise AuditChildError(f"the audit process did not finish within {timeout_seconds:g} s and was killed") from exc
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if child.returncode != 0 or "counts" not in answer:
        reason = answer.get("error") or f"exit status {child.returncode}, no summary (its log lines say why)"
        raise AuditChildError(f"the audit process failed: {reason}")
    return AuditSummary(
        counts={(p, m): int(n) for p, m, n in answer["counts"]},
        findings=int(answer["findings"]),
        admin_access_namespaces=int(answer.get("adminAccessNamespaces", 0)),
        objects=int(answer["objects"]),
        seconds=float(answer["seconds"]),
        peak_rss_mib=float(answer["peakRssMiB"]),
        pid=int(answer["pid"]),
        excepted={str(k): int(v) for k, v in answer.get("excepted", {}).items()},
        doors={str(k): int(v) for k, v in answer.get("doors", {}).items()},
        report_owner_problem=str(answer.get("reportOwnerProblem") or ""),
    )


if __name__ == "__main__":
    sys.exit(main())
