"""The matrix of chart values the chart tests render, lint and send to the apiserver.

Each case is a (name, values) pair merged over charts/dra-guard/values.yaml: the defaults, each
policy in each mode, each certificate mode, monitoring on, one replica, the development url, and
the optional switches.
"""

from __future__ import annotations

import base64
from typing import Any

#: A syntactically valid caBundle (base64 of a PEM block); its content does not matter for rendering.
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()

MODES = ("enforce", "warn", "audit")
#: config.drivers.declared of the cases that render the fail-closed eviction webhook (one driver in
#: a namespace of its own, one sharing kube-system)
DECLARED = [
    {"namespace": "gpu-operator", "name": "nvidia-dra-driver-gpu-kubelet-plugin"},
    {"namespace": "kube-system", "name": "dra-example-driver-kubeletplugin"},
]
POLICIES = ("rbac", "probes", "eviction")


def cases() -> list[tuple[str, dict[str, Any]]]:
    """Every (name, values) case of the matrix."""
    out: list[tuple[str, dict[str, Any]]] = [("defaults", {})]
    declared = {"drivers": {"declared": DECLARED}}
    for mode in MODES:
        out.append((f"global-{mode}", {"config": {"mode": mode, **declared}}))
    for policy in POLICIES:
        for mode in MODES:
            out.append((f"{policy}-{mode}", {"config": {"policies": {policy: {"mode": mode}}, **declared}}))
    out += [
        (
            "certs-self",
            {
                "certificates": {"mode": "self", "extraDnsNames": ["dra-guard.example.com"]},
                "config": {"drivers": {"declared": DECLARED}},
            },
        ),
        (
            "declared-drivers",
            {"config": {"drivers": {"declared": DECLARED}}, "webhooks": {"eviction": {"bestEffort": {"enabled": True}}}},
        ),
        ("certs-cert-manager", {"certificates": {"mode": "cert-manager"}}),
        (
            "certs-cert-manager-issuer",
            {
                "certificates": {
                    "mode": "cert-manager",
                    "certManager": {"issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca"}},
                }
            },
        ),
        (
            "certs-files",
            {"certificates": {"mode": "files", "files": {"secretName": "my-dra-guard-tls"}}, "webhooks": {"caBundle": CA_BUNDLE}},
        ),
        (
            "monitoring",
            {
                "monitoring": {
                    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                    "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
                    "dashboard": {"enabled": True},
                }
            },
        ),
        (
            "monitoring-cert-manager",
            {
                "certificates": {"mode": "cert-manager"},
                "monitoring": {
                    "serviceMonitor": {"enabled": True},
                    "prometheusRule": {"enabled": True, "draControlPlane": False},
                },
            },
        ),
        ("replicas-1", {"replicaCount": 1}),
        (
            "audit-off-files",
            {
                "config": {"audit": {"intervalSeconds": 0}},
                "certificates": {"mode": "files", "files": {"secretName": "my-dra-guard-tls"}},
                "webhooks": {"caBundle": CA_BUNDLE},
            },
        ),
        ("policyreport-crds", {"policyReports": {"installCRDs": True}}),
        ("report-crds-both", {"policyReports": {"installCRDs": True}, "config": {"audit": {"reportFormat": "both"}}}),
        ("audit-no-reports", {"config": {"audit": {"intervalSeconds": 300, "qps": 5, "burst": 10, "policyReports": False}}}),
        ("dev-url", {"webhooks": {"url": "https://127.0.0.1:8443", "caBundle": CA_BUNDLE}}),
        ("pre-delete", {"preDelete": {"enabled": True}}),
        (
            "client-auth",
            {
                "clientAuth": {"caConfigMap": "apiserver-client-ca"},
                "networkPolicy": {
                    "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
                    "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
                },
            },
        ),
        ("no-network-policy", {"networkPolicy": {"enabled": False}}),
        (
            "switches",
            {
                "config": {
                    "eviction": {"guardDeletes": True},
                    "rbac": {"driverSubjects": {"serviceAccounts": ["gpu-operator:nvidia-dra-driver"]}},
                    "drivers": {
                        "selectors": [
                            {"namespace": "gpu", "matchLabels": {"app": "gpu-driver"}, "driverName": "gpu.example.com"}
                        ],
                        "declared": [{"namespace": "gpu", "name": "gpu-driver"}],
                    },
                },
                "webhooks": {
                    "excludedNamespaces": ["gpu-operator"],
                    "probes": {"enabled": False},
                    "rbac": {"timeoutSeconds": 5},
                    "eviction": {"failurePolicy": "Fail"},
                },
                "fullnameOverride": "guard",
                "image": {"digest": "sha256:" + "a" * 64},
                "extraArgs": ["--log-level", "debug"],
                "podLabels": {"team": "platform"},
                "tests": {"enabled": False},
                "preDelete": {"enabled": False},
            },
        ),
    ]
    return out


def case_ids() -> list[str]:
    """The case names, for pytest ids."""
    return [name for name, _ in cases()]
