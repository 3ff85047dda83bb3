"""The RBAC of the charts people install beside DRA drivers, as `helm template` renders it with the
chart's defaults: fixtures we write ourselves with the structure of the public templates (no copied
files), read with the search tool. Each function names its source; only the RBAC objects (and the
ServiceAccounts) are kept, without labels and with read-only rules on the charts' own API groups
shortened (neither changes what dra-guard judges).

- nvidia_dra_driver_gpu(): kubernetes-sigs/dra-driver-nvidia-gpu (the NVIDIA/k8s-dra-driver-gpu
  successor), chart dra-driver-nvidia-gpu 0.4.1 (Chart.yaml at 764900e7),
  deployments/helm/dra-driver-nvidia-gpu/templates/rbac-kubeletplugin.yaml at 7923b97b,
  rbac-controller.yaml at 75af8cfe, rbac-compute-domain-daemon.yaml at 2dc387ef, names from
  _helpers.tpl at 14046d00; release and namespace dra-driver-nvidia-gpu (so the fullname is the
  chart name), serviceAccount.create true, IMEX driver-managed (the default: the daemon's RBAC is
  rendered), no ADDITIONAL_NAMESPACES, no OpenShift.
- cluster_autoscaler(): kubernetes/autoscaler, chart cluster-autoscaler (Chart.yaml 9.38.0 as
  stored; templates/clusterrole.yaml at 0ebbdfb2, clusterrolebinding.yaml at b8d7cffa, role.yaml at
  06418d54), release cluster-autoscaler in kube-system, rbac.create and rbac.clusterScoped true
  (the defaults), no priority expander, no clusterapi provider.
- karpenter(): aws/karpenter-provider-aws, chart karpenter (templates/clusterrole-core.yaml at
  05096692, clusterrole.yaml at 93f2cf91 with webhook.enabled false, role.yaml at 00c29898 without
  the webhook's Lease and Secret rules), release karpenter in kube-system (the namespace its getting
  started guide installs to).
"""

from __future__ import annotations

from typing import Any

RBAC = "rbac.authorization.k8s.io"


def _role(name: str, rules: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role" if namespace else "ClusterRole",
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "rules": rules,
    }


def _binding(
    name: str, role: str, subjects: list[tuple[str, str]], *, namespace: str = "", role_kind: str = "ClusterRole"
) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns} for ns, sa in subjects],
        "roleRef": {"kind": role_kind, "name": role, "apiGroup": RBAC},
    }


def _sa(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}


def _rule(groups: list[str], resources: list[str], verbs: list[str], names: list[str] | None = None) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **({"resourceNames": names} if names else {})}


NVIDIA_NS = "dra-driver-nvidia-gpu"
NVIDIA_NAME = "dra-driver-nvidia-gpu"
NVIDIA_SA = f"{NVIDIA_NAME}-service-account"
#: the chart's three ServiceAccounts: kubelet plugin, controller, ComputeDomain daemon
NVIDIA_SERVICE_ACCOUNTS = (
    f"{NVIDIA_NS}:{NVIDIA_SA}-kubeletplugin",
    f"{NVIDIA_NS}:{NVIDIA_SA}-controller",
    f"{NVIDIA_NS}:compute-domain-daemon-service-account",
)
#: the one grant of the chart dra-guard refuses: the daemon's cluster-wide pods patch
NVIDIA_DAEMON_BINDING = "compute-domain-daemon-role-binding"


