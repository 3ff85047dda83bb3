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
from collections.abc import Callable, Mapping
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


LabelMatcher = Callable[[Mapping[str, str]], bool]


def compile_selector(selector: Any) -> LabelMatcher:
    """A metav1.LabelSelector dict made into a function labels -> bool (an empty selector matches
    everything). The values of In / NotIn are held as sets, so matching costs O(number of
    requirements), not O(number of values): a selector with 500,000 values is read once, then each
    role's labels are looked up in it.

    Supports matchLabels and matchExpressions with In, NotIn, Exists, DoesNotExist. An unknown
    operator matches nothing (the apiserver would have rejected it).
    """
    selector = as_map(selector)
    exact = [(key, value) for key, value in as_map(selector.get("matchLabels")).items()]
    checks: list[tuple[str, str, frozenset[str]]] = []
    for expr in as_list(selector.get("matchExpressions")):
        expr = as_map(expr)
        op = as_str(expr.get("operator"))
        checks.append(
            (as_str(expr.get("key")), op, frozenset(strings(expr.get("values"))) if op in ("In", "NotIn") else frozenset())
        )

    def matches(labels: Mapping[str, str]) -> bool:
        for key, value in exact:
            if labels.get(key) != value:
                return False
        for key, op, values in checks:
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

    return matches


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a metav1.LabelSelector dict matches `labels` (see compile_selector; to test many
    label sets against one selector, compile it once)."""
    return compile_selector(selector)(labels)


def aggregation_matcher(aggregator: Mapping[str, Any]) -> LabelMatcher | None:
    """For ClusterRole dict `aggregator`: a function labels -> whether its aggregationRule selects a
    role with those labels (any of its clusterRoleSelectors), or None when it has no aggregationRule."""
    rule = aggregator.get("aggregationRule")
    if not isinstance(rule, Mapping):
        return None
    selectors = [compile_selector(sel) for sel in as_list(rule.get("clusterRoleSelectors"))]
    return lambda labels: any(m(labels) for m in selectors)


def aggregates(aggregator: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ClusterRole dict `aggregator` has an aggregationRule selecting a role with `labels`."""
    matcher = aggregation_matcher(aggregator)
    return matcher is not None and matcher(labels)


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

    @classmethod
    def parse(cls, text: str) -> Subject | None:
        """The Subject `str()` printed ("ServiceAccount ns/name", "User alice"); None for other text
        (findings carry subjects in that form: Finding.details["subject"])."""
        kind, _, name = text.partition(" ")
        if not kind or not name:
            return None
        if kind == "ServiceAccount":
            namespace, _, name = name.partition("/")
            return cls(kind=kind, name=name, namespace=namespace) if namespace and name else None
        return cls(kind=kind, name=name)


def subjects_of(binding: Mapping[str, Any]) -> list[Subject]:
    """The subjects of a binding dict; malformed entries are skipped."""
    out = []
    for s in as_list(binding.get("subjects")):
        s = as_map(s)
        kind, name = as_str(s.get("kind")), as_str(s.get("name"))
        if kind and name:
            out.append(Subject(kind=kind, name=name, namespace=as_str(s.get("namespace"))))
    return out


def service_account_reach(binding: Mapping[str, Any]) -> set[tuple[str, str]]:
    """What of a binding's subjects can be a ServiceAccount: ("sa", "namespace/name") for a
    ServiceAccount subject or its User form (system:serviceaccount:<ns>:<name>), ("group", name) for
    the groups every ServiceAccount is in (system:serviceaccounts, system:serviceaccounts:<ns>,
    system:authenticated)."""
    out = set()
    for s in subjects_of(binding):
        if s.kind == "ServiceAccount":
            out.add(("sa", f"{s.namespace}/{s.name}"))
        elif s.kind == "User" and s.name.startswith("system:serviceaccount:") and s.name.count(":") == 3:
            _, _, ns, sa = s.name.split(":")
            out.add(("sa", f"{ns}/{sa}"))
        elif s.kind == "Group" and (s.name == "system:authenticated" or s.name.startswith("system:serviceaccounts")):
            out.add(("group", s.name))
    return out
