"""The output formats of `dra-guard audit -o`: table (default), json, yaml, sarif (SARIF 2.1.0, for
code-scanning UIs), junit (JUnit XML, for CI test reports). The policyreport and openreports
formats are in webhook.audit.reports. Every renderer takes the findings with their modes and returns text.

`problems` (the inputs that could not be read, each a line naming the file) make every format
say the audit is incomplete, never clean: the findings then cover only what could be read."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from webhook.policies.decision import Finding
from webhook.policies.registry import PAGE, source_of
from webhook.version import version

Result = tuple[Finding, str]
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
#: the apiVersion and kind of `-o json` / `-o yaml`
API_VERSION, KIND = "dra-guard.io/v1alpha1", "AuditResult"
#: what enforce mode does about a finding ("skip": an exception of the config skips it), and "pass"
#: for an object a policy judged without one
RESULTS = ("refuse", "patch", "advisory", "skip", "pass")


def acting(finding: Finding) -> bool:
    """Whether enforce mode would refuse or patch for this finding (what exit code 1 means)."""
    return finding.enforced or finding.fixed_by_patch


def as_dict(finding: Finding, mode: str, sources: Mapping[tuple[str, str, str], str]) -> dict[str, Any]:
    """A finding's JSON/YAML form: Finding.as_dict plus the source page's section and, for an
    object read from a file, where ("path:line")."""
    out = finding.as_dict(mode=mode)
    out["source"] = source_of(finding.policy)
    where = sources.get((finding.kind, finding.namespace, finding.name))
    if where:
        out["file"] = where
    return out


def render_table(
    findings: list[Result], problems: Sequence[str] = (), sources: Mapping[tuple[str, str, str], str] | None = None
) -> str:
    """A plain-text table: RESULT (what enforce mode does: refuse, patch, advisory, skip) POLICY
    CHECK MODE KIND NAMESPACE NAME LOCATION (where a file's object is, "path:line" from `sources`;
    "-" for one read from the cluster), the message on the next line, and a count; with `problems`
    a last line says the audit is incomplete (never "No findings")."""
    incomplete = (
        (f"Incomplete audit: {len(problems)} input(s) could not be read (named on stderr); only the rest was judged.\n")
        if problems
        else ""
    )
    if not findings:
        return incomplete or "No findings: nothing here would be refused.\n"
    where = sources or {}
    lines = []
    rows = [("RESULT", "POLICY", "CHECK", "MODE", "KIND", "NAMESPACE", "NAME", "LOCATION")] + [
        (result_of(f), f.policy, f.check, mode, f.kind, f.namespace or "-", f.name, where.get((f.kind, f.namespace, f.name), "-"))
        for f, mode in findings
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("  ".join(h.ljust(w) for h, w in zip(rows[0], widths, strict=True)).rstrip())
    for (f, _), row in zip(findings, rows[1:], strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        lines.append(f"    {f.message}")
    count = sum(1 for f, _ in findings if acting(f))
    skipped = sum(1 for f, _ in findings if f.skipped)
    excepted = f"{skipped} skipped by exceptions, " if skipped else ""
    lines.append(
        f"\n{len(findings)} finding(s): {count} that enforce mode would refuse or patch, "
        f"{excepted}{len(findings) - count - skipped} advisory. Why: {PAGE}"
    )
    return "\n".join(lines) + "\n" + incomplete


def result_of(finding: Finding) -> str:
    """ "refuse" (enforce mode refuses), "patch" (it patches), "skip" (an exception skips it) or "advisory"."""
    if finding.skipped:
        return "skip"
    return "refuse" if finding.enforced else "patch" if finding.fixed_by_patch else "advisory"


def summary(
    findings: list[Result], judged: Mapping[str, list[tuple[str, str, str]]] | None = None, problems: Sequence[str] = ()
) -> dict[str, Any]:
    """{"complete": no input problem, "inputErrors": how many, "findings": N, "results": {refuse,
    patch, advisory, skip, pass: count}, "byPolicy": {policy: {the same counts}}}. pass: the objects of
    `judged` (policy -> (kind, namespace, name), from webhook.audit.run.audit) without a finding of
    that policy, as in PolicyReports."""
    by_policy: dict[str, dict[str, int]] = {}
    found: set[tuple[str, str, str, str]] = set()
    for f, _ in findings:
        by_policy.setdefault(f.policy, dict.fromkeys(RESULTS, 0))[result_of(f)] += 1
        found.add((f.policy, f.kind, f.namespace, f.name))
    for policy, objects in (judged or {}).items():
        counts = by_policy.setdefault(policy, dict.fromkeys(RESULTS, 0))
        counts["pass"] += sum(1 for key in set(objects) if (policy, *key) not in found)
    return {
        "complete": not problems,
        "inputErrors": len(problems),
        "findings": len(findings),
        "results": {r: sum(c[r] for c in by_policy.values()) for r in RESULTS},
        "byPolicy": dict(sorted(by_policy.items())),
    }


def envelope(
    findings: list[Result],
    sources: Mapping[tuple[str, str, str], str] | None = None,
    *,
    judged: Mapping[str, list[tuple[str, str, str]]] | None = None,
    problems: Sequence[str] = (),
) -> dict[str, Any]:
    """The AuditResult of `-o json` and `-o yaml`: {"apiVersion": API_VERSION, "kind": KIND,
    "summary": summary(), "inputErrors": [each problem], "findings": [as_dict() of each]}."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "summary": summary(findings, judged, problems),
        "inputErrors": list(problems),
        "findings": [as_dict(f, mode, sources or {}) for f, mode in findings],
    }


