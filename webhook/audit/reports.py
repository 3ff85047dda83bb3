"""Findings as wgpolicyk8s.io/v1alpha2 (Cluster)PolicyReports, the shape Kyverno and the Policy
Reporter UI read: one ClusterPolicyReport "dra-guard" for cluster-scoped objects and one
PolicyReport "dra-guard" per namespace, with a `pass` result for every object a policy judged
without a finding (so compliance ratios mean something).

Result and severity follow what enforce mode does: a refusal is fail/high; a missing probe that
enforce mode adds by patch at the next change is warn/low; an advisory is warn/medium; a finding an
exception of the config skips is skip/info, with properties exceptionRef, exceptionReason,
exceptionOwner and exceptionExpires.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from webhook.policies.decision import Finding
from webhook.policies.registry import source_of

Result = tuple[Finding, str]
MANAGED_BY = {"app.kubernetes.io/managed-by": "dra-guard"}
RESULTS = ("pass", "fail", "warn", "error", "skip")


def result_and_severity(finding: Finding) -> tuple[str, str]:
    """("fail", "high") for a refusal, ("warn", "low") for what enforce mode patches,
    ("warn", "medium") for an advisory, ("skip", "info") for what an exception skips."""
    if finding.skipped:
        return "skip", "info"
    if finding.enforced:
        return "fail", "high"
    if finding.fixed_by_patch:
        return "warn", "low"
    return "warn", "medium"


def _resource(kind: str, namespace: str, name: str) -> dict[str, str]:
    return {"kind": kind, "name": name, **({"namespace": namespace} if namespace else {})}


def policy_reports(findings: list[Result], *, now: float | None = None,
                   judged: Mapping[str, list[tuple[str, str, str]]] | None = None,
                   problems: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The reports (wgpolicyk8s.io/v1alpha2 dicts) of `findings`; `judged` (policy -> (kind,
    namespace, name) of the objects it judged, from webhook.audit.run.audit) adds a `pass` result
    for each judged object without a finding of that policy; each of `problems` (inputs that could
    not be read) an `error` result of policy "input" in the ClusterPolicyReport."""
    seconds = int(now if now is not None else time.time())
    stamp = {"seconds": seconds, "nanos": 0}
    groups: dict[str, list[dict[str, Any]]] = {}
    failed: set[tuple[str, str, str, str]] = set()
    for f, mode in findings:
        result, severity = result_and_severity(f)
        failed.add((f.policy, f.kind, f.namespace, f.name))
        groups.setdefault(f.namespace, []).append({
            "source": "dra-guard", "policy": f.policy, "rule": f.check or f.policy, "result": result,
            "severity": severity, "scored": True, "message": f.message[:1024],
            "properties": {"mode": mode, "patch": str(f.fixed_by_patch).lower(), "source": source_of(f.policy),
                           **{f"exception{k.capitalize()}": v for k, v in f.exception.items()}},
            "resources": [_resource(f.kind, f.namespace, f.name)], "timestamp": stamp})
    for policy, objects in sorted((judged or {}).items()):
        for kind, namespace, name in objects:
            if (policy, kind, namespace, name) in failed:
                continue
            groups.setdefault(namespace, []).append({
                "source": "dra-guard", "policy": policy, "rule": policy, "result": "pass", "scored": True,
                "message": f"{kind} {name}: nothing the {policy} policy would refuse or patch",
                "resources": [_resource(kind, namespace, name)], "timestamp": stamp})
    for problem in problems:
        groups.setdefault("", []).append({
            "source": "dra-guard", "policy": "input", "rule": "readable", "result": "error", "scored": True,
            "message": problem[:1024], "timestamp": stamp})
    reports = []
    for namespace in sorted(groups):
        results = groups[namespace]
        summary = {k: sum(1 for r in results if r["result"] == k) for k in RESULTS}
        meta: dict[str, Any] = {"name": "dra-guard", "labels": dict(MANAGED_BY)}
        if namespace:
            meta["namespace"] = namespace
        reports.append({"apiVersion": "wgpolicyk8s.io/v1alpha2",
                        "kind": "PolicyReport" if namespace else "ClusterPolicyReport",
                        "metadata": meta, "summary": summary, "results": results})
    return reports


def empty_cluster_report() -> dict[str, Any]:
    """dra-guard's ClusterPolicyReport with no result (the periodic audit ran and found nothing cluster-wide)."""
    return {"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "ClusterPolicyReport",
            "metadata": {"name": "dra-guard", "labels": dict(MANAGED_BY)},
            "summary": dict.fromkeys(RESULTS, 0), "results": []}


def render_policyreport(findings: list[Result], judged: Mapping[str, list[tuple[str, str, str]]] | None = None, *,
                        problems: Sequence[str] = ()) -> str:
    """The reports of policy_reports() as one YAML stream (kubectl apply -f - takes it)."""
    return yaml.safe_dump_all(policy_reports(findings, judged=judged, problems=problems), sort_keys=False)
