"""Real DRA drivers, as pure functions over the catalogue fixtures (tests/drivers_catalogue.py):
recognition, names and how they were learned, probes, the drain order with names from ResourceSlices,
several drivers per DaemonSet, kubelet roots, trusted labels, health port <= 0, surge rollouts."""

from __future__ import annotations

import copy

import pytest

from tests.builders import claim, driver_daemonset, eviction_request, node_object, plugin_container, pod
from tests.drivers_catalogue import (
    COMPUTE_DOMAIN_LABEL,
    CatalogueDriver,
    catalogue,
    compute_domain_daemon,
    compute_domain_daemon_rbac,
    compute_domain_daemon_slice,
    example_driver,
    google_tpu,
    intel_gaudi,
    intel_gpu,
    net_driver,
    nvidia_compute_domain,
    nvidia_gpu,
    resource_slice,
    sriov_driver,
)
from webhook import audit, drainplan
from webhook.config import from_mapping
from webhook.model import drivers
from webhook.model.facts import build_facts
from webhook.policies import eviction, probes

NODE = "node-a"


def config_for(*entries: CatalogueDriver, **extra):
    return from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [e.service_account for e in entries]}}, **extra})


def driver_pod(entry: CatalogueDriver, node: str = NODE, *, suffix: str = "a", ready: bool = False):
    ds = entry.daemonset
    p = pod(f"{ds['metadata']['name']}-{suffix}", node, namespace=entry.namespace, ds=ds["metadata"]["name"])
    if ready:
        p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return p


def facts_with(entries, *objects, config=None):
    entries = list(entries)
    objs = [o for e in entries for o in e.objects] + [driver_pod(e) for e in entries]
    return build_facts(objs + list(objects), config or config_for(*entries))


def evict(facts, entry: CatalogueDriver, suffix: str = "a"):
    name = f"{entry.daemonset['metadata']['name']}-{suffix}"
    return eviction.review(eviction_request(name, namespace=entry.namespace), index=facts.claims, config=facts.config.eviction)


def consumers(*drivers_: str):
    """A running consumer pod and a claim reserved by it on NODE for each driver name."""
    out = []
    for i, d in enumerate(drivers_):
        out += [
            pod(f"consumer-{i}", NODE, claims=(f"claim-{i}",)),
            claim(f"claim-{i}", driver=d, node=NODE, reserved=(f"consumer-{i}",)),
        ]
    return out


# ---------------------------------------------------------------- item 9: the catalogue, one driver at a time
@pytest.mark.parametrize("entry", catalogue(), ids=lambda e: e.key)
def test_catalogue_driver_is_recognised_probed_and_protected(entry):
    cfg = config_for(entry)
    facts = build_facts(list(entry.objects), cfg)
    d = drivers.detect(entry.daemonset, config=cfg.detection, can_write_slices=facts.service_account_writes_slices)
    assert d is not None and d.protects, entry.key
    # probes: a patch on exactly the expected containers, ports as the chart declares them
    decision = probes.review(
        {"operation": "CREATE", "object": entry.daemonset},
        detection=cfg.detection,
        config=cfg.probes,
        can_write_slices=facts.service_account_writes_slices,
    )
    patched = {}
    for op in decision.patch:
        parts = op["path"].split("/")
        if parts[-1] == "livenessProbe":
            cname = entry.daemonset["spec"]["template"]["spec"]["containers"][int(parts[-2])]["name"]
            patched[cname] = op["value"]["grpc"]["port"]
    assert patched == {c: p for c, p in entry.probes.items() if p}, entry.key
    # drain order: each of its drivers' claims holds the pod; names learned from ResourceSlices
    slices = [resource_slice(n, NODE) for n in entry.names]
    for held in entry.names:
        facts = facts_with([entry], *slices, *consumers(held))
        refused = evict(facts, entry)
        assert not refused.allowed and refused.findings[0].code == 429, (entry.key, held)
        assert refused.findings[0].details["drivers"] == [held]
        assert f"ResourceSlice on node {NODE}" in refused.findings[0].details["learned"][held]
    released = facts_with(
        [entry],
        *slices,
        pod("consumer-0", NODE, phase="Succeeded"),
        claim("claim-0", driver=entry.names[0], node=NODE, reserved=("consumer-0",)),
    )
    assert evict(released, entry).allowed


