"""A pod that lists no claim still holds its driver: the real kube-scheduler makes the claim of a
DRA extended resource (KEP-5004: a DeviceClass with spec.extendedResourceName) for a pod that asks
`example.com/fabric-gpu: 1`, on devices a ResourceSlice offers to the nodes of a rack (a
nodeSelector on a node label). drain-plan names that pod first, and dra-guard refuses the driver
pod's eviction with 429 until it is gone."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.builders import driver_daemonset
from tests.e2e import objects
from tests.e2e.cluster import TOLERATE_ALL, fake_node
from tests.e2e.guard import EVICTION_REFUSED
from tests.e2e.kube import dra_guard, evict, get_json, wait_for

NODE = "e2e-fabric-a"
DRIVER = "fabric.example.com"
RESOURCE = "example.com/fabric-gpu"
RACK = "topology.example.com/rack"
WORK, DRIVERS = "fabric-work", "fabric-drivers"

#: the devices of a rack, reachable from the nodes labelled with it (no nodeName)
RACK_SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "e2e-fabric-rack-r1"},
    "spec": {
        "driver": DRIVER,
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": RACK, "operator": "In", "values": ["r1"]}]}]},
        "pool": {"name": "rack-r1", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}],
    },
}
DRA_OBJECTS = objects.manifests(
    objects.device_class("e2e-fabric-gpu", DRIVER, extendedResourceName=RESOURCE),
    RACK_SLICE,
    objects.namespace(WORK),
    objects.namespace(DRIVERS),
)

CONSUMER = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer", "namespace": WORK},
    "spec": {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "tolerations": TOLERATE_ALL,
        "containers": [
            {
                "name": "c",
                "image": "registry.example/app:v1",
                "resources": {"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}},
            }
        ],
    },
}


@pytest.fixture(scope="module")
def scenario(control_plane, start_guard):
    cp = control_plane
    cp.session("admin").post(f"{cp.url}/api/v1/nodes", json=fake_node(NODE, labels={RACK: "r1"}), timeout=10).raise_for_status()
    cp.kubectl("admin", "apply", "-f", "-", input=DRA_OBJECTS)
    ds = driver_daemonset(name="e2e-fabric-driver", namespace=DRIVERS, plugin_subdir=DRIVER)
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    g = start_guard(mode="enforce", declared=((DRIVERS, "e2e-fabric-driver"),))
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(ds))
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(CONSUMER))
    try:
        yield g
    finally:
        g.stop()
        for ns in (WORK, DRIVERS):
            cp.kubectl("admin", "delete", "pod", "-n", ns, "--all", "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "daemonset", "-n", DRIVERS, "e2e-fabric-driver", check=False)
        cp.kubectl("admin", "delete", "resourceclaims", "-n", WORK, "--all", "--wait=false", check=False)
        cp.kubectl("admin", "delete", "-f", "-", "--wait=false", input=DRA_OBJECTS, check=False)
        cp.kubectl("admin", "delete", "node", NODE, check=False)


def driver_pod_name(cp):
    pods = get_json(cp, "pods", "-n", DRIVERS, "-l", "app=e2e-fabric-driver") or {"items": []}
    running = [p for p in pods["items"] if p["spec"].get("nodeName") == NODE and not p["metadata"].get("deletionTimestamp")]
    return running[0]["metadata"]["name"] if running else None


def bound_consumer(cp):
    pod = get_json(cp, "pod", "-n", WORK, "trainer")
    return pod if pod and pod["spec"].get("nodeName") == NODE else None


def test_an_extended_resource_pod_holds_the_driver(control_plane, scenario):
    cp = control_plane
    driver_pod = wait_for("the DaemonSet controller and scheduler to place the driver pod", lambda: driver_pod_name(cp))
    pod = wait_for("the scheduler to bind the pod asking the extended resource", lambda: bound_consumer(cp))
    # what the scheduler stored: no spec.resourceClaims; the claim it made is named in the status
    assert "resourceClaims" not in pod["spec"]
    extended = pod["status"]["extendedResourceClaimStatus"]
    claim_name = extended["resourceClaimName"]
    assert extended["requestMappings"][0]["containerName"] == "c"
    assert extended["requestMappings"][0]["resourceName"] == RESOURCE
    claim = get_json(cp, "resourceclaim", "-n", WORK, claim_name)
    status = claim["status"]
    assert status["allocation"]["devices"]["results"][0]["driver"] == DRIVER
    assert [(r["resource"], r["name"]) for r in status["reservedFor"]] == [("pods", "trainer")]
    # devices of a rack: the allocation selects nodes by label, not by name
    terms = status["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert any(e["key"] == RACK for t in terms for e in t.get("matchExpressions", [])), terms

    plan = dra_guard(cp, "drain-plan", NODE, "-o", "json", timeout=60)
    assert plan.returncode == 1, plan.stdout + plan.stderr
    result = json.loads(plan.stdout)
    assert result["evictFirst"] == [f"{WORK}/trainer"]
    assert result["driverPods"][0]["heldBy"] == [{"claim": f"{WORK}/{claim_name}", "pods": [f"{WORK}/trainer"]}]

    last = []

    def refused():
        r = evict(cp, DRIVERS, driver_pod)
        last[:] = [r.status_code, r.text]
        message = r.json().get("message", "") if r.headers.get("Content-Type", "").startswith("application/json") else ""
        # only dra-guard's refusal naming the claim counts, not its "caches not ready" 429
        return [r] if r.status_code == 429 and message.startswith(EVICTION_REFUSED) and claim_name in message else None

    try:
        wait_for("dra-guard to refuse the driver eviction", refused)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last answer {last}; dra-guard log:\n{scenario.proc.log()}") from None
    assert f"{WORK}/trainer" in last[1]

    # once the pod is gone and its claim released, the driver may go
    assert evict(cp, WORK, "trainer", grace=0).status_code in (200, 201)
    wait_for(
        "the driver eviction to be allowed",
        lambda: evict(cp, DRIVERS, driver_pod, grace=0).status_code in (200, 201),
        timeout=90,
        interval=1,
    )
