"""Ways a declared driver pod leaves its node that no admission webhook sees: reported (advisory
findings of `dra-guard audit --cluster` and the periodic audit, policy "eviction").

Sources (kube-scheduler and kube-controller-manager v1.37, read for ../shared/docs/dra-facts.md
"Draining a node"): scheduler preemption deletes pods of a lower priority (the DELETE is refused
by dra-guard while claims need the driver, but the scheduler then picks other victims and a
pod of priority ``system-node-critical``, which any namespace may use unless a ResourceQuota
with a PriorityClass scopeSelector limits it, outranks the driver); the taint-eviction
controller deletes pods that do not tolerate a node's NoExecute taint (a DELETE too, refused the
same way, but the driver is then taken off as soon as its claims are released, even while
the node keeps running pods that need new claims); a ``pods/status`` writer can mark a running
consumer terminal and a ``nodes`` writer can taint or relabel the node (webhook.model.claims
trusts a terminal phase only without a running container; what else such a writer does is
theirs to answer for). Pure over the Facts indexes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.config import Config
from webhook.model.drivers import pod_spec
from webhook.model.facts import Facts
from webhook.model.powers import resource_ok
from webhook.model.readers import as_list, as_map, as_str, name_of, strings
from webhook.policies.decision import Finding, short

POLICY = "eviction"
#: the audit's findings of a declared driver that admission cannot keep on its node: these here, and
#: the declared entries the eviction webhook cannot match (webhook.policies.eviction); counted by the
#: periodic audit into dra_guard_driver_doors_open{check} (alert DraGuardDriverDoorsOpen)
DOOR_CHECKS: tuple[str, ...] = (
    "driver-preemptible",
    "driver-taint-evictable",
    "status-writer",
    "declared-driver-missing",
    "declared-driver-unmatched",
)
#: the priority a node's DRA driver should run at: no pod outranks it, whoever may use the class
#: (user-defined PriorityClasses stop at 1,000,000,000 and kube-scheduler preempts only pods of a
#: strictly lower priority), so a driver at it is never a victim of preemption
NODE_CRITICAL = "system-node-critical"
#: the one built-in class below NODE_CRITICAL: outranked by any pod at NODE_CRITICAL, which every
#: namespace may use unless the apiserver's ResourceQuota admission limits it (limitedResources +
#: a quota with a PriorityClass scopeSelector): a limit the API does not show, so not trusted here
CLUSTER_CRITICAL = "system-cluster-critical"
_TENANTS_OUTRANK = (
    f", and every namespace may run pods at {NODE_CRITICAL} unless a ResourceQuota scopeSelector on PriorityClass limits it"
)
#: write on these lets a user take a driver pod off its node, or fake that its consumers finished
STATUS_WRITES: tuple[tuple[str, str], ...] = (("", "pods/status"), ("", "nodes"))
WRITE_VERBS = frozenset({"update", "patch", "*"})
#: bootstrap ClusterRoleBindings of the controllers (kube-controller-manager
#: --use-service-account-credentials) and of the scheduler: the control plane
CONTROL_PLANE_BINDINGS = ("system:controller:", "system:kube-scheduler", "system:kube-controller-manager", "system:node")
#: the identities those bindings name: the controllers' kube-system ServiceAccounts, the scheduler,
#: the controller manager and the nodes. A subject is the control plane's only in a binding of
#: CONTROL_PLANE_BINDINGS *and* one of these: a binding merely named like one (anyone with
#: ClusterRoleBinding create picks any name) still reports the users it names.
CONTROL_PLANE_USERS = frozenset({"system:kube-scheduler", "system:kube-controller-manager"})


def _control_plane_subject(subject: Mapping[str, Any]) -> bool:
    kind, name, namespace = as_str(subject.get("kind")), as_str(subject.get("name")), as_str(subject.get("namespace"))
    if kind == "ServiceAccount":
        return namespace == "kube-system"
    if kind == "User":
        return name in CONTROL_PLANE_USERS or name.startswith("system:node:")
    return kind == "Group" and name == "system:nodes"


def _advisory(
    namespace: str, name: str, check: str, message: str, what: str, details: Mapping[str, Any] | None = None
) -> Finding:
    """An advisory finding `check` on declared driver DaemonSet namespace/name; its kubectl summary
    says the driver `what`."""
    return Finding(
        policy=POLICY,
        kind="DaemonSet",
        namespace=namespace,
        name=name,
        check=check,
        enforced=False,
        message=message,
        summary=short(f"dra-guard: driver {namespace}/{name} {what}"),
        details=dict(details or {}),
    )


def _tolerates_no_execute(spec: Mapping[str, Any]) -> bool:
    """Whether a PodSpec dict tolerates every NoExecute taint (a toleration with no key,
    operator Exists and effect NoExecute or empty)."""
    return any(
        not as_str(t.get("key")) and as_str(t.get("operator")) == "Exists" and as_str(t.get("effect")) in ("", "NoExecute")
        for t in map(as_map, as_list(spec.get("tolerations")))
    )


def driver_findings(facts: Facts, config: Config) -> Iterator[Finding]:
    """``driver-preemptible`` for a declared driver DaemonSet whose pods do not run at priority
    system-node-critical, ``driver-taint-evictable`` for one whose pods do not tolerate every
    NoExecute taint. (A DaemonSet that does not exist is declared-driver-missing.)"""
    for entry in config.detection.declared:
        ds = facts.claims.daemonset(entry.namespace, entry.name)
        if ds is None:
            continue
        spec = pod_spec(ds)
        priority = as_str(spec.get("priorityClassName"))
        if priority != NODE_CRITICAL:
            yield _advisory(
                entry.namespace,
                entry.name,
                "driver-preemptible",
                f"Declared DRA driver DaemonSet {entry.namespace}/{entry.name} runs its pods at priority class "
                f"{priority or '(none: 0)'}: kube-scheduler may preempt them for a pod of higher priority"
                f"{_TENANTS_OUTRANK if priority == CLUSTER_CRITICAL else ''}. dra-guard refuses that DELETE while claims "
                f"need the driver, but the scheduler then keeps choosing victims. Set priorityClassName: {NODE_CRITICAL} "
                f"in its pod template: no pod outranks it.",
                f"can be preempted (priority {priority or 0})",
                details={"priorityClassName": priority},
            )
        if not _tolerates_no_execute(spec):
            yield _advisory(
                entry.namespace,
                entry.name,
                "driver-taint-evictable",
                f"Declared DRA driver DaemonSet {entry.namespace}/{entry.name} does not tolerate every NoExecute "
                f"taint: a NoExecute taint on a node makes the taint-eviction controller delete its pod there (refused "
                f"by dra-guard while claims need the driver, then deleted as soon as they are released). Add the "
                f"toleration {{operator: Exists, effect: NoExecute}} to its pod template.",
                "does not tolerate NoExecute taints",
            )


def _grants_status_write(role: Mapping[str, Any]) -> list[str]:
    """The resources of STATUS_WRITES a ClusterRole dict's rules give update or patch on."""
    found = []
    for group, resource in STATUS_WRITES:
        for rule in map(as_map, as_list(role.get("rules"))):
            groups, resources, verbs = strings(rule.get("apiGroups")), strings(rule.get("resources")), strings(rule.get("verbs"))
            if ("*" in groups or group in groups) and resource_ok(resources, resource) and WRITE_VERBS & set(verbs):
                found.append(resource)
                break
    return found


