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
- intel-gpu: Intel GPU resource driver, its Helm chart (intel/intel-resource-drivers-for-kubernetes,
  charts/intel-gpu-resource-driver: templates/resource-driver.yaml and values.yaml at 1ec8d68f, image
  tag v0.11.0; templates/clusterrole.yaml and clusterrolebinding.yaml at 49701062; _helpers.tpl at
  3f3f5500; Chart.yaml as stored says 0.7.1, older than those values) with the defaults: container
  kubelet-plugin, command /kubelet-gpu-plugin, args --healthcheck-port=51516 and -m (health
  monitoring through xpumd), containerPort healthcheck with startup and liveness probes, /etc/cdi,
  /var/run/cdi, sysfs and xpumd mounts, not privileged; ServiceAccount intel-gpu-sa, ClusterRole
  intel-gpu-resource-driver-role (ResourceSlice write, nodes and ResourceClaim get: unchanged) and
  ClusterRoleBinding intel-gpu-resource-driver-rolebinding, both with metadata.namespace set; release
  namespace intel-gpu-resource-driver. The kustomize manifest (deployments/gpu/base/resource-driver.yaml
  at 075b22d2) has the same RBAC under other names.
- example: the Kubernetes dra-example-driver (kubernetes-sigs/dra-example-driver,
  deployments/helm/dra-example-driver): templates/clusterrole.yaml at 04cf504d (ResourceClaim status
  update, and resourceclaims/driver associated-node:update/patch for gpu.example.com, the granular
  status authorization of 1.36+), clusterrolebinding.yaml at cba2ec61 (`<fullname>-role-binding`),
  _helpers.tpl at 10b7c642; release and namespace dra-example-driver; Chart.yaml is 0.0.0-dev in the
  repository (the version is set from the release tag). DaemonSet: container plugin, command
  dra-example-kubeletplugin, --healthcheck-port. The stored kubeletplugin.yaml versions (009b41fc,
  f6acdbae) are older than that shape (no health flag, an init container of the NAS era): kept.
- cpu (`cpu_driver()`): the DRA CPU driver's Helm chart, the install its docs recommend
  (kubernetes-sigs/dra-driver-cpu, deployment/helm/dra-driver-cpu, Chart.yaml 0.2.0 at 7f955682;
  templates/clusterrole.yaml at 1b2274c6, clusterrolebinding.yaml at 74a0798c, daemonset.yaml at
  40967c0b, values.yaml at 1b2274c6, _helpers.tpl at 2c7730aa; docs/user/installation.md at
  24f5b0ef: `helm install dra-driver-cpu ... -n kube-system`; install.yaml is deprecated): DaemonSet,
  ServiceAccount, ClusterRole and ClusterRoleBinding dra-driver-cpu in kube-system, container dracpu,
  args [/dracpu, --v=4, --cpu-device-mode=grouped, --group-by=numanode, --bind-address=:8080], HTTP
  liveness and readiness probes on port healthz (no gRPC health service), NRI socket, /var/run/cdi;
  ClusterRole with ResourceSlice write, ResourceClaim status write, pods read and
  resourceclaims/driver associated-node verbs for dra.cpu; driver dra.cpu.
