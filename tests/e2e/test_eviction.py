"""Drain order on the real control plane: real scheduler allocates and reserves a claim, the real
ResourceClaim controller creates it from a template and releases it (issue acceptance 5 and 6).
Every way this control plane takes a driver pod off its node is tried while the claim is reserved:
eviction, DELETE, deletecollection, the real DaemonSet controller's rolling update (goes through)
and its deletion when the node no longer matches (refused), and the eviction of the pod of a
declared DaemonSet whose 63-character name the apiserver cuts in its pods' names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.builders import driver_daemonset
from tests.e2e import objects
from tests.e2e.cluster import TOLERATE_ALL, fake_node
from tests.e2e.guard import EVICTION_REFUSED
from tests.e2e.kube import apply_objects, evict, get_json, review_caused, wait_for

NODE = "e2e-node-a"
DRIVER = "gpu.example.com"
#: a legal DaemonSet name of 63 characters: the apiserver cuts its pods' generated names to 58 + 5
LONG = "dra-driver-cpu-" + "x" * 48

DRA_OBJECTS = objects.manifests(
    objects.device_class("e2e-gpu", DRIVER),
    objects.node_slice(NODE, DRIVER, devices=("gpu-0", "gpu-1")),
    objects.namespace("work"),
    objects.claim_template("work", "e2e-gpu"),
)


def consumer_pod(name):
    return objects.consumer(name, "work", NODE, TOLERATE_ALL)


@pytest.fixture(scope="module")
def scenario(control_plane, start_guard):
    cp = control_plane
    cp.session("admin").post(f"{cp.url}/api/v1/nodes", json=fake_node(NODE), timeout=10).raise_for_status()
    cp.kubectl("admin", "apply", "-f", "-", input=DRA_OBJECTS)
    cp.kubectl("admin", "create", "namespace", "gpu", check=False)
    ds = driver_daemonset(name="e2e-gpu-driver", namespace="gpu")
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    # the node has no kubelet: the node lifecycle controller soon taints it unreachable, and a
    # DaemonSet puts pods only where it tolerates every NoSchedule taint
    ds["spec"]["template"]["spec"]["tolerations"] = TOLERATE_ALL
    g = start_guard(mode="enforce", declared=(("gpu", "e2e-gpu-driver"), ("gpu", LONG)))
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(ds))
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(consumer_pod("consumer")))
    try:
        yield g
    finally:
        g.stop()
        cp.kubectl("admin", "delete", "pod", "-n", "work", "--all", "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "daemonset", "-n", "gpu", "e2e-gpu-driver", LONG, check=False)
        cp.kubectl("admin", "delete", "pod", "-n", "gpu", "--all", "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "-f", "-", input=DRA_OBJECTS, check=False)
        cp.kubectl("admin", "delete", "node", NODE, check=False)


def driver_pod_name(cp):
    pods = get_json(cp, "pods", "-n", "gpu", "-l", "app=e2e-gpu-driver") or {"items": []}
    running = [p for p in pods["items"] if p["spec"].get("nodeName") == NODE and not p["metadata"].get("deletionTimestamp")]
    return running[0]["metadata"]["name"] if running else None


def claim_reserved(cp):
    claims = get_json(cp, "resourceclaims", "-n", "work") or {"items": []}
    return [c for c in claims["items"] if (c.get("status") or {}).get("reservedFor")]


def dra_guard_refusal(answer):
    """Whether an apiserver answer (kubectl's stderr, or a requests.Response) is dra-guard's own
    refusal of a driver still needed (not a CEL error of a matchCondition, not its "caches not
    ready" 429)."""
    if not isinstance(answer, str):
        is_json = answer.headers.get("Content-Type", "").startswith("application/json")
        answer = answer.json().get("message", "") if is_json else ""
    return EVICTION_REFUSED in answer and "is still needed on node" in answer


def wait_guarded(cp, scenario):
    """The driver pod's name once the claim is reserved and dra-guard refuses its eviction."""
    driver_pod = wait_for("the DaemonSet controller and scheduler to place the driver pod", lambda: driver_pod_name(cp))
    wait_for("the scheduler to allocate and reserve the claim", lambda: claim_reserved(cp))
    last = []

    def refused():
        r = evict(cp, "gpu", driver_pod)
        last[:] = [r.status_code, r.text]
        return r.status_code == 429 and dra_guard_refusal(r)

    try:
        wait_for("dra-guard to refuse the driver eviction", refused)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last answer {last}; dra-guard log:\n{scenario.proc.log()}") from None
    return driver_pod


def reserved_consumer(cp, name):
    """Create consumer pod `name` and wait until its claim is reserved; the claim's name."""
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(consumer_pod(name)))
    pod = wait_for(
        f"consumer {name}'s claim made",
        lambda: (lambda p: p if p and p["status"].get("resourceClaimStatuses") else None)(
            get_json(cp, "pod", "-n", "work", name)
        ),
    )
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    wait_for("its claim reserved", lambda: any(c["metadata"]["name"] == claim for c in claim_reserved(cp)))
    return claim


def wait_refused_naming(cp, driver_pod, text, why):
    """Wait until dra-guard refuses the driver pod's eviction with `text` in its message (JSON
    escapes undone); AssertionError with the last answer otherwise."""
    last = []

    def named():
        r = evict(cp, "gpu", driver_pod)
        last[:] = [r.status_code, r.text]
        return r.status_code == 429 and dra_guard_refusal(r) and text in r.text.replace("\\u003e", ">")

    try:
        wait_for(why, named, timeout=30)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last answer {last}") from None


def test_delete_and_deletecollection_of_a_held_driver_pod_are_refused(control_plane, scenario):
    """eviction.guardDeletes is on by default: a DELETE of the driver pod, and each pod of a
    deletecollection (reviewed with no request name), are judged by dra-guard itself."""
    cp = control_plane
    driver_pod = wait_guarded(cp, scenario)
    one = cp.kubectl("admin", "delete", "pod", "-n", "gpu", driver_pod, "--dry-run=server", check=False)
    assert one.returncode != 0 and dra_guard_refusal(one.stderr), one.stderr
    r = cp.session("admin").delete(f"{cp.url}/api/v1/namespaces/gpu/pods", params={"dryRun": "All"}, timeout=30)
    assert r.status_code == 429, r.text
    assert dra_guard_refusal(r) and driver_pod in r.json()["message"], r.text
    assert driver_pod_name(cp) == driver_pod


def pods_of(cp, daemonset):
    pods = get_json(cp, "pods", "-n", "gpu", "-l", f"app={daemonset}") or {"items": []}
    return pods["items"]


def test_a_declared_daemonset_named_with_63_characters_is_guarded(control_plane, scenario):
    """Its pods' names start with the first 58 characters of its name, not "<name>-": the chart's
    eviction condition still sends their evictions to dra-guard, which refuses them."""
    cp = control_plane
    wait_guarded(cp, scenario)
    ds = driver_daemonset(name=LONG, namespace="gpu")
    ds["spec"]["template"]["spec"].update(nodeSelector={"kubernetes.io/hostname": NODE}, tolerations=TOLERATE_ALL)
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(ds))
    try:
        name = wait_for("the long DaemonSet's pod", lambda: (pods_of(cp, LONG) or [{}])[0].get("metadata", {}).get("name"))
        assert len(name) == 63 and name.startswith(LONG[:58]) and not name.startswith(LONG + "-")
        last = []

        def refused():
            r = evict(cp, "gpu", name)
            last[:] = [r.status_code, r.text]
            return r.status_code == 429 and dra_guard_refusal(r)

        wait_for("dra-guard to refuse the long-named driver pod's eviction", refused)
        assert "work/consumer" in last[1]
    finally:
        # the garbage collector's deletes are never sent; then the Terminating pods go at once
        cp.kubectl("admin", "delete", "daemonset", "-n", "gpu", LONG, "--wait=false", check=False)
        wait_for(
            "the garbage collector to delete its pods",
            lambda: all(p["metadata"].get("deletionTimestamp") for p in pods_of(cp, LONG)),
        )
        cp.kubectl("admin", "delete", "pods", "-n", "gpu", "-l", f"app={LONG}", "--grace-period=0", "--force", check=False)