def test_gaudi_rbac_needs_devicetaintrules_in_driver_resources():
    """Intel's Gaudi ClusterRole creates DeviceTaintRules: as a driver subject alone its grant is an
    RBAC violation; with the entry's rbac.driverResources it is none (the e2e proves the same on the
    real control plane)."""
    from webhook.audit import load
    from webhook.policies import rbac

    entry = intel_gaudi()
    objects = [load.as_stored(o) for o in entry.objects]
    assert entry.driver_resources == ("devicetaintrules",)
    [finding] = rbac.audit(build_facts(objects, config_for(entry)).rbac, config_for(entry).rbac)
    assert "rbac.driverResources" in finding.message
    widened = config_for(
        entry,
        rbac={
            "driverSubjects": {"serviceAccounts": [entry.service_account]},
            "driverResources": ["resourceslices", *entry.driver_resources],
        },
    )
    assert list(rbac.audit(build_facts(objects, widened).rbac, widened.rbac)) == []


def test_only_the_tpu_plugin_container_is_the_kubelet_plugin():
    """The TPU DaemonSet runs three containers; only tpu-dra-plugin mounts the kubelet folders, so
    only it would ever get a probe (none today: no gRPC health port, an exec readiness probe)."""
    tpu = google_tpu()
    cfg = config_for(tpu)
    facts = build_facts(list(tpu.objects), cfg)
    d = drivers.detect(tpu.daemonset, config=cfg.detection, can_write_slices=facts.service_account_writes_slices)
    assert d is not None and d.plugin_containers == (0,)
    decision = probes.review(
        {"operation": "CREATE", "object": tpu.daemonset},
        detection=cfg.detection,
        config=cfg.probes,
        can_write_slices=facts.service_account_writes_slices,
    )
    assert decision.patch == () and [f.check for f in decision.findings] == ["no-healthcheck-port"]
    assert not any("seamless" in w for w in decision.warnings)  # POD_UID and maxSurge 1: it supports it


def test_the_sriov_chart_gets_no_probe_even_with_assume_default_port():
    """The SR-IOV chart's default (healthcheckPort -1) renders no HEALTHCHECK_PORT: its health
    service is off, and dra-guard, which knows the image, adds no probe on the default port."""
    sriov = sriov_driver()
    assert not any(e["name"] == "HEALTHCHECK_PORT" for e in sriov.daemonset["spec"]["template"]["spec"]["containers"][0]["env"])
    cfg = config_for(sriov, probes={"assumeDefaultPort": True})
    facts = build_facts(list(sriov.objects), cfg)
    decision = probes.review(
        {"operation": "CREATE", "object": sriov.daemonset},
        detection=cfg.detection,
        config=cfg.probes,
        can_write_slices=facts.service_account_writes_slices,
    )
    assert decision.patch == () and [f.check for f in decision.findings] == ["healthcheck-disabled"]


def test_compute_domain_daemon_is_a_consumer_holding_the_kubelet_plugin():
    """NVIDIA's ComputeDomain daemon DaemonSet (made by the controller) is no driver: no ResourceSlice
    write, no kubelet mounts. Its pod reserves the shared adminAccess claim allocated from the
    chart's static slice (selected by node label, not node-local): that holds the ComputeDomain
    kubelet plugin pod on the daemon's node, and only there."""
    cd = nvidia_compute_domain()
    domain = "cd-1"
    daemon_claim, daemon_ds = compute_domain_daemon(cd.namespace, domain, "cd-1-daemon")
    cfg = config_for(cd)
    objs = [
        *cd.objects,
        *compute_domain_daemon_rbac(cd.namespace),
        daemon_ds,
        compute_domain_daemon_slice(),
        resource_slice("compute-domain.nvidia.com", NODE),
        driver_pod(cd),
        driver_pod(cd, "node-b", suffix="b"),
        node_object(NODE, {COMPUTE_DOMAIN_LABEL: domain}),
        node_object("node-b", {COMPUTE_DOMAIN_LABEL: domain}),
    ]
    facts = build_facts(objs, cfg)
    assert drivers.detect(daemon_ds, config=cfg.detection, can_write_slices=facts.service_account_writes_slices) is None
    assert (
        probes.review(
            {"operation": "CREATE", "object": daemon_ds},
            detection=cfg.detection,
            config=cfg.probes,
            can_write_slices=facts.service_account_writes_slices,
        ).patch
        == ()
    )
    daemon_pod = pod("cd-1-daemon-x", NODE, namespace=cd.namespace, claims=("cd-1-daemon",))
    allocated = claim(
        "cd-1-daemon",
        driver="compute-domain.nvidia.com",
        namespace=cd.namespace,
        node=None,
        labels={COMPUTE_DOMAIN_LABEL: domain},
        reserved=("cd-1-daemon-x",),
    )
    facts = build_facts([*objs, daemon_pod, allocated], cfg)
    refused = evict(facts, cd)
    assert not refused.allowed and refused.findings[0].details["claims"] == [f"{cd.namespace}/cd-1-daemon"]
    assert evict(facts, cd, "b").allowed  # the other labelled node runs no daemon pod
    daemon_eviction = eviction.review(
        eviction_request("cd-1-daemon-x", namespace=cd.namespace), index=facts.claims, config=facts.config.eviction
    )
    assert daemon_eviction.allowed


