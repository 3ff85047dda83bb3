"""The configuration's frozen dataclasses; each field declares its config key (webhook.config.declare)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Final, Literal, get_args

from webhook.config.declare import Key, key

Mode = Literal["enforce", "warn", "audit"]
FailureMode = Literal["deny", "allow"]
CertificatesMode = Literal["self", "cert-manager", "files"]

MODES: Final[tuple[str, ...]] = get_args(Mode)
FAILURE_MODES: Final[tuple[str, ...]] = get_args(FailureMode)
POLICY_NAMES: Final = ("rbac", "probes", "eviction")
# What a policy answers when it fails internally: the RBAC guard fails closed (like its
# failurePolicy: Fail); the probes mutation fails open (a missing probe is not worth blocking a
# driver's rollout; `dra-guard audit` is the backstop).
# The eviction guard fails open too (its chart failurePolicy is Ignore): a broken guard must never
# wedge every drain in the cluster; stale caches are handled separately (429, retry).
DEFAULT_FAILURE_MODES: Final = {"rbac": "deny", "probes": "allow", "eviction": "allow"}
CONFIG_API_VERSION: Final = "dra-guard.io/v1alpha1"
CONFIG_KIND: Final = "DraGuardConfiguration"

#: the file's optional header (like KubeSchedulerConfiguration); `dra-guard audit` finds the file by it
HEADER_KEYS: Final = (
    Key("apiVersion", choices=(CONFIG_API_VERSION,), chart=False,
        help="the config file's API version; lets `dra-guard audit` find the file among manifests"),
    Key("kind", choices=(CONFIG_KIND,), chart=False, help="the config file's kind"),
)

# Identities that are never admins or drivers, whatever the config says: they stand for everyone
# (or every ServiceAccount), so granting them DRA write would grant it to the whole cluster.
# Source: Kubernetes RBAC docs, "Default roles and role bindings" / "Referring to subjects".
NEVER_PRIVILEGED_GROUPS: Final = frozenset({"system:authenticated", "system:unauthenticated", "system:serviceaccounts"})
NEVER_PRIVILEGED_GROUP_PREFIXES: Final = ("system:serviceaccounts:",)
NEVER_PRIVILEGED_USERS: Final = frozenset({"system:anonymous"})

_STRINGS = "a list of non-empty strings"


@dataclasses.dataclass(frozen=True)
class SubjectSet:
    """A set of RBAC identities: user names, group names and ServiceAccounts ("ns:name" / "ns:*")."""

    users: frozenset[str] = dataclasses.field(default=frozenset(), metadata=key(
        "users", help="user names"))
    groups: frozenset[str] = dataclasses.field(default=frozenset(), metadata=key(
        "groups", help="group names (system:authenticated and the like are never trusted)"))
    service_accounts: frozenset[str] = dataclasses.field(default=frozenset(), metadata=key(
        "serviceAccounts", pattern="^[^:]+:[^:]+$", pattern_help="'namespace:name' or 'namespace:*'",
        help="ServiceAccounts as namespace:name, or namespace:* for every one of a namespace"))

    def contains(self, *, kind: str, name: str, namespace: str = "") -> bool:
        """Whether an RBAC subject belongs to the set.

        kind is "User", "Group" or "ServiceAccount" (rbac.authorization.k8s.io/v1 Subject.kind).
        A User named ``system:serviceaccount:<ns>:<name>`` is the ServiceAccount <ns>/<name>, as the
        apiserver authenticates it. Never-privileged identities (system:authenticated, ...) are
        never members.
        """
        if kind == "Group":
            if name in NEVER_PRIVILEGED_GROUPS or name.startswith(NEVER_PRIVILEGED_GROUP_PREFIXES):
                return False
            return name in self.groups
        if kind == "User":
            if name in NEVER_PRIVILEGED_USERS:
                return False
            if name.startswith("system:serviceaccount:") and name.count(":") == 3:
                _, _, ns, sa = name.split(":")
                if self._has_service_account(ns, sa):
                    return True
            return name in self.users
        if kind == "ServiceAccount":
            return self._has_service_account(namespace, name)
        return False

    def _has_service_account(self, namespace: str, name: str) -> bool:
        return f"{namespace}:{name}" in self.service_accounts or f"{namespace}:*" in self.service_accounts

    def contains_requester(self, *, username: str, groups: list[str] | tuple[str, ...]) -> bool:
        """Whether an authenticated requester (AdmissionReview request.userInfo) is in the set."""
        if self.contains(kind="User", name=username):
            return True
        return any(self.contains(kind="Group", name=g) for g in groups)


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Per-policy settings: the mode its findings are enforced in, and what an internal error answers."""

    mode: Mode = dataclasses.field(metadata=key(
        "mode", inherit="mode",
        help="enforce refuses and patches, warn allows with a kubectl warning, audit only records; "
             "unset: the top-level mode"))
    failure_mode: FailureMode = dataclasses.field(metadata=key(
        "failureMode", per_name=DEFAULT_FAILURE_MODES,
        help="what an internal policy error answers: deny refuses the request, allow admits it"))