def template_generation(cp):
    ds = get_json(cp, "daemonset", "-n", "gpu", "e2e-gpu-driver")
    return ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"]


def patch_template(cp, spec):
    cp.kubectl(
        "admin",
        "patch",
        "daemonset",
        "-n",
        "gpu",
        "e2e-gpu-driver",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"template": {"spec": spec}}}),
    )


def refused_deletes(scenario):
    from tests.scrape import metric, scrape

    return metric(scrape(scenario.proc), "dra_guard_driver_evictions_total", driver=DRIVER, decision="refused", default=0.0)


def roll(cp, old):
    """Wait until the DaemonSet controller deleted driver pod `old`, confirm the deletion as the
    absent kubelet would (its final DELETE: never sent to dra-guard), return the new pod's name."""
    wait_for(
        "the rolling update to delete the old pod",
        lambda: (
            not any(
                p["metadata"]["name"] == old and not p["metadata"].get("deletionTimestamp") for p in pods_of(cp, "e2e-gpu-driver")
            )
        ),
    )
    cp.kubectl("admin", "delete", "pod", "-n", "gpu", old, "--grace-period=0", "--force", check=False)
    new = wait_for("the new pod on the node", lambda: driver_pod_name(cp))
    assert new != old
    return new


def test_the_daemonset_controller_may_roll_the_driver_but_not_take_it_off_the_node(control_plane, scenario):
    """The real DaemonSet controller (maxUnavailable 1, the default): its DELETE of the pod of an
    older template goes through while the claim is reserved (a new pod comes back on the node);
    once the DaemonSet's nodeSelector no longer matches the node, its DELETE is refused and the
    driver pod stays. While dra-guard is hung the controller's DELETE of a new rollout fails
    (failurePolicy Fail) and the rollout waits until dra-guard answers again."""
    cp = control_plane
    pod = wait_guarded(cp, scenario)
    try:
        patch_template(cp, {"containers": [{"name": "plugin", "image": "registry.example/driver:v2"}]})
        pod = roll(cp, pod)
        before = refused_deletes(scenario)
        # the node no longer matches: the controller would delete the driver and put none back
        patch_template(cp, {"nodeSelector": {"kubernetes.io/hostname": NODE, "e2e-gpu": "never"}})
        wait_for("dra-guard to refuse the DaemonSet controller's DELETE", lambda: refused_deletes(scenario) > before)
        time.sleep(2)
        assert driver_pod_name(cp) == pod, "the driver pod must stay while the claim is reserved"
        # matching again: the template of the running pod (the controller's revision hash matches), nothing to roll
        patch_template(cp, {"nodeSelector": {"e2e-gpu": None}})
        # dra-guard hung: the controller's DELETE fails, the driver pod stays until it answers
        os.killpg(scenario.proc.proc.pid, signal.SIGSTOP)
        try:
            patch_template(cp, {"containers": [{"name": "plugin", "image": "registry.example/driver:v3"}]})
            time.sleep(8)  # the webhook's timeout is 3 s: the controller has tried and been refused
            assert driver_pod_name(cp) == pod, "the rollout must wait while dra-guard is hung"
        finally:
            os.killpg(scenario.proc.proc.pid, signal.SIGCONT)
        pod = roll(cp, pod)
    finally:
        patch_template(cp, {"nodeSelector": {"e2e-gpu": None}})
        for p in pods_of(cp, "e2e-gpu-driver"):
            if p["metadata"].get("deletionTimestamp"):
                cp.kubectl(
                    "admin", "delete", "pod", "-n", "gpu", p["metadata"]["name"], "--grace-period=0", "--force", check=False
                )
    wait_for("a driver pod of the current template", lambda: driver_pod_name(cp))


