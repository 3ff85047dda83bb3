"""Manifests of the test DRA driver (tests/dradriver) for the real node, shaped like a driver's chart.

Like dra-example-driver's chart (tests/drivers_catalogue.py): a ServiceAccount with the driver's
ClusterRole (ResourceSlices, ResourceClaims get, Nodes get), a DaemonSet whose container mounts
/var/lib/kubelet/plugins_registry, /var/lib/kubelet/plugins and /var/run/cdi from the host and
takes ``--healthcheck-port``, so dra-guard's probes policy recognises it and adds its gRPC probe.
Differences forced by the test cluster (no Service, no DNS, no kube-proxy): ``hostNetwork: true``
and a kubeconfig file (ConfigMap) pointing at the apiserver on 127.0.0.1 with the pod's projected
ServiceAccount token (the control plane runs without the ServiceAccount admission plugin, so the
token volume is declared here). The image is node.DRIVER_IMAGE (``imagePullPolicy: Never``).

The driver's own log lines (see tests/dradriver/main.go) are the evidence the tests read:
``dradriver: prepared claim ...``, ``dradriver: unprepared claim ...``, ``dradriver: health ...``,
``dradriver: unprepare of claim ... failed`` (while `UNPREPARE_FAIL_FILE` exists), ``dradriver:
stopping`` (SIGTERM). `UNPREPARE_DELAY_FILE` makes each unprepare sleep first.
"""

from __future__ import annotations

import base64
import pathlib
from typing import Any

import yaml

from tests.e2e.node import APP_IMAGE, CDI_DIR, DRIVER_IMAGE, KUBELET_ROOT

DRIVER = "gpu.e2e.dra-guard.test"
NAMESPACE = "dra-test-driver"
NAME = "dradriver"
SERVICE_ACCOUNT = "dradriver"
HEALTH_PORT = 51515
DEVICE_CLASS = "e2e-test-gpu"
TOKEN_DIR = "/var/run/secrets/dra-test-driver"
#: while this host file exists, the driver's health service answers NOT_SERVING (its plugin folder is mounted)
UNHEALTHY_FILE = KUBELET_ROOT / "plugins" / DRIVER / "unhealthy"
#: while this host file exists, every unprepare of the driver fails (the kubelet retries it and
#: keeps the consumer Terminating); the driver logs "dradriver: unprepare of claim ... failed"
UNPREPARE_FAIL_FILE = KUBELET_ROOT / "plugins" / DRIVER / "unprepare-fail"
#: a host file holding a Go duration ("3s"): each unprepare call of the driver sleeps that long
#: first (read at each call); absent: no delay
UNPREPARE_DELAY_FILE = KUBELET_ROOT / "plugins" / DRIVER / "unprepare-delay"


def cdi_file(claim_uid: str) -> pathlib.Path:
    """The CDI spec file the driver writes for a prepared claim (and removes when unpreparing)."""
    return CDI_DIR / f"{DRIVER}-{claim_uid}.json"