@dataclasses.dataclass(frozen=True)
class RbacConfig:
    """Settings of the RBAC guard (policy ``rbac``)."""

    api_group: str = dataclasses.field(default="resource.k8s.io", metadata=key(
        "apiGroup", min_length=1, help="the API group of the protected resources"))
    admin_only_resources: frozenset[str] = dataclasses.field(default=frozenset({"deviceclasses"}), metadata=key(
        "adminOnlyResources", help="resources only adminSubjects may write"))
    driver_resources: frozenset[str] = dataclasses.field(default=frozenset({"resourceslices"}), metadata=key(
        "driverResources", help="resources adminSubjects and driverSubjects may write"))
    write_verbs: frozenset[str] = dataclasses.field(
        default=frozenset({"create", "update", "patch", "delete", "deletecollection"}), metadata=key(
            "writeVerbs", help="the verbs that count as write"))
    # kube-system's ServiceAccounts are the control plane's controllers: the garbage collector, the
    # namespace controller and the storage version migrator hold write on every resource by design
    admin_subjects: SubjectSet = dataclasses.field(
        default=SubjectSet(groups=frozenset({"system:masters"}), service_accounts=frozenset({"kube-system:*"})),
        metadata=key("adminSubjects", help="who may write the admin-only and the driver resources"))
    driver_subjects: SubjectSet = dataclasses.field(default=SubjectSet(), metadata=key(
        "driverSubjects", help="DRA drivers: who may write the driver resources (ResourceSlices), not DeviceClasses"))
    aggregation_controller_users: frozenset[str] = dataclasses.field(default=frozenset({
        "system:serviceaccount:kube-system:clusterrole-aggregation-controller", "system:kube-controller-manager"}),
        metadata=key("aggregationControllerUsers", help="users whose rule copies into aggregating roles only warn"))

    @property
    def protected_resources(self) -> frozenset[str]:
        """Every resource the guard protects (admin-only plus driver resources)."""
        return self.admin_only_resources | self.driver_resources


@dataclasses.dataclass(frozen=True)
class DriverSelector:
    """A configured way to recognise a driver: DaemonSets in `namespace` whose labels include `match_labels`."""

    namespace: str = dataclasses.field(metadata=key(
        "namespace", required=True, min_length=1, help="the namespace of the driver's DaemonSets"))
    match_labels: Mapping[str, str] = dataclasses.field(default_factory=dict, metadata=key(
        "matchLabels", help="labels a driver DaemonSet carries (all of them)"))
    driver_name: str = dataclasses.field(default="", metadata=key(
        "driverName", help="the DRA driver name it publishes (e.g. gpu.example.com)"))


