"""The driver catalogue on the real control plane (issue 15, item 9).

For each public driver's shape (tests/drivers_catalogue.py): its RBAC is accepted by the RBAC guard
because its ServiceAccount is a configured driver subject (and the same binding for another
ServiceAccount is refused); its DaemonSet gets the probe patch the chart calls for, or none; the
real scheduler allocates a claim of each of its drivers from ResourceSlices published by its
ServiceAccount on a node and reserves it; evicting the driver pod is refused with 429 while a claim
of any of its drivers is reserved there (dra-guard learns the names from the ResourceSlices: most
of these charts name their driver nowhere), without an API request of dra-guard's; it is allowed
once the claims are released.
"""
from __future__ import annotations

import copy
import json
import time

import pytest
import yaml

from tests.drivers_catalogue import CatalogueDriver, catalogue, resource_slice
from tests.e2e.cluster import TOLERATE_ALL, fake_node
from tests.e2e.guard import Guard
from tests.e2e.kube import evict, get_json, wait_for

WORK = "catalogue-work"
ENTRIES = catalogue()


def slug(driver: str) -> str:
    return driver.replace(".", "-")


@pytest.fixture(scope="module")
def guard(control_plane, tmp_path_factory):
    cp = control_plane
    cp.kubectl("admin", "create", "namespace", WORK, check=False)
    g = Guard(cp, tmp_path_factory.mktemp("dra-guard-catalogue"))
    g.start(mode="enforce", driver_service_accounts=tuple(e.service_account for e in ENTRIES),
            declared=tuple((e.namespace, e.daemonset["metadata"]["name"]) for e in ENTRIES))
    g.register()
    try:
        yield g
    finally:
        g.stop()
        cp.kubectl("admin", "delete", "pod", "-n", WORK, "--all", "--grace-period=0", "--force", check=False)


def consumer(entry: CatalogueDriver, driver: str, node: str) -> dict:
    name = f"{entry.key}-{slug(driver)}"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": WORK},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": TOLERATE_ALL,
                     "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": f"{entry.key}-{slug(driver)}"}],
                     "containers": [{"name": "c", "image": "registry.example/app:v1",
                                     "resources": {"claims": [{"name": "dev"}]}}]}}


def dra_objects(entry: CatalogueDriver) -> list[dict]:
    out = []
    for driver in entry.names:
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"{entry.key}-{driver}"},
                    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}})
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"{entry.key}-{slug(driver)}", "namespace": WORK},
                    "spec": {"spec": {"devices": {"requests": [
                        {"name": "dev", "exactly": {"deviceClassName": f"{entry.key}-{driver}"}}]}}}})
    return out


def reserved_drivers(cp, entry: CatalogueDriver) -> set[str]:
    claims = get_json(cp, "resourceclaims", "-n", WORK) or {"items": []}
    found = set()
    for c in claims["items"]:
        status = c.get("status") or {}
        if status.get("reservedFor") and c["metadata"]["name"].startswith(entry.key + "-"):
            found.update(r["driver"] for r in status["allocation"]["devices"]["results"])
    return found


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.key)
def test_catalogue_driver_on_the_real_control_plane(control_plane, guard, entry):
    cp = control_plane
    node = f"e2e-cat-{entry.key}"
    ds = copy.deepcopy(entry.daemonset)
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    rbac = [o for o in entry.objects if o["kind"] != "DaemonSet"]
    cp.session("admin").post(f"{cp.url}/api/v1/nodes", json=fake_node(node), timeout=10).raise_for_status()
    if entry.namespace != "kube-system":
        cp.kubectl("admin", "create", "namespace", entry.namespace, check=False)
    try:
        # its RBAC, installed by an RBAC manager (alice; admins are never sent to the RBAC webhook):
        # accepted, since its ServiceAccount is a configured driver subject; the same binding for a
        # ServiceAccount that is not one is refused (server-side dry run)
        roles = [o for o in rbac if o["apiVersion"].startswith("rbac.authorization.k8s.io/")]
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump_all([o for o in rbac if o not in roles]))
        installed = cp.kubectl("alice", "apply", "-f", "-", input=yaml.safe_dump_all(roles), check=False)
        assert installed.returncode == 0, installed.stderr
        other = copy.deepcopy(next(o for o in rbac if o["kind"] == "ClusterRoleBinding"))
        other["metadata"]["name"] += "-other"
        other["subjects"][0].update(name="not-a-driver", namespace=WORK)
        out = cp.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=json.dumps(other), check=False)
        assert out.returncode != 0 and "dra-guard" in out.stderr, out

        # its DaemonSet: the probe patch the chart calls for, or none (existing probes untouched)
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(ds))
        stored = get_json(cp, "daemonset", "-n", entry.namespace, ds["metadata"]["name"])
        containers = {c["name"]: c for c in stored["spec"]["template"]["spec"]["containers"]}
        original = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
        for cname, port in entry.probes.items():
            if port:
                assert containers[cname]["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}, cname
                assert containers[cname]["startupProbe"]["grpc"] == {"port": port, "service": "liveness"}, cname
            else:  # untouched (the apiserver only fills in defaults such as successThreshold)
                for probe in ("livenessProbe", "startupProbe"):
                    mine, theirs = original[cname].get(probe), containers[cname].get(probe)
                    assert (mine is None and theirs is None) or (
                        mine is not None and theirs is not None and {k: theirs.get(k) for k in mine} == mine), (cname, probe)
        added = {k for k in (stored["metadata"].get("annotations") or {}) if k.startswith("probes.dra-guard.io/")}
        assert added == {f"probes.dra-guard.io/{c}" for c, p in entry.probes.items() if p}

        # its ResourceSlices, published by its own ServiceAccount; a claim of each driver, reserved on the node
        ns, sa = entry.service_account.split(":")
        for driver in entry.names:
            cp.kubectl("admin", "create", "-f", "-", f"--as=system:serviceaccount:{ns}:{sa}",
                       input=json.dumps(resource_slice(driver, node)))
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump_all(dra_objects(entry)))
        for driver in entry.names:
            cp.kubectl("admin", "apply", "-f", "-", input=json.dumps(consumer(entry, driver, node)))

        def driver_pod():
            pods = get_json(cp, "pods", "-n", entry.namespace) or {"items": []}
            return next((p["metadata"]["name"] for p in pods["items"] if p["spec"].get("nodeName") == node
                         and not p["metadata"].get("deletionTimestamp")), None)

        pod = wait_for("the DaemonSet controller and scheduler to place the driver pod", driver_pod)
        wait_for("the scheduler to allocate and reserve a claim of each driver",
                 lambda: reserved_drivers(cp, entry) == set(entry.names))

        # refused while a claim of each of its drivers is reserved; dra-guard calls no API for it
        last: list = []

        def refused():
            r = evict(cp, entry.namespace, pod)
            last[:] = [r.status_code, r.text]
            return [r] if r.status_code == 429 and "dra-guard" in r.text else None

        try:
            wait_for("dra-guard to refuse the driver eviction", refused)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; last answer {last}; dra-guard log:\n{guard.proc.log()}") from None
        before = {ev["auditID"] for ev in cp.audit_events("dra-guard", stage=None)}
        for driver in entry.names:
            r = evict(cp, entry.namespace, pod)
            assert r.status_code == 429 and driver in r.text, r.text
            time.sleep(0.2)
            # release this driver's claim: the next driver's claim must still hold the pod
            assert evict(cp, WORK, f"{entry.key}-{slug(driver)}", grace=0).status_code in (200, 201)
            rest = set(entry.names[entry.names.index(driver) + 1:])
            wait_for("the claim to be released", lambda rest=rest: reserved_drivers(cp, entry) == rest)
            if rest:
                def still_held_by_the_rest(gone: str = driver) -> list | None:
                    answer = evict(cp, entry.namespace, pod)
                    return [answer] if answer.status_code == 429 and gone not in answer.text else None

                held = wait_for("dra-guard to see the release", still_held_by_the_rest)[0]
                assert all(n in held.text for n in rest), held.text
        new = [ev for ev in cp.audit_events("dra-guard", stage=None) if ev["auditID"] not in before]
        assert all(ev["verb"] == "watch" for ev in new), [(ev["verb"], ev["requestURI"]) for ev in new]

        # allowed once every claim is released
        wait_for("dra-guard to allow the eviction", lambda: evict(cp, entry.namespace, pod, grace=0).status_code in (200, 201))
    finally:
        cp.kubectl("admin", "delete", "pod", "-n", WORK, "--field-selector", f"spec.nodeName={node}",
                   "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "daemonset", "-n", entry.namespace, ds["metadata"]["name"], "--ignore-not-found",
                   check=False)
        cp.kubectl("admin", "delete", "pod", "-n", entry.namespace, "--field-selector", f"spec.nodeName={node}",
                   "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(dra_objects(entry)),
                   check=False)
        for driver in entry.names:
            cp.kubectl("admin", "delete", "resourceslice", f"{node}-{driver}", "--ignore-not-found", check=False)
        cp.kubectl("admin", "delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(rbac), check=False)
        cp.kubectl("admin", "delete", "node", node, check=False)