def test_a_claim_deleted_under_its_running_pod_still_holds_the_driver(control_plane, scenario):
    """A namespace admin (the default `admin` ClusterRole) removes the finalizer of a reserved claim
    and deletes it while its pod still runs on the node: the claim objects no longer say the
    devices are prepared, the node still does; dra-guard keeps refusing and names that claim."""
    cp = control_plane
    driver_pod = wait_guarded(cp, scenario)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "e2e-alice-admin", "namespace": "work"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "ClusterRole", "name": "admin", "apiGroup": "rbac.authorization.k8s.io"},
    }
    apply_objects(cp, binding)
    try:
        claim = reserved_consumer(cp, "held")
        unprotect = cp.kubectl(
            "alice", "patch", "resourceclaim", "-n", "work", claim, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
        )
        assert unprotect.returncode == 0, unprotect.stderr
        cp.kubectl("alice", "delete", "resourceclaim", "-n", "work", claim, "--wait=false")
        wait_for("the claim gone", lambda: get_json(cp, "resourceclaim", "-n", "work", claim) is None)
        wait_refused_naming(cp, driver_pod, f"work/{claim} (missing or not allocated", "dra-guard to name the deleted claim")
        wait_refused_naming(cp, driver_pod, "-> pod work/held", "the message to name the pod too")
    finally:
        cp.kubectl("admin", "delete", "pod", "-n", "work", "held", "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "rolebinding", "-n", "work", "e2e-alice-admin", check=False)


def test_a_running_consumer_marked_succeeded_by_a_status_writer_still_holds_the_driver(control_plane, scenario):
    """alice, given `pods/status` patch in the consumers' namespace, writes phase Succeeded on a
    consumer whose container the node reports running: the resourceclaim controller believes it
    and unreserves the claim, dra-guard does not (a terminal phase next to a running container is
    not the kubelet's) and keeps refusing the driver's eviction, naming that pod."""
    cp = control_plane
    driver_pod = wait_guarded(cp, scenario)
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "e2e-status-writer", "namespace": "work"},
            "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "e2e-status-writer", "namespace": "work"},
            "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "Role", "name": "e2e-status-writer", "apiGroup": "rbac.authorization.k8s.io"},
        },
    ]
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    try:
        claim = reserved_consumer(cp, "faked")
        # the node's report (this test plays the kubelet of the fake node): the container runs
        running = {"status": {"phase": "Running", "containerStatuses": [
            {"name": "c", "ready": True, "restartCount": 0, "image": "registry.example/app:v1", "imageID": "",
             "state": {"running": {"startedAt": "2026-12-05T00:00:00Z"}}}
        ]}}  # fmt: skip
        out = cp.kubectl(
            "admin", "patch", "pod", "-n", "work", "faked", "--subresource=status", "--type=merge", "-p", json.dumps(running)
        )
        assert out.returncode == 0, out.stderr
        fake_end = cp.kubectl(
            "alice",
            "patch",
            "pod",
            "-n",
            "work",
            "faked",
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status":{"phase":"Succeeded"}}',
        )
        assert fake_end.returncode == 0, fake_end.stderr
        wait_for(
            "the resourceclaim controller to believe it",
            lambda: not any(c["metadata"]["name"] == claim for c in claim_reserved(cp)),
        )
        wait_refused_naming(cp, driver_pod, "pod work/faked", "dra-guard to keep the driver for the pod that still runs")
    finally:
        cp.kubectl("admin", "delete", "pod", "-n", "work", "faked", "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "-f", "-", input=yaml.safe_dump_all(rbac), check=False)


def test_a_noexecute_device_taint_rule_takes_the_consumer_and_the_driver_is_held_while_it_terminates(control_plane, scenario):
    """An admin's DeviceTaintRule with effect NoExecute on the device of a running consumer: the
    device-taint-eviction controller deletes the consumer (a DELETE of a pod that is no driver's:
    never sent to dra-guard, no PodDisruptionBudget), and while that pod terminates (the node has
    not confirmed it stopped) the driver's eviction is refused naming it."""
    cp = control_plane
    driver_pod = wait_guarded(cp, scenario)
    rule = "e2e-gpu-broken"
    try:
        claim = get_json(cp, "resourceclaim", "-n", "work", reserved_consumer(cp, "tainted"))
        [result] = claim["status"]["allocation"]["devices"]["results"]
        taint_rule = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": rule},
            "spec": {
                "deviceSelector": {"driver": result["driver"], "pool": result["pool"], "device": result["device"]},
                "taint": {"key": "example.com/broken", "value": "true", "effect": "NoExecute"},
            },
        }
        cp.kubectl("admin", "apply", "-f", "-", input=json.dumps(taint_rule))
        wait_for(
            "the device-taint-eviction controller to delete the consumer",
            lambda: (get_json(cp, "pod", "-n", "work", "tainted") or {}).get("metadata", {}).get("deletionTimestamp"),
            timeout=60,
        )
        wait_refused_naming(cp, driver_pod, "pod work/tainted", "dra-guard to name the terminating consumer")
    finally:
        cp.kubectl("admin", "delete", "devicetaintrule", rule, "--ignore-not-found", check=False)
        cp.kubectl("admin", "delete", "pod", "-n", "work", "tainted", "--grace-period=0", "--force", check=False)


