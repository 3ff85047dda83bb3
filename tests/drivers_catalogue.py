"""A catalogue of the DRA drivers people run, as fixtures we write ourselves (no copied files).

Each entry reproduces the STRUCTURE of a public driver's chart or manifest, read with the search
tool: the kubelet plugin DaemonSet's containers, command/args, environment, ports, probes,
hostPath mounts, ServiceAccount and the RBAC that lets it write ResourceSlices. Values that do not
change what dra-guard sees (images, resources, security contexts, scripts) are simplified.

- nvidia-gpu: NVIDIA GPU DRA driver (NVIDIA/k8s-dra-driver-gpu, deployments/helm/nvidia-dra-driver-gpu,
  templates/kubeletplugin.yaml): one DaemonSet, two containers (compute-domains, gpus), each its
  own driver (compute-domain.nvidia.com, gpu.nvidia.com) named nowhere in the spec (the binaries
  know it), `bash -c` scripts, HEALTHCHECK_PORT via env, the whole kubelet plugins folder mounted,
  registrar/plugins paths as chart values (kubeletRegistrarDirectoryPath); newer charts add a
  gRPC startupProbe + livenessProbe per container, older ones none.
- intel-gpu: Intel GPU resource driver (intel/intel-resource-drivers-for-kubernetes,
  deployments/gpu/base/resource-driver.yaml): container kubelet-plugin, command /kubelet-gpu-plugin,
  containerPort healthcheck 51516 with startup and liveness probes, /etc/cdi and /var/run/cdi, sysfs.
- example: the Kubernetes dra-example-driver (kubernetes-sigs/dra-example-driver,
  deployments/helm/dra-example-driver/templates/kubeletplugin.yaml): container plugin, command
  dra-example-kubeletplugin, --healthcheck-port, no probe in the shape used here.
- cpu: the DRA CPU driver (kubernetes-sigs/dra-driver-cpu, install.yaml): DaemonSet dracpu in
  kube-system, args [/dracpu, --v=4], hostNetwork/hostPID, NRI socket, pod-resources, /var/run/cdi;
  no health service; driver dra.cpu.
- net: the DRA network driver (google/dranet, install.yaml): DaemonSet dranet in kube-system,
  args [/dranet, --v=4], an HTTP readinessProbe on 9177, no /var/run/cdi (recognised by its RBAC
  alone); driver dra.net.
- intel-gaudi (RBAC only, `intel_gaudi_rbac()`): Intel's Gaudi resource driver; its ClusterRole
  writes ResourceSlices and also creates DeviceTaintRules (admin-only by default), bound to
  ServiceAccount intel-gaudi-resource-driver in namespace intel-gaudi-resource-driver. The shape
  of its rules as reported in the issue, not read from the chart: no DaemonSet here, so it is not
  in catalogue().
- sriov (`sriov_driver()`): the SR-IOV DRA driver (k8snetworkplumbingwg/dra-driver-sriov): its
  chart switches the health service off by not rendering HEALTHCHECK_PORT (the binary's default
  then means "off"); the shape here is the one that matters for that (image name, kubelet plugin
  mounts, no health port anywhere), as the issue describes it, not read from the chart: not in
  catalogue().
"""
from __future__ import annotations

import dataclasses
from typing import Any

KUBELET = "/var/lib/kubelet"


@dataclasses.dataclass(frozen=True)
class CatalogueDriver:
    """One public driver's shape.

    names: the driver names it publishes ResourceSlices for (what its binaries know).
    probes: container -> the gRPC port dra-guard adds a probe on (None: no probe expected).
    objects: ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet (dicts with kind set).
    """

    key: str
    namespace: str
    names: tuple[str, ...]
    probes: dict[str, int | None]
    objects: tuple[dict[str, Any], ...]

    @property
    def daemonset(self) -> dict[str, Any]:
        """The kubelet plugin DaemonSet."""
        return next(o for o in self.objects if o["kind"] == "DaemonSet")

    @property
    def service_account(self) -> str:
        """"namespace:name" of its ServiceAccount (the form of rbac.driverSubjects.serviceAccounts)."""
        sa = next(o for o in self.objects if o["kind"] == "ServiceAccount")
        return f"{sa['metadata']['namespace']}:{sa['metadata']['name']}"


def _host(name: str, path: str, type_: str | None = None) -> dict[str, Any]:
    vol: dict[str, Any] = {"name": name, "hostPath": {"path": path}}
    if type_:
        vol["hostPath"]["type"] = type_
    return vol


def _mounts(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"name": n, "mountPath": p} for n, p in pairs]


