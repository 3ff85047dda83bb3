"""drivers.declared: the DRA driver DaemonSets whose pods' evictions fail closed (the chart renders
them into a failurePolicy Fail webhook); dra-guard recognises them as drivers and reports every
driver it recognises that is missing from the list, with the value that declares it."""

from __future__ import annotations

import json
import logging

import pytest

from tests.builders import driver_daemonset, eviction_request, plugin_container
from webhook import metrics
from webhook.admission import respond
from webhook.audit.run import audit
from webhook.config import ConfigError, from_mapping
from webhook.kube.state import ClusterState
from webhook.model import drivers
from webhook.model.facts import build_facts
from webhook.policies import eviction

DECLARED = {"drivers": {"declared": [{"namespace": "gpu", "name": "gpu-driver"}]}}


def undeclared_findings(objects, config):
    return [f for f, _ in audit(objects, config).findings if f.check == "undeclared-driver"]


def test_a_recognised_driver_missing_from_the_list_is_reported_with_the_value_that_declares_it():
    config = from_mapping(DECLARED)
    objects = [driver_daemonset(name="gpu-driver", namespace="gpu"), driver_daemonset(name="net-driver", namespace="net")]
    (finding,) = undeclared_findings(objects, config)
    assert (finding.kind, finding.namespace, finding.name, finding.enforced) == ("DaemonSet", "net", "net-driver", False)
    # the Helm value repeats the drivers already declared (--set-json replaces the list)
    helm = """--set-json 'config.drivers.declared=[{"namespace":"gpu","name":"gpu-driver"},{"namespace":"net","name":"net-driver"}]'"""
    assert finding.details["helm"] == helm and helm in finding.message
    assert "drivers.declared: [{namespace: net, name: net-driver}]" in finding.message
    # declared: no finding, and the audit judged it (a PolicyReport `pass`)
    assert undeclared_findings(objects[:1], config) == []
    assert ("DaemonSet", "gpu", "gpu-driver") in audit(objects[:1], config).judged["eviction"]


def test_each_finding_names_only_its_own_driver_so_the_output_grows_linearly():
    """A finding carrying the value for every undeclared driver made the audit's output grow with
    the square of the drivers (4 MB of manifests: 449 MB of JSON); each now repeats only the
    drivers already declared and its own, and points to --suggest-values for all at once."""
    config = from_mapping(DECLARED)
    objects = [driver_daemonset(name=f"driver-{i}", namespace=f"ns-{i}") for i in range(40)]
    findings = undeclared_findings(objects, config)
    assert len(findings) == 40
    for finding in findings:
        value = json.loads(finding.details["helm"].split("config.drivers.declared=", 1)[1].strip("'"))
        assert value == [{"namespace": "gpu", "name": "gpu-driver"}, {"namespace": finding.namespace, "name": finding.name}]
        assert "dra-guard audit --suggest-values" in finding.message
        assert len(finding.message) < 600


def test_not_a_driver_an_untrusted_label_and_dra_guards_own_namespace_are_not_reported():
    config = from_mapping(None)
    plain = driver_daemonset(name="fluentd", namespace="logging", containers=[plugin_container("c", mounts=())], cdi=False)
    plain["spec"]["template"]["spec"]["volumes"] = []
    untrusted = driver_daemonset(name="x", namespace="x", cdi=False, labels={drivers.DRIVER_KEY: "x.example.com"})
    own = driver_daemonset(name="d", namespace=config.rbac.guard_namespace)
    assert undeclared_findings([plain, untrusted, own], config) == []


def test_a_declared_daemonset_is_a_driver_even_when_nothing_else_says_so():
    ds = driver_daemonset(name="gpu-driver", namespace="gpu", cdi=False)  # no /var/run/cdi: not auto-detected
    assert drivers.detect(ds, config=from_mapping(None).detection) is None
    found = drivers.detect(ds, config=from_mapping(DECLARED).detection)
    assert found is not None and found.protects and found.evidence == drivers.DECLARED
    # a dra-guard.io/driver label on a declared DaemonSet is trusted
    labelled = driver_daemonset(name="gpu-driver", namespace="gpu", cdi=False, labels={drivers.DRIVER_KEY: "gpu.example.com"})
    found = drivers.detect(labelled, config=from_mapping(DECLARED).detection)
    assert found is not None and found.protects and found.names == ("gpu.example.com",)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"namespace": "gpu"}, "drivers.declared[0].name: required"),
        (
            {"namespace": "gpu", "name": "a') || true || ('"},
            "drivers.declared[0].name: \"a') || true || ('\" must be a DaemonSet name",
        ),
        ({"namespace": "GPU", "name": "d"}, "drivers.declared[0].namespace: 'GPU' must be a namespace name"),
        ({"namespace": "gpu", "name": "d", "driverName": "x"}, "drivers.declared[0]: unknown key"),
    ],
)
def test_a_declared_entry_the_webhook_could_not_select_is_a_config_error(entry, message):
    with pytest.raises(ConfigError, match=None) as exc:
        from_mapping({"drivers": {"declared": [entry]}})
    assert message.split(":")[0] in str(exc.value) and message.split(": ", 1)[1][:20] in str(exc.value), str(exc.value)


