"""The driver catalogue on the real control plane.

For each public driver's shape (tests/drivers_catalogue.py): its RBAC is accepted by the RBAC guard
because its ServiceAccount is a configured driver subject, with rbac.driverResources widened where
the vendor's ClusterRole needs it (Intel's Gaudi driver creates DeviceTaintRules: without the
setting its binding is refused with a message naming it), and the same binding for another
ServiceAccount is refused; its DaemonSet gets the probe patch the chart calls for, or none; the
real scheduler allocates a claim of each of its drivers from ResourceSlices published by its
ServiceAccount on a node and reserves it; evicting the driver pod is refused with 429 while a claim
of any of its drivers is reserved there (dra-guard learns the names from the ResourceSlices: most
of these charts name their driver nowhere), without an API request of dra-guard's; it is allowed
once the claims are released. NVIDIA's ComputeDomain daemon (a DaemonSet the driver's controller
creates, whose pods reserve a shared adminAccess claim on the chart's static, label-selected
ResourceSlice) is a consumer, not a driver: it gets no probe, its pods may be evicted, and it
holds the ComputeDomain kubelet plugin pod on its node.
"""

from __future__ import annotations

import copy
import json
import time

import pytest
import yaml

from tests import drivers_catalogue as drivers
from tests.e2e.cluster import TOLERATE_ALL, fake_node
from tests.e2e.guard import Guard
from tests.e2e.kube import evict, get_json, review_caused, wait_for

WORK = "catalogue-work"
ENTRIES = drivers.catalogue()
DRIVER_SERVICE_ACCOUNTS = tuple(e.service_account for e in ENTRIES)


def slug(driver: str) -> str:
    return driver.replace(".", "-")


@pytest.fixture(scope="module")
def guard(control_plane, start_guard):
    cp = control_plane
    g = start_guard(
        namespaces=(WORK,),
        mode="enforce",
        driver_service_accounts=DRIVER_SERVICE_ACCOUNTS,
        declared=tuple((e.namespace, e.daemonset["metadata"]["name"]) for e in ENTRIES),
    )
    try:
        yield g
    finally:
        g.stop()
        cp.kubectl("admin", "delete", "pod", "-n", WORK, "--all", "--grace-period=0", "--force", check=False)


def configure(guard: Guard, driver_resources: tuple[str, ...] = ()) -> None:
    """dra-guard with rbac.driverResources = resourceslices plus `driver_resources`: restarted
    (same port and CA, the webhook configuration unchanged) only when that differs from now."""
    wanted = ("resourceslices", *driver_resources)
    if guard.driver_resources != wanted:
        guard.start(mode="enforce", driver_service_accounts=DRIVER_SERVICE_ACCOUNTS, driver_resources=wanted)


def consumer(entry: drivers.CatalogueDriver, driver: str, node: str) -> dict:
    name = f"{entry.key}-{slug(driver)}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORK},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": TOLERATE_ALL,
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": f"{entry.key}-{slug(driver)}"}],
            "containers": [{"name": "c", "image": "registry.example/app:v1", "resources": {"claims": [{"name": "dev"}]}}],
        },
    }


def dra_objects(entry: drivers.CatalogueDriver) -> list[dict]:
    out = []
    for driver in entry.names:
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": f"{entry.key}-{driver}"},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
            }
        )
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": f"{entry.key}-{slug(driver)}", "namespace": WORK},
                "spec": {
                    "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": f"{entry.key}-{driver}"}}]}}
                },
            }
        )
    return out


def within(mine, theirs) -> bool:
    """Whether `theirs` (as stored) is `mine` with defaults filled in: every key of `mine`, at any
    depth, with the same value."""
    if isinstance(mine, dict):
        return isinstance(theirs, dict) and all(k in theirs and within(v, theirs[k]) for k, v in mine.items())
    return mine == theirs