def _fieldref(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _grpc(port: int, *, period: int, threshold: int) -> dict[str, Any]:
    return {"grpc": {"port": port, "service": "liveness"}, "periodSeconds": period, "timeoutSeconds": 10,
            "failureThreshold": threshold}


def _rbac(namespace: str, sa: str, role: str, slice_verbs: list[str], extra_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
         "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": slice_verbs},
                   *extra_rules]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}},
    ]


def _daemonset(name: str, namespace: str, sa: str, containers: list[dict[str, Any]], volumes: list[dict[str, Any]],
               *, labels: dict[str, str], init: list[dict[str, Any]] | None = None, host: bool = False,
               strategy: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"serviceAccountName": sa, "containers": containers, "volumes": volumes,
                            "tolerations": [{"operator": "Exists"}]}
    if init:
        spec["initContainers"] = init
    if host:
        spec.update(hostNetwork=True, hostPID=True)
    ds: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "DaemonSet",
                          "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                          "spec": {"selector": {"matchLabels": dict(labels)},
                                   "template": {"metadata": {"labels": dict(labels)}, "spec": spec}}}
    if strategy:
        ds["spec"]["updateStrategy"] = strategy
    return ds


def nvidia_gpu(*, probes_in_chart: bool = True, registrar: str = f"{KUBELET}/plugins_registry",
               plugins: str = f"{KUBELET}/plugins", ports: tuple[int, int] = (51515, 51516),
               namespace: str = "") -> CatalogueDriver:
    """NVIDIA's kubelet plugin DaemonSet (compute-domains + gpus); `probes_in_chart` False is the
    older chart without probes; `registrar`/`plugins` are the chart's kubelet path values; a port
    of 0 is the chart's "no health service"."""
    sa, name = "nvidia-dra-driver-gpu-service-account-kubeletplugin", "nvidia-dra-driver-gpu-kubelet-plugin"
    key = "nvidia-gpu" if probes_in_chart else "nvidia-gpu-legacy"
    namespace = namespace or f"{key}-driver"  # two shapes, two releases: objects never collide

    def container(cname: str, binary: str, port: int) -> dict[str, Any]:
        c: dict[str, Any] = {
            "name": cname, "image": "registry.example/nvidia/k8s-dra-driver-gpu:v25", "command": ["bash", "-c"],
            "args": [f"if [ \"${{MASK_NVIDIA_DRIVER_PARAMS}}\" = \"true\" ]; then mount-params; fi\n"
                     f"{binary} -v $(LOG_VERBOSITY)"],
            "securityContext": {"privileged": True},
            "env": [{"name": "LOG_VERBOSITY", "value": "4"}, {"name": "MASK_NVIDIA_DRIVER_PARAMS", "value": "false"},
                    {"name": "NVIDIA_DRIVER_ROOT", "value": "/"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                    {"name": "CDI_ROOT", "value": "/var/run/cdi"}, {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
                    _fieldref("NODE_NAME", "spec.nodeName"), _fieldref("NAMESPACE", "metadata.namespace"),
                    {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": registrar},
                    {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": plugins},
                    {"name": "HEALTHCHECK_PORT", "value": str(port)}],
            "volumeMounts": _mounts(("plugins-registry", registrar), ("plugins", plugins), ("cdi", "/var/run/cdi"),
                                    ("driver-root", "/driver-root"))}
        c["volumeMounts"][1]["mountPropagation"] = "Bidirectional"
        if probes_in_chart and port > 0:
            c["startupProbe"] = _grpc(port, period=10, threshold=60)
            c["livenessProbe"] = _grpc(port, period=10, threshold=3)
        return c

    containers = [container("compute-domains", "compute-domain-kubelet-plugin", ports[0]),
                  container("gpus", "gpu-kubelet-plugin", ports[1])]
    init = [{"name": "init-container", "image": "registry.example/nvidia/k8s-dra-driver-gpu:v25",
             "command": ["bash", "/usr/bin/kubelet-plugin-prestart.sh"],
             "env": [{"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": registrar},
                     {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": plugins}],
             "volumeMounts": _mounts(("driver-root-parent", "/driver-root-parent"))}]
    volumes = [_host("plugins-registry", registrar), _host("plugins", plugins), _host("cdi", "/var/run/cdi"),
               _host("driver-root-parent", "/", "DirectoryOrCreate"), _host("driver-root", "/", "DirectoryOrCreate")]
    labels = {"app.kubernetes.io/name": "nvidia-dra-driver-gpu", "app.kubernetes.io/component": "kubelet-plugin"}
    ds = _daemonset(name, namespace, sa, containers, volumes, labels=labels, init=init,
                    strategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}})
    rbac = _rbac(namespace, sa, f"{key}-kubeletplugin-role",
                 ["get", "list", "watch", "create", "update", "patch", "delete"],
                 [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
                  {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
    probes = {"compute-domains": None, "gpus": None} if probes_in_chart else {
        "compute-domains": ports[0] or None, "gpus": ports[1] or None}
    return CatalogueDriver(key=key, namespace=namespace,
                           names=("compute-domain.nvidia.com", "gpu.nvidia.com"), probes=probes,
                           objects=(*rbac, ds))


def intel_gpu() -> CatalogueDriver:
    """Intel's GPU resource driver kubelet plugin (gpu.intel.com)."""
    ns, sa = "intel-gpu-resource-driver", "intel-gpu-resource-driver-service-account"
    c = {"name": "kubelet-plugin", "image": "registry.example/intel/intel-gpu-resource-driver:v0.8",
         "command": ["/kubelet-gpu-plugin"], "ports": [{"name": "healthcheck", "containerPort": 51516}],
         "startupProbe": _grpc(51516, period=10, threshold=60), "livenessProbe": _grpc(51516, period=30, threshold=3),
         "env": [_fieldref("NODE_NAME", "spec.nodeName"), _fieldref("POD_NAMESPACE", "metadata.namespace"),
                 {"name": "SYSFS_ROOT", "value": "/sysfs"}],
         "volumeMounts": _mounts(("plugins-registry", f"{KUBELET}/plugins_registry"), ("plugins", f"{KUBELET}/plugins"),
                                 ("cdi", "/etc/cdi"), ("varruncdi", "/var/run/cdi"), ("sysfs", "/sysfs"),
                                 ("xpumd-socket", "/run/xpumd")),
         "securityContext": {"privileged": True, "readOnlyRootFilesystem": True}}
    volumes = [_host("plugins-registry", f"{KUBELET}/plugins_registry"), _host("plugins", f"{KUBELET}/plugins"),
               _host("cdi", "/etc/cdi"), _host("varruncdi", "/var/run/cdi"), _host("sysfs", "/sys"),
               _host("xpumd-socket", "/run/xpumd")]
    ds = _daemonset("intel-gpu-resource-driver-kubelet-plugin", ns, sa, [c], volumes,
                    labels={"app": "intel-gpu-resource-driver-kubelet-plugin"})
    ds["spec"]["template"]["spec"]["serviceAccount"] = sa
    rbac = _rbac(ns, sa, "intel-gpu-resource-driver-role", ["get", "list", "watch", "create", "update", "patch", "delete"],
                 [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                  {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}])
    return CatalogueDriver(key="intel-gpu", namespace=ns, names=("gpu.intel.com",), probes={"kubelet-plugin": None},
                           objects=(*rbac, ds))


def example_driver() -> CatalogueDriver:
    """The Kubernetes dra-example-driver kubelet plugin (gpu.example.com), health port by flag."""
    ns, sa = "dra-example-driver", "dra-example-driver-service-account"
    c = {"name": "plugin", "image": "registry.example/dra-example-driver:v0.2", "command": ["dra-example-kubeletplugin"],
         "args": ["--healthcheck-port=51515"],
         "env": [{"name": "CDI_ROOT", "value": "/var/run/cdi"}, _fieldref("NODE_NAME", "spec.nodeName"),
                 _fieldref("NAMESPACE", "metadata.namespace"), {"name": "NUM_DEVICES", "value": "8"}],
         "volumeMounts": _mounts(("plugins-registry", f"{KUBELET}/plugins_registry"), ("plugins", f"{KUBELET}/plugins"),
                                 ("cdi", "/var/run/cdi"))}
    volumes = [_host("plugins-registry", f"{KUBELET}/plugins_registry"), _host("plugins", f"{KUBELET}/plugins"),
               _host("cdi", "/var/run/cdi")]
    ds = _daemonset("dra-example-driver-kubeletplugin", ns, sa, [c], volumes,
                    labels={"app.kubernetes.io/name": "dra-example-driver"})
    rbac = _rbac(ns, sa, "dra-example-driver-role", ["get", "list", "watch", "create", "update", "patch", "delete"],
                 [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
                  {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
    return CatalogueDriver(key="example", namespace=ns, names=("gpu.example.com",), probes={"plugin": 51515},
                           objects=(*rbac, ds))


def _kube_system_driver(name: str, driver: str, extra_mounts: list[tuple[str, str, str]],
                        readiness: dict[str, Any] | None) -> CatalogueDriver:
    """The DRA CPU and network drivers' shared shape: DaemonSet <name> in kube-system, NRI init."""
    mounts = [("device-plugin", f"{KUBELET}/plugins", f"{KUBELET}/plugins"),
              ("plugin-registry", f"{KUBELET}/plugins_registry", f"{KUBELET}/plugins_registry"),
              ("nri-plugin", "/var/run/nri", "/var/run/nri"), *extra_mounts]
    c: dict[str, Any] = {"name": name, "image": f"registry.example/{name}:stable", "args": [f"/{name}", "--v=4"],
                         "volumeMounts": _mounts(*((n, mp) for n, _, mp in mounts))}
    if readiness:
        c["readinessProbe"] = readiness
    init = [{"name": "enable-nri", "image": "registry.example/busybox:stable", "command": ["/bin/sh", "-c", "true"],
             "volumeMounts": _mounts(("etc", "/etc")), "securityContext": {"privileged": True}}]
    volumes = [_host(n, hp) for n, hp, _ in mounts] + [_host("etc", "/etc")]
    labels = {"tier": "node", "app": name, "k8s-app": name}
    ds = _daemonset(name, "kube-system", name, [c], volumes, labels=labels, init=init, host=True)
    rbac = _rbac("kube-system", name, name, ["list", "watch", "create", "update", "delete"],
                 [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                  {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "deviceclasses"], "verbs": ["get"]},
                  {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["patch", "update"]}])
    return CatalogueDriver(key=name, namespace="kube-system", names=(driver,), probes={name: None}, objects=(*rbac, ds))


def cpu_driver() -> CatalogueDriver:
    """The DRA CPU driver (dra.cpu): no health service, /var/run/cdi and the pod-resources socket."""
    return _kube_system_driver("dracpu", "dra.cpu", [
        ("pod-resources-socket", f"{KUBELET}/pod-resources", f"{KUBELET}/pod-resources"),
        ("cdi-dir", "/var/run/cdi", "/var/run/cdi")], None)


def net_driver() -> CatalogueDriver:
    """The DRA network driver (dra.net): no /var/run/cdi, an HTTP readinessProbe, netns and BPF mounts."""
    return _kube_system_driver("dranet", "dra.net", [
        ("netns", "/var/run/netns", "/var/run/netns"), ("infiniband", "/dev/infiniband", "/dev/infiniband"),
        ("bpf-programs", "/sys/fs/bpf", "/sys/fs/bpf")], {"httpGet": {"path": "/healthz", "port": 9177}})


def intel_gaudi_rbac() -> list[dict[str, Any]]:
    """Intel's Gaudi resource driver RBAC: ServiceAccount, ClusterRole (ResourceSlice write and
    DeviceTaintRule create/update/delete), ClusterRoleBinding (dicts with kind set)."""
    ns = sa = "intel-gaudi-resource-driver"
    return _rbac(ns, sa, "intel-gaudi-resource-driver-role",
                 ["create", "update", "patch", "delete", "get", "list", "watch"],
                 [{"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
                   "verbs": ["create", "get", "list", "watch", "update", "delete"]}])


def sriov_driver() -> CatalogueDriver:
    """The SR-IOV DRA driver's kubelet plugin with its health service off (no HEALTHCHECK_PORT)."""
    ns = sa = "dra-driver-sriov"
    c = {"name": "kubelet-plugin", "image": "registry.example/k8snetworkplumbingwg/dra-driver-sriov:v0.1",
         "command": ["/dra-driver-sriov"], "env": [_fieldref("NODE_NAME", "spec.nodeName")],
         "volumeMounts": _mounts(("plugins-registry", f"{KUBELET}/plugins_registry"), ("plugins", f"{KUBELET}/plugins"),
                                 ("cdi", "/var/run/cdi")),
         "securityContext": {"privileged": True}}
    volumes = [_host("plugins-registry", f"{KUBELET}/plugins_registry"), _host("plugins", f"{KUBELET}/plugins"),
               _host("cdi", "/var/run/cdi")]
    labels = {"app.kubernetes.io/name": "dra-driver-sriov"}
    ds = _daemonset("dra-driver-sriov-kubeletplugin", ns, sa, [c], volumes, labels=labels)
    rbac = _rbac(ns, sa, "dra-driver-sriov-role", ["get", "list", "watch", "create", "update", "patch", "delete"], [])
    return CatalogueDriver(key="sriov", namespace=ns, names=(), probes={"kubelet-plugin": None}, objects=(*rbac, ds))


def catalogue() -> list[CatalogueDriver]:
    """Every catalogue driver, the NVIDIA chart in its newer (probes) and older (no probes) shape;
    the older one installed for a kubelet whose root is not /var/lib/kubelet (the chart's
    kubeletRegistrarDirectoryPath / kubeletPluginsDirectoryPath values), with no dra-guard config for it."""
    return [nvidia_gpu(), nvidia_gpu(probes_in_chart=False, registrar="/var/data/kubelet/plugins_registry",
                                     plugins="/var/data/kubelet/plugins"),
            intel_gpu(), example_driver(), cpu_driver(), net_driver()]


def resource_slice(driver: str, node: str) -> dict[str, Any]:
    """A node-local resource.k8s.io/v1 ResourceSlice of `driver` on `node` (one device), as its kubelet plugin publishes."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "dev-0"}]}}