def writer_findings(facts: Facts, config: Config) -> Iterator[Finding]:
    """``status-writer`` for each ClusterRoleBinding giving a subject that is neither an admin
    (rbac.adminSubjects) nor the control plane (a CONTROL_PLANE_BINDINGS binding's controller,
    scheduler or node identity) update/patch on pods/status or nodes in every namespace: who can
    fake a consumer's end or taint a node."""
    for binding in facts.rbac.bindings():
        name = name_of(binding)
        bootstrap = name.startswith(CONTROL_PLANE_BINDINGS)
        role = facts.rbac.role(as_str(as_map(binding.get("roleRef")).get("name")))
        resources = _grants_status_write(role) if role is not None else []
        if not resources:
            continue
        others = [
            f"{as_str(s.get('kind'))} {as_str(s.get('namespace')) + '/' if s.get('namespace') else ''}{as_str(s.get('name'))}"
            for s in map(as_map, as_list(binding.get("subjects")))
            if not (bootstrap and _control_plane_subject(s))
            and not config.rbac.admin_subjects.contains(
                kind=as_str(s.get("kind")), name=as_str(s.get("name")), namespace=as_str(s.get("namespace"))
            )
        ]
        if not others:
            continue
        yield Finding(
            policy=POLICY,
            kind="ClusterRoleBinding",
            name=name,
            check="status-writer",
            enforced=False,
            message=f"ClusterRoleBinding {name} gives {', '.join(others)} update/patch on {', '.join(resources)} in every "
            f"namespace: a pods/status writer can mark a running pod terminal, a nodes writer can taint or relabel a "
            f"node, both ways to take a DRA driver off a node whose claims still need it.",
            summary=short(f"dra-guard: {name} gives {', '.join(resources)} write to {len(others)} non-admin subject(s)"),
            details={"resources": resources, "subjects": others},
        )
