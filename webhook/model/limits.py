"""How much one reviewed object may make dra-guard evaluate (config server.limits).

A forged or hostile review can carry an object far larger than any real one (a ClusterRole whose
aggregationRule lists 500,000 label values, a binding with a million subjects): judging it would
cost seconds of a worker's CPU. Counting is cheap (list lengths), so an object over a limit is not
judged: the policy's failure mode answers at once (webhook.admission.NotJudged). The limits are far
above real objects: the apiserver's own aggregated ClusterRoles have tens of rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.config import ServerConfig
from webhook.model.readers import as_list, as_map


def _selector_values(obj: Mapping[str, Any]) -> int:
    """Label requirements and values in a ClusterRole dict's aggregationRule.clusterRoleSelectors."""
    total = 0
    for selector in as_list(as_map(obj.get("aggregationRule")).get("clusterRoleSelectors")):
        selector = as_map(selector)
        total += len(as_map(selector.get("matchLabels")))
        for expr in as_list(selector.get("matchExpressions")):
            total += 1 + len(as_list(as_map(expr).get("values")))
    return total


def _containers(obj: Mapping[str, Any]) -> int:
    """Containers, initContainers and ephemeralContainers of a DaemonSet's pod template (or a Pod)."""
    spec = as_map(obj.get("spec"))
    pod = as_map(as_map(spec.get("template")).get("spec")) or spec
    return sum(len(as_list(pod.get(k))) for k in ("containers", "initContainers", "ephemeralContainers"))


def over_limit(request: Mapping[str, Any], limits: ServerConfig) -> str | None:
    """Why the object (or oldObject) of an AdmissionReview request dict is too large to judge, or None.

    Counts rules (ClusterRole, Role), subjects (bindings), aggregationRule label values and the
    containers of a pod template, against server.limits.maxRules / maxSubjects / maxSelectorValues /
    maxContainers.
    """
    for field in ("object", "oldObject"):
        obj = as_map(request.get(field))
        if not obj:
            continue
        counts = (
            ("rules", len(as_list(obj.get("rules"))), limits.max_rules, "maxRules"),
            ("subjects", len(as_list(obj.get("subjects"))), limits.max_subjects, "maxSubjects"),
            ("aggregationRule label values", _selector_values(obj), limits.max_selector_values, "maxSelectorValues"),
            ("containers", _containers(obj), limits.max_containers, "maxContainers"),
        )
        for what, count, most, key in counts:
            if count > most:
                return f"request.{field} has {count} {what}; dra-guard judges at most {most} (server.limits.{key})"
    return None
