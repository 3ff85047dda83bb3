"""`dra-guard drain NODE` and `dra-guard uncordon NODE` on the real control plane.

A fake node (cluster.fake_node) per test, with a ResourceSlice of its own, a DRA driver DaemonSet
placed on it by the real DaemonSet controller and scheduler, and consumers whose claims the real
scheduler allocates and reserves and the real resourceclaim controller makes from templates and
releases. The test plays the kubelet (`FakeKubelet`): it marks pods Running and Ready, and a pod
being deleted terminal and then deletes it, as the kubelet does once it has unprepared its claims;
a pod it is told to hold stays Terminating (an unprepare that keeps failing).

What runs here is what the real node (test_node_drain.py: the real kubelet, containerd and the
test driver) does not cover: Events, taint order and uncordon on the happy path; the client dry
run read in the audit log (also on the real node, but here with a pod the PDB guards and the
server run's dryRun=All writes); a driver pod
deleted while a DaemonSet consumer holds a claim (the DaemonSet taint lifted). A blocking PDB, an
unprepare that keeps failing, a force-deleted consumer (the kubelet's gauge, or the safety period
without nodes/proxy), a driver crash, two drains at once, a killed drain rerun, both dry runs,
devices reachable from two nodes (the real one and a simulated one), a DaemonSet consumer and
dra-guard down while the drain waits for the claims run on the real node only.
"""

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
from tests.e2e.cluster import fake_node
from tests.e2e.fakekubelet import NO_KUBELET, FakeKubelet
from tests.e2e.kube import get_json, wait_for
from tests.e2e.objects import claim_template, device_class
from webhook.model import drain as plan

NAMESPACE = "drain-e2e"
DRIVER = "drain.example.com"
DEVICE_CLASS = "drain-e2e-gpu"


def objects(node: str) -> list[dict]:
    """The node's ResourceSlice and driver DaemonSet (on `node` only)."""
    ds = driver_daemonset(name=f"driver-{node}", namespace=NAMESPACE, plugin_subdir=DRIVER, sa="default")
    spec = ds["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    spec["tolerations"] = NO_KUBELET
    spec["terminationGracePeriodSeconds"] = 1
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-slice"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(4)],
            },
        },
        ds,
    ]


def consumer(name: str, node: str, *, labels: dict | None = None, claim: bool = True) -> dict:
    """A bare pod on `node`, with its own claim from the template (claim=True)."""
    spec: dict = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": NO_KUBELET,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "registry.example/app:v1"}],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {"app": name}},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def shared(control_plane):
    cp = control_plane
    cp.kubectl("admin", "create", "namespace", NAMESPACE, check=False)
    cp.kubectl(
        "admin",
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                device_class(DEVICE_CLASS, DRIVER),
                claim_template(NAMESPACE, DEVICE_CLASS),
            ]
        ),
    )
    return cp


class Scene:
    """One test's node: its name, the fake kubelet, helpers to run the command and read the node."""

    def __init__(self, cp, node: str, kubelet: FakeKubelet, tmp_path) -> None:
        self.cp, self.node, self.kubelet, self.tmp = cp, node, kubelet, tmp_path

    def argv(self, *args: str, user_kubeconfig=None) -> list[str]:
        kubeconfig = str(user_kubeconfig or self.cp.kubeconfig("admin"))
        return [sys.executable, "-m", "webhook.cli", *args, "--kubeconfig", kubeconfig]

    def run(self, *args: str, user_kubeconfig=None, limit: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args, user_kubeconfig=user_kubeconfig), capture_output=True, text=True, timeout=limit)

    def drain(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run("drain", self.node, *args, **kw)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv("drain", self.node, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def get_node(self) -> dict:
        return get_json(self.cp, "node", self.node)

    def pods(self) -> list[dict]:
        return (get_json(self.cp, "pods", "-n", NAMESPACE, "--field-selector", f"spec.nodeName={self.node}") or {"items": []})[
            "items"
        ]

    def pod_names(self) -> set[str]:
        return {p["metadata"]["name"] for p in self.pods()}

    def add(self, *objs: dict) -> None:
        self.cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump_all(list(objs)))

    def running(self, name: str) -> dict:
        return wait_for(
            f"pod {name} Running",
            lambda: next(
                (p for p in self.pods() if p["metadata"]["name"] == name and p["status"].get("phase") == "Running"), None
            ),
            timeout=60,
        )

    def reserved(self, name: str) -> str:
        """Wait until pod `name`'s claim is allocated and reserved; its claim's name."""
        pod = self.running(name)
        claim = wait_for(
            f"{name}'s claim reserved",
            lambda: next(
                (
                    c
                    for c in (get_json(self.cp, "resourceclaims", "-n", NAMESPACE) or {"items": []})["items"]
                    if any(r.get("uid") == pod["metadata"]["uid"] for r in (c.get("status") or {}).get("reservedFor") or [])
                ),
                None,
            ),
            timeout=60,
        )
        return claim["metadata"]["name"]

    def driver_pod(self) -> str:
        return self.running(wait_for("the driver pod", lambda: self._driver_name(), timeout=60))["metadata"]["name"]

    def _driver_name(self):
        return next(
            (p["metadata"]["name"] for p in self.pods() if p["metadata"]["name"].startswith(f"driver-{self.node}-")), None
        )


@pytest.fixture()
def scene(shared, tmp_path, request):
    cp = shared
    node = f"drain-{request.node.name.removeprefix('test_').replace('_', '-')[:40]}".rstrip("-")
    cp.session("admin").post(f"{cp.url}/api/v1/nodes", json=fake_node(node), timeout=10).raise_for_status()
    try:
        with FakeKubelet(cp, node) as kubelet:
            s = Scene(cp, node, kubelet, tmp_path)
            s.add(*objects(node))
            yield s
    finally:
        cp.kubectl("admin", "delete", "daemonset", "-n", NAMESPACE, f"driver-{node}", "--wait=false", check=False)
        cp.kubectl("admin", "delete", "pdb", "-n", NAMESPACE, "--all", "--wait=false", check=False)
        for name in {
            p["metadata"]["name"]
            for p in (get_json(cp, "pods", "-n", NAMESPACE, "--field-selector", f"spec.nodeName={node}") or {"items": []})[
                "items"
            ]
        }:
            cp.kubectl(
                "admin", "delete", "pod", "-n", NAMESPACE, name, "--grace-period=0", "--force", "--wait=false", check=False
            )
        cp.kubectl("admin", "delete", "resourceslice", f"{node}-slice", check=False)
        cp.kubectl("admin", "delete", "node", node, check=False)


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def pdb(name: str, app: str) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    }


