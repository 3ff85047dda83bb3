"""Findings as policy reports a policy UI reads, in either report API:

- wgpolicyk8s.io/v1alpha2 ClusterPolicyReport / PolicyReport (the Kubernetes Policy WG's API, which
  Kyverno 1.x and the Policy Reporter read);
- openreports.io/v1alpha1 ClusterReport / Report (its successor, the same result fields plus a
  report-level `source`).

One cluster-scoped report "dra-guard" and one namespaced report "dra-guard" per namespace, with a
`pass` result for every object a policy judged without a finding (so compliance ratios mean something).

Result and severity follow what enforce mode does: a refusal is fail/high; a missing probe that
enforce mode adds by patch at the next change is warn/low; an advisory is warn/medium; a finding an
exception of the config skips is skip/info, with properties exceptionRef, exceptionReason,
exceptionOwner and exceptionExpires.

Each report may name an owner (metadata.ownerReferences, one item: the release's ClusterRole,
webhook.kube.reports.ReportOwner), so that the Kubernetes garbage collector deletes the reports with it.

A result names an object in `resources` (apiVersion, kind, namespace, name, uid) only when that
object was read (from the cluster or the files: `refs`). A finding about something that is not an
object there (a control-plane component that runs outside the cluster, an API group, a driver) is
filed scope-less in the cluster-scoped report, its subject in `properties.subject`: a UI never shows
a result against a Pod that does not exist.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from webhook.policies.decision import Finding
from webhook.policies.registry import source_of

Result = tuple[Finding, str]
#: (kind, namespace, name) of an object
Key = tuple[str, str, str]
MANAGED_BY = {"app.kubernetes.io/managed-by": "dra-guard"}
RESULTS = ("pass", "fail", "warn", "error", "skip")
#: the report APIs dra-guard writes, by group: (apiVersion, cluster-scoped kind, namespaced kind)
WGPOLICY = "wgpolicyk8s.io"
OPENREPORTS = "openreports.io"
FORMATS: dict[str, tuple[str, str, str]] = {
    WGPOLICY: ("wgpolicyk8s.io/v1alpha2", "ClusterPolicyReport", "PolicyReport"),
    OPENREPORTS: ("openreports.io/v1alpha1", "ClusterReport", "Report"),
}
#: a result's `message` at most (characters): what policy UIs show in a table cell
MESSAGE_LIMIT = 1024
#: the whole message kept in properties.message when the message is cut (characters): a report
#: holds every result of a namespace in one object, which etcd limits to about 1.5 MB
FULL_MESSAGE_LIMIT = 8192
ELLIPSIS = "…"
#: the lists of a finding's details a result's properties carry whole (an RBAC finding's message
#: names the first few resources of a wide role)
DETAIL_LISTS = ("resources", "verbs", "roles")
#: results[].category of each policy (the page's topic); "input" is an unreadable input
CATEGORIES = {
    "rbac": "DRA access control",
    "probes": "DRA driver health",
    "eviction": "DRA drain order",
    "controlplane": "DRA control plane",
    "input": "dra-guard input",
}


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


def category(policy: str) -> str:
    """results[].category of `policy` (CATEGORIES; "DRA" for a policy not listed)."""
    return CATEGORIES.get(policy, "DRA")


def cut(text: str, limit: int) -> str:
    """`text` whole when it has at most `limit` characters, else cut at the last whitespace
    before the limit, trailing whitespace and punctuation dropped, and "…" added (at most `limit`
    characters in all). A text whose first `limit` - 1 characters hold no whitespace (one long
    token) is cut there."""
    if len(text) <= limit:
        return text
    head = text[: limit - len(ELLIPSIS) + 1]  # + 1: a whitespace right after the kept part is a boundary
    at = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    kept = head[:at] if at > 0 else head[:-1]
    return kept.rstrip(" \t\n,;:") + ELLIPSIS


def message_fields(message: str) -> tuple[str, dict[str, str]]:
    """(results[].message, extra properties) of a finding's message: the message whole when it has at
    most MESSAGE_LIMIT characters; else cut at a word (cut()) and the whole text, up to
    FULL_MESSAGE_LIMIT characters, in properties.message."""
    if len(message) <= MESSAGE_LIMIT:
        return message, {}
    return cut(message, MESSAGE_LIMIT), {"message": cut(message, FULL_MESSAGE_LIMIT)}


def detail_lists(finding: Finding) -> dict[str, str]:
    """Properties holding a finding's lists whole (DETAIL_LISTS of its details, comma-separated, each
    up to FULL_MESSAGE_LIMIT characters): a message names only the first items of a long list."""
    out = {}
    for key in DETAIL_LISTS:
        value = finding.details.get(key)
        if isinstance(value, (list, tuple)) and value:
            out[key] = cut(", ".join(str(v) for v in value), FULL_MESSAGE_LIMIT)
    return out


def subject(kind: str, namespace: str, name: str) -> str:
    """ "Pod kube-system/kube-scheduler", "ClusterRoleBinding x": what a finding is about, in words."""
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def resource_ref(kind: str, namespace: str, name: str, ref: Mapping[str, str]) -> dict[str, str]:
    """An ObjectReference (results[].resources[] item) of an object read: apiVersion and uid from
    `ref` (uid absent for an object read from a file)."""
    out = {"apiVersion": ref.get("apiVersion", ""), "kind": kind, "name": name}
    if namespace:
        out["namespace"] = namespace
    if ref.get("uid"):
        out["uid"] = ref["uid"]
    return {k: v for k, v in out.items() if v}


def policy_reports(
    findings: list[Result],
    *,
    refs: Mapping[Key, Mapping[str, str]],
    now: float | None = None,
    judged: Mapping[str, list[Key]] | None = None,
    problems: Sequence[str] = (),
    api: str = WGPOLICY,
    owner: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The reports of `findings` as dicts of the report API `api` (WGPOLICY or OPENREPORTS).

    refs: (kind, namespace, name) -> {"apiVersion": ..., "uid": ...} of the objects read (the cluster's,
    the files'): webhook.audit.run.Audit.refs. A finding whose object is not there is filed
    scope-less in the cluster-scoped report (properties.subject names it).
    judged: policy -> (kind, namespace, name) of the objects it judged (Audit.judged): a `pass`
    result for each judged object read without a finding of that policy.
    problems: inputs that could not be read: an `error` result each, policy "input", cluster-scoped.
    now: the results' timestamp (seconds since the epoch; default: now).
    owner: an ownerReference (apiVersion, kind, name, uid, ...) every report carries as its only
    metadata.ownerReferences item; None: no ownerReferences.
    Raises KeyError for an unknown `api`."""
    api_version, cluster_kind, namespaced_kind = FORMATS[api]
    seconds = int(now if now is not None else time.time())
    stamp = {"seconds": seconds, "nanos": 0}
    groups: dict[str, list[dict[str, Any]]] = {}

    def add(
        namespace: str,
        policy: str,
        rule: str,
        result: str,
        message: str,
        *,
        severity: str = "",
        properties: Mapping[str, str] | None = None,
        resource: dict[str, str] | None = None,
    ) -> None:
        text, extra = message_fields(message)
        entry: dict[str, Any] = {
            "source": "dra-guard",
            "policy": policy,
            "rule": rule,
            "category": category(policy),
            "result": result,
            "scored": True,
            "message": text,
        }
        if severity:
            entry["severity"] = severity
        props = {**(properties or {}), **extra}
        if props:
            entry["properties"] = props
        if resource is not None:
            entry["resources"] = [resource]
        entry["timestamp"] = stamp
        groups.setdefault(namespace, []).append(entry)

    failed: set[tuple[str, str, str, str]] = set()
    for f, mode in findings:
        result, severity = result_and_severity(f)
        failed.add((f.policy, f.kind, f.namespace, f.name))
        ref = refs.get((f.kind, f.namespace, f.name))
        props = {
            "mode": mode,
            "patch": str(f.fixed_by_patch).lower(),
            "source": source_of(f.policy),
            **detail_lists(f),
            **{f"exception{k.capitalize()}": v for k, v in f.exception.items()},
        }
        if ref is None:
            add(
                "",
                f.policy,
                f.check or f.policy,
                result,
                f.message,
                severity=severity,
                properties={**props, "subject": subject(f.kind, f.namespace, f.name)},
            )
        else:
            add(
                f.namespace,
                f.policy,
                f.check or f.policy,
                result,
                f.message,
                severity=severity,
                properties=props,
                resource=resource_ref(f.kind, f.namespace, f.name, ref),
            )
    for policy, objects in sorted((judged or {}).items()):
        for kind, namespace, name in objects:
            ref = refs.get((kind, namespace, name))
            if (policy, kind, namespace, name) in failed or ref is None:
                continue
            add(
                namespace,
                policy,
                policy,
                "pass",
                f"{kind} {name}: nothing the {policy} policy would refuse or patch",
                resource=resource_ref(kind, namespace, name, ref),
            )
    for problem in problems:
        add("", "input", "readable", "error", problem)
    reports = []
    for namespace in sorted(groups):
        results = groups[namespace]
        summary = {k: sum(1 for r in results if r["result"] == k) for k in RESULTS}
        meta = report_metadata(namespace, owner)
        report: dict[str, Any] = {
            "apiVersion": api_version,
            "kind": namespaced_kind if namespace else cluster_kind,
            "metadata": meta,
        }
        if api == OPENREPORTS:
            report["source"] = "dra-guard"
        reports.append({**report, "summary": summary, "results": results})
    return reports


