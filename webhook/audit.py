"""`dra-guard audit`: the admission policies run over manifests (and, with --cluster, live objects).

The same policy code as admission decides; roles and bindings are resolved among the objects
given (files first, then the live cluster's, a file's object replacing the live one of the same
kind and name: the audit answers "what if I applied these files").
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from webhook.config import CONFIG_KIND, Config, ConfigError, from_mapping
from webhook.model.facts import build_facts
from webhook.policies import controlplane, probes
from webhook.policies.decision import Finding
from webhook.policies.registry import POLICIES

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class InputError(ValueError):
    """A manifest could not be read or parsed; the message names the file (and line)."""


def _files(paths: Iterable[str]) -> list[pathlib.Path]:
    out: list[pathlib.Path] = []
    for raw in paths:
        path = pathlib.Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES)
            if not found:
                raise InputError(f"{path}: folder holds no .yaml, .yml or .json file")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(f"{path}: no such file or folder")
    return out


def _expand(doc: Any, *, where: str) -> list[dict[str, Any]]:
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise InputError(f"{where}: expected a Kubernetes object (a mapping), got {type(doc).__name__}")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        return [obj for item in doc["items"] for obj in _expand(item, where=where)]
    if not isinstance(kind, str) or not kind:
        raise InputError(f"{where}: object has no kind")
    return [doc]


def load_manifests(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Kubernetes objects from files or folders of YAML/JSON (multi-document files and *List kinds).

    Raises InputError naming the file and, for invalid YAML, the line.
    """
    objects: list[dict[str, Any]] = []
    for path in _files(paths):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from exc
        try:
            docs = list(yaml.safe_load_all(text))
        except RecursionError:
            raise InputError(f"{path}: invalid YAML: nested too deeply") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise InputError(f"{path}{line}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc
        for i, doc in enumerate(docs, 1):
            objects.extend(_expand(doc, where=f"{path} document {i}"))
    return objects


def config_from(objects: list[dict[str, Any]]) -> Config:
    """The DraGuardConfiguration among `objects` (at most one), else the defaults.

    Raises InputError when there are several or the one found is invalid.
    """
    found = [o for o in objects if o.get("kind") == CONFIG_KIND]
    if len(found) > 1:
        raise InputError(f"{len(found)} {CONFIG_KIND} documents among the manifests; keep one or pass --config")
    try:
        return from_mapping(found[0] if found else None)
    except ConfigError as exc:
        raise InputError(f"{CONFIG_KIND} among the manifests: {exc}") from exc


def merge(files: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Live objects overlaid with the files' (same kind, namespace and name: the file's wins)."""
    def key(o: Mapping[str, Any]) -> tuple[str, str, str]:
        meta = o.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        return str(o.get("kind")), str(meta.get("namespace", "")), str(meta.get("name", ""))
    merged = {key(o): o for o in live}
    merged.update({key(o): o for o in files})
    return list(merged.values())


def run(objects: list[dict[str, Any]], config: Config, *, served_versions: list[str] | None = None) -> list[tuple[Finding, str]]:
    """Every finding over `objects`, each with the mode its policy is configured in.

    objects: plain Kubernetes object dicts with `kind` set: ClusterRoles, ClusterRoleBindings and
    DaemonSets are judged by the admission policies; with a live cluster also Pods, Nodes,
    ConfigMaps, ResourceSlices and ResourceClaims for the control-plane checks.
    served_versions: resource.k8s.io versions the cluster serves (preferred first); None offline,
    where only checks whose objects are among the files run (e.g. a kubeadm static pod manifest of
    kube-controller-manager).
    """
    findings: list[tuple[Finding, str]] = []
    facts = build_facts(objects, config)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind")), []).append(obj)
    for policy in POLICIES:
        if policy.audit is not None:
            mode = config.policy(policy.name).mode
            findings += [(f, mode) for f in policy.audit(facts, config, by_kind)]

    pods = by_kind.get("Pod", [])
    system_pods = [p for p in pods if (p.get("metadata") or {}).get("namespace") == "kube-system"]
    advisory = "audit"
    if served_versions is not None:
        claims = facts.claims
        nodes = [str((n.get("metadata") or {}).get("name")) for n in by_kind.get("Node", [])]
        seamless = {((ds.get("metadata") or {}).get("namespace", ""), (ds.get("metadata") or {}).get("name", "")):
                    probes.supports_seamless_upgrade(ds) for ds in by_kind.get("DaemonSet", [])}
        checks = (controlplane.controller_manager(system_pods)
                  + controlplane.scheduler(system_pods, [c for c in by_kind.get("ConfigMap", [])
                                                         if (c.get("metadata") or {}).get("namespace") == "kube-system"])
                  + controlplane.api_versions(served_versions, by_kind.get("ResourceSlice", []))
                  + controlplane.old_kubelets(by_kind.get("Node", []), claims, seamless)
                  + controlplane.drain_holds(claims, nodes))
        findings += [(f, advisory) for f in checks]
    elif any(controlplane.component_pods(system_pods, "kube-controller-manager")):
        findings += [(f, advisory) for f in controlplane.controller_manager(system_pods)]
    return findings


def exit_code(findings: list[tuple[Finding, str]]) -> int:
    """1 when enforce mode would refuse or patch something, else 0 (advisories alone do not fail)."""
    return 1 if any(f.enforced or f.fixed_by_patch for f, _ in findings) else 0


def render_table(findings: list[tuple[Finding, str]]) -> str:
    """A plain-text table: POLICY CHECK MODE KIND NAMESPACE NAME, the message on the next line."""
    if not findings:
        return "No findings: nothing here would be refused.\n"
    lines = []
    rows = [("POLICY", "CHECK", "MODE", "KIND", "NAMESPACE", "NAME")] + [
        (f.policy, f.check, mode, f.kind, f.namespace or "-", f.name) for f, mode in findings]
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(rows[0], widths, strict=True)).rstrip())
    for (f, _), row in zip(findings, rows[1:], strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        lines.append(f"    {f.message}")
    acting = sum(1 for f, _ in findings if f.enforced or f.fixed_by_patch)
    lines.append(f"\n{len(findings)} finding(s): {acting} that enforce mode would refuse or patch, "
                 f"{len(findings) - acting} advisory.")
    return "\n".join(lines) + "\n"


def render_json(findings: list[tuple[Finding, str]]) -> str:
    """A JSON array of findings (policy, kind, namespace, name, mode, message, details)."""
    return json.dumps([f.as_dict(mode=mode) for f, mode in findings], indent=2, default=str) + "\n"


def policy_reports(findings: list[tuple[Finding, str]], *, now: float | None = None) -> list[dict[str, Any]]:
    """The findings as wgpolicyk8s.io/v1alpha2 reports: one ClusterPolicyReport "dra-guard" for
    cluster-scoped objects and one PolicyReport "dra-guard" per namespace (the shape Kyverno and
    the Policy Reporter UI read). Findings enforce mode would refuse or patch are "fail",
    advisories "warn"."""
    import time

    seconds = int(now if now is not None else time.time())
    groups: dict[str, list[dict[str, Any]]] = {}
    for f, mode in findings:
        result = "fail" if (f.enforced or f.fixed_by_patch) else "warn"
        resource = {"kind": f.kind, "name": f.name, **({"namespace": f.namespace} if f.namespace else {})}
        groups.setdefault(f.namespace, []).append({
            "source": "dra-guard", "policy": f.policy, "rule": f.check or f.policy, "result": result,
            "severity": "high" if result == "fail" else "medium", "scored": True, "message": f.message[:1024],
            "properties": {"mode": mode}, "resources": [resource], "timestamp": {"seconds": seconds, "nanos": 0}})
    reports = []
    for namespace in sorted(groups):
        results = groups[namespace]
        summary = {k: sum(1 for r in results if r["result"] == k) for k in ("pass", "fail", "warn", "error", "skip")}
        meta: dict[str, Any] = {"name": "dra-guard", "labels": {"app.kubernetes.io/managed-by": "dra-guard"}}
        if namespace:
            meta["namespace"] = namespace
        reports.append({"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport" if namespace else "ClusterPolicyReport",
                        "metadata": meta, "summary": summary, "results": results})
    return reports


def empty_cluster_report() -> dict[str, Any]:
    """dra-guard's ClusterPolicyReport with no result (the periodic audit ran and found nothing cluster-wide)."""
    return {"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "ClusterPolicyReport",
            "metadata": {"name": "dra-guard", "labels": {"app.kubernetes.io/managed-by": "dra-guard"}},
            "summary": {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}, "results": []}


def render_policyreport(findings: list[tuple[Finding, str]]) -> str:
    """The reports of policy_reports() as one YAML stream (kubectl apply -f - takes it)."""
    return yaml.safe_dump_all(policy_reports(findings), sort_keys=False)
