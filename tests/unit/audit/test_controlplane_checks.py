"""Cluster audit checks of the control plane's DRA tuning (pure), and the PolicyReport output."""

from __future__ import annotations

import re

import pytest

from tests.builders import claim, index_with, pod
from webhook import audit
from webhook.config import from_mapping
from webhook.policies import controlplane


def kcm_pod(*args, name="kube-controller-manager-cp1", labels=True):
    meta = {"name": name, "namespace": "kube-system"}
    if labels:
        meta["labels"] = {"component": "kube-controller-manager", "tier": "control-plane"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [
                {
                    "name": "kube-controller-manager",
                    "image": "registry.k8s.io/kube-controller-manager:v1.37.2",
                    "command": ["kube-controller-manager", "--leader-elect=true", *args],
                }
            ]
        },
    }


@pytest.mark.parametrize(
    "args, reported",
    [
        (["--kube-api-qps=20", "--kube-api-burst=30"], True),
        (["--kube-api-qps=100", "--kube-api-burst=200"], False),
        (["--kube-api-qps", "75", "--kube-api-burst", "150"], False),
        (["--kube-api-qps=75"], True),  # burst defaults to 30
        ([], True),  # defaults 20/30
    ],
)
def test_controller_manager_floor(args, reported):
    found = controlplane.controller_manager([kcm_pod(*args)])
    assert bool(found) is reported
    if reported:
        assert "75" in found[0].message and "150" in found[0].message and not found[0].enforced


def test_controller_manager_not_visible_is_said_not_guessed():
    found = controlplane.controller_manager([pod("coredns", "n", namespace="kube-system", claims=())])
    assert [f.check for f in found] == ["controller-manager-qps-unknown"]
    assert "unknown" in found[0].message


def test_controller_manager_found_by_command_without_labels():
    assert controlplane.controller_manager([kcm_pod("--kube-api-qps=5", labels=False)])[0].check == "controller-manager-qps"


def test_scheduler_checks():
    sched = {
        "metadata": {"name": "kube-scheduler-cp1", "namespace": "kube-system", "labels": {"component": "kube-scheduler"}},
        "spec": {"containers": [{"name": "kube-scheduler", "command": ["kube-scheduler", "--kube-api-qps=10"]}]},
    }
    assert controlplane.scheduler([sched])[0].check == "scheduler-qps"
    cm = {
        "metadata": {"name": "sched-config", "namespace": "kube-system"},
        "data": {
            "config.yaml": "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
            "clientConnection:\n  qps: 200\n  burst: 400\n"
        },
    }
    assert controlplane.scheduler([], [cm]) == []
    assert controlplane.scheduler([])[0].check == "scheduler-qps-unknown"


def test_api_versions_and_beta_users():
    slices = [
        {
            "kind": "ResourceSlice",
            "metadata": {
                "name": "s",
                "managedFields": [
                    {"manager": "gpu-kubelet-plugin", "apiVersion": "resource.k8s.io/v1beta1", "operation": "Update"},
                    {"manager": "kubelet", "apiVersion": "resource.k8s.io/v1", "operation": "Update"},
                ],
            },
            "spec": {"driver": "gpu.example.com"},
        }
    ]
    found = controlplane.api_versions(["v1", "v1beta2", "v1beta1"], slices)
    assert [(f.check, f.details["version"]) for f in found] == [("dra-beta-api-in-use", "v1beta1")]
    assert "1.38" in found[0].message and "gpu-kubelet-plugin" in found[0].message
    assert [f.check for f in controlplane.api_versions(["v1beta1"], [])] == ["dra-api-v1-missing"]
    assert [f.check for f in controlplane.api_versions([], [])] == ["dra-api-not-served"]


def test_old_kubelet_with_seamless_driver():
    idx = index_with()
    nodes = [
        {"kind": "Node", "metadata": {"name": "node-a"}, "status": {"nodeInfo": {"kubeletVersion": "v1.32.9"}}},
        {"kind": "Node", "metadata": {"name": "node-b"}, "status": {"nodeInfo": {"kubeletVersion": "v1.34.1"}}},
    ]
    found = controlplane.old_kubelets(nodes, idx, {("gpu", "gpu-driver"): True})
    assert [f.name for f in found] == ["node-a"]
    assert controlplane.old_kubelets(nodes, idx, {("gpu", "gpu-driver"): False}) == []


def test_drain_holds():
    idx = index_with(pod("consumer", "node-a"), claim("gpu"))
    found = controlplane.drain_holds(idx, ["node-a", "node-b"])
    assert [(f.policy, f.check, f.details["node"]) for f in found] == [("eviction", "drain-blocked", "node-a")]


def test_offline_audit_reads_a_kubeadm_static_pod_manifest():
    findings = audit.run([kcm_pod("--kube-api-qps=20", "--kube-api-burst=30")], from_mapping(None))
    assert [f.check for f, _ in findings] == ["controller-manager-qps"]
    assert audit.exit_code(findings) == 0  # advisory


def test_policy_report_shape():
    result = audit.audit([kcm_pod("--kube-api-qps=20")], from_mapping(None))
    reports = audit.policy_reports(result.findings, refs=result.refs, now=1_700_000_000)
    assert [(r["kind"], r["metadata"].get("namespace")) for r in reports] == [("PolicyReport", "kube-system")]
    result = reports[0]["results"][0]
    assert result["result"] == "warn" and result["policy"] == "controlplane" and result["resources"][0]["kind"] == "Pod"
    assert reports[0]["summary"]["warn"] == 1


#: words a sentence may start with in lower case: component and command names
PROPER = re.compile(r"(kube-[a-z-]+|kubelet|kubectl|dra-guard|helm|--[a-z-]+)\b")


@pytest.mark.parametrize(
    "found",
    [
        lambda: controlplane.controller_manager([pod("coredns", "n", namespace="kube-system", claims=())]),
        lambda: controlplane.controller_manager([kcm_pod("--kube-api-qps=5")]),
        lambda: controlplane.scheduler([]),
    ],
    ids=["controller-manager-unknown", "controller-manager-below-floor", "scheduler-unknown"],
)
def test_every_sentence_starts_with_a_capital_or_a_name(found):
    """A sentence of a control-plane finding starts in upper case, unless with a component's name."""
    [finding] = found()
    for sentence in re.split(r"(?<=[.!?])\s+", finding.message)[1:]:
        assert sentence[0].isupper() or sentence[0].isdigit() or PROPER.match(sentence), (sentence, finding.message)