def test_happy_path_consumers_first_driver_last(scene):
    """Cordon, the consumers (one with a claim, one without) evicted, the claim released, then the
    driver (tainted only now) evicted last and not put back by its DaemonSet; the autoscalers'
    annotations and the holder gone after; Events on the Node."""
    scene.add(consumer("with-claim", scene.node), consumer("plain", scene.node, claim=False))
    driver = scene.driver_pod()
    scene.reserved("with-claim")
    scene.running("plain")
    out = scene.drain("--evict-drivers", "--timeout", "60s", "-o", "json")
    assert out.returncode == 0, out.stdout + out.stderr
    seen = events(out.stdout)
    kinds = [e["event"] for e in seen]
    assert kinds[0] == "cordon" and kinds[-1] == "done"
    evicted = [e["pod"] for e in seen if e["event"] == "evict"]
    assert evicted[-1] == f"{NAMESPACE}/{driver}", evicted
    assert {f"{NAMESPACE}/with-claim", f"{NAMESPACE}/plain"} <= set(evicted[:-1])
    taints = [i for i, e in enumerate(seen) if e["event"] == "taint"]
    assert len(taints) == 1 and "drain.dra-guard.io/drivers" in seen[taints[0]]["message"]
    assert taints[0] > max(i for i, e in enumerate(seen) if e["event"] == "evict" and e["pod"] != f"{NAMESPACE}/{driver}")
    node = scene.get_node()
    assert node["spec"].get("unschedulable") is True
    annotations = node["metadata"].get("annotations") or {}
    assert plan.HOLDER not in annotations and not set(plan.AUTOSCALER_ANNOTATIONS) & set(annotations)
    assert plan.read_state(node)["unschedulableBefore"] is False
    time.sleep(2)  # the DaemonSet controller had its chance to put the driver back
    assert scene.pod_names() == set(), scene.pod_names()
    reasons = {
        e["reason"]
        for e in (
            get_json(scene.cp, "events", "-n", "default", "--field-selector", f"involvedObject.name={scene.node}")
            or {"items": []}
        )["items"]
    }
    assert {"DraGuardDrainStarted", "DraGuardDrainDone"} <= reasons

    # uncordon restores what the drain changed: cordon and taint gone, the record removed
    out = scene.run("uncordon", scene.node)
    assert out.returncode == 0, out.stderr
    node = scene.get_node()
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints", [])
    assert plan.STATE not in (node["metadata"].get("annotations") or {})