def nvidia_dra_driver_gpu(namespace: str = NVIDIA_NS) -> list[dict[str, Any]]:
    """The RBAC of dra-driver-nvidia-gpu 0.4.1 with its defaults (see the module docstring), in
    the order helm applies it (ServiceAccounts, ClusterRoles, ClusterRoleBindings, Roles, RoleBindings)."""
    n, sa = NVIDIA_NAME, NVIDIA_SA
    return [
        _sa(namespace, f"{sa}-kubeletplugin"),
        _sa(namespace, f"{sa}-controller"),
        _sa(namespace, "compute-domain-daemon-service-account"),
        _role(
            f"{n}-clusterrole-kubeletplugin",
            [
                _rule(["resource.nvidia.com"], ["computedomains"], ["get", "list", "watch"]),
                _rule(["resource.k8s.io"], ["resourceclaims"], ["get", "list", "watch"]),
                _rule(["resource.k8s.io"], ["resourceslices"], ["get", "list", "watch", "create", "update", "delete"]),
                _rule([""], ["nodes"], ["get", "list", "watch", "update", "patch"]),
                _rule([""], ["pods"], ["get", "list", "watch"]),
                _rule([""], ["events"], ["create"]),
            ],
        ),
        _role(
            f"{n}-clusterrole-controller",
            [
                _rule(["resource.nvidia.com"], ["computedomains"], ["get", "list", "watch", "update"]),
                _rule(["resource.nvidia.com"], ["computedomains/status"], ["update"]),
                _rule(["resource.k8s.io"], ["resourceclaimtemplates"], ["get", "list", "watch", "create", "update", "delete"]),
                _rule(["resource.k8s.io"], ["resourceclaims"], ["get", "list", "watch", "create", "update", "delete"]),
                _rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update"]),
                _rule([""], ["nodes"], ["get", "list", "watch", "update"]),
                _rule([""], ["pods"], ["get", "list", "watch"]),
            ],
        ),
        _role(
            "compute-domain-daemon-role",
            [
                _rule(
                    ["resource.nvidia.com"],
                    ["computedomains", "computedomains/status"],
                    ["get", "list", "watch", "update", "patch"],
                ),
                _rule(["resource.nvidia.com"], ["computedomaincliques"], ["get", "list", "watch", "create", "update", "patch"]),
                _rule([""], ["pods"], ["get", "list", "watch", "patch"]),
            ],
        ),
        _binding(
            f"{n}-clusterrole-binding-kubeletplugin", f"{n}-clusterrole-kubeletplugin", [(namespace, f"{sa}-kubeletplugin")]
        ),
        _binding(
            f"{n}-clusterrole-binding-controller-{namespace}", f"{n}-clusterrole-controller", [(namespace, f"{sa}-controller")]
        ),
        _binding(NVIDIA_DAEMON_BINDING, "compute-domain-daemon-role", [(namespace, "compute-domain-daemon-service-account")]),
        _role(f"{n}-role-kubeletplugin", [_rule(["resource.nvidia.com"], ["computedomaincliques"], ["get"])], namespace),
        _role(
            f"{n}-role-controller",
            [
                _rule(["apps"], ["daemonsets"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
                _rule(["resource.nvidia.com"], ["computedomaincliques"], ["get", "list", "watch", "update"]),
            ],
            namespace,
        ),
        _binding(
            f"{n}-role-binding-kubeletplugin",
            f"{n}-role-kubeletplugin",
            [(namespace, f"{sa}-kubeletplugin")],
            namespace=namespace,
            role_kind="Role",
        ),
        _binding(
            f"{n}-role-binding-controller",
            f"{n}-role-controller",
            [(namespace, f"{sa}-controller")],
            namespace=namespace,
            role_kind="Role",
        ),
    ]


AUTOSCALER_NS = "kube-system"
AUTOSCALER = "cluster-autoscaler"


def cluster_autoscaler() -> list[dict[str, Any]]:
    """The RBAC of the cluster-autoscaler chart with its defaults (see the module docstring)."""
    ns, name = AUTOSCALER_NS, AUTOSCALER
    read = ["watch", "list", "get"]
    return [
        _sa(ns, name),
        _role(
            name,
            [
                _rule([""], ["events", "endpoints"], ["create", "patch"]),
                _rule([""], ["pods/eviction"], ["create"]),
                _rule([""], ["pods/status"], ["update"]),
                _rule([""], ["endpoints"], ["get", "update"], [name]),
                _rule([""], ["nodes"], ["watch", "list", "get", "update"]),
                _rule(
                    [""],
                    ["namespaces", "pods", "services", "replicationcontrollers", "persistentvolumeclaims", "persistentvolumes"],
                    read,
                ),
                _rule(["batch"], ["jobs", "cronjobs"], read),
                _rule(["batch", "extensions"], ["jobs"], ["get", "list", "patch", "watch"]),
                _rule(["extensions"], ["replicasets", "daemonsets"], read),
                _rule(["policy"], ["poddisruptionbudgets"], ["watch", "list"]),
                _rule(["apps"], ["daemonsets", "replicasets", "statefulsets"], read),
                _rule(["storage.k8s.io"], ["storageclasses", "csinodes", "csidrivers", "csistoragecapacities"], read),
                _rule([""], ["configmaps"], ["list", "watch"]),
                _rule(["coordination.k8s.io"], ["leases"], ["create"]),
                _rule(["coordination.k8s.io"], ["leases"], ["get", "update"], [name]),
            ],
        ),
        _binding(name, name, [(ns, name)]),
        _role(
            name,
            [
                _rule([""], ["configmaps"], ["create"]),
                _rule([""], ["configmaps"], ["delete", "get", "update"], ["cluster-autoscaler-status"]),
            ],
            ns,
        ),
        _binding(name, name, [(ns, name)], namespace=ns, role_kind="Role"),
    ]


KARPENTER_NS = "kube-system"
KARPENTER = "karpenter"


def karpenter() -> list[dict[str, Any]]:
    """The RBAC of the karpenter chart with its defaults (see the module docstring)."""
    ns, name = KARPENTER_NS, KARPENTER
    read = ["get", "list", "watch"]
    return [
        _sa(ns, name),
        _role(
            f"{name}-core",
            [
                _rule(["karpenter.sh"], ["nodepools", "nodepools/status", "nodeclaims", "nodeclaims/status"], read),
                _rule(
                    [""],
                    ["pods", "nodes", "persistentvolumes", "persistentvolumeclaims", "replicationcontrollers", "namespaces"],
                    read,
                ),
                _rule(["storage.k8s.io"], ["storageclasses", "csinodes", "volumeattachments"], read),
                _rule(["apps"], ["daemonsets", "deployments", "replicasets", "statefulsets"], read),
                _rule(["policy"], ["poddisruptionbudgets"], read),
                _rule(["resource.k8s.io"], ["deviceclasses", "resourceclaims", "resourceslices"], read),
                _rule(["karpenter.sh"], ["nodeclaims", "nodeclaims/status"], ["create", "delete", "update", "patch"]),
                _rule(["karpenter.sh"], ["nodepools", "nodepools/status"], ["update", "patch"]),
                _rule([""], ["events"], ["create", "patch"]),
                _rule([""], ["nodes"], ["patch", "delete", "update"]),
                _rule([""], ["pods/eviction"], ["create"]),
                _rule([""], ["pods"], ["delete"]),
            ],
        ),
        _role(
            name,
            [
                _rule(["karpenter.k8s.aws"], ["ec2nodeclasses"], read),
                _rule(["karpenter.k8s.aws"], ["ec2nodeclasses", "ec2nodeclasses/status"], ["patch", "update"]),
            ],
        ),
        _binding(f"{name}-core", f"{name}-core", [(ns, name)]),
        _binding(name, name, [(ns, name)]),
        _role(
            name,
            [
                _rule(["coordination.k8s.io"], ["leases"], ["get", "watch"]),
                _rule([""], ["configmaps", "namespaces", "secrets"], read),
                _rule([""], ["configmaps"], ["update", "patch", "delete"], ["config-logging"]),
                _rule(["coordination.k8s.io"], ["leases"], ["patch", "update"], ["karpenter-leader-election"]),
                _rule(["coordination.k8s.io"], ["leases"], ["create"]),
                _rule([""], ["configmaps"], ["create"]),
            ],
            ns,
        ),
        _role(f"{name}-dns", [_rule([""], ["services"], ["get"], ["kube-dns"])], "kube-system"),
        _role(
            f"{name}-lease",
            [_rule(["coordination.k8s.io"], ["leases"], read), _rule(["coordination.k8s.io"], ["leases"], ["delete"])],
            "kube-node-lease",
        ),
        _binding(name, name, [(ns, name)], namespace=ns, role_kind="Role"),
        _binding(f"{name}-dns", f"{name}-dns", [(ns, name)], namespace="kube-system", role_kind="Role"),
        _binding(f"{name}-lease", f"{name}-lease", [(ns, name)], namespace="kube-node-lease", role_kind="Role"),
    ]