- net (`net_driver()`): the DRA network driver, now kubernetes-sigs/dranet (install.yaml at
  19c8d05f; google/dranet's at 03e59c2c is the older shape): DaemonSet dranet in kube-system, an
  install-hook init container (its OCI hook onto the host), args [/dranet, --v=4,
  --hostname-override=$(NODE_NAME)], HTTP startup and readiness probes on 9177, no /var/run/cdi
  (recognised by its RBAC alone); ClusterRole with event write, ResourceSlice write, ResourceClaim
  status write and resourceclaims/driver associated-node verbs for dra.net; driver dra.net.
- intel-gaudi (`intel_gaudi()`; its RBAC alone: `intel_gaudi_rbac()`): Intel's Gaudi resource driver
  (intel/intel-resource-drivers-for-kubernetes, deployments/gaudi/base/resource-driver.yaml at
  3ef104c6, the newest stored, the kustomize manifest `kubectl apply -k deployments/gaudi/` installs;
  its Helm chart, Chart.yaml 0.4.1 at 2b74f62f, templates/clusterrole.yaml at 5bb8ff65, has no
  DeviceTaintRule rule: with the chart rbac.driverSubjects alone is enough): container kubelet-plugin, command /kubelet-gaudi-plugin, SYSFS_ROOT=/sys, /etc/cdi,
  /etc/habanalabs, /var/run/cdi and /sys mounts, no health port (cmd/kubelet-gaudi-plugin/main.go has
  none); ClusterRole intel-gaudi-resource-driver-role with ResourceSlice write and DeviceTaintRule
  get/list/watch/create (admin-only by default: `driver_resources`), the ClusterRole and its
  ClusterRoleBinding carrying metadata.namespace (kept verbatim); driver gaudi.intel.com
  (deployments/gaudi/base/device-class.yaml). Left out: the manifest's ValidatingAdmissionPolicy that
  ties the ServiceAccount's ResourceSlice writes to its own node (it needs the node-name extra of a
  real pod's token; the tests publish slices by impersonation).
- sriov (`sriov_driver()`): the SR-IOV DRA driver (k8snetworkplumbingwg/dra-driver-sriov, Helm chart
  deployments/helm/dra-driver-sriov: templates/dra-driver.yaml at 0e0e76f0, templates/clusterrole.yaml
  at 2713e5f4 (the newest stored: edbe7459 lacks its pods and resourceclaims/driver rules), values.yaml at 007f0f22, templates/_helpers.tpl at bb99f020; binary flags in
  cmd/dra-driver-sriov/main.go at 007f0f22, driver name in pkg/consts/consts.go), release and
  namespace dra-driver-sriov: DaemonSet dra-driver-sriov-kubeletplugin, container plugin, command
  /usr/bin/dra-driver-sriov, image repository .../dra-driver-sriov (README: ghcr.io/k8snetworkplumbingwg;
  older values: quay.io/schseba), host network and PID, sriov-cni init container, NRI socket, netns
  and CNI mounts; healthcheckPort -1 by default, so the chart renders neither HEALTHCHECK_PORT nor a
  probe and the binary's default (-1) means "no health service"; ClusterRole with ResourceSlice write,
  ResourceClaim status and resourceclaims/driver associated-node:update, metadata.namespace set on it.
  The ServiceAccount (`<fullname>-service-account`, from _helpers.tpl) and ClusterRoleBinding
  templates are not in the stored index: written from the helper's names, labelled as such.
- tpu (`google_tpu()`): the Google TPU DRA driver (kubernetes-sigs/dra-driver-google-tpu, Helm chart
  deployments/helm/dra-driver-google-tpu: templates/kubeletplugin.yaml at d8ef3f1a,
  templates/clusterrole.yaml at 5af6ed6d (the only stored version), values.yaml at 90ea4b28; cmd/tpu-dra-kubeletplugin/main.go
  and health.go at d8ef3f1a; namespace from demo/scripts/install-dra-driver.sh): containers
  tpu-dra-plugin (exec readinessProbe `tpu-dra-kubeletplugin healthcheck` over a container-local Unix
  socket: no gRPC health port), sidecar-log-collector, vbar-control-agent; POD_UID and a surge
  rollout (seamless upgrade); ClusterRole (metadata.namespace set) with ResourceSlice, node and
  ResourceClaim-status write; driver tpu.google.com. Its _helpers.tpl is not in the stored index:
  the ServiceAccount name (`<fullname>-service-account`) and ClusterRoleBinding are written by the
  pattern of the charts it derives from.
- memory (`memory_driver()`): the DRA memory driver; kubernetes-sigs/dra-driver-memory is not in the
  stored index, read from its development repository ffromani/dra-driver-memory
  (hack/ci/install.tmpl.yaml at 270342d2, the manifest its CI installs; README.md; the other stored
  version, 06d423ef, has the same RBAC): DaemonSet
  dramemory in kube-system, command /bin/dramemory, NRI and cgroupfs mounts, no health service;
  driver dra.memory.
- nvidia-compute-domain (`nvidia_compute_domain()`, with `compute_domain_daemon_slice()`,
  `compute_domain_daemon()`, `compute_domain_daemon_rbac()`): NVIDIA's ComputeDomain kubelet plugin,
  as the chart in kubernetes-sigs/dra-driver-nvidia-gpu (the NVIDIA/k8s-dra-driver-gpu successor)
  renders it with GPU allocation off (deployments/helm/dra-driver-nvidia-gpu/templates/kubeletplugin.yaml
  at 14046d00, rbac-kubeletplugin.yaml at 7923b97b); the chart's static ResourceSlice of the shared
  daemon device (templates/resourceslice-compute-domain-daemon.yaml at 413251a8: pool
  compute-domain-daemons, a nodeSelector on resource.nvidia.com/computeDomain, installed by Helm);
  the per-ComputeDomain daemon DaemonSet the controller creates in the driver namespace
  (templates/compute-domain-daemon-with-shared-resource-claim.tmpl.yaml at 82a11c29; its Role lets
  the controller write DaemonSets there: rbac-controller.yaml at 75af8cfe) with its shared
  adminAccess ResourceClaim (templates/compute-domain-daemon-resource-claim.tmpl.yaml at 4fe61b41)
  and RBAC (rbac-compute-domain-daemon.yaml at 2dc387ef); device names from
  cmd/compute-domain-kubelet-plugin/deviceinfo.go at 310773cd (channel-N per node, one "daemon").
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
    driver_resources: what rbac.driverResources must add to "resourceslices" for its RBAC to be
    accepted (the setting the vendor's ClusterRole needs), empty for most.
    """

    key: str
    namespace: str
    names: tuple[str, ...]
    probes: dict[str, int | None]
    objects: tuple[dict[str, Any], ...]
    driver_resources: tuple[str, ...] = ()

    @property
    def daemonset(self) -> dict[str, Any]:
        """The kubelet plugin DaemonSet."""
        return next(o for o in self.objects if o["kind"] == "DaemonSet")

    @property
    def service_account(self) -> str:
        """ "namespace:name" of its ServiceAccount (the form of rbac.driverSubjects.serviceAccounts)."""
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
    return {
        "grpc": {"port": port, "service": "liveness"},
        "periodSeconds": period,
        "timeoutSeconds": 10,
        "failureThreshold": threshold,
    }


def _rbac(namespace: str, sa: str, role: str, slice_verbs: list[str], extra_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": slice_verbs}, *extra_rules],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        },
    ]


def _daemonset(
    name: str,
    namespace: str,
    sa: str,
    containers: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    *,
    labels: dict[str, str],
    init: list[dict[str, Any]] | None = None,
    host: bool = False,
    strategy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "serviceAccountName": sa,
        "containers": containers,
        "volumes": volumes,
        "tolerations": [{"operator": "Exists"}],
    }
    if init:
        spec["initContainers"] = init
    if host:
        spec.update(hostNetwork=True, hostPID=True)
    ds: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"selector": {"matchLabels": dict(labels)}, "template": {"metadata": {"labels": dict(labels)}, "spec": spec}},
    }
    if strategy:
        ds["spec"]["updateStrategy"] = strategy
    return ds


def nvidia_gpu(
    *,
    probes_in_chart: bool = True,
    registrar: str = f"{KUBELET}/plugins_registry",
    plugins: str = f"{KUBELET}/plugins",
    ports: tuple[int, int] = (51515, 51516),
    namespace: str = "",
) -> CatalogueDriver:
    """NVIDIA's kubelet plugin DaemonSet (compute-domains + gpus); `probes_in_chart` False is the
    older chart without probes; `registrar`/`plugins` are the chart's kubelet path values; a port
    of 0 is the chart's "no health service"."""
    sa, name = "nvidia-dra-driver-gpu-service-account-kubeletplugin", "nvidia-dra-driver-gpu-kubelet-plugin"
    key = "nvidia-gpu" if probes_in_chart else "nvidia-gpu-legacy"
    namespace = namespace or f"{key}-driver"  # two shapes, two releases: objects never collide

    def container(cname: str, binary: str, port: int) -> dict[str, Any]:
        c: dict[str, Any] = {
            "name": cname,
            "image": "registry.example/nvidia/k8s-dra-driver-gpu:v25",
            "command": ["bash", "-c"],
            "args": [f'if [ "${{MASK_NVIDIA_DRIVER_PARAMS}}" = "true" ]; then mount-params; fi\n{binary} -v $(LOG_VERBOSITY)'],
            "securityContext": {"privileged": True},
            "env": [
                {"name": "LOG_VERBOSITY", "value": "4"},
                {"name": "MASK_NVIDIA_DRIVER_PARAMS", "value": "false"},
                {"name": "NVIDIA_DRIVER_ROOT", "value": "/"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                {"name": "CDI_ROOT", "value": "/var/run/cdi"},
                {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
                _fieldref("NODE_NAME", "spec.nodeName"),
                _fieldref("NAMESPACE", "metadata.namespace"),
                {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": registrar},
                {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": plugins},
                {"name": "HEALTHCHECK_PORT", "value": str(port)},
            ],
            "volumeMounts": _mounts(
                ("plugins-registry", registrar), ("plugins", plugins), ("cdi", "/var/run/cdi"), ("driver-root", "/driver-root")
            ),
        }
        c["volumeMounts"][1]["mountPropagation"] = "Bidirectional"
        if probes_in_chart and port > 0:
            c["startupProbe"] = _grpc(port, period=10, threshold=60)
            c["livenessProbe"] = _grpc(port, period=10, threshold=3)
        return c

    containers = [
        container("compute-domains", "compute-domain-kubelet-plugin", ports[0]),
        container("gpus", "gpu-kubelet-plugin", ports[1]),
    ]
    init = [
        {
            "name": "init-container",
            "image": "registry.example/nvidia/k8s-dra-driver-gpu:v25",
            "command": ["bash", "/usr/bin/kubelet-plugin-prestart.sh"],
            "env": [
                {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": registrar},
                {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": plugins},
            ],
            "volumeMounts": _mounts(("driver-root-parent", "/driver-root-parent")),
        }
    ]
    volumes = [
        _host("plugins-registry", registrar),
        _host("plugins", plugins),
        _host("cdi", "/var/run/cdi"),
        _host("driver-root-parent", "/", "DirectoryOrCreate"),
        _host("driver-root", "/", "DirectoryOrCreate"),
    ]
    labels = {"app.kubernetes.io/name": "nvidia-dra-driver-gpu", "app.kubernetes.io/component": "kubelet-plugin"}
    ds = _daemonset(
        name,
        namespace,
        sa,
        containers,
        volumes,
        labels=labels,
        init=init,
        strategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
    )
    rbac = _rbac(
        namespace,
        sa,
        f"{key}-kubeletplugin-role",
        ["get", "list", "watch", "create", "update", "patch", "delete"],
        [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        ],
    )
    probes = (
        {"compute-domains": None, "gpus": None}
        if probes_in_chart
        else {"compute-domains": ports[0] or None, "gpus": ports[1] or None}
    )
    return CatalogueDriver(
        key=key, namespace=namespace, names=("compute-domain.nvidia.com", "gpu.nvidia.com"), probes=probes, objects=(*rbac, ds)
    )


def intel_gpu() -> CatalogueDriver:
    """Intel's GPU resource driver kubelet plugin (gpu.intel.com) as its Helm chart renders it with
    the defaults: health port 51516 by flag with startup and liveness probes, health monitoring
    through xpumd (`-m`), ServiceAccount intel-gpu-sa; ClusterRole and ClusterRoleBinding with
    metadata.namespace set."""
    ns, sa = "intel-gpu-resource-driver", "intel-gpu-sa"
    c = {
        "name": "kubelet-plugin",
        "image": "registry.example/intel/intel-gpu-resource-driver:v0.11.0",
        "command": ["/kubelet-gpu-plugin"],
        "args": ["--healthcheck-port=51516", "-m"],
        "ports": [{"name": "healthcheck", "containerPort": 51516}],
        "startupProbe": _grpc(51516, period=10, threshold=60),
        "livenessProbe": _grpc(51516, period=30, threshold=3),
        "env": [
            _fieldref("NODE_NAME", "spec.nodeName"),
            _fieldref("POD_NAMESPACE", "metadata.namespace"),
            {"name": "SYSFS_ROOT", "value": "/sysfs"},
        ],
        "volumeMounts": _mounts(
            ("plugins-registry", f"{KUBELET}/plugins_registry"),
            ("plugins", f"{KUBELET}/plugins"),
            ("cdi", "/etc/cdi"),
            ("varruncdi", "/var/run/cdi"),
            ("sysfs", "/sysfs"),
            ("xpumd-socket", "/run/xpumd"),
        ),
        "securityContext": {"privileged": False, "readOnlyRootFilesystem": True, "runAsUser": 0},
    }
    volumes = [
        _host("plugins-registry", f"{KUBELET}/plugins_registry"),
        _host("plugins", f"{KUBELET}/plugins"),
        _host("cdi", "/etc/cdi"),
        _host("varruncdi", "/var/run/cdi"),
        _host("sysfs", "/sys"),
        _host("xpumd-socket", "/run/xpumd"),
    ]
    ds = _daemonset(
        "intel-gpu-resource-driver-kubelet-plugin",
        ns,
        sa,
        [c],
        volumes,
        labels={"app": "intel-gpu-resource-driver"},
    )
    rbac = _rbac_of(
        ns,
        sa,
        "intel-gpu-resource-driver-role",
        "intel-gpu-resource-driver-rolebinding",
        _rules(("", ["nodes"], ["get"]), _SLICES_RW, ("resource.k8s.io", ["resourceclaims"], ["get"])),
        namespaced_cluster_objects=True,
    )
    return CatalogueDriver(
        key="intel-gpu", namespace=ns, names=("gpu.intel.com",), probes={"kubelet-plugin": None}, objects=(*rbac, ds)
    )


def example_driver() -> CatalogueDriver:
    """The Kubernetes dra-example-driver kubelet plugin (gpu.example.com), health port by flag."""
    ns, sa = "dra-example-driver", "dra-example-driver-service-account"
    c = {
        "name": "plugin",
        "image": "registry.example/dra-example-driver:v0.2",
        "command": ["dra-example-kubeletplugin"],
        "args": ["--healthcheck-port=51515"],
        "env": [
            {"name": "CDI_ROOT", "value": "/var/run/cdi"},
            _fieldref("NODE_NAME", "spec.nodeName"),
            _fieldref("NAMESPACE", "metadata.namespace"),
            {"name": "NUM_DEVICES", "value": "8"},
        ],
        "volumeMounts": _mounts(
            ("plugins-registry", f"{KUBELET}/plugins_registry"), ("plugins", f"{KUBELET}/plugins"), ("cdi", "/var/run/cdi")
        ),
    }
    volumes = [
        _host("plugins-registry", f"{KUBELET}/plugins_registry"),
        _host("plugins", f"{KUBELET}/plugins"),
        _host("cdi", "/var/run/cdi"),
    ]
    ds = _daemonset(
        "dra-example-driver-kubeletplugin", ns, sa, [c], volumes, labels={"app.kubernetes.io/name": "dra-example-driver"}
    )
    rbac = _rbac_of(
        ns,
        sa,
        "dra-example-driver-role",
        "dra-example-driver-role-binding",
        [
            *_rules(("resource.k8s.io", ["resourceclaims"], ["get"]), ("resource.k8s.io", ["resourceclaims/status"], ["update"])),
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "verbs": ["associated-node:update", "associated-node:patch"],
                "resourceNames": ["gpu.example.com"],
            },
            *_rules(("", ["nodes"], ["get"]), _SLICES_RW),
        ],
        namespaced_cluster_objects=True,
    )
    return CatalogueDriver(key="example", namespace=ns, names=("gpu.example.com",), probes={"plugin": 51515}, objects=(*rbac, ds))


def _kube_system_driver(
    name: str,
    sa: str,
    driver: str,
    container: dict[str, Any],
    host_mounts: list[tuple[str, str, str]],
    rules: list[dict[str, Any]],
    *,
    labels: dict[str, str],
    init: list[dict[str, Any]] | None = None,
    extra_volumes: list[dict[str, Any]] | None = None,
) -> CatalogueDriver:
    """The DRA CPU and network drivers' shared shape: DaemonSet `name` in kube-system on the host
    network, ServiceAccount, ClusterRole and ClusterRoleBinding `sa`; `host_mounts` are
    (volume, host path, mount path) of the one container."""
    c = {**container, "volumeMounts": _mounts(*((n, mp) for n, _, mp in host_mounts))}
    volumes = [_host(n, hp) for n, hp, _ in host_mounts] + list(extra_volumes or [])
    ds = _daemonset(name, "kube-system", sa, [c], volumes, labels=labels, init=init)
    ds["spec"]["template"]["spec"]["hostNetwork"] = True
    rbac = _rbac_of("kube-system", sa, sa, sa, rules)
    return CatalogueDriver(key=name, namespace="kube-system", names=(driver,), probes={c["name"]: None}, objects=(*rbac, ds))


def _http_probe(port: int | str, **extra: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/healthz", "port": port}, **extra}


def cpu_driver() -> CatalogueDriver:
    """The DRA CPU driver (dra.cpu) as its Helm chart renders it, release dra-driver-cpu in
    kube-system: container dracpu with HTTP liveness and readiness probes on port healthz (8080),
    no gRPC health service; /var/run/cdi, NRI socket; ResourceClaim status and
    resourceclaims/driver write for dra.cpu."""
    name = "dra-driver-cpu"
    c = {
        "name": "dracpu",
        "image": "registry.example/dra-driver-cpu:v0.2.0",
        "args": ["/dracpu", "--v=4", "--cpu-device-mode=grouped", "--group-by=numanode", "--bind-address=:8080"],
        "ports": [{"name": "healthz", "containerPort": 8080}],
        "livenessProbe": _http_probe("healthz", initialDelaySeconds=10),
        "readinessProbe": _http_probe("healthz", initialDelaySeconds=5),
        "securityContext": {"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}},
    }
    mounts = [
        ("device-plugin", f"{KUBELET}/plugins", f"{KUBELET}/plugins"),
        ("plugin-registry", f"{KUBELET}/plugins_registry", f"{KUBELET}/plugins_registry"),
        ("nri-plugin", "/var/run/nri", "/var/run/nri"),
        ("cdi-dir", "/var/run/cdi", "/var/run/cdi"),
    ]
    rules = [
        *_rules(
            ("", ["nodes"], ["get"]),
            ("resource.k8s.io", ["resourceslices"], ["list", "watch", "create", "update", "delete"]),
            ("resource.k8s.io", ["resourceclaims", "deviceclasses"], ["get"]),
            ("resource.k8s.io", ["resourceclaims/status"], ["patch", "update"]),
            ("", ["pods"], ["get", "list", "watch"]),
        ),
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "resourceNames": ["dra.cpu"],
            "verbs": ["associated-node:patch", "associated-node:update"],
        },
    ]
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name}
    entry = _kube_system_driver(name, name, "dra.cpu", c, mounts, rules, labels=labels)
    template = entry.daemonset["spec"]["template"]
    template["metadata"]["labels"].update({"tier": "node", "k8s-app": name})
    template["spec"]["priorityClassName"] = "system-node-critical"
    return entry


def net_driver() -> CatalogueDriver:
    """The DRA network driver (dra.net): no /var/run/cdi, HTTP startup and readiness probes (no
    gRPC health service), netns and BPF mounts, an init container installing its OCI hook on the
    host; event write, ResourceClaim status and resourceclaims/driver write for dra.net."""
    name = "dranet"
    image = "registry.example/networking/dranet:stable"
    c = {
        "name": name,
        "image": image,
        "args": [f"/{name}", "--v=4", "--hostname-override=$(NODE_NAME)"],
        "env": [_fieldref("NODE_NAME", "spec.nodeName")],
        "securityContext": {"privileged": True},
        "startupProbe": _http_probe(9177, failureThreshold=12, periodSeconds=5),
        "readinessProbe": _http_probe(9177),
    }
    mounts = [
        ("device-plugin", f"{KUBELET}/plugins", f"{KUBELET}/plugins"),
        ("plugin-registry", f"{KUBELET}/plugins_registry", f"{KUBELET}/plugins_registry"),
        ("nri-plugin", "/var/run/nri", "/var/run/nri"),
        ("netns", "/var/run/netns", "/var/run/netns"),
        ("infiniband", "/dev/infiniband", "/dev/infiniband"),
        ("bpf-programs", "/sys/fs/bpf", "/sys/fs/bpf"),
        ("dranet-run", "/var/run/dranet", "/var/run/dranet"),
    ]
    init = [
        {
            "name": "install-hook",
            "image": image,
            "command": ["/dranet-hook", "install", "/host/opt/dranet/bin"],
            "volumeMounts": _mounts(("hook-bin", "/host/opt/dranet/bin")),
        }
    ]
    rules = [
        *_rules(
            ("", ["nodes"], ["get"]),
            ("", ["events"], ["create", "patch", "update"]),
            ("resource.k8s.io", ["resourceslices"], ["list", "watch", "create", "update", "delete"]),
            ("resource.k8s.io", ["resourceclaims", "deviceclasses"], ["get"]),
            ("resource.k8s.io", ["resourceclaims/status"], ["patch", "update"]),
        ),
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "verbs": ["associated-node:patch", "associated-node:update"],
            "resourceNames": ["dra.net"],
        },
    ]
    labels = {"tier": "node", "app": name, "k8s-app": name}
    entry = _kube_system_driver(
        name,
        name,
        "dra.net",
        c,
        mounts,
        rules,
        labels=labels,
        init=init,
        extra_volumes=[_host("hook-bin", "/opt/dranet/bin", "DirectoryOrCreate")],
    )
    entry.daemonset["spec"]["selector"]["matchLabels"] = {"app": name}
    return entry


def _rules(*rules: tuple[str, list[str], list[str]]) -> list[dict[str, Any]]:
    """RBAC rules from (apiGroup, resources, verbs), in the vendor's order."""
    return [{"apiGroups": [g], "resources": list(r), "verbs": list(v)} for g, r, v in rules]


def _rbac_of(
    namespace: str, sa: str, role: str, binding: str, rules: list[dict[str, Any]], *, namespaced_cluster_objects: bool = False
) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole (`rules` as given) and ClusterRoleBinding `binding`; with
    `namespaced_cluster_objects` the ClusterRole and ClusterRoleBinding carry metadata.namespace
    as some vendor manifests do (the apiserver drops it: both kinds are cluster-scoped)."""
    quirk = {"namespace": namespace} if namespaced_cluster_objects else {}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role, **quirk},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding, **quirk},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        },
    ]


#: ResourceSlice write, as every chart here spells it.
_SLICES_RW = ("resource.k8s.io", ["resourceslices"], ["get", "list", "watch", "create", "update", "patch", "delete"])


def intel_gaudi() -> CatalogueDriver:
    """Intel's Gaudi resource driver (gaudi.intel.com): its ClusterRole also creates DeviceTaintRules
    (admin-only by default: rbac.driverResources must name devicetaintrules), and its ClusterRole and
    ClusterRoleBinding carry metadata.namespace; no health service."""
    ns, sa = "intel-gaudi-resource-driver", "intel-gaudi-resource-driver-service-account"
    c = {
        "name": "kubelet-plugin",
        "image": "registry.example/intel/intel-gaudi-resource-driver:v0.7",
        "command": ["/kubelet-gaudi-plugin"],
        "env": [
            _fieldref("NODE_NAME", "spec.nodeName"),
            _fieldref("POD_NAMESPACE", "metadata.namespace"),
            {"name": "SYSFS_ROOT", "value": "/sys"},
        ],
        "volumeMounts": _mounts(
            ("plugins-registry", f"{KUBELET}/plugins_registry"),
            ("plugins", f"{KUBELET}/plugins"),
            ("cdi", "/etc/cdi"),
            ("etc-habanalabs", "/etc/habanalabs"),
            ("varruncdi", "/var/run/cdi"),
            ("sysfs", "/sys"),
        ),
        "securityContext": {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0},
    }
    volumes = [
        _host("plugins-registry", f"{KUBELET}/plugins_registry"),
        _host("plugins", f"{KUBELET}/plugins"),
        _host("cdi", "/etc/cdi"),
        _host("etc-habanalabs", "/etc/habanalabs"),
        _host("varruncdi", "/var/run/cdi"),
        _host("sysfs", "/sys"),
    ]
    ds = _daemonset(
        "intel-gaudi-resource-driver-kubelet-plugin",
        ns,
        sa,
        [c],
        volumes,
        labels={"app": "intel-gaudi-resource-driver-kubelet-plugin"},
    )
    ds["spec"]["template"]["spec"]["serviceAccount"] = sa
    rbac = _rbac_of(
        ns,
        sa,
        "intel-gaudi-resource-driver-role",
        "intel-gaudi-resource-driver-role-binding",
        _rules(
            ("", ["nodes"], ["get"]),
            _SLICES_RW,
            ("resource.k8s.io", ["devicetaintrules"], ["get", "list", "watch", "create"]),
            ("resource.k8s.io", ["resourceclaims"], ["get"]),
        ),
        namespaced_cluster_objects=True,
    )
    return CatalogueDriver(
        key="intel-gaudi",
        namespace=ns,
        names=("gaudi.intel.com",),
        probes={"kubelet-plugin": None},
        objects=(*rbac, ds),
        driver_resources=("devicetaintrules",),
    )


def intel_gaudi_rbac() -> list[dict[str, Any]]:
    """Intel's Gaudi resource driver RBAC as its manifest ships it: ServiceAccount, ClusterRole
    (ResourceSlice write, DeviceTaintRule create) and ClusterRoleBinding, the last two with
    metadata.namespace set (dicts with kind set)."""
    return [o for o in intel_gaudi().objects if o["kind"] != "DaemonSet"]


def sriov_driver() -> CatalogueDriver:
    """The SR-IOV DRA driver's kubelet plugin (sriovnetwork.k8snetworkplumbingwg.io) as its chart
    renders it by default: healthcheckPort -1, so no HEALTHCHECK_PORT env var and no probe (the
    binary's default -1 then means "no health service"); NRI socket, CNI mounts, host network."""
    ns = "dra-driver-sriov"
    sa = "dra-driver-sriov-service-account"
    env = [
        {"name": "CDI_ROOT", "value": "/var/run/cdi"},
        {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": f"{KUBELET}/plugins_registry"},
        {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": f"{KUBELET}/plugins"},
        {"name": "NRI_PLUGIN_NAME", "value": "dra-driver-sriov"},
        {"name": "NRI_PLUGIN_IDX", "value": "42"},
        {"name": "DEFAULT_INTERFACE_PREFIX", "value": "vfnet"},
        {"name": "CONFIGURATION_MODE", "value": "STANDALONE"},
        {"name": "ENABLE_DEVICE_METADATA", "value": "true"},
        _fieldref("NODE_NAME", "spec.nodeName"),
        _fieldref("NAMESPACE", "metadata.namespace"),
        {"name": "V", "value": "3"},
        {"name": "LOG_FORMAT", "value": "text"},
        {"name": "ALSOLOGTOSTDERR", "value": "true"},
    ]
    c = {
        "name": "plugin",
        "image": "registry.example/k8snetworkplumbingwg/dra-driver-sriov:v1.0.0",
        "command": ["/usr/bin/dra-driver-sriov"],
        "env": env,
        "securityContext": {"privileged": True},
        "volumeMounts": _mounts(
            ("plugins-registry", f"{KUBELET}/plugins_registry"),
            ("plugins", f"{KUBELET}/plugins"),
            ("cdi", "/var/run/cdi"),
            ("cri-socket", "/var/run/nri/nri.sock"),
            ("netns", "/var/run/netns"),
            ("cni-results", "/var/lib/cni/"),
            ("cni-bin", "/opt/cni/bin"),
        ),
    }
    c["volumeMounts"][4]["mountPropagation"] = "HostToContainer"
    init = [
        {
            "name": "sriov-cni",
            "image": "registry.example/k8snetworkplumbingwg/sriov-cni:v2.10.0",
            "args": ["--no-sleep"],
            "securityContext": {"privileged": True},
            "volumeMounts": _mounts(("cni-bin", "/host/opt/cni/bin"), ("os-release", "/host/etc/os-release")),
        }
    ]
    volumes = [
        _host("cni-results", "/var/lib/cni/"),
        _host("netns", "/var/run/netns"),
        _host("cri-socket", "/var/run/nri/nri.sock", "Socket"),
        _host("plugins-registry", f"{KUBELET}/plugins_registry"),
        _host("plugins", f"{KUBELET}/plugins"),
        _host("cdi", "/var/run/cdi"),
        _host("cni-bin", "/opt/cni/bin"),
        _host("os-release", "/etc/os-release", "File"),
    ]
    labels = {
        "app.kubernetes.io/name": "dra-driver-sriov",
        "app.kubernetes.io/instance": "dra-driver-sriov",
        "app.kubernetes.io/component": "kubeletplugin",
    }
    ds = _daemonset(
        "dra-driver-sriov-kubeletplugin",
        ns,
        sa,
        [c],
        volumes,
        labels=labels,
        init=init,
        host=True,
        strategy={"type": "RollingUpdate"},
    )
    rbac = _rbac_of(
        ns,
        sa,
        "dra-driver-sriov-role",
        "dra-driver-sriov-role-binding",
        _rules(
            ("", ["pods"], ["get", "list", "watch"]),
            ("resource.k8s.io", ["resourceclaims"], ["get"]),
            ("resource.k8s.io", ["resourceclaims/status"], ["get", "list", "update", "patch"]),
            ("resource.k8s.io", ["resourceclaims/driver"], ["associated-node:update"]),
            ("", ["nodes"], ["get", "list", "watch"]),
            _SLICES_RW,
            ("k8s.cni.cncf.io", ["network-attachment-definitions"], ["get"]),
            ("sriovnetwork.k8snetworkplumbingwg.io", ["sriovresourcepolicies"], ["get", "list", "watch"]),
            ("sriovnetwork.k8snetworkplumbingwg.io", ["deviceattributes"], ["get", "list", "watch"]),
        ),
        namespaced_cluster_objects=True,
    )
    return CatalogueDriver(
        key="sriov", namespace=ns, names=("sriovnetwork.k8snetworkplumbingwg.io",), probes={"plugin": None}, objects=(*rbac, ds)
    )


def google_tpu() -> CatalogueDriver:
    """The Google TPU DRA driver (tpu.google.com): three containers (the plugin, a log sidecar, the
    vbar control agent), an exec readinessProbe on the plugin (its `healthcheck` subcommand over a
    container-local Unix socket: no gRPC health port), surge rollouts; RBAC with node and
    ResourceClaim-status write."""
    ns = "dra-driver-google-tpu"
    sa = "dra-driver-google-tpu-service-account"
    plugin = {
        "name": "tpu-dra-plugin",
        "image": "registry.example/dra-driver-google/dra-driver-google-tpu:v0.2.0",
        "command": ["tpu-dra-kubeletplugin"],
        "securityContext": {"privileged": True},
        "readinessProbe": {
            "exec": {"command": ["tpu-dra-kubeletplugin", "healthcheck"]},
            "periodSeconds": 5,
            "timeoutSeconds": 10,
        },
        "env": [
            {"name": "CDI_ROOT", "value": "/var/run/cdi"},
            {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": f"{KUBELET}/plugins_registry"},
            {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": f"{KUBELET}/plugins"},
            _fieldref("NODE_NAME", "spec.nodeName"),
            _fieldref("POD_NAMESPACE", "metadata.namespace"),
            _fieldref("POD_NAME", "metadata.name"),
            _fieldref("NODE_IP", "status.hostIP"),
            _fieldref("POD_UID", "metadata.uid"),
            {"name": "DEVICE_CLASSES", "value": "tpu"},
        ],
        "volumeMounts": _mounts(
            ("plugins-registry", f"{KUBELET}/plugins_registry"),
            ("plugins", f"{KUBELET}/plugins"),
            ("cdi", "/var/run/cdi"),
            ("sys", "/sys"),
            ("proc", "/proc"),
            ("dev", "/dev"),
            ("pod-resources", f"{KUBELET}/pod-resources"),
            ("tpu-logs", "/tmp/tpu_logs"),
        ),
    }
    sidecar = {
        "name": "sidecar-log-collector",
        "image": "registry.example/gke-distroless/bash:stable",
        "args": ["/bin/sh", "-c", "tail -n+1 -F /tmp/tpu_logs/tpu_driver.INFO"],
        "volumeMounts": [{"name": "tpu-logs", "mountPath": "/tmp/tpu_logs", "readOnly": True}],
    }
    vbar = {
        "name": "vbar-control-agent",
        "image": "registry.example/gke-release/vbar_control_agent:stable",
        "command": ["vbar_control_agent_files/bin/vbar_control_agent"],
        "args": ["--logtostderr", "--census_enabled=false", "--gid=", "--uid=", "--chroot="],
        "env": [{"name": "TPU_SKIP_MDS_QUERY", "value": "true"}, {"name": "TPU_ON_GKE", "value": "true"}],
        "securityContext": {"privileged": True, "readOnlyRootFilesystem": True},
    }
    init = [
        {
            "name": "tpu-network-optimization",
            "image": "registry.example/gke-release/tpu_network_optimizer:stable",
            "command": ["/tpu_network_optimizer.sh"],
            "securityContext": {"privileged": True},
            "volumeMounts": _mounts(("sys", "/sys"), ("proc", "/proc")),
        }
    ]
    volumes = [
        _host("plugins-registry", f"{KUBELET}/plugins_registry"),
        _host("plugins", f"{KUBELET}/plugins"),
        _host("cdi", "/var/run/cdi"),
        _host("dev", "/dev", "DirectoryOrCreate"),
        _host("pod-resources", f"{KUBELET}/pod-resources", "DirectoryOrCreate"),
        _host("tpu-env", "/etc/tpu", "DirectoryOrCreate"),
        _host("tpu-logs", "/tmp/tpu_logs", "DirectoryOrCreate"),
        _host("sys", "/sys", "Directory"),
        _host("proc", "/proc", "Directory"),
    ]
    labels = {"app.kubernetes.io/name": "dra-driver-google-tpu", "app.kubernetes.io/instance": "dra-driver-google-tpu"}
    ds = _daemonset(
        "dra-driver-google-tpu-kubeletplugin",
        ns,
        sa,
        [plugin, sidecar, vbar],
        volumes,
        labels=labels,
        init=init,
        strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
    )
    ds["spec"]["template"]["spec"]["hostNetwork"] = True
    rbac = _rbac_of(
        ns,
        sa,
        "dra-driver-google-tpu-role",
        "dra-driver-google-tpu-role-binding",
        [
            *_rules(("resource.k8s.io", ["resourceclaims"], ["get"]), ("resource.k8s.io", ["resourceclaims/status"], ["update"])),
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "verbs": ["associated-node:update", "associated-node:patch"],
                "resourceNames": ["tpu.google.com"],
            },
            *_rules(
                _SLICES_RW,
                ("", ["nodes"], ["update", "patch", "get", "list", "watch"]),
                ("", ["nodes/status"], ["update", "patch", "get", "list", "watch"]),
                ("", ["pods"], ["get", "list", "watch"]),
            ),
        ],
        namespaced_cluster_objects=True,
    )
    return CatalogueDriver(
        key="tpu",
        namespace=ns,
        names=("tpu.google.com",),
        probes={"tpu-dra-plugin": None, "sidecar-log-collector": None, "vbar-control-agent": None},
        objects=(*rbac, ds),
    )


def memory_driver() -> CatalogueDriver:
    """The DRA memory driver (dra.memory): DaemonSet dramemory in kube-system, one binary for the
    kubelet plugin and an NRI plugin, cgroupfs mounted, no health service."""
    name = "dramemory"
    c = {
        "name": name,
        "image": "registry.example/dramem:stable",
        "command": ["/bin/dramemory"],
        "args": ["-v=6", "--cgroup-mount=/sys/fs/cgroup"],
        "securityContext": {"privileged": True, "runAsUser": 0},
        "volumeMounts": _mounts(
            ("device-plugin", f"{KUBELET}/plugins"),
            ("plugin-registry", f"{KUBELET}/plugins_registry"),
            ("nri-plugin", "/var/run/nri"),
            ("cdi-dir", "/var/run/cdi"),
            ("cgroupfs", "/sys/fs/cgroup"),
        ),
    }
    c["volumeMounts"][4]["mountPropagation"] = "HostToContainer"
    init = [
        {
            "name": "setup-runtime",
            "image": "registry.example/dramem:stable",
            "command": ["/bin/setup.sh"],
            "securityContext": {"privileged": True},
            "volumeMounts": _mounts(("etc", "/etc")),
        }
    ]
    volumes = [
        _host("device-plugin", f"{KUBELET}/plugins"),
        _host("plugin-registry", f"{KUBELET}/plugins_registry"),
        _host("nri-plugin", "/var/run/nri"),
        _host("cdi-dir", "/var/run/cdi", "DirectoryOrCreate"),
        _host("cgroupfs", "/sys/fs/cgroup"),
        _host("etc", "/etc"),
    ]
    ds = _daemonset(
        name, "kube-system", name, [c], volumes, labels={"tier": "node", "app": name, "k8s-app": name}, init=init, host=True
    )
    ds["spec"]["selector"]["matchLabels"] = {"app": name}
    ds["spec"]["template"]["metadata"]["labels"]["build"] = "devel"
    rbac = _rbac_of(
        "kube-system",
        name,
        name,
        name,
        _rules(
            ("", ["nodes"], ["get"]),
            ("resource.k8s.io", ["resourceslices"], ["list", "watch", "create", "update", "delete"]),
            ("resource.k8s.io", ["resourceclaims", "deviceclasses"], ["get"]),
            ("resource.k8s.io", ["resourceclaims/status"], ["patch", "update"]),
            ("", ["pods"], ["get", "list", "watch"]),
        ),
    )
    return CatalogueDriver(key="memory", namespace="kube-system", names=("dra.memory",), probes={name: None}, objects=(*rbac, ds))


#: The label the ComputeDomain controller puts on the nodes (and daemon pods) of a ComputeDomain.
COMPUTE_DOMAIN_LABEL = "resource.nvidia.com/computeDomain"


def nvidia_compute_domain() -> CatalogueDriver:
    """NVIDIA's ComputeDomain kubelet plugin alone (compute-domain.nvidia.com; the chart with GPU
    allocation off): one container with the chart's gRPC probes, per-node ResourceSlices of IMEX
    channel devices; the chart also installs the static ResourceSlice of the shared daemon device
    (compute_domain_daemon_slice(), not node-local: a nodeSelector on COMPUTE_DOMAIN_LABEL)."""
    ns, sa = "nvidia-compute-domain", "dra-driver-nvidia-gpu-service-account-kubeletplugin"
    image = "registry.example/dra-driver-nvidia-gpu:v26"
    c = {
        "name": "compute-domains",
        "image": image,
        "command": ["bash", "-c"],
        "args": [
            'if [ "${MASK_NVIDIA_DRIVER_PARAMS}" = "true" ]; then mount-params; fi\n'
            "compute-domain-kubelet-plugin -v $(LOG_VERBOSITY)"
        ],
        "startupProbe": {**_grpc(51515, period=1, threshold=600)},
        "livenessProbe": _grpc(51515, period=10, threshold=3),
        "env": [
            {"name": "LOG_VERBOSITY", "value": "4"},
            {"name": "MASK_NVIDIA_DRIVER_PARAMS", "value": "false"},
            {"name": "NVIDIA_DRIVER_ROOT", "value": "/"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
            {"name": "CDI_ROOT", "value": "/var/run/cdi"},
            {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
            _fieldref("NODE_NAME", "spec.nodeName"),
            _fieldref("NAMESPACE", "metadata.namespace"),
            {"name": "IMEX_MODE", "value": "daemon"},
            {"name": "IMEX_ISOLATION", "value": "domain"},
            {"name": "IMEX_HOST_SOCKET_PATH", "value": ""},
            {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": f"{KUBELET}/plugins_registry"},
            {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": f"{KUBELET}/plugins"},
            {"name": "HEALTHCHECK_PORT", "value": "51515"},
            {"name": "GPU_CLIQUE_LABEL_ENABLED", "value": "true"},
        ],
        "securityContext": {"privileged": True},
        "volumeMounts": _mounts(
            ("plugins-registry", f"{KUBELET}/plugins_registry"),
            ("plugins", f"{KUBELET}/plugins"),
            ("cdi", "/var/run/cdi"),
            ("driver-root", "/driver-root"),
        ),
    }
    c["volumeMounts"][1]["mountPropagation"] = "Bidirectional"
    init = [
        {
            "name": "init-container",
            "image": image,
            "command": ["bash", "/usr/bin/kubelet-plugin-prestart.sh"],
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "driver-root-parent", "mountPath": "/driver-root-parent", "readOnly": True}],
        }
    ]
    volumes = [
        _host("plugins-registry", f"{KUBELET}/plugins_registry"),
        _host("plugins", f"{KUBELET}/plugins"),
        _host("cdi", "/var/run/cdi"),
        _host("driver-root-parent", "/", "DirectoryOrCreate"),
        _host("driver-root", "/", "DirectoryOrCreate"),
    ]
    labels = {"app.kubernetes.io/name": "dra-driver-nvidia-gpu", "app.kubernetes.io/component": "kubelet-plugin"}
    ds = _daemonset("dra-driver-nvidia-gpu-kubelet-plugin", ns, sa, [c], volumes, labels=labels, init=init)
    rbac = _rbac_of(
        ns,
        sa,
        "dra-driver-nvidia-gpu-clusterrole-kubeletplugin",
        "dra-driver-nvidia-gpu-clusterrole-binding-kubeletplugin",
        _rules(
            ("resource.nvidia.com", ["computedomains"], ["get", "list", "watch"]),
            ("resource.k8s.io", ["resourceclaims"], ["get", "list", "watch"]),
            ("resource.k8s.io", ["resourceslices"], ["get", "list", "watch", "create", "update", "delete"]),
            ("", ["nodes"], ["get", "list", "watch", "update", "patch"]),
            ("", ["pods"], ["get", "list", "watch"]),
            ("", ["events"], ["create"]),
        ),
    )
    return CatalogueDriver(
        key="nvidia-compute-domain",
        namespace=ns,
        names=("compute-domain.nvidia.com",),
        probes={"compute-domains": None},
        objects=(*rbac, ds),
    )


def compute_domain_daemon_slice() -> dict[str, Any]:
    """The chart's static ResourceSlice of the shared ComputeDomain daemon device (installed by
    Helm, i.e. by an admin, not by the kubelet plugin): cluster-wide pool compute-domain-daemons,
    reachable from every node the kubelet plugin labelled with COMPUTE_DOMAIN_LABEL, one device
    "daemon" that many claims may share."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "compute-domain-daemons.nvidia.com"},
        "spec": {
            "driver": "compute-domain.nvidia.com",
            "pool": {"name": "compute-domain-daemons", "generation": 1, "resourceSliceCount": 1},
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": COMPUTE_DOMAIN_LABEL, "operator": "Exists"}]}]},
            "devices": [{"name": "daemon", "allowMultipleAllocations": True, "attributes": {"type": {"string": "daemon"}}}],
        },
    }


def compute_domain_daemon(
    namespace: str, domain: str, claim: str, image: str = "registry.example/dra-driver-nvidia-gpu:v26"
) -> list[dict[str, Any]]:
    """What the ComputeDomain controller creates for ComputeDomain `domain` (its UID) in the driver
    namespace, the shared-claim shape: a ResourceClaim `claim` with adminAccess on the daemon
    device class, and the per-domain daemon DaemonSet (ServiceAccount
    compute-domain-daemon-service-account, exec probes, on the nodes labelled for the domain) whose
    pods reserve that claim. The daemon is a consumer of compute-domain.nvidia.com, not a driver:
    its ServiceAccount writes no ResourceSlices and it mounts no kubelet plugin folders."""
    claim_obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim,
            "namespace": namespace,
            "labels": {COMPUTE_DOMAIN_LABEL: domain, "resource.nvidia.com/computeDomainTarget": "Daemon"},
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": "daemon", "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com", "adminAccess": True}}
                ]
            }
        },
    }
    check = {"exec": {"command": ["compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "check"]}, "timeoutSeconds": 10}
    c = {
        "name": "compute-domain-daemon",
        "image": image,
        "command": ["compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "run"],
        "env": [
            {"name": "LOG_VERBOSITY", "value": "4"},
            {"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": "18"},
            _fieldref("NODE_NAME", "spec.nodeName"),
            _fieldref("POD_IP", "status.podIP"),
            _fieldref("POD_UID", "metadata.uid"),
            _fieldref("POD_NAME", "metadata.name"),
            _fieldref("POD_NAMESPACE", "metadata.namespace"),
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        ],
        "resources": {"claims": [{"name": "compute-domain-daemon"}]},
        "startupProbe": {**check, "periodSeconds": 1, "failureThreshold": 1200},
        "livenessProbe": {**check, "periodSeconds": 60, "failureThreshold": 20},
        "readinessProbe": {**check, "periodSeconds": 10, "failureThreshold": 1},
    }
    labels = {COMPUTE_DOMAIN_LABEL: domain}
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": f"computedomain-daemon-{domain}", "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": "compute-domain-daemon-service-account",
                    "nodeSelector": dict(labels),
                    "containers": [c],
                    "tolerations": [{"operator": "Exists", "effect": e} for e in ("NoSchedule", "NoExecute", "PreferNoSchedule")],
                    "resourceClaims": [{"name": "compute-domain-daemon", "resourceClaimName": claim}],
                },
            },
        },
    }
    return [claim_obj, ds]


def compute_domain_daemon_rbac(namespace: str) -> list[dict[str, Any]]:
    """The chart's RBAC of the daemon: ComputeDomain status and cliques, pods; no DRA write."""
    rules = _rules(
        ("resource.nvidia.com", ["computedomains", "computedomains/status"], ["get", "list", "watch", "update", "patch"]),
        ("resource.nvidia.com", ["computedomaincliques"], ["get", "list", "watch", "create", "update", "patch"]),
        ("", ["pods"], ["get", "list", "watch", "patch"]),
    )
    return _rbac_of(
        namespace,
        "compute-domain-daemon-service-account",
        "compute-domain-daemon-role",
        "compute-domain-daemon-role-binding",
        rules,
    )


def catalogue() -> list[CatalogueDriver]:
    """Every catalogue driver, the NVIDIA chart in its newer (probes) and older (no probes) shape;
    the older one installed for a kubelet whose root is not /var/lib/kubelet (the chart's
    kubeletRegistrarDirectoryPath / kubeletPluginsDirectoryPath values), with no dra-guard config for it."""
    return [
        nvidia_gpu(),
        nvidia_gpu(probes_in_chart=False, registrar="/var/data/kubelet/plugins_registry", plugins="/var/data/kubelet/plugins"),
        intel_gpu(),
        example_driver(),
        cpu_driver(),
        net_driver(),
        intel_gaudi(),
        sriov_driver(),
        google_tpu(),
        memory_driver(),
        nvidia_compute_domain(),
    ]


def resource_slice(driver: str, node: str) -> dict[str, Any]:
    """A node-local resource.k8s.io/v1 ResourceSlice of `driver` on `node` (one device), as its kubelet plugin publishes."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }
