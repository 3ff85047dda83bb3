"""Cluster audit checks of the control plane's DRA tuning and of what drains would wait for (pure).

Source: "Good practices for DRA as a Cluster Admin":
- "Monitor and tune your components for higher load, especially in high scale environments": in the
  page's 100-node scale test, kube-controller-manager with client QPS 75 / Burst 150 matched the
  performance without DRA — the floor to start from (flags --kube-api-qps / --kube-api-burst).
- "Prefer DRA drivers that support seamless upgrade": needs kubelet >= 1.33.
- "Draining nodes: drain the DRA driver last": which driver pods are held by prepared claims now.
API removal dates: resource.k8s.io v1beta1 is removed in Kubernetes 1.38 and v1beta2 in 1.39 (v1 is GA
since 1.34). Every check returns advisory Findings (policy "controlplane" or "eviction"): they are
reported, never refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.model import attribution
from webhook.model.claim_index import ClaimIndex
from webhook.model.readers import as_list as _list
from webhook.model.readers import as_map as _map
from webhook.policies.decision import Finding, short

POLICY = "controlplane"
KCM_QPS_FLOOR = 75
KCM_BURST_FLOOR = 150
REMOVED_IN = {"v1beta1": "1.38", "v1beta2": "1.39"}
SEAMLESS_MIN_KUBELET = (1, 33)
PAGE = "the DRA cluster-admin good practices page"


def _finding(
    check: str, kind: str, name: str, message: str, summary: str, *, namespace: str = "", policy: str = POLICY, **details: Any
) -> Finding:
    return Finding(
        policy=policy,
        kind=kind,
        namespace=namespace,
        name=name,
        message=message,
        summary=short(summary),
        check=check,
        enforced=False,
        details=details,
    )


def _flag(words: Iterable[Any], flag: str) -> str | None:
    """The value of --flag=V or --flag V in a command line, None when absent."""
    texts = [w for w in words if isinstance(w, str)]
    for i, w in enumerate(texts):
        if w == flag and i + 1 < len(texts):
            return texts[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


def component_pods(pods: Iterable[Mapping[str, Any]], component: str) -> list[Mapping[str, Any]]:
    """kube-system pods of a control-plane component, as kubeadm runs them (label component=...,
    or a container whose command starts with the component's binary)."""
    out = []
    for pod in pods:
        meta = _map(pod.get("metadata"))
        if meta.get("namespace") != "kube-system":
            continue
        labels = _map(meta.get("labels"))
        commands = [
            c
            for c in map(_map, _list(_map(pod.get("spec")).get("containers")))
            if any(isinstance(w, str) and w.rsplit("/", 1)[-1] == component for w in _list(c.get("command"))[:1])
        ]
        if labels.get("component") == component or commands:
            out.append(pod)
    return out


def _args(pod: Mapping[str, Any], component: str) -> list[str]:
    for c in map(_map, _list(_map(pod.get("spec")).get("containers"))):
        words = _list(c.get("command")) + _list(c.get("args"))
        if any(isinstance(w, str) and w.rsplit("/", 1)[-1] == component for w in words[:1]) or c.get("name") == component:
            return [w for w in words if isinstance(w, str)]
    return []


def controller_manager(pods: Iterable[Mapping[str, Any]]) -> list[Finding]:
    """kube-controller-manager client QPS/Burst against the page's 75/150 floor.

    pods: kube-system Pod dicts. No visible kube-controller-manager pod (managed control planes)
    gives one "unknown" finding that says so instead of guessing (named Pod
    kube-system/kube-controller-manager, an object that does not exist: reports file it scope-less,
    webhook.audit.reports).
    """
    found = component_pods(pods, "kube-controller-manager")
    if not found:
        return [
            _finding(
                "controller-manager-qps-unknown",
                "Pod",
                "kube-controller-manager",
                namespace="kube-system",
                message=f"kube-controller-manager is not visible as a pod in kube-system (a managed control plane?), so its "
                f"client QPS/Burst are unknown. {PAGE.capitalize()} found --kube-api-qps={KCM_QPS_FLOOR} "
                f"--kube-api-burst={KCM_BURST_FLOOR} the floor for DRA at scale: check them with your provider.",
                summary="kube-controller-manager not visible: its --kube-api-qps/--kube-api-burst are unknown",
            )
        ]
    out = []
    for pod in found:
        meta = _map(pod.get("metadata"))
        args = _args(pod, "kube-controller-manager")
        raw_qps, raw_burst = _flag(args, "--kube-api-qps"), _flag(args, "--kube-api-burst")
        # the flags' defaults in kube-controller-manager are 20 and 30
        qps = float(raw_qps) if raw_qps and re.fullmatch(r"[0-9.]+", raw_qps) else 20.0
        burst = int(raw_burst) if raw_burst and raw_burst.isdigit() else 30
        if qps < KCM_QPS_FLOOR or burst < KCM_BURST_FLOOR:
            shown = f"--kube-api-qps={raw_qps or '20 (default)'} --kube-api-burst={raw_burst or '30 (default)'}"
            out.append(
                _finding(
                    "controller-manager-qps",
                    "Pod",
                    str(meta.get("name")),
                    namespace="kube-system",
                    message=f"kube-controller-manager runs with {shown}, below the floor of {PAGE}: in its 100-node scale "
                    f"test, --kube-api-qps={KCM_QPS_FLOOR} --kube-api-burst={KCM_BURST_FLOOR} matched the performance "
                    f"without DRA. The ResourceClaim controller needs these API calls; raise both (and watch the "
                    f"resource_claim work queue).",
                    summary=f"kube-controller-manager {shown} is below the DRA floor {KCM_QPS_FLOOR}/{KCM_BURST_FLOOR}",
                    qps=qps,
                    burst=burst,
                )
            )
    return out


def scheduler(pods: Iterable[Mapping[str, Any]], configmaps: Iterable[Mapping[str, Any]] = ()) -> list[Finding]:
    """kube-scheduler client QPS/Burst when visible (flags, or a KubeSchedulerConfiguration in a
    kube-system ConfigMap). The page gives no number for the scheduler: values below its defaults
    (50/100) are reported, invisible configuration is said to be unknown."""
    # (kind, name) of the object that shows the values: the Pod, or the ConfigMap; findings are
    # filed against it (never against a "kube-scheduler" Pod that may not exist)
    values: list[tuple[str, str, float, float]] = []
    for pod in component_pods(pods, "kube-scheduler"):
        args = _args(pod, "kube-scheduler")
        qps, burst = _flag(args, "--kube-api-qps"), _flag(args, "--kube-api-burst")
        if qps or burst:
            values.append(("Pod", str(_map(pod.get("metadata")).get("name")), float(qps or 50), float(burst or 100)))
    for cm in configmaps:
        for text in _map(cm.get("data")).values():
            if isinstance(text, str) and "KubeSchedulerConfiguration" in text:
                qps_m = re.search(r"^\s*qps:\s*([0-9.]+)", text, re.M)
                burst_m = re.search(r"^\s*burst:\s*([0-9]+)", text, re.M)
                values.append(
                    (
                        "ConfigMap",
                        str(_map(cm.get("metadata")).get("name")),
                        float(qps_m.group(1)) if qps_m else 50.0,
                        float(burst_m.group(1)) if burst_m else 100.0,
                    )
                )
    if not values:
        return [
            _finding(
                "scheduler-qps-unknown",
                "Pod",
                "kube-scheduler",
                namespace="kube-system",
                message="kube-scheduler's client QPS/Burst are not visible (set in a config file on the control-plane host, "
                "or a managed control plane). The scheduler makes more API calls for DRA pods: watch "
                "scheduler_pod_scheduling_sli_duration_seconds and raise clientConnection.qps/burst if it grows.",
                summary="kube-scheduler client QPS/Burst not visible",
            )
        ]
    return [
        _finding(
            "scheduler-qps",
            kind,
            name,
            namespace="kube-system",
            message=f"kube-scheduler ({kind.lower() if kind == 'Pod' else kind} {name}) uses client QPS {qps:g} / Burst "
            f"{burst:g}, below its defaults 50/100; DRA "
            f"scheduling makes more API calls (ResourceClaim status updates). Raise clientConnection.qps/burst.",
            summary=f"kube-scheduler client QPS/Burst {qps:g}/{burst:g} below the defaults 50/100",
            qps=qps,
            burst=burst,
        )
        for kind, name, qps, burst in values
        if qps < 50 or burst < 100
    ]


def api_versions(served: list[str], slices: Iterable[Mapping[str, Any]]) -> list[Finding]:
    """Which resource.k8s.io versions are served, and beta versions (removed in 1.38 / 1.39) still
    written by drivers, read from the ResourceSlices' managedFields (manager -> apiVersion)."""
    out = []
    if not served:
        out.append(
            _finding(
                "dra-api-not-served",
                "APIGroup",
                "resource.k8s.io",
                message="The cluster serves no resource.k8s.io version: DRA is not enabled.",
                summary="resource.k8s.io is not served: DRA is not enabled",
            )
        )
        return out
    if "v1" not in served:
        out.append(
            _finding(
                "dra-api-v1-missing",
                "APIGroup",
                "resource.k8s.io",
                message=f"The cluster serves resource.k8s.io {', '.join(served)} but not v1 (GA since 1.34); "
                f"v1beta1 is removed in 1.38 and v1beta2 in 1.39: plan the upgrade of drivers and clients.",
                summary=f"resource.k8s.io v1 not served (serves {', '.join(served)})",
                served=served,
            )
        )
    users: dict[tuple[str, str], set[str]] = {}
    for sl in slices:
        driver = str(_map(sl.get("spec")).get("driver") or "?")
        for entry in map(_map, _list(_map(sl.get("metadata")).get("managedFields"))):
            version = str(entry.get("apiVersion") or "").rpartition("/")[2]
            if version in REMOVED_IN:
                users.setdefault((driver, version), set()).add(str(entry.get("manager") or "?"))
    for (driver, version), managers in sorted(users.items()):
        out.append(
            _finding(
                "dra-beta-api-in-use",
                "ResourceSlice",
                driver,
                message=f"Driver {driver} (field managers {', '.join(sorted(managers))}) writes ResourceSlices through "
                f"resource.k8s.io/{version}, which is removed in Kubernetes {REMOVED_IN[version]}. Upgrade the "
                f"driver to one that uses resource.k8s.io/v1 before upgrading the cluster.",
                summary=f"driver {driver} uses resource.k8s.io/{version} (removed in {REMOVED_IN[version]})",
                driver=driver,
                version=version,
            )
        )
    return out


def _kubelet_version(node: Mapping[str, Any]) -> tuple[int, int] | None:
    raw = str(_map(_map(_map(node.get("status")).get("nodeInfo"))).get("kubeletVersion") or "")
    m = re.match(r"v?(\d+)\.(\d+)", raw)
    return (int(m.group(1)), int(m.group(2))) if m else None


def old_kubelets(
    nodes: Iterable[Mapping[str, Any]], index: ClaimIndex, seamless: Mapping[tuple[str, str], bool]
) -> list[Finding]:
    """Nodes whose kubelet is older than 1.33 running a driver that relies on seamless upgrade.

    seamless: (namespace, DaemonSet name) -> whether that driver supports seamless upgrade.
    """
    out = []
    for node in nodes:
        version = _kubelet_version(node)
        name = str(_map(node.get("metadata")).get("name"))
        if version is None or version >= SEAMLESS_MIN_KUBELET:
            continue
        for pod, driver in index.driver_pods_on(name):
            if seamless.get((pod.namespace, pod.daemonset)):
                out.append(
                    _finding(
                        "seamless-upgrade-old-kubelet",
                        "Node",
                        name,
                        message=f"Node {name} runs kubelet {version[0]}.{version[1]} with driver {driver.name or pod.daemonset} "
                        f"(DaemonSet {pod.namespace}/{pod.daemonset}), which relies on seamless upgrade; that needs "
                        f"kubelet >= 1.33. Upgrade the node, or keep that driver's updateStrategy at maxSurge 0.",
                        summary=f"node {name}: kubelet {version[0]}.{version[1]} < 1.33 runs a seamless-upgrade driver",
                        driver=driver.name or pod.daemonset,
                    )
                )
    return out


def drain_holds(index: ClaimIndex, nodes: Iterable[str]) -> list[Finding]:
    """Driver pods a drain would have to leave for last right now (policy "eviction", advisory);
    the same rules as the eviction policy (webhook.model.attribution.need), and how each driver
    name was learned (spec, label, selector, or the node's ResourceSlices)."""
    out = []
    for node in sorted(set(nodes)):
        for pod, driver in index.driver_pods_on(node):
            needed = attribution.need(index, pod, driver)
            if not needed.held:
                continue
            holds = list(dict.fromkeys(h for _, h in needed.holds))
            names = ",".join(needed.held_names)
            learned = {n: how for n, how in needed.names if n in needed.held_names}
            out.append(
                _finding(
                    "drain-blocked",
                    "Pod",
                    pod.name,
                    namespace=pod.namespace,
                    policy="eviction",
                    message=f"Node {node}: DRA driver pod {pod.namespace}/{pod.name} (driver {names}) is held by "
                    f"{len(holds)} prepared claim(s) ({', '.join(h.claim for h in holds[:10])}); a drain must "
                    f"evict their pods first (dra-guard drain-plan {node}). Driver name learned from: "
                    + "; ".join(f"{n}: {how}" for n, how in learned.items())
                    + ".",
                    summary=f"node {node}: driver pod {pod.name} held by {len(holds)} claim(s)",
                    node=node,
                    driver=names,
                    learned=learned,
                    claims=[h.claim for h in holds],
                )
            )
    return out