def test_dra_guards_own_namespace_cannot_be_declared(monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "dra-guard")
    with pytest.raises(ConfigError, match=r"drivers.declared\[0\].namespace: dra-guard is dra-guard's own namespace"):
        from_mapping({"drivers": {"declared": [{"namespace": "dra-guard", "name": "d"}]}})
    monkeypatch.delenv("POD_NAMESPACE")
    # unknown own namespace (offline audit): accepted
    assert from_mapping({"drivers": {"declared": [{"namespace": "dra-guard", "name": "d"}]}}).detection.declared


def test_the_server_logs_each_undeclared_driver_once_and_keeps_a_gauge_while_it_stays(caplog):
    config = from_mapping(DECLARED)
    state = ClusterState(None, config=config)
    gauge = metrics.UNDECLARED_DRIVERS.labels(daemonset_namespace="net", daemonset="net-driver")
    caplog.set_level(logging.WARNING, logger="dra_guard.cluster")
    state._daemonset_event("ADDED", driver_daemonset(name="gpu-driver", namespace="gpu"))
    state._daemonset_event("ADDED", driver_daemonset(name="net-driver", namespace="net"))
    state._daemonset_event("MODIFIED", driver_daemonset(name="net-driver", namespace="net"))
    lines = [r for r in caplog.records if r.getMessage() == "undeclared DRA driver"]
    assert len(lines) == 1 and (lines[0].namespace, lines[0].daemonset) == ("net", "net-driver")
    assert "net-driver" in lines[0].helm and "gpu-driver" in lines[0].helm
    assert gauge._value.get() == 1
    assert ("gpu", "gpu-driver") not in {
        (s.labels["daemonset_namespace"], s.labels["daemonset"]) for m in metrics.UNDECLARED_DRIVERS.collect() for s in m.samples
    }
    state._daemonset_event("DELETED", driver_daemonset(name="net-driver", namespace="net"))
    assert ("net", "net-driver") not in {
        (s.labels["daemonset_namespace"], s.labels["daemonset"]) for m in metrics.UNDECLARED_DRIVERS.collect() for s in m.samples
    }


def test_an_internal_error_of_the_eviction_policy_is_a_429_never_an_allow():
    """The fail-closed webhook's policy fails closed too: failureMode deny (the default) answers
    429, which drains retry (a 500 would stop kubectl drain)."""
    config = from_mapping(None)

    def broken(request):
        raise RuntimeError("boom")

    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {**eviction_request("gpu-driver-a"), "uid": "u-1"},
    }
    answer = respond(review, policy="eviction", evaluate=broken, settings=config.policy("eviction"), first=True)
    assert config.policy("eviction").failure_mode == "deny"
    assert answer["response"]["allowed"] is False and answer["response"]["status"]["code"] == 429
    allow = from_mapping({"policies": {"eviction": {"failureMode": "allow"}}})
    answer = respond(review, policy="eviction", evaluate=broken, settings=allow.policy("eviction"), first=True)
    assert answer["response"]["allowed"] is True
    json.dumps(answer)


def test_facts_from_files_judge_a_declared_driver_like_the_server():
    config = from_mapping(DECLARED)
    facts = build_facts([driver_daemonset(name="gpu-driver", namespace="gpu", cdi=False)], config)
    assert (
        list(
            eviction.audit_objects(
                facts, config, {"DaemonSet": [driver_daemonset(name="gpu-driver", namespace="gpu", cdi=False)]}
            )
        )
        == []
    )


@pytest.mark.parametrize("mode", ["warn", "audit"])
@pytest.mark.parametrize("policy, first", [("eviction", True), ("rbac", False)])
def test_warn_and_audit_mode_never_refuse_not_even_when_dra_guard_cannot_judge(mode, policy, first):
    """Audit (and warn) only record: a policy's internal error and a review not judged in time
    (overload, deadline, size) are allowed there, where enforce mode refuses them (429 / 500 / 503)."""
    from webhook.admission import NotJudged, overload_answer

    def broken(request):
        raise RuntimeError("boom")

    def late(request):
        raise NotJudged("past its deadline", cause="deadline")

    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {**eviction_request("gpu-driver-a"), "uid": "u-2"},
    }
    for config, allowed in ((from_mapping({"mode": mode}), True), (from_mapping(None), False)):
        settings = config.policy(policy)
        for evaluate in (broken, late):
            answer = respond(review, policy=policy, evaluate=evaluate, settings=settings, first=first)
            assert answer["response"]["allowed"] is allowed, (mode, policy, evaluate.__name__)
            assert ("warnings" in answer["response"]) is (allowed and mode == "warn")
        shed = overload_answer(review, policy=policy, settings=settings, first=first, why="overloaded")
        assert shed["response"]["allowed"] is allowed