def test_drain_plan_says_how_each_name_was_learned():
    nv = nvidia_gpu()
    facts = facts_with([nv], *(resource_slice(n, NODE) for n in nv.names), *consumers("gpu.nvidia.com"))
    plan = drainplan.plan(facts.claims, NODE)
    [entry] = plan["driverPods"]
    assert {d["name"] for d in entry["drivers"]} == {"gpu.nvidia.com", "compute-domain.nvidia.com"}
    assert all("ResourceSlice on node node-a" in d["learnedFrom"] for d in entry["drivers"])
    assert not entry["canEvictNow"] and plan["evictFirst"] == ["work/consumer-0"]
    assert "learned from ResourceSlice" in drainplan.render_text(plan)


def test_the_compute_domain_controllers_daemonset_write_needs_it_in_driver_subjects():
    """The ComputeDomain controller's Role writes DaemonSets in the driver namespace (it creates the
    daemons): a workload power in a namespace whose ServiceAccounts write ResourceSlices, refused
    unless the controller's ServiceAccount is a driver subject too (as the README says)."""
    from tests.builders import review
    from webhook.policies import rbac

    cd = nvidia_compute_domain()
    controller = "dra-driver-nvidia-gpu-service-account-controller"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "dra-driver-nvidia-gpu-role-controller", "namespace": cd.namespace},
        "rules": [
            {
                "apiGroups": ["apps"],
                "resources": ["daemonsets"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "dra-driver-nvidia-gpu-role-binding-controller", "namespace": cd.namespace},
        "subjects": [{"kind": "ServiceAccount", "name": controller, "namespace": cd.namespace}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
    }
    index = rbac.RbacIndex.from_objects([role])
    refused = rbac.review(review(binding)["request"], index=index, config=config_for(cd).rbac)
    assert not refused.allowed and "daemonsets" in refused.findings[0].message
    both = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [cd.service_account, f"{cd.namespace}:{controller}"]}}})
    assert rbac.review(review(binding)["request"], index=index, config=both.rbac).allowed


# ---------------------------------------------------------------- item 1: identity from the cluster
def test_unnamed_driver_is_attributed_the_drivers_no_named_pod_accounts_for():
    """The example driver names itself (plugins/gpu.example.com); NVIDIA's pod names nothing: it is
    attributed the NVIDIA slices, not gpu.example.com's."""
    nv = nvidia_gpu()
    named = driver_daemonset(name="gpu-driver", namespace="gpu")  # mounts plugins/gpu.example.com + cdi
    objs = [
        named,
        pod("gpu-driver-a", NODE, namespace="gpu", ds="gpu-driver"),
        *(resource_slice(n, NODE) for n in (*nv.names, "gpu.example.com")),
    ]
    facts = facts_with([nv], *objs, *consumers("gpu.example.com"))
    assert evict(facts, nv).allowed  # gpu.example.com's claim does not hold NVIDIA's pod
    assert not eviction.review(eviction_request("gpu-driver-a"), index=facts.claims, config=facts.config.eviction).allowed
    facts = facts_with([nv], *objs, *consumers("compute-domain.nvidia.com"))
    assert not evict(facts, nv).allowed


def test_ambiguous_attribution_holds_every_unnamed_pod():
    """NVIDIA's and Intel's pods on one node both name nothing: a claim of either holds both."""
    nv, intel = nvidia_gpu(), intel_gpu()
    slices = [resource_slice(n, NODE) for n in (*nv.names, *intel.names)]
    facts = facts_with([nv, intel], *slices, *consumers("gpu.intel.com"))
    for entry in (nv, intel):
        d = evict(facts, entry)
        assert not d.allowed, entry.key
        assert "ambiguous" in d.findings[0].details["learned"]["gpu.intel.com"]