def render_json(
    findings: list[Result],
    sources: Mapping[tuple[str, str, str], str] | None = None,
    *,
    judged: Mapping[str, list[tuple[str, str, str]]] | None = None,
    problems: Sequence[str] = (),
) -> str:
    """envelope() as JSON; each finding has policy, kind, namespace, name, mode, check, enforced,
    patch, message, source, file (objects read from files) and details."""
    return json.dumps(envelope(findings, sources, judged=judged, problems=problems), indent=2, default=str) + "\n"


def render_yaml(
    findings: list[Result],
    sources: Mapping[tuple[str, str, str], str] | None = None,
    *,
    judged: Mapping[str, list[tuple[str, str, str]]] | None = None,
    problems: Sequence[str] = (),
) -> str:
    """The JSON form (render_json) as YAML."""
    return yaml.safe_dump(json.loads(render_json(findings, sources, judged=judged, problems=problems)), sort_keys=False)


def render_sarif(
    findings: list[Result], sources: Mapping[tuple[str, str, str], str] | None = None, *, problems: Sequence[str] = ()
) -> str:
    """SARIF 2.1.0: one run of tool dra-guard, a rule per check (helpUri: the source page's
    section), a result per finding: level error when enforce mode would refuse or patch, warning
    for advisories (and, for a finding an exception skips, an accepted external suppression); a physical location (file and line) for objects read from files, a logical one
    (kind/namespace/name) always. The run's invocation has executionSuccessful false and an error
    notification per input problem when there are any."""
    sources = sources or {}
    rules: dict[str, dict[str, Any]] = {}
    results = []
    for f, mode in findings:
        rule_id = f"{f.policy}/{f.check or f.policy}"
        rules.setdefault(
            rule_id,
            {
                "id": rule_id,
                "name": f.check or f.policy,
                "shortDescription": {"text": f"dra-guard {f.policy}: {f.check or f.policy}"},
                "helpUri": source_of(f.policy),
            },
        )
        logical = "/".join(p for p in (f.kind, f.namespace, f.name) if p)
        result: dict[str, Any] = {
            "ruleId": rule_id,
            "level": "error" if acting(f) else "warning",
            "message": {"text": f.message},
            "properties": {"mode": mode, "enforced": f.enforced, "patch": f.fixed_by_patch},
            "locations": [{"logicalLocations": [{"name": logical, "kind": "resource"}]}],
        }
        if f.skipped:  # SARIF's own word for an accepted finding: code-scanning UIs show it as dismissed
            result["suppressions"] = [
                {
                    "kind": "external",
                    "status": "accepted",
                    "justification": f"exception {f.exception['ref']} (owner {f.exception['owner']}, "
                    f"expires {f.exception['expires']}): {f.exception['reason']}",
                }
            ]
        where = sources.get((f.kind, f.namespace, f.name))
        if where:
            path, _, line = where.rpartition(":")
            result["locations"][0]["physicalLocation"] = {
                "artifactLocation": {"uri": path},
                "region": {"startLine": int(line) if line.isdigit() else 1},
            }
        results.append(result)
    sarif = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {"name": "dra-guard", "version": version(), "informationUri": PAGE, "rules": list(rules.values())}
                },
                "invocations": [
                    {
                        "executionSuccessful": not problems,
                        "toolExecutionNotifications": [
                            {"level": "error", "descriptor": {"id": "input-error"}, "message": {"text": p}} for p in problems
                        ],
                    }
                ],
                "results": results,
            }
        ],
    }
    return json.dumps(sarif, indent=2) + "\n"


def render_junit(
    findings: list[Result], sources: Mapping[tuple[str, str, str], str] | None = None, *, problems: Sequence[str] = ()
) -> str:
    """JUnit XML: a test suite "dra-guard", a test case per finding (a failure when enforce mode
    would refuse or patch; skipped when an exception skips it; advisories pass with their message as output), a test case in error per
    input problem, and one passing case "no findings" when there is neither, so CI reports show the
    audit ran."""
    sources = sources or {}
    suite = ET.Element(
        "testsuite",
        name="dra-guard",
        tests=str(max(1, len(findings) + len(problems))),
        failures=str(sum(1 for f, _ in findings if acting(f))),
        errors=str(len(problems)),
        skipped=str(sum(1 for f, _ in findings if f.skipped)),
    )
    for problem in problems:
        case = ET.SubElement(suite, "testcase", classname="dra-guard.input", name=problem.split(": ", 1)[0])
        ET.SubElement(case, "error", message=problem, type="input-error").text = problem
    for f, mode in findings:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"dra-guard.{f.policy}.{f.check or f.policy}",
            name="/".join(p for p in (f.kind, f.namespace, f.name) if p),
        )
        where = sources.get((f.kind, f.namespace, f.name))
        if where:
            case.set("file", where.rpartition(":")[0])
        text = f"{f.message}\nmode: {mode}\nsource: {source_of(f.policy)}"
        if f.skipped:
            ET.SubElement(case, "skipped", message=f.summary).text = text
        elif acting(f):
            ET.SubElement(case, "failure", message=f.summary, type=f.check or f.policy).text = text
        else:
            ET.SubElement(case, "system-out").text = text
    if not findings and not problems:
        ET.SubElement(suite, "testcase", classname="dra-guard", name="no findings")
    suites = ET.Element(
        "testsuites",
        name="dra-guard",
        tests=suite.get("tests", "0"),
        failures=suite.get("failures", "0"),
        errors=suite.get("errors", "0"),
    )
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