def declared_checks(objects, config, *, online=True):
    checks = ("declared-driver-missing", "declared-driver-unmatched")
    found = audit(objects, config, served_versions=["v1"] if online else None).findings
    return sorted((f.check, f.name, f.details.get("pods")) for f, _ in found if f.check in checks)


def daemonset_pod(name, ds="gpu-driver"):
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "gpu",
            "ownerReferences": [{"kind": "DaemonSet", "name": ds, "controller": True, "uid": "u"}],
        },
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Running"},
    }


def test_the_eviction_prefix_is_the_generated_name_prefix_as_the_apiserver_cuts_it():
    assert eviction.eviction_prefix("gpu-driver") == "gpu-driver-"
    long = "d" * 63
    assert eviction.eviction_prefix(long) == long[:58]
    assert eviction.eviction_prefix("e" * 57) == "e" * 57 + "-"


def test_the_cluster_audit_reports_a_declared_daemonset_that_does_not_exist_and_pods_the_webhook_misses():
    config = from_mapping(
        {"drivers": {"declared": [{"namespace": "gpu", "name": "gpu-driver"}, {"namespace": "gpu", "name": "old"}]}}
    )
    ds = driver_daemonset(name="gpu-driver", namespace="gpu")
    objects = [ds, daemonset_pod("gpu-driver-abcde"), daemonset_pod("hand-made")]
    assert declared_checks(objects, config) == [
        ("declared-driver-missing", "old", None),
        ("declared-driver-unmatched", "gpu-driver", ["hand-made"]),
    ]
    # files are not a whole cluster: a DaemonSet missing from them is no finding
    assert declared_checks(objects, config, online=False) == []


def door_checks(objects, config):
    checks = ("driver-preemptible", "driver-taint-evictable", "status-writer")
    found = audit(objects, config, served_versions=["v1"]).findings
    return sorted((f.check, f.name) for f, _ in found if f.check in checks)


def test_the_cluster_audit_reports_declared_drivers_that_preemption_or_a_noexecute_taint_can_remove():
    ds = driver_daemonset(name="gpu-driver", namespace="gpu")
    assert door_checks([ds], from_mapping(DECLARED)) == [
        ("driver-preemptible", "gpu-driver"),
        ("driver-taint-evictable", "gpu-driver"),
    ]
    ds["spec"]["template"]["spec"].update(
        priorityClassName="system-node-critical", tolerations=[{"operator": "Exists", "effect": "NoExecute"}]
    )
    assert door_checks([ds], from_mapping(DECLARED)) == []
    assert door_checks([ds], from_mapping(None)) == []  # only declared drivers


def test_a_driver_at_system_cluster_critical_is_preemptible_by_pods_every_namespace_may_run():
    ds = driver_daemonset(name="gpu-driver", namespace="gpu")
    ds["spec"]["template"]["spec"].update(
        priorityClassName="system-cluster-critical", tolerations=[{"operator": "Exists", "effect": "NoExecute"}]
    )
    found = [f for f, _ in audit([ds], from_mapping(DECLARED), served_versions=["v1"]).findings]
    [preemptible] = [f for f in found if f.check == "driver-preemptible"]
    assert "every namespace may run pods at system-node-critical" in preemptible.message
    assert "ResourceQuota scopeSelector" in preemptible.message
    # below it, the tenants' reach is not the point: any higher priority preempts
    ds["spec"]["template"]["spec"]["priorityClassName"] = "high"
    found = [f for f, _ in audit([ds], from_mapping(DECLARED), served_versions=["v1"]).findings]
    [preemptible] = [f for f in found if f.check == "driver-preemptible"]
    assert "every namespace" not in preemptible.message


def test_the_cluster_audit_reports_who_may_write_pod_status_or_nodes_besides_admins_and_the_control_plane():
    def role(name, resource, verbs):
        rules = [{"apiGroups": [""], "resources": [resource], "verbs": verbs}]
        return {"kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}

    def binding(name, role_name, subject):
        ref = {"kind": "ClusterRole", "name": role_name, "apiGroup": "rbac.authorization.k8s.io"}
        return {"kind": "ClusterRoleBinding", "metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}

    alice = {"kind": "User", "name": "alice"}
    objects = [
        role("status", "pods/status", ["patch"]),
        role("nodes", "nodes", ["update"]),
        role("reader", "pods/status", ["get"]),
        binding("alice-status", "status", alice),
        binding("alice-nodes", "nodes", alice),
        binding("alice-reads", "reader", alice),
        binding("admins-status", "status", {"kind": "Group", "name": "system:masters"}),
        binding(
            "system:controller:node-controller",
            "nodes",
            {"kind": "ServiceAccount", "name": "node-controller", "namespace": "kube-system"},
        ),
    ]
    assert door_checks(objects, from_mapping(None)) == [("status-writer", "alice-nodes"), ("status-writer", "alice-status")]
    # a binding merely named like the control plane's still reports the user it names
    disguised = binding("system:controller:alice", "status", alice)
    assert door_checks([*objects, disguised], from_mapping(None)) == [
        ("status-writer", "alice-nodes"),
        ("status-writer", "alice-status"),
        ("status-writer", "system:controller:alice"),
    ]