def test_a_claim_whose_driver_has_no_slice_is_still_not_orphaned():
    """The slice is gone (the driver unregistered) but a claim of it is reserved on the node: the
    unnamed driver pod is still held."""
    nv = nvidia_gpu()
    facts = facts_with([nv], *consumers("gpu.nvidia.com"))
    d = evict(facts, nv)
    assert not d.allowed and "ResourceClaim allocated on node" in d.findings[0].details["learned"]["gpu.nvidia.com"]


# ---------------------------------------------------------------- item 2: several drivers per DaemonSet
@pytest.mark.parametrize("how", ["annotation", "selector", "args", "env"])
def test_several_drivers_per_daemonset(how):
    base = driver_daemonset(name="multi", namespace="gpu", plugin_subdir="", sa="multi")
    cfg = from_mapping(None)
    if how == "annotation":
        base["metadata"]["annotations"] = {drivers.DRIVER_KEY: "a.example.com, b.example.com"}
        cfg = from_mapping({"drivers": {"selectors": [{"namespace": "gpu", "matchLabels": {}}]}})
    elif how == "selector":
        cfg = from_mapping(
            {
                "drivers": {
                    "selectors": [
                        {"namespace": "gpu", "matchLabels": {}, "driverName": "a.example.com", "driverNames": ["b.example.com"]}
                    ]
                }
            }
        )
    elif how == "args":
        base["spec"]["template"]["spec"]["containers"] = [
            plugin_container("a", args=["--driver-name=a.example.com"]),
            plugin_container("b", args=["--driver-name", "b.example.com"]),
        ]
    else:
        base["spec"]["template"]["spec"]["containers"][0]["env"] = [
            {"name": "DRIVER_NAMES", "value": "a.example.com,b.example.com"}
        ]
    d = drivers.detect(base, config=cfg.detection)
    assert d is not None and set(d.names) == {"a.example.com", "b.example.com"} and d.complete
    for held in ("a.example.com", "b.example.com"):
        facts = build_facts([base, pod("multi-a", NODE, namespace="gpu", ds="multi"), *consumers(held)], cfg)
        r = eviction.review(eviction_request("multi-a"), index=facts.claims, config=cfg.eviction)
        assert not r.allowed, (how, held)


# ---------------------------------------------------------------- item 3: kubelet roots
def test_kubelet_root_elsewhere():
    nv = nvidia_gpu(registrar="/var/data/kubelet/plugins_registry", plugins="/var/data/kubelet/plugins")
    cfg = from_mapping({"drivers": {"autoDetect": True}})
    assert drivers.detect(nv.daemonset, config=cfg.detection) is not None  # plugins_registry found anywhere
    # a chart that mounts the kubelet root itself: recognised once the root is configured
    root_only = driver_daemonset(name="r", namespace="gpu", plugin_subdir="")
    spec = root_only["spec"]["template"]["spec"]
    spec["volumes"] = [
        {"name": "kubelet", "hostPath": {"path": "/data/kubelet"}},
        {"name": "cdi", "hostPath": {"path": "/var/run/cdi"}},
    ]
    spec["containers"] = [plugin_container("plugin", args=["--healthcheck-port=51515"], mounts=("kubelet", "cdi"))]
    assert drivers.detect(root_only, config=cfg.detection) is None
    rooted = from_mapping({"drivers": {"kubeletRootDirs": ["/var/lib/kubelet", "/data/kubelet"]}})
    d = drivers.detect(root_only, config=rooted.detection)
    assert d is not None and d.plugin_containers == (0,)


def test_resourceslice_write_alone_is_enough():
    """The DRA network driver mounts no /var/run/cdi: its RBAC recognises it."""
    net = net_driver()
    assert drivers.detect(net.daemonset, config=from_mapping(None).detection) is None
    facts = build_facts(list(net.objects), config_for(net))
    assert (
        drivers.detect(net.daemonset, config=facts.config.detection, can_write_slices=facts.service_account_writes_slices)
        is not None
    )