@dataclasses.dataclass(frozen=True)
class DetectionConfig:
    """How drivers are recognised: configured selectors, and whether auto-detection runs."""

    selectors: tuple[DriverSelector, ...] = dataclasses.field(default=(), metadata=key(
        "selectors", help="DaemonSets that are DRA drivers, besides the auto-detected ones"))
    auto_detect: bool = dataclasses.field(default=True, metadata=key(
        "autoDetect", help="recognise DRA drivers by what their DaemonSets mount and publish"))


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """The probe dra-guard adds (seconds for periods and timeouts) and where its port comes from."""

    key_groups: ClassVar[Mapping[str, str]] = {
        "startupProbe": "a gRPC startupProbe added with the liveness probe, for slow-starting drivers"}

    period_seconds: int = dataclasses.field(default=10, metadata=key(
        "periodSeconds", lo=1, hi=3600, help="seconds between liveness probes"))
    timeout_seconds: int = dataclasses.field(default=10, metadata=key(
        "timeoutSeconds", lo=1, hi=3600, help="seconds a probe may take"))
    failure_threshold: int = dataclasses.field(default=3, metadata=key(
        "failureThreshold", lo=1, hi=1000, help="failed probes in a row before the container restarts"))
    service: str = dataclasses.field(default="liveness", metadata=key(
        "service", help="the gRPC health service name probed"))
    default_port: int = dataclasses.field(default=51515, metadata=key(
        "defaultPort", lo=1, hi=65535, help="the health port assumed when assumeDefaultPort is set"))
    assume_default_port: bool = dataclasses.field(default=False, metadata=key(
        "assumeDefaultPort", help="use defaultPort when a driver declares no health port"))
    startup_probe: bool = dataclasses.field(default=False, metadata=key(
        "startupProbe.enabled", help="add the startupProbe"))
    startup_period_seconds: int = dataclasses.field(default=1, metadata=key(
        "startupProbe.periodSeconds", lo=1, hi=3600, help="seconds between startup probes"))
    startup_failure_threshold: int = dataclasses.field(default=600, metadata=key(
        "startupProbe.failureThreshold", lo=1, hi=100000, help="failed startup probes before the container restarts"))


@dataclasses.dataclass(frozen=True)
class EvictionConfig:
    """Settings of the drain-order guard (policy ``eviction``). Times in seconds."""

    max_cache_age_seconds: int = dataclasses.field(default=180, metadata=key(
        "maxCacheAgeSeconds", lo=10, hi=86400,
        help="caches without news for longer answer 429 'not ready, retry'"))
    max_listed_claims: int = dataclasses.field(default=10, metadata=key(
        "maxListedClaims", lo=1, hi=1000, help="claims named in a refusal, then 'and N more'"))
    guard_deletes: bool = dataclasses.field(default=False, metadata=key(
        "guardDeletes", help="also guard DELETE of driver pods (the DaemonSet controller is exempt)"))
    daemonset_controller_users: frozenset[str] = dataclasses.field(default=frozenset({
        "system:serviceaccount:kube-system:daemon-set-controller", "system:kube-controller-manager"}),
        metadata=key("daemonSetControllerUsers", help="the DaemonSet controller's user names (exempt from guardDeletes)"))


