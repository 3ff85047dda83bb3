"""RBAC facts dra-guard reads: protected write grants in PolicyRules, label selectors (ClusterRole
aggregation) and binding subjects. Pure: plain dicts in, small frozen records out.

Rule semantics follow the Kubernetes RBAC authorizer (k8s.io/kubernetes/pkg/apis/rbac/v1/
evaluation_helpers.go) and the ClusterRole aggregation controller (pkg/controller/
clusterroleaggregation). A *protected grant* is a PolicyRule whose apiGroups match the DRA group
(or "*"), whose resources match a protected resource (or "*", or "<resource>/<subresource>"), with a
write verb (or "*"). resourceNames narrows a grant but is still a grant; nonResourceURLs rules grant
nothing here.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from webhook.config import RbacConfig
from webhook.model.readers import as_list, as_map, as_str, strings


@dataclasses.dataclass(frozen=True, order=True)
class Grant:
    """Write access to one protected resource with one verb ("*" for all verbs), via a role; or an
    escalation power (webhook.model.powers) named in `resource`. namespaced: a RoleBinding grants
    it in its namespace (DRA write and cluster-scoped powers only through a ClusterRoleBinding)."""

    resource: str
    verb: str
    role: str
    namespaced: bool = False


def protected_grants(rules: Any, config: RbacConfig, *, role: str) -> list[Grant]:
    """The protected write grants in a list of PolicyRules (rbac.authorization.k8s.io/v1 PolicyRule dicts).

    Tolerates missing keys and wrong types (they grant nothing). `role` names the ClusterRole
    the rules belong to, for messages.
    """
    grants: set[Grant] = set()
    for rule in as_list(rules):
        rule = as_map(rule)
        groups = strings(rule.get("apiGroups"))
        if "*" not in groups and config.api_group not in groups:
            continue
        verbs = strings(rule.get("verbs"))
        write = ["*"] if "*" in verbs else sorted(set(verbs) & config.write_verbs)
        if not write:
            continue
        resources: set[str] = set()
        for res in strings(rule.get("resources")):
            if res == "*":
                resources |= config.protected_resources
            else:
                base = res.split("/", 1)[0]  # a subresource of a protected resource is protected too
                if base in config.protected_resources:
                    resources.add(base)
        grants |= {Grant(resource=r, verb=v, role=role) for r in resources for v in write}
    return sorted(grants)



def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a metav1.LabelSelector dict matches `labels` (an empty selector matches everything).

    Supports matchLabels and matchExpressions with In, NotIn, Exists, DoesNotExist. An unknown
    operator matches nothing (the apiserver would have rejected it).
    """
    selector = as_map(selector)
    for key, value in as_map(selector.get("matchLabels")).items():
        if labels.get(key) != value:
            return False
    for expr in as_list(selector.get("matchExpressions")):
        expr = as_map(expr)
        key, op, values = as_str(expr.get("key")), as_str(expr.get("operator")), strings(expr.get("values"))
        present = key in labels
        if op == "In":
            ok = present and labels[key] in values
        elif op == "NotIn":
            ok = not present or labels[key] not in values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        else:
            ok = False
        if not ok:
            return False
    return True


def aggregates(aggregator: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ClusterRole dict `aggregator` has an aggregationRule selecting a role with `labels`."""
    rule = aggregator.get("aggregationRule")
    if not isinstance(rule, Mapping):
        return False
    return any(selector_matches(sel, labels) for sel in as_list(rule.get("clusterRoleSelectors")))



@dataclasses.dataclass(frozen=True)
class Subject:
    """An RBAC subject (rbac.authorization.k8s.io/v1 Subject)."""

    kind: str
    name: str
    namespace: str = ""

    def __str__(self) -> str:
        if self.kind == "ServiceAccount":
            return f"ServiceAccount {self.namespace}/{self.name}"
        return f"{self.kind} {self.name}"


def subjects_of(binding: Mapping[str, Any]) -> list[Subject]:
    """The subjects of a binding dict; malformed entries are skipped."""
    out = []
    for s in as_list(binding.get("subjects")):
        s = as_map(s)
        kind, name = as_str(s.get("kind")), as_str(s.get("name"))
        if kind and name:
            out.append(Subject(kind=kind, name=name, namespace=as_str(s.get("namespace"))))
    return out