def driver_objects(
    cp: Any, *, args: tuple[str, ...] = (), strategy: dict[str, Any] | None = None, termination_grace: int = 5
) -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, ClusterRole(+Binding), kubeconfig ConfigMap, DeviceClass and the
    driver DaemonSet (extra driver `args`, e.g. "--start-delay=20s"; `strategy` = DaemonSet
    updateStrategy) for ControlPlane `cp`."""
    ca = base64.b64encode(cp.ca_file.read_bytes()).decode()
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "driver",
        "clusters": [{"name": "e2e", "cluster": {"server": cp.url, "certificate-authority-data": ca}}],
        "users": [{"name": "driver", "user": {"tokenFile": f"{TOKEN_DIR}/token"}}],
        "contexts": [{"name": "driver", "context": {"cluster": "e2e", "user": "driver"}}],
    }
    role = f"{NAME}-role"
    container = {
        "name": "plugin",
        "image": DRIVER_IMAGE,
        "imagePullPolicy": "Never",
        "args": [
            f"--driver-name={DRIVER}",
            f"--healthcheck-port={HEALTH_PORT}",
            "--kubeconfig=/etc/dradriver/kubeconfig",
            f"--unhealthy-file=/var/lib/kubelet/plugins/{DRIVER}/unhealthy",
            f"--unprepare-fail-file=/var/lib/kubelet/plugins/{DRIVER}/unprepare-fail",
            f"--unprepare-delay-file=/var/lib/kubelet/plugins/{DRIVER}/unprepare-delay",
            *args,
        ],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        ],
        "volumeMounts": [
            {"name": "plugins-registry", "mountPath": "/var/lib/kubelet/plugins_registry"},
            {"name": "plugins", "mountPath": "/var/lib/kubelet/plugins"},
            {"name": "cdi", "mountPath": "/var/run/cdi"},
            {"name": "kubeconfig", "mountPath": "/etc/dradriver", "readOnly": True},
            {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
        ],
    }
    ds: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": NAME}},
        "spec": {
            "selector": {"matchLabels": {"app": NAME}},
            "template": {
                "metadata": {"labels": {"app": NAME}},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "hostNetwork": True,
                    "terminationGracePeriodSeconds": termination_grace,
                    "containers": [container],
                    "volumes": [
                        {"name": "plugins-registry", "hostPath": {"path": "/var/lib/kubelet/plugins_registry"}},
                        {"name": "plugins", "hostPath": {"path": "/var/lib/kubelet/plugins"}},
                        {"name": "cdi", "hostPath": {"path": "/var/run/cdi"}},
                        {"name": "kubeconfig", "configMap": {"name": f"{NAME}-kubeconfig"}},
                        {
                            "name": "token",
                            "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]},
                        },
                    ],
                },
            },
        },
    }
    if strategy is not None:
        ds["spec"]["updateStrategy"] = strategy
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{NAME}-kubeconfig", "namespace": NAMESPACE},
            "data": {"kubeconfig": yaml.safe_dump(kubeconfig)},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
        ds,
    ]


def consumer_objects(name: str, *, namespace: str = "work", grace: int = 5) -> list[dict[str, Any]]:
    """Namespace `namespace`, a ResourceClaimTemplate `name` (one device of DEVICE_CLASS) and Pod
    `name` using it; its container (APP_IMAGE) prints DRA_GUARD_TEST_DEVICE from the CDI edit."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": grace,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
                "containers": [
                    {"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    ]


# ---------------------------------------------------------------------------------- test helpers


def apply(cp: Any, objects: list[dict[str, Any]], *, user: str = "admin") -> None:
    """kubectl apply a list of objects as `user`."""
    import json

    cp.kubectl(user, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def driver_pods(cp: Any, *, include_terminating: bool = False) -> list[dict[str, Any]]:
    """The test driver's pods (dicts), oldest first; without terminating ones unless asked."""
    from tests.e2e.kube import get_json

    pods = (get_json(cp, "pods", "-n", NAMESPACE, "-l", f"app={NAME}") or {"items": []})["items"]
    pods = [p for p in pods if include_terminating or not p["metadata"].get("deletionTimestamp")]
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


def restarts(pod: dict[str, Any]) -> int:
    """The restartCount of the pod's first container (0 before it has a status)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def ready(pod: dict[str, Any] | None) -> bool:
    """Whether the pod's Ready condition is True."""
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def kubelet_probe_counts(cp: Any, pod: str, probe_type: str = "Liveness") -> dict[str, float]:
    """The kubelet's own prober_probe_total for container "plugin" of `pod` (result -> count), read
    from the real kubelet's /metrics/probes on the node's address (port 10250) with the admin token
    (the kubelet authenticates it with a TokenReview and authorizes it with a SubjectAccessReview)."""
    import warnings

    import urllib3

    from tests.e2e.node import node_address

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        sess = cp.session("admin")
        text = sess.get(f"https://{node_address()}:10250/metrics/probes", verify=False, timeout=10).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if (
            line.startswith("prober_probe_total{")
            and f'pod="{pod}"' in line
            and f'probe_type="{probe_type}"' in line
            and 'container="plugin"' in line
        ):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            counts[result] = counts.get(result, 0) + float(line.rsplit(" ", 1)[1])
    return counts
