"""`dra-guard audit`: the admission policies run over manifests (and, with --cluster, live objects).

The same policy code as admission decides; roles and bindings are resolved among the objects
given (files first, then the live cluster's, a file's object replacing the live one of the same
kind and name: the audit answers "what if I applied these files"). Offline, the bootstrap
ClusterRoles whose defaults dra-guard knows (webhook.model.bootstrap) and that the files do not
define are taken as every apiserver stores them, and findings reached through them say so.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from webhook.audit.load import InputError, object_key
from webhook.config import CONFIG_KIND, Config, ConfigError, from_mapping
from webhook.model import bootstrap, drivers
from webhook.model.facts import Facts, build_facts
from webhook.model.readers import as_map, as_str, name_of
from webhook.policies import controlplane, drain_doors, eviction, exceptions, probes
from webhook.policies.decision import Finding, short
from webhook.policies.registry import POLICIES

#: a finding and the mode its policy runs in
Result = tuple[Finding, str]


#: the apiVersion of each kind the audit reads, for objects read from a LIST (whose items carry
#: none); resource.k8s.io kinds take the version the cluster serves
API_VERSIONS = {
    "Pod": "v1",
    "Node": "v1",
    "Namespace": "v1",
    "ConfigMap": "v1",
    "DaemonSet": "apps/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
}
DRA_KINDS = frozenset({"ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "DeviceTaintRule"})


@dataclasses.dataclass
class Audit:
    """The audit of a set of objects: findings (each with its policy's mode); per policy, the
    objects it judged ((kind, namespace, name)): those without a finding passed; and `refs`, the
    apiVersion and uid ({"apiVersion": ..., "uid": ...}, uid absent for a file's object) of each
    object a finding or a judgement names that was really read (from the cluster or the files):
    what reports may name in results[].resources."""

    findings: list[Result]
    judged: dict[str, list[tuple[str, str, str]]]
    refs: dict[tuple[str, str, str], dict[str, str]] = dataclasses.field(default_factory=dict)


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
        # one line per error, each saying where the configuration came from
        raise InputError("\n".join(f"{CONFIG_KIND} among the manifests: {p}" for p in exc.problems)) from exc


def merge(files: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Live objects overlaid with the files' (same kind, namespace and name: the file's wins)."""
    merged = {object_key(o): o for o in live}
    merged.update({object_key(o): o for o in files})
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
    return audit(objects, config, served_versions=served_versions).findings


def audit(
    objects: list[dict[str, Any]],
    config: Config,
    *,
    served_versions: list[str] | None = None,
    online: bool = False,
    facts: Facts | None = None,
    now: datetime.datetime | None = None,
) -> Audit:
    """run(), plus the objects each policy judged (for `pass` results in PolicyReports) and the
    unresolved roleRef findings (a ClusterRoleBinding whose ClusterRole is not among `objects`:
    advisory, never a silent clean). online: `objects` include the live cluster's.
    facts: the indexes to judge by, already holding what `objects` would add (e.g. filled by
    webhook.kube.lists.stream_audit_cluster, files added with webhook.model.facts.add_objects);
    None: built from `objects`. The config's exceptions are applied at `now` (an aware datetime;
    None: the clock's): covered findings skipped, expired exceptions reported (webhook.policies.exceptions)."""
    findings: list[tuple[Finding, str]] = []
    assumed = [] if online or facts is not None else bootstrap_roles(objects)
    facts = facts if facts is not None else build_facts([*assumed, *objects], config)
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
        seamless = {
            (
                (ds.get("metadata") or {}).get("namespace", ""),
                (ds.get("metadata") or {}).get("name", ""),
            ): probes.supports_seamless_upgrade(ds)
            for ds in by_kind.get("DaemonSet", [])
        }
        checks = (
            controlplane.controller_manager(system_pods)
            + controlplane.scheduler(
                system_pods,
                [c for c in by_kind.get("ConfigMap", []) if (c.get("metadata") or {}).get("namespace") == "kube-system"],
            )
            + controlplane.api_versions(served_versions, by_kind.get("ResourceSlice", []))
            + controlplane.old_kubelets(by_kind.get("Node", []), claims, seamless)
            + controlplane.drain_holds(claims, nodes)
        )
        findings += [(f, advisory) for f in checks]
        findings += [(f, advisory) for f in eviction.declared_findings(facts, config)]
        findings += [(f, advisory) for f in drain_doors.driver_findings(facts, config)]
        findings += [(f, advisory) for f in drain_doors.writer_findings(facts, config)]
    elif any(controlplane.component_pods(system_pods, "kube-controller-manager")):
        findings += [(f, advisory) for f in controlplane.controller_manager(system_pods)]
    findings += [(f, config.policy("rbac").mode) for f in unresolved_role_refs(by_kind, facts.rbac.role, online=online)]
    if assumed:
        findings = note_defaults(findings, {name_of(r) for r in assumed})
    findings = exceptions.apply(findings, config.exceptions, now=now or datetime.datetime.now(datetime.UTC))
    driver_daemonsets = [
        object_key(ds)
        for ds in by_kind.get("DaemonSet", [])
        if drivers.detect(ds, config=config.detection, can_write_slices=facts.service_account_writes_slices)
    ]
    judged = {
        "rbac": [object_key(b) for b in by_kind.get("ClusterRoleBinding", [])],
        "probes": driver_daemonsets,
        "eviction": driver_daemonsets,  # declared (pass) or not (undeclared-driver)
    }
    keys = {(f.kind, f.namespace, f.name) for f, _ in findings} | {k for ks in judged.values() for k in ks}
    dra_version = f"resource.k8s.io/{served_versions[0]}" if served_versions else ""
    return Audit(findings=findings, judged=judged, refs=object_refs(keys, objects, facts, dra_version=dra_version))


def object_refs(
    keys: set[tuple[str, str, str]], objects: list[dict[str, Any]], facts: Facts, *, dra_version: str = ""
) -> dict[tuple[str, str, str], dict[str, str]]:
    """(kind, namespace, name) -> {"apiVersion", "uid"} for each of `keys` that names an object read:
    one of `objects`, a binding in facts.rbac (the audit streams them there), or a Pod in
    facts.claims. Keys of anything else (a control-plane component not running as a Pod here, an
    API group, a driver) are left out. dra_version: the apiVersion of resource.k8s.io objects
    listed without one ("resource.k8s.io/v1")."""
    by_key = {object_key(o): o for o in objects}
    bindings: dict[tuple[str, str], Any] = {}
    if any(k[0] in ("ClusterRoleBinding", "RoleBinding") for k in keys):
        for b in [*facts.rbac.bindings(), *facts.rbac.bindings(namespaced=True)]:
            bindings[(as_str(as_map(b.get("metadata")).get("namespace")), name_of(b))] = b
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for key in keys:
        kind, namespace, name = key
        api_version = API_VERSIONS.get(kind) or (dra_version if kind in DRA_KINDS else "")
        uid: Any = None
        obj = by_key.get(key)
        if obj is not None:
            api_version = as_str(obj.get("apiVersion")) or api_version
            uid = as_map(obj.get("metadata")).get("uid")
        elif kind in ("ClusterRoleBinding", "RoleBinding") and bool(namespace) == (kind == "RoleBinding"):
            binding = bindings.get((namespace, name))
            if binding is None:
                continue
            uid = as_map(binding.get("metadata")).get("uid")
        elif kind == "Pod" and (pod := facts.claims.pod(namespace, name)) is not None:
            uid = pod.uid
        else:
            continue
        out[key] = {"apiVersion": api_version, **({"uid": uid} if isinstance(uid, str) and uid else {})}
    return out


def bootstrap_roles(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The known bootstrap ClusterRoles (webhook.model.bootstrap.DEFAULTS) that `objects` do not
    define, as the apiserver stores them: every cluster has them, so files that bind `edit`
    without defining it are judged by what `edit` is everywhere."""
    defined = {name_of(o) for o in objects if o.get("kind") == "ClusterRole"}
    return [r for name in bootstrap.DEFAULTS if name not in defined and (r := bootstrap.stored_role(name)) is not None]


def note_defaults(findings: list[Result], assumed: set[str]) -> list[Result]:
    """RBAC findings whose grants come through a role in `assumed` (bootstrap roles the files do not
    define), with a note saying they were judged by the role's Kubernetes default rules."""
    out: list[Result] = []
    for f, mode in findings:
        via = [r for r in dict.fromkeys([f.details.get("roleRef"), *f.details.get("roles", ())]) if r in assumed]
        if f.policy != "rbac" or not via:
            out.append((f, mode))
            continue
        one = len(via) == 1
        note = (
            f" ClusterRole{'' if one else 's'} {', '.join(via)} {'is' if one else 'are'} not among the "
            f"manifests: judged by {'its' if one else 'their'} Kubernetes default rules (every cluster's)."
        )
        out.append((dataclasses.replace(f, message=f.message + note, details={**f.details, "judgedByDefaults": via}), mode))
    return out


def unresolved_role_refs(by_kind: Mapping[str, list[dict[str, Any]]], role: Any, *, online: bool) -> list[Finding]:
    """Advisory findings for ClusterRoleBindings whose roleRef names a ClusterRole that `role(name)`
    (an RbacIndex lookup) does not know: what they grant cannot be judged."""
    out = []
    for binding in by_kind.get("ClusterRoleBinding", []):
        ref = as_map(binding.get("roleRef"))
        role_name = as_str(ref.get("name"))
        if as_str(ref.get("kind")) not in ("", "ClusterRole") or not role_name or role(role_name) is not None:
            continue
        name = name_of(binding)
        where = "among the manifests nor in the cluster" if online else "among the manifests"
        fix = (
            "it grants nothing until the role exists, and dra-guard judges the role against this binding when it is created"
            if online
            else "add the role's manifest (-f), or audit against the live cluster's roles (--cluster)"
        )
        out.append(
            Finding(
                policy="rbac",
                kind="ClusterRoleBinding",
                name=name,
                check="unresolved-roleref",
                enforced=False,
                message=f"ClusterRoleBinding {name} refers to ClusterRole {role_name}, which is not {where}: dra-guard "
                f"cannot tell whether it grants write on DeviceClasses or ResourceSlices; {fix}.",
                summary=short(f"dra-guard: ClusterRole {role_name} of ClusterRoleBinding {name} not found; not judged"),
                details={"roleRef": role_name},
            )
        )
    return out


def only_files(result: Audit, baseline: Audit, file_keys: set[tuple[str, str, str]]) -> Audit:
    """`audit --scope files`: the findings that concern an object of the files, or that the files
    introduce (absent from `baseline`, the live cluster's audit without the files)."""

    def key(f: Finding) -> tuple[str, str, str, str, str, str]:
        return f.policy, f.check, f.kind, f.namespace, f.name, f.message

    before = {key(f) for f, _ in baseline.findings}
    kept = [(f, m) for f, m in result.findings if (f.kind, f.namespace, f.name) in file_keys or key(f) not in before]
    judged = {p: [k for k in keys if k in file_keys] for p, keys in result.judged.items()}
    return Audit(findings=kept, judged=judged, refs=result.refs)


def exit_code(findings: list[tuple[Finding, str]]) -> int:
    """1 when enforce mode would refuse or patch something, else 0 (advisories alone do not fail)."""
    return 1 if any(f.enforced or f.fixed_by_patch for f, _ in findings) else 0
