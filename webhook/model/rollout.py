"""Whether the DaemonSet controller's DELETE of a driver pod is a rolling update that puts a new
pod back on the same node (pure).

Source: kube-controller-manager v1.37 pkg/controller/daemon: a pod is of the DaemonSet's current
template when its label ``pod-template-generation`` equals the DaemonSet's annotation
``deprecated.daemonset.template.generation`` (util.IsPodUpdated; ``controller-revision-hash`` is
the other half of that test, but the DaemonSet object does not carry its current hash). A rolling
update deletes pods of an older template; the controller then creates the new one on a node only
when NodeShouldRunDaemonPod says so: the pod template's ``nodeName`` (empty or that node),
``nodeSelector`` and required node affinity select the node, and every NoSchedule/NoExecute taint
is tolerated by the template's tolerations plus those the controller adds to every daemon pod
(util.AddOrUpdateDaemonPodTolerations). A deletion for any other reason (the node no longer
matches, an untolerated NoExecute taint, a duplicate) brings no pod back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.model.drivers import pod_spec
from webhook.model.nodes import Taint, read_selector, selects, tolerates
from webhook.model.readers import as_list, as_map, as_str

TEMPLATE_GENERATION_LABEL = "pod-template-generation"
TEMPLATE_GENERATION_ANNOTATION = "deprecated.daemonset.template.generation"

#: the tolerations the DaemonSet controller adds to every daemon pod (util.AddOrUpdateDaemonPodTolerations)
DAEMON_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
#: added too when the pod uses the host network
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"}


def outdated(pod: Mapping[str, Any], daemonset: Mapping[str, Any]) -> bool:
    """Whether core/v1 Pod dict `pod` is of an older template than apps/v1 DaemonSet dict
    `daemonset` (both generations known and different). Unknown counts as not outdated."""
    have = as_str(as_map(as_map(pod.get("metadata")).get("labels")).get(TEMPLATE_GENERATION_LABEL))
    want = as_str(as_map(as_map(daemonset.get("metadata")).get("annotations")).get(TEMPLATE_GENERATION_ANNOTATION))
    return bool(have) and bool(want) and have != want


def why_not_placed(daemonset: Mapping[str, Any], node: str, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> str:
    """ "" when the DaemonSet controller would create a pod of `daemonset` on node `node` (its
    labels and NoSchedule/NoExecute taints), else why not (for messages)."""
    spec = pod_spec(daemonset)
    wanted_node = as_str(spec.get("nodeName"))
    if wanted_node and wanted_node != node:
        return f"its pod template names node {wanted_node}"
    selector = {str(k): v for k, v in as_map(spec.get("nodeSelector")).items()}
    if any(labels.get(k) != v for k, v in selector.items()):
        return "the node no longer matches its nodeSelector"
    required = as_map(
        as_map(as_map(spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    terms = read_selector(required)
    if required and not selects(terms, node, labels):
        return "the node no longer matches its required node affinity"
    tolerations = [as_map(t) for t in as_list(spec.get("tolerations"))] + list(DAEMON_TOLERATIONS)
    if spec.get("hostNetwork") is True:
        tolerations.append(HOST_NETWORK_TOLERATION)
    for taint in taints:
        if not tolerates(tolerations, taint):
            key, value, effect = taint
            return f"the node has taint {key}{'=' + value if value else ''}:{effect}, which its pods do not tolerate"
    return ""