@dataclasses.dataclass(frozen=True)
class CertificatesConfig:
    """How the serving certificate is obtained (times in seconds, validity in days).

    mode "files": the user provides tls.crt/tls.key (serve --tls-cert-file/--tls-key-file);
    "cert-manager": the same files, written by cert-manager into a mounted Secret (its CA
    injector fills caBundle); "self": dra-guard keeps a CA and a serving certificate in the Secret
    `secret_name` of `namespace`, writes them to `dir`, and keeps every caBundle of its webhook
    configurations equal to its CA. In every mode the files are reloaded when their digest changes.
    """

    mode: CertificatesMode = dataclasses.field(default="files", metadata=key(
        "mode", help="self: dra-guard keeps its own CA; cert-manager or files: mounted tls.crt/tls.key"))
    namespace: str = dataclasses.field(default="", metadata=key(
        "namespace", help="self mode: the Secret's namespace; empty: $POD_NAMESPACE, else dra-guard"))
    service: str = dataclasses.field(default="dra-guard", metadata=key(
        "service", help="the Service whose DNS names the certificate carries"))
    extra_dns_names: tuple[str, ...] = dataclasses.field(default=(), metadata=key(
        "extraDnsNames", help="more DNS names for the certificate"))
    extra_ip_addresses: tuple[str, ...] = dataclasses.field(default=(), metadata=key(
        "extraIpAddresses", ip=True, help="IP addresses for the certificate, e.g. 127.0.0.1 for a webhook registered by url"))
    secret_name: str = dataclasses.field(default="dra-guard-tls", metadata=key(
        "secretName", help="self mode: the Secret with the CA and serving certificate, shared by every replica"))
    lease_name: str = dataclasses.field(default="dra-guard-certs", metadata=key(
        "leaseName", help="self mode: the Lease that lets one replica at a time write"))
    validating_webhook: str = dataclasses.field(default="dra-guard", metadata=key(
        "validatingWebhookConfiguration", help="self mode: the ValidatingWebhookConfiguration whose caBundle is kept right"))
    mutating_webhook: str = dataclasses.field(default="dra-guard", metadata=key(
        "mutatingWebhookConfiguration", help="self mode: the MutatingWebhookConfiguration whose caBundle is kept right"))
    dir: str = dataclasses.field(default="/run/dra-guard/certs", metadata=key(
        "dir", help="self mode: where the serving files are written; a folder of dra-guard's user "
                    "that no one else may write (created 0700); never a shared one like /tmp"))
    ca_validity_days: int = dataclasses.field(default=3650, metadata=key(
        "caValidityDays", lo=1, hi=36500, help="days the self-made CA is valid"))
    leaf_validity_days: int = dataclasses.field(default=365, metadata=key(
        "leafValidityDays", lo=1, hi=3650, below="caValidityDays",
        help="days the serving certificate is valid; shorter than caValidityDays"))
    renew_after_share: float = dataclasses.field(default=2 / 3, metadata=key(
        "renewAfterShare", lo=0.1, hi=0.95, help="renew once this share of a certificate's lifetime has passed"))
    check_interval_seconds: int = dataclasses.field(default=60, metadata=key(
        "checkIntervalSeconds", lo=1, hi=86400, help="self mode: seconds between reconciles"))
    reload_interval_seconds: int = dataclasses.field(default=10, metadata=key(
        "reloadIntervalSeconds", lo=1, hi=3600, help="seconds between checks of the serving files' digest"))


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """The in-server periodic audit (times in seconds; qps/burst limit its own API requests)."""

    interval_seconds: int = dataclasses.field(default=600, metadata=key(
        "intervalSeconds", lo=0, hi=86400, help="seconds between periodic audits; 0 turns the periodic audit off"))
    qps: float = dataclasses.field(default=10.0, metadata=key(
        "qps", lo=0, lo_exclusive=True, hi=1000, help="the audit's own client-side API rate limit (requests per second)"))
    burst: int = dataclasses.field(default=20, metadata=key(
        "burst", lo=1, hi=1000, help="the audit's API request burst"))
    policy_reports: bool = dataclasses.field(default=True, metadata=key(
        "policyReports", help="write (Cluster)PolicyReports when wgpolicyk8s.io/v1alpha2 is served"))


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """HTTP server settings (gunicorn). Sizes in bytes, times in seconds."""

    key_groups: ClassVar[Mapping[str, str]] = {
        "limits": "the most one review may make dra-guard evaluate; beyond, the policy's failure mode answers"}

    port: int = dataclasses.field(default=8443, metadata=key(
        "port", lo=1, hi=65535, help="the HTTPS port"))
    max_request_bytes: int = dataclasses.field(default=8 * 1024 * 1024, metadata=key(
        "maxRequestBytes", lo=1024, hi=64 * 1024 * 1024, help="request bodies above this many bytes get HTTP 400"))
    workers: int = dataclasses.field(default=1, metadata=key(
        "workers", lo=1, hi=64, help="gunicorn processes; each keeps its own caches"))
    threads: int = dataclasses.field(default=8, metadata=key(
        "threads", lo=1, hi=256, help="gunicorn gthread threads per process"))
    shutdown_delay_seconds: int = dataclasses.field(default=5, metadata=key(
        "shutdownDelaySeconds", lo=0, hi=60,
        help="on SIGTERM: /readyz says no, keep serving this many seconds, then drain"))
    review_deadline_seconds: float = dataclasses.field(default=2.5, metadata=key(
        "reviewDeadlineSeconds", lo=0.1, hi=29,
        help="every review is answered within this many seconds of its arrival, by its policy or else by the "
             "overload answer (eviction: 429 retry); keep below the webhooks' timeoutSeconds (3)"))
    drop_after_seconds: float = dataclasses.field(default=3.0, metadata=key(
        "dropAfterSeconds", lo=0.1, hi=30,
        help="a request still queued after this many seconds is dropped unanswered: the apiserver's timeout has passed"))
    reserved_threads: int = dataclasses.field(default=2, metadata=key(
        "reservedThreads", lo=1, hi=255, below="threads",
        help="threads per worker that RBAC and DaemonSet reviews never hold: kept for evictions and probes"))
    client_ca_file: str = dataclasses.field(default="", metadata=key(
        "clientCAFile",
        help="PEM file of CAs: when set, a client must present a certificate they signed (TLS); "
             "give the apiserver one with an AdmissionConfiguration kubeconfig (docs/reliability.md)"))
    probe_port: int = dataclasses.field(default=0, metadata=key(
        "probePort", lo=0, hi=65535,
        help="0: off; else a second HTTPS port that asks no client certificate, for the kubelet's probes and "
             "Prometheus (/healthz, /readyz, /metrics only); needed with clientCAFile"))
    max_rules: int = dataclasses.field(default=2000, metadata=key(
        "limits.maxRules", lo=1, hi=1_000_000, help="a reviewed object with more RBAC rules is not judged (failure mode)"))
    max_subjects: int = dataclasses.field(default=2000, metadata=key(
        "limits.maxSubjects", lo=1, hi=1_000_000, help="a reviewed binding with more subjects is not judged (failure mode)"))
    max_selector_values: int = dataclasses.field(default=10_000, metadata=key(
        "limits.maxSelectorValues", lo=1, hi=10_000_000,
        help="a reviewed ClusterRole whose aggregationRule has more label values is not judged (failure mode)"))
    max_containers: int = dataclasses.field(default=200, metadata=key(
        "limits.maxContainers", lo=1, hi=100_000,
        help="a reviewed DaemonSet with more containers (init and regular) is not judged (failure mode)"))


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Kubernetes API access settings. Times in seconds.

    request_timeout_seconds (cluster.requestTimeoutSeconds): the timeout of each LIST page of the
    caches, and the whole budget of the API reads an admission may make (ClusterState.fetch_cluster_role,
    ClusterState.refresh_bindings); keep it below the RBAC webhook's timeoutSeconds (3)."""

    request_timeout_seconds: float = dataclasses.field(default=2.0, metadata=key(
        "requestTimeoutSeconds", lo=0, lo_exclusive=True, hi=30,
        help="seconds for each LIST page and for all API reads of one admission; below the RBAC webhook's timeout"))
    binding_refresh_interval_seconds: float = dataclasses.field(default=2.0, metadata=key(
        "bindingRefreshIntervalSeconds", lo=0, hi=300,
        help="at most one full API read of the ClusterRoleBindings per this many seconds (ClusterRole reviews "
             "in between share the last one and the watch)"))


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole validated configuration. Build it with load_config() or from_mapping()."""

    mode: Mode = dataclasses.field(default="enforce", metadata=key(
        "mode", help="enforce refuses and patches, warn allows with a kubectl warning, audit only records"))
    policies: Mapping[str, PolicyConfig] = dataclasses.field(default_factory=dict, metadata=key(
        "policies", names=POLICY_NAMES, help="per-policy mode and failureMode"))
    rbac: RbacConfig = dataclasses.field(default=RbacConfig(), metadata=key(
        "rbac", help="the RBAC guard: who may write DeviceClasses and ResourceSlices"))
    detection: DetectionConfig = dataclasses.field(default=DetectionConfig(), metadata=key(
        "drivers", help="how DRA driver DaemonSets are recognised"))
    probes: ProbeConfig = dataclasses.field(default=ProbeConfig(), metadata=key(
        "probes", help="the gRPC liveness probe added to driver containers"))
    eviction: EvictionConfig = dataclasses.field(default=EvictionConfig(), metadata=key(
        "eviction", help="the drain-order guard: the DRA driver leaves a node last"))
    certificates: CertificatesConfig = dataclasses.field(default=CertificatesConfig(), metadata=key(
        "certificates", chart=False, help="the serving certificate"))
    audit: AuditConfig = dataclasses.field(default=AuditConfig(), metadata=key(
        "audit", help="the in-server periodic audit (one replica at a time)"))
    server: ServerConfig = dataclasses.field(default=ServerConfig(), metadata=key(
        "server", help="the HTTPS server (gunicorn)"))
    cluster: ClusterConfig = dataclasses.field(default=ClusterConfig(), metadata=key(
        "cluster", help="Kubernetes API access"))
    ignored: tuple[str, ...] = ()  # "key: reason" lines for entries that were accepted but have no effect

    def policy(self, name: str) -> PolicyConfig:
        """The settings of policy `name` (one of POLICY_NAMES), falling back to the global mode."""
        return self.policies.get(name) or PolicyConfig(
            mode=self.mode, failure_mode=DEFAULT_FAILURE_MODES.get(name, "deny"))  # type: ignore[arg-type]