def test_dry_run_client_writes_nothing_and_server_sends_dry_runs(scene, tmp_path):
    scene.add(consumer("guarded", scene.node), consumer("free", scene.node, claim=False), pdb("keep-one", "guarded"))
    scene.driver_pod()
    scene.reserved("guarded")
    scene.running("free")
    cp = scene.cp
    # a ServiceAccount of its own, so that the audit log shows this run's requests alone
    cp.kubectl("admin", "create", "serviceaccount", "drainer", "-n", NAMESPACE, check=False)
    cp.kubectl(
        "admin",
        "create",
        "clusterrolebinding",
        "drain-e2e-drainer",
        "--clusterrole=cluster-admin",
        f"--serviceaccount={NAMESPACE}:drainer",
        check=False,
    )
    user = f"system:serviceaccount:{NAMESPACE}:drainer"
    kubeconfig = token_kubeconfig(cp, tmp_path / "drainer", "drainer")

    out = scene.drain("--dry-run=client", "--evict-drivers", user_kubeconfig=kubeconfig)
    assert out.returncode == 0, out.stderr
    assert "would cordon" in out.stdout and f"{NAMESPACE}/guarded" in out.stdout and "phase drivers" in out.stdout
    time.sleep(1)  # the audit events are written just after the answers
    mine = cp.audit_events(user)
    assert mine and not [e for e in mine if e["verb"] in ("create", "update", "patch", "delete")], [
        (e["verb"], e["requestURI"]) for e in mine if e["verb"] not in ("get", "list", "watch")
    ]
    assert not scene.get_node()["spec"].get("unschedulable")
    # it asks only about its node: pods by field selector, claims by name, never a cluster-wide list
    pod_reads = [e for e in mine if e.get("objectRef", {}).get("resource") == "pods" and e["verb"] in ("list", "watch")]
    assert pod_reads and all("fieldSelector=spec.nodeName" in e["requestURI"] for e in pod_reads), pod_reads
    assert not [e for e in mine if e["verb"] == "list" and e.get("objectRef", {}).get("resource") == "resourceclaims"]

    out = scene.drain("--dry-run=server", user_kubeconfig=kubeconfig)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"eviction of pod {NAMESPACE}/free accepted (dry run)" in out.stdout
    assert f"eviction of pod {NAMESPACE}/guarded would be refused (429)" in out.stdout
    time.sleep(1)
    writes = [e for e in cp.audit_events(user) if e["verb"] in ("create", "patch") and "dryRun=All" in e["requestURI"]]
    assert {e["objectRef"]["resource"] for e in writes} == {"nodes", "pods"}
    assert not scene.get_node()["spec"].get("unschedulable") and scene.pod_names() >= {"guarded", "free"}
    assert not any(p["metadata"].get("deletionTimestamp") for p in scene.pods())


def token_kubeconfig(cp, path, account: str):
    token = cp.kubectl("admin", "create", "token", account, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    config = yaml.safe_load(cp.kubeconfig("admin").read_text())
    config["users"][0]["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    return path


def agent_daemonset(node: str) -> dict:
    """A DaemonSet on `node` that is not a DRA driver and whose pods each use a claim (a monitoring agent)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": f"agent-{node}", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": f"agent-{node}"}},
            "template": {"metadata": {"labels": {"app": f"agent-{node}"}}, "spec": {**consumer("x", node)["spec"]}},
        },
    }


def test_a_driver_killed_mid_drain_is_reported_and_can_come_back(scene):
    """The agent's unprepare keeps failing (held Terminating) while the DaemonSet taint is on; its
    driver pod is then deleted: the drain reports the driver unavailable with a claim prepared and
    lifts the DaemonSet taint so that the driver's DaemonSet can put it back; once the agent is
    released the drain finishes."""
    scene.add(agent_daemonset(scene.node))
    driver = scene.driver_pod()
    agent = wait_for("the agent pod", lambda: next((n for n in scene.pod_names() if n.startswith("agent-")), None), timeout=60)
    scene.reserved(agent)
    scene.kubelet.hold.add(agent)
    proc = scene.start("--timeout", "90s", "-o", "json")
    try:
        wait_for("the agent Terminating", lambda: any(p["metadata"].get("deletionTimestamp") for p in scene.pods()), timeout=30)
        scene.cp.kubectl("admin", "delete", "pod", "-n", NAMESPACE, driver, "--grace-period=0", "--force")
        back = wait_for(
            "a new driver pod Running",
            lambda: next(
                (
                    p["metadata"]["name"]
                    for p in scene.pods()
                    if p["metadata"]["name"].startswith(f"driver-{scene.node}-")
                    and p["metadata"]["name"] != driver
                    and p["status"].get("phase") == "Running"
                ),
                None,
            ),
            timeout=60,
        )
        scene.kubelet.hold.discard(agent)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        scene.cp.kubectl("admin", "delete", "daemonset", "-n", NAMESPACE, f"agent-{scene.node}", "--wait=false", check=False)
    assert proc.returncode == 0, stdout + stderr
    messages = [e["message"] for e in events(stdout)]
    assert any(f"driver {DRIVER} on {scene.node} unavailable while 1 claim(s) are prepared" in m for m in messages), messages
    assert any("removed taint drain.dra-guard.io/daemonsets" in m for m in messages), messages
    assert back in scene.pod_names()