def test_drain_waits_for_the_claim_then_evicts_the_driver(control_plane, scenario, tmp_path):
    cp = control_plane
    driver_pod = wait_for("the DaemonSet controller and scheduler to place the driver pod", lambda: driver_pod_name(cp))
    claims = wait_for("the scheduler to allocate and reserve the claim", lambda: claim_reserved(cp))
    claim_name = claims[0]["metadata"]["name"]
    assert claims[0]["status"]["allocation"]["devices"]["results"][0]["driver"] == DRIVER

    # the eviction API answers 429 with our message, once dra-guard's caches have the claim
    last = []

    def refused():
        r = evict(cp, "gpu", driver_pod)
        last[:] = [r.status_code, r.text]
        # only dra-guard's own refusal of a still-needed driver counts: not a PDB's 429, not its
        # "caches not ready" 429 (which names no claim), not "dra-guard" in some other text
        message = r.json().get("message", "") if r.headers.get("Content-Type", "").startswith("application/json") else ""
        ours = message.startswith(EVICTION_REFUSED)
        return [r] if r.status_code == 429 and ours and "is still needed on node" in message else None  # a 429 Response is falsy

    try:
        resp = wait_for("dra-guard to refuse the driver eviction", refused)[0]
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last answer {last}; dra-guard log:\n{scenario.proc.log()}") from None
    assert f"work/{claim_name}" in resp.text and "work/consumer" in resp.text

    # acceptance 6: drain-plan names the blocking claim
    kubeconfig = str(cp.kubeconfig("admin"))
    plan = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "drain-plan", NODE, "--kubeconfig", kubeconfig, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plan.returncode == 1, plan.stderr
    result = json.loads(plan.stdout)
    assert result["evictFirst"] == ["work/consumer"]
    assert result["driverPods"][0]["heldBy"][0]["claim"] == f"work/{claim_name}"

    # a drain loop that retries on 429 like kubectl drain: driver first in its list, but it must go last.
    # No kubelet runs on the node, so evictions use gracePeriodSeconds 0 (the pod is gone at once).
    pending = [("gpu", driver_pod), ("work", "consumer")]
    order = []
    deadline = time.monotonic() + 90
    while pending and time.monotonic() < deadline:
        for ns, name in list(pending):
            r = evict(cp, ns, name, grace=0)
            if r.status_code in (200, 201):
                order.append(name)
                pending.remove((ns, name))
            else:
                assert r.status_code == 429, r.text
        time.sleep(1)
    assert order == ["consumer", driver_pod]
    assert not claim_reserved(cp)


def test_ordinary_pod_eviction_is_untouched(control_plane, scenario):
    """Acceptance 3 end to end: allowed from the cache, and dra-guard makes no API request for it."""
    cp = control_plane
    before = {ev["auditID"] for ev in cp.audit_events("dra-guard", stage=None)}
    apply_objects(
        cp,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plain", "namespace": "work"},
            "spec": {"nodeName": NODE, "tolerations": TOLERATE_ALL, "containers": [{"name": "c", "image": "x"}]},
        },
    )
    assert evict(cp, "work", "plain", grace=0).status_code in (200, 201)
    time.sleep(0.5)
    new = [ev for ev in cp.audit_events("dra-guard", stage=None) if ev["auditID"] not in before]
    # watches renew on their own clock, and so do the APIService check and the Lease writers
    caused = review_caused(new)
    assert caused == [], [(ev["verb"], ev["requestURI"]) for ev in caused]
