"""The settings of the dra-guard process itself (certificates, the periodic audit, the server, the
Kubernetes API client): frozen dataclasses whose fields declare their config keys
(webhook.config.declare), like webhook.config.types."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal

from webhook.config.declare import key

CertificatesMode = Literal["self", "cert-manager", "files"]


@dataclasses.dataclass(frozen=True)
class CertificatesConfig:
    """How the serving certificate is obtained (times in seconds, validity in days).

    mode "files": the user provides tls.crt/tls.key (serve --tls-cert-file/--tls-key-file);
    "cert-manager": the same files, written by cert-manager into a mounted Secret (its CA
    injector fills caBundle); "self": dra-guard keeps a CA and a serving certificate in the Secret
    `secret_name` of `namespace`, writes them to `dir`, and keeps every caBundle of its webhook
    configurations equal to its CA. In every mode the files are reloaded when their digest changes.
    """

    mode: CertificatesMode = dataclasses.field(
        default="files",
        metadata=key("mode", help="self: dra-guard keeps its own CA; cert-manager or files: mounted tls.crt/tls.key"),
    )
    namespace: str = dataclasses.field(
        default="", metadata=key("namespace", help="self mode: the Secret's namespace; empty: $POD_NAMESPACE, else dra-guard")
    )
    service: str = dataclasses.field(
        default="dra-guard", metadata=key("service", help="the Service whose DNS names the certificate carries")
    )
    extra_dns_names: tuple[str, ...] = dataclasses.field(
        default=(), metadata=key("extraDnsNames", help="more DNS names for the certificate")
    )
    extra_ip_addresses: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata=key(
            "extraIpAddresses", ip=True, help="IP addresses for the certificate, e.g. 127.0.0.1 for a webhook registered by url"
        ),
    )
    secret_name: str = dataclasses.field(
        default="dra-guard-tls",
        metadata=key("secretName", help="self mode: the Secret with the CA and serving certificate, shared by every replica"),
    )
    lease_name: str = dataclasses.field(
        default="dra-guard-certs", metadata=key("leaseName", help="self mode: the Lease that lets one replica at a time write")
    )
    validating_webhook: str = dataclasses.field(
        default="dra-guard",
        metadata=key(
            "validatingWebhookConfiguration", help="self mode: the ValidatingWebhookConfiguration whose caBundle is kept right"
        ),
    )
    mutating_webhook: str = dataclasses.field(
        default="dra-guard",
        metadata=key(
            "mutatingWebhookConfiguration", help="self mode: the MutatingWebhookConfiguration whose caBundle is kept right"
        ),
    )
    webhooks_config_map: str = dataclasses.field(
        default="",
        metadata=key(
            "webhooksConfigMap",
            help="self mode: a ConfigMap in `namespace` whose key webhooks.json holds the webhooks "
            "both configurations must have ({validating: [...], mutating: [...]}); they are "
            "then reconciled whole and drift is reported, not only caBundle; the chart sets it",
        ),
    )
    dir: str = dataclasses.field(
        default="/run/dra-guard/certs",
        metadata=key(
            "dir",
            help="self mode: where the serving files are written; a folder of dra-guard's user "
            "that no one else may write (created 0700); never a shared one like /tmp",
        ),
    )
    ca_validity_days: int = dataclasses.field(
        default=3650, metadata=key("caValidityDays", lo=1, hi=36500, help="days the self-made CA is valid")
    )
    leaf_validity_days: int = dataclasses.field(
        default=365,
        metadata=key(
            "leafValidityDays",
            lo=1,
            hi=3650,
            below="caValidityDays",
            help="days the serving certificate is valid; shorter than caValidityDays",
        ),
    )
    renew_after_share: float = dataclasses.field(
        default=2 / 3,
        metadata=key("renewAfterShare", lo=0.1, hi=0.95, help="renew once this share of a certificate's lifetime has passed"),
    )
    check_interval_seconds: int = dataclasses.field(
        default=60, metadata=key("checkIntervalSeconds", lo=1, hi=86400, help="self mode: seconds between reconciles")
    )
    reload_interval_seconds: int = dataclasses.field(
        default=10,
        metadata=key("reloadIntervalSeconds", lo=1, hi=3600, help="seconds between checks of the serving files' digest"),
    )


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """The in-server periodic audit (times in seconds; qps/burst limit its own API requests)."""

    interval_seconds: int = dataclasses.field(
        default=600,
        metadata=key("intervalSeconds", lo=0, hi=86400, help="seconds between periodic audits; 0 turns the periodic audit off"),
    )
    qps: float = dataclasses.field(
        default=10.0,
        metadata=key(
            "qps", lo=0, lo_exclusive=True, hi=1000, help="the audit's own client-side API rate limit (requests per second)"
        ),
    )
    burst: int = dataclasses.field(default=20, metadata=key("burst", lo=1, hi=1000, help="the audit's API request burst"))
    policy_reports: bool = dataclasses.field(
        default=True,
        metadata=key("policyReports", help="write dra-guard's reports (the report API of reportFormat) when it is served"),
    )
    report_format: Literal["wgpolicyk8s.io", "openreports.io", "both"] = dataclasses.field(
        default="wgpolicyk8s.io",
        metadata=key(
            "reportFormat",
            help="the report API of policyReports: wgpolicyk8s.io (v1alpha2 ClusterPolicyReport/"
            "PolicyReports, Kyverno 1.x and the Policy Reporter), openreports.io (v1alpha1 "
            "ClusterReport/Reports, their successor) or both; dra-guard's reports of an API not "
            "chosen are deleted",
        ),
    )
    # chart=False: the chart renders its own ClusterRole's name here (like the certificates
    # section's names); a values key could only point the reports at an object the release
    # does not delete
    report_owner_cluster_role: str = dataclasses.field(
        default="",
        metadata=key(
            "reportOwnerClusterRole",
            chart=False,
            pattern=r"^[^/%]*$",
            pattern_help="a ClusterRole name (no '/' or '%')",
            help="the ClusterRole every report names in metadata.ownerReferences (its uid read at each audit), so "
            "the Kubernetes garbage collector deletes the reports once that ClusterRole is deleted (helm "
            "uninstall); the chart sets its own; empty: reports without an owner (`dra-guard cleanup` removes them)",
        ),
    )


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """HTTP server settings (gunicorn). Sizes in bytes, times in seconds."""

    key_groups: ClassVar[Mapping[str, str]] = {
        "limits": "the most one review may make dra-guard evaluate; beyond, the policy's failure mode answers"
    }

    port: int = dataclasses.field(default=8443, metadata=key("port", lo=1, hi=65535, help="the HTTPS port"))
    max_request_bytes: int = dataclasses.field(
        default=8 * 1024 * 1024,
        metadata=key(
            "maxRequestBytes",
            lo=1024,
            hi=64 * 1024 * 1024,
            help="a request body above this many bytes is refused: HTTP 413 from its Content-Length, before it is read",
        ),
    )
    workers: int = dataclasses.field(
        default=1, metadata=key("workers", lo=1, hi=64, help="gunicorn processes; each keeps its own caches")
    )
    threads: int = dataclasses.field(
        default=8,
        metadata=key(
            "threads",
            lo=1,
            hi=256,
            help="threads per admission lane of a worker process that run the app and the policies: the eviction "
            "guard has this many of its own, RBAC and DaemonSet reviews share as many",
        ),
    )
    shutdown_delay_seconds: int = dataclasses.field(
        default=5,
        metadata=key(
            "shutdownDelaySeconds", lo=0, hi=60, help="on SIGTERM: /readyz says no, keep serving this many seconds, then drain"
        ),
    )
    review_deadline_seconds: float = dataclasses.field(
        default=2.5,
        metadata=key(
            "reviewDeadlineSeconds",
            lo=0.1,
            hi=29,
            help="every review is answered within this many seconds of its arrival, by its policy or else by the "
            "overload answer (eviction: 429 retry); keep below the webhooks' timeoutSeconds (3); "
            "policies.<name>.reviewDeadlineSeconds overrides it per policy",
        ),
    )
    drop_after_seconds: float = dataclasses.field(
        default=3.0,
        metadata=key(
            "dropAfterSeconds",
            lo=0.1,
            hi=30,
            help="a request still queued after this many seconds is dropped unanswered: the apiserver's timeout has passed",
        ),
    )
    client_ca_file: str = dataclasses.field(
        default="",
        metadata=key(
            "clientCAFile",
            help="PEM file of CAs: when set, a client must present a certificate they signed (TLS); "
            "give the apiserver one with an AdmissionConfiguration kubeconfig (docs/reliability.md)",
        ),
    )
    probe_port: int = dataclasses.field(
        default=0,
        metadata=key(
            "probePort",
            lo=0,
            hi=65535,
            help="0: off; else a second HTTPS port that asks no client certificate, for the kubelet's probes and "
            "Prometheus (/healthz, /readyz, /metrics only); needed with clientCAFile",
        ),
    )
    max_rules: int = dataclasses.field(
        default=2000,
        metadata=key(
            "limits.maxRules", lo=1, hi=1_000_000, help="a reviewed object with more RBAC rules is not judged (failure mode)"
        ),
    )
    max_subjects: int = dataclasses.field(
        default=2000,
        metadata=key(
            "limits.maxSubjects", lo=1, hi=1_000_000, help="a reviewed binding with more subjects is not judged (failure mode)"
        ),
    )
    max_selector_values: int = dataclasses.field(
        default=10_000,
        metadata=key(
            "limits.maxSelectorValues",
            lo=1,
            hi=10_000_000,
            help="a reviewed ClusterRole whose aggregationRule has more label values is not judged (failure mode)",
        ),
    )
    max_containers: int = dataclasses.field(
        default=200,
        metadata=key(
            "limits.maxContainers",
            lo=1,
            hi=100_000,
            help="a reviewed DaemonSet with more containers (init and regular) is not judged (failure mode)",
        ),
    )


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Kubernetes API access settings. Times in seconds.

    request_timeout_seconds (cluster.requestTimeoutSeconds): the timeout of each LIST page of the
    caches, and the whole budget of the API reads an admission may make (ClusterState.fetch_cluster_role,
    ClusterState.refresh_bindings); keep it below the RBAC webhook's timeoutSeconds (3).
    startup_wait_seconds (cluster.startupWaitSeconds): how long `serve` retries a transient API
    failure at start-up (webhook.kube.errors.until_reachable) before it exits 2: without it, a pod
    started during an apiserver restart crash-loops and its back-off keeps it down for minutes."""

    request_timeout_seconds: float = dataclasses.field(
        default=2.0,
        metadata=key(
            "requestTimeoutSeconds",
            lo=0,
            lo_exclusive=True,
            hi=30,
            help="seconds for each LIST page and for all API reads of one admission; below the RBAC webhook's timeout",
        ),
    )
    startup_wait_seconds: float = dataclasses.field(
        default=60.0,
        metadata=key(
            "startupWaitSeconds",
            lo=0,
            hi=3600,
            help="at start-up, how long `serve` retries an API that is unreachable, times out or answers 429/5xx "
            "(an apiserver restarting) before it exits 2; credentials, RBAC and TLS errors exit at once",
        ),
    )
    api_check_interval_seconds: float = dataclasses.field(
        default=30.0,
        metadata=key(
            "apiCheckIntervalSeconds",
            lo=1,
            hi=3600,
            help="how often the APIServices of the groups dra-guard reads are checked to be served by the apiserver "
            "itself (a redirected one makes dra-guard not ready); also at start-up",
        ),
    )
    binding_refresh_interval_seconds: float = dataclasses.field(
        default=2.0,
        metadata=key(
            "bindingRefreshIntervalSeconds",
            lo=0,
            hi=300,
            help="at most one full API read of the ClusterRoleBindings per this many seconds (ClusterRole reviews "
            "in between share the last one and the watch)",
        ),
    )