def reserved_drivers(cp, entry: drivers.CatalogueDriver) -> set[str]:
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
        if entry.driver_resources:
            # the vendor's RBAC writes more than ResourceSlices: refused until rbac.driverResources
            # names those resources too, and the refusal says so
            configure(guard)
            refused = cp.kubectl("alice", "apply", "-f", "-", input=yaml.safe_dump_all(roles), check=False)
            assert refused.returncode != 0 and "dra-guard" in refused.stderr, refused
            assert "rbac.driverResources" in refused.stderr, refused.stderr
            assert all(r in refused.stderr for r in entry.driver_resources), refused.stderr
        configure(guard, entry.driver_resources)
        installed = cp.kubectl("alice", "apply", "-f", "-", input=yaml.safe_dump_all(roles), check=False)
        assert installed.returncode == 0, installed.stderr
        other = copy.deepcopy(next(o for o in rbac if o["kind"] == "ClusterRoleBinding"))
        other["metadata"]["name"] += "-other"
        other["subjects"][0].update(name="not-a-driver", namespace=WORK)
        out = cp.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=json.dumps(other), check=False)
        assert out.returncode != 0 and "dra-guard" in out.stderr, out
        # a ServiceAccount writing what a driver writes is told of rbac.driverSubjects, for exactly it
        assert f"config.rbac.extraDriverSubjects.serviceAccounts: [{WORK}:not-a-driver]" in out.stderr, out.stderr

        # its DaemonSet: the probe patch the chart calls for, or none (existing probes untouched)
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(ds))
        stored = get_json(cp, "daemonset", "-n", entry.namespace, ds["metadata"]["name"])
        containers = {c["name"]: c for c in stored["spec"]["template"]["spec"]["containers"]}
        original = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
        for cname, port in entry.probes.items():
            if port:
                assert containers[cname]["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}, cname
                assert containers[cname]["startupProbe"]["grpc"] == {"port": port, "service": "liveness"}, cname
            else:  # untouched (the apiserver only fills in defaults such as successThreshold, httpGet.scheme)
                for probe in ("livenessProbe", "startupProbe"):
                    mine, theirs = original[cname].get(probe), containers[cname].get(probe)
                    assert (mine is None and theirs is None) or within(mine, theirs), (cname, probe, theirs)
        added = {k for k in (stored["metadata"].get("annotations") or {}) if k.startswith("probes.dra-guard.io/")}
        assert added == {f"probes.dra-guard.io/{c}" for c, p in entry.probes.items() if p}

        # its ResourceSlices, published by its own ServiceAccount; a claim of each driver, reserved on the node
        ns, sa = entry.service_account.split(":")
        for driver in entry.names:
            cp.kubectl(
                "admin",
                "create",
                "-f",
                "-",
                f"--as=system:serviceaccount:{ns}:{sa}",
                input=json.dumps(drivers.resource_slice(driver, node)),
            )
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump_all(dra_objects(entry)))
        for driver in entry.names:
            cp.kubectl("admin", "apply", "-f", "-", input=json.dumps(consumer(entry, driver, node)))

        def driver_pod():
            pods = get_json(cp, "pods", "-n", entry.namespace) or {"items": []}
            return next(
                (
                    p["metadata"]["name"]
                    for p in pods["items"]
                    if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")
                ),
                None,
            )

        pod = wait_for("the DaemonSet controller and scheduler to place the driver pod", driver_pod)
        wait_for(
            "the scheduler to allocate and reserve a claim of each driver",
            lambda: reserved_drivers(cp, entry) == set(entry.names),
        )

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
            rest = set(entry.names[entry.names.index(driver) + 1 :])
            wait_for("the claim to be released", lambda rest=rest: reserved_drivers(cp, entry) == rest)
            if rest:

                def still_held_by_the_rest(gone: str = driver) -> list | None:
                    answer = evict(cp, entry.namespace, pod)
                    return [answer] if answer.status_code == 429 and gone not in answer.text else None

                held = wait_for("dra-guard to see the release", still_held_by_the_rest)[0]
                assert all(n in held.text for n in rest), held.text
        new = [ev for ev in cp.audit_events("dra-guard", stage=None) if ev["auditID"] not in before]
        caused = review_caused(new)
        assert caused == [], [(ev["verb"], ev["requestURI"]) for ev in caused]

        # allowed once every claim is released
        wait_for("dra-guard to allow the eviction", lambda: evict(cp, entry.namespace, pod, grace=0).status_code in (200, 201))
    finally:
        cp.kubectl(
            "admin",
            "delete",
            "pod",
            "-n",
            WORK,
            "--field-selector",
            f"spec.nodeName={node}",
            "--grace-period=0",
            "--force",
            check=False,
        )
        cp.kubectl(
            "admin", "delete", "daemonset", "-n", entry.namespace, ds["metadata"]["name"], "--ignore-not-found", check=False
        )
        cp.kubectl(
            "admin",
            "delete",
            "pod",
            "-n",
            entry.namespace,
            "--field-selector",
            f"spec.nodeName={node}",
            "--grace-period=0",
            "--force",
            check=False,
        )
        cp.kubectl("admin", "delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(dra_objects(entry)), check=False)
        for driver in entry.names:
            cp.kubectl("admin", "delete", "resourceslice", f"{node}-{driver}", "--ignore-not-found", check=False)
        cp.kubectl("admin", "delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(rbac), check=False)
        cp.kubectl("admin", "delete", "node", node, check=False)


def test_compute_domain_daemon_is_a_consumer_that_holds_the_kubelet_plugin(control_plane, guard):
    """NVIDIA's ComputeDomain kubelet plugin on a node, the chart's static daemon ResourceSlice
    (nodeSelector on the ComputeDomain node label, published by Helm, not by the plugin), and the
    daemon DaemonSet the controller creates for a ComputeDomain with its shared adminAccess claim:
    the scheduler allocates the claim from the static slice and reserves it for the daemon pod.
    dra-guard patches no probe into the daemon (not a driver: no ResourceSlice write, no kubelet
    plugin mounts), lets its pod be evicted, and refuses the eviction of the kubelet plugin pod on
    the daemon's node while the daemon's claim is reserved there."""
    cp = control_plane
    configure(guard)
    entry = drivers.nvidia_compute_domain()
    ns, domain = entry.namespace, "0f6c3f5e-cd01"
    node = "e2e-cat-cd-daemon"
    plugin_ds = copy.deepcopy(entry.daemonset)
    plugin_ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    claim_name = f"computedomain-daemon-{domain}"
    daemon_claim, daemon_ds = drivers.compute_domain_daemon(ns, domain, claim_name)
    daemon_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "compute-domain-daemon.nvidia.com"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'compute-domain.nvidia.com' && "
                        "device.attributes['compute-domain.nvidia.com'].type == 'daemon'"
                    }
                }
            ]
        },
    }
    static_slice = drivers.compute_domain_daemon_slice()
    rbac = [o for o in entry.objects if o["kind"] != "DaemonSet"] + drivers.compute_domain_daemon_rbac(ns)
    # the plugin labelled the node for the ComputeDomain during a workload's channel Prepare
    cp.session("admin").post(
        f"{cp.url}/api/v1/nodes", json=fake_node(node, labels={drivers.COMPUTE_DOMAIN_LABEL: domain}), timeout=10
    ).raise_for_status()
    cp.kubectl("admin", "create", "namespace", ns, check=False)
    # the driver namespace may hold adminAccess claims (an admin's label)
    cp.kubectl("admin", "label", "namespace", ns, "resource.kubernetes.io/admin-access=true", "--overwrite")
    try:
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump_all([*rbac, daemon_class, static_slice, plugin_ds]))
        sa_ns, sa = entry.service_account.split(":")
        cp.kubectl(
            "admin",
            "create",
            "-f",
            "-",
            f"--as=system:serviceaccount:{sa_ns}:{sa}",
            input=json.dumps(drivers.resource_slice("compute-domain.nvidia.com", node)),
        )  # its channel devices
        # what the controller creates for the ComputeDomain: untouched by dra-guard
        cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump_all([daemon_claim, daemon_ds]))
        stored = get_json(cp, "daemonset", "-n", ns, daemon_ds["metadata"]["name"])
        assert not any(k.startswith("probes.dra-guard.io/") for k in stored["metadata"].get("annotations") or {})
        [daemon_c] = stored["spec"]["template"]["spec"]["containers"]
        assert "grpc" not in daemon_c["livenessProbe"] and daemon_c["livenessProbe"]["exec"]

        def pod_on_node(prefix: str) -> str | None:
            pods = get_json(cp, "pods", "-n", ns) or {"items": []}
            return next(
                (
                    p["metadata"]["name"]
                    for p in pods["items"]
                    if p["spec"].get("nodeName") == node
                    and p["metadata"]["name"].startswith(prefix)
                    and not p["metadata"].get("deletionTimestamp")
                ),
                None,
            )

        plugin_pod = wait_for("the kubelet plugin pod on the node", lambda: pod_on_node(plugin_ds["metadata"]["name"]))
        daemon_pod = wait_for("the daemon pod on the node", lambda: pod_on_node(daemon_ds["metadata"]["name"]))

        def reserved() -> dict | None:
            claim = get_json(cp, "resourceclaim", "-n", ns, claim_name) or {}
            status = claim.get("status") or {}
            return status if status.get("reservedFor") else None

        status = wait_for("the scheduler to allocate the daemon claim from the static slice and reserve it", reserved)
        [result] = status["allocation"]["devices"]["results"]
        assert result["pool"] == "compute-domain-daemons" and result.get("adminAccess") is True, status
        assert "nodeName" not in str(status["allocation"].get("nodeSelector")), status  # label-selected, not node-local

        last: list = []

        def refused():
            r = evict(cp, ns, plugin_pod)
            last[:] = [r.status_code, r.text]
            return [r] if r.status_code == 429 and "dra-guard" in r.text else None  # a 429 Response is falsy

        try:
            [answer] = wait_for("dra-guard to refuse the kubelet plugin's eviction", refused)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; last answer {last}; dra-guard log:\n{guard.proc.log()}") from None
        assert "compute-domain.nvidia.com" in answer.text and daemon_pod in answer.text, answer.text
        # the daemon is a consumer: its own eviction is dra-guard's to allow (no driver of its own)
        cp.kubectl("admin", "delete", "daemonset", "-n", ns, daemon_ds["metadata"]["name"])  # the ComputeDomain went away
        assert evict(cp, ns, daemon_pod, grace=0).status_code in (200, 201)
        wait_for("the daemon claim to be released", lambda: not reserved())
        wait_for(
            "dra-guard to allow the kubelet plugin's eviction",
            lambda: evict(cp, ns, plugin_pod, grace=0).status_code in (200, 201),
        )
    finally:
        for name in (daemon_ds["metadata"]["name"], plugin_ds["metadata"]["name"]):
            cp.kubectl("admin", "delete", "daemonset", "-n", ns, name, "--ignore-not-found", check=False)
        cp.kubectl(
            "admin",
            "delete",
            "pod",
            "-n",
            ns,
            "--field-selector",
            f"spec.nodeName={node}",
            "--grace-period=0",
            "--force",
            check=False,
        )
        # its finalizer goes once no pod reserves it: never wait on that here
        cp.kubectl("admin", "delete", "resourceclaim", "-n", ns, claim_name, "--ignore-not-found", "--wait=false", check=False)
        cp.kubectl(
            "admin",
            "delete",
            "resourceslice",
            f"{node}-compute-domain.nvidia.com",
            static_slice["metadata"]["name"],
            "--ignore-not-found",
            check=False,
        )
        cp.kubectl("admin", "delete", "deviceclass", daemon_class["metadata"]["name"], "--ignore-not-found", check=False)
        cp.kubectl("admin", "delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(rbac), check=False)
        cp.kubectl("admin", "delete", "node", node, check=False)