# ---------------------------------------------------------------- item 4: trustworthy identity
def test_a_tenant_label_does_not_shield_a_pod():
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "tenant", "namespace": "team-a", "labels": {drivers.DRIVER_KEY: "gpu.nvidia.com"}},
        "spec": {"template": {"spec": {"serviceAccountName": "tenant", "containers": [{"name": "c", "image": "x"}]}}},
    }
    nv = nvidia_gpu()
    objs = [
        ds,
        pod("tenant-a", NODE, namespace="team-a", ds="tenant"),
        resource_slice("gpu.nvidia.com", NODE),
        *consumers("gpu.nvidia.com"),
    ]
    facts = facts_with([nv], *objs)
    r = eviction.review(eviction_request("tenant-a", namespace="team-a"), index=facts.claims, config=facts.config.eviction)
    assert r.allowed and "not protected" in r.warnings[0]
    assert not evict(facts, nv).allowed  # and the label takes no attribution from NVIDIA's real pod
    # trusted through a selector
    cfg = from_mapping({"drivers": {"selectors": [{"namespace": "team-a", "matchLabels": {}}]}})
    facts = build_facts(objs, cfg)
    assert not eviction.review(eviction_request("tenant-a", namespace="team-a"), index=facts.claims, config=cfg.eviction).allowed


# ---------------------------------------------------------------- item 5: health port <= 0
@pytest.mark.parametrize("where", ["annotation", "flag", "env"])
def test_health_port_zero_or_below_means_no_probe(where):
    c = plugin_container(
        "plugin",
        args=["--healthcheck-port=-1"] if where == "flag" else [],
        env=[{"name": "HEALTHCHECK_PORT", "value": "0"}] if where == "env" else None,
    )
    ds = driver_daemonset(containers=[c], annotations={probes.PORT_ANNOTATION: "0"} if where == "annotation" else None)
    cfg = from_mapping({"probes": {"assumeDefaultPort": True}})
    d = probes.review({"operation": "CREATE", "object": ds}, detection=cfg.detection, config=cfg.probes)
    assert not d.patch
    [f] = [f for f in d.findings if f.check == "healthcheck-disabled"]
    assert not f.enforced and not f.fixed_by_patch
    assert [f.check for f in probes.audit(ds, detection=cfg.detection, config=cfg.probes)] == ["healthcheck-disabled"]
    nv = nvidia_gpu(probes_in_chart=False, ports=(0, 51516))  # the NVIDIA chart's healthcheckPort: 0
    d = probes.review({"operation": "CREATE", "object": nv.daemonset}, detection=cfg.detection, config=cfg.probes)
    assert {op["path"] for op in d.patch if op["path"].endswith("livenessProbe")} == {
        "/spec/template/spec/containers/1/livenessProbe"
    }


# ---------------------------------------------------------------- item 7: seamless upgrade
def test_surge_rollout_lets_the_older_pod_go_and_holds_the_last():
    ex = example_driver()
    objs = [*ex.objects, resource_slice("gpu.example.com", NODE), *consumers("gpu.example.com")]
    cfg = config_for(ex)
    old, new = driver_pod(ex, suffix="a", ready=True), driver_pod(ex, suffix="b", ready=False)
    facts = build_facts([*objs, old, new], cfg)
    assert not evict(facts, ex, "a").allowed  # the new pod is not Ready yet
    facts.claims.upsert_pod(driver_pod(ex, suffix="b", ready=True))
    allowed = evict(facts, ex, "a")
    assert allowed.allowed and "seamless upgrade" in allowed.warnings[0]
    facts.claims.delete_pod(ex.namespace, old["metadata"]["name"])
    assert not evict(facts, ex, "b").allowed  # the last one is held
    terminating = copy.deepcopy(old)
    terminating["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    terminating["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    facts.claims.upsert_pod(terminating)
    assert not evict(facts, ex, "b").allowed  # a Terminating peer does not take over


def test_audit_says_how_each_name_was_learned_and_reports_a_disabled_health_port():
    nv = nvidia_gpu(probes_in_chart=False, ports=(0, 51516))
    node = {"kind": "Node", "metadata": {"name": NODE}, "status": {"nodeInfo": {"kubeletVersion": "v1.37.2"}}}
    objs = [*nv.objects, driver_pod(nv), node, *(resource_slice(n, NODE) for n in nv.names), *consumers("gpu.nvidia.com")]
    found = audit.run(objs, config_for(nv), served_versions=["v1"])
    [(blocked, mode)] = [(f, m) for f, m in found if f.check == "drain-blocked"]
    assert mode == "audit" and "gpu.nvidia.com: ResourceSlice on node node-a" in blocked.message
    assert blocked.details["learned"] == {"gpu.nvidia.com": "ResourceSlice on node node-a, named by no other driver pod there"}
    [disabled] = [f for f, _ in found if f.check == "healthcheck-disabled"]
    assert disabled.details["container"] == "compute-domains" and not disabled.enforced