def report_metadata(namespace: str, owner: Mapping[str, Any] | None) -> dict[str, Any]:
    """metadata of dra-guard's report in `namespace` ("": the cluster-scoped one): name dra-guard,
    label MANAGED_BY and, with an `owner` (an ownerReference), ownerReferences [owner]."""
    meta: dict[str, Any] = {"name": "dra-guard", "labels": dict(MANAGED_BY)}
    if namespace:
        meta["namespace"] = namespace
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return meta


def empty_cluster_report(api: str = WGPOLICY, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """dra-guard's cluster-scoped report of API `api` with no result (the periodic audit ran and
    found nothing cluster-wide); `owner` as policy_reports()."""
    api_version, cluster_kind, _ = FORMATS[api]
    return {
        "apiVersion": api_version,
        "kind": cluster_kind,
        "metadata": report_metadata("", owner),
        **({"source": "dra-guard"} if api == OPENREPORTS else {}),
        "summary": dict.fromkeys(RESULTS, 0),
        "results": [],
    }


def render_reports(
    findings: list[Result],
    *,
    refs: Mapping[Key, Mapping[str, str]],
    judged: Mapping[str, list[Key]] | None = None,
    problems: Sequence[str] = (),
    api: str = WGPOLICY,
) -> str:
    """The reports of policy_reports() as one YAML stream (kubectl apply -f - takes it)."""
    return yaml.safe_dump_all(
        policy_reports(findings, refs=refs, judged=judged, problems=problems, api=api), sort_keys=False, allow_unicode=True
    )
