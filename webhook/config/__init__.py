"""dra-guard configuration: one YAML file, loaded and validated once at start-up.

The same file is read by ``dra-guard serve --config`` and ``dra-guard audit --config``, and the
Helm chart renders it into a ConfigMap. Every key is optional; an unknown key, a wrong type or an
unknown mode stops start-up with a ConfigError that names the key (``policies.rbac.mode: ...``).

The file may carry ``apiVersion: dra-guard.io/v1alpha1`` and ``kind: DraGuardConfiguration``
(like KubeSchedulerConfiguration); `dra-guard audit` then also finds it among manifest files.

Example (all defaults shown)::

    apiVersion: dra-guard.io/v1alpha1
    kind: DraGuardConfiguration
    mode: enforce                 # enforce | warn | audit, like validationActions Deny/Warn/Audit
    policies:
      rbac: {mode: enforce, failureMode: deny}
      probes: {mode: enforce, failureMode: allow}
      eviction: {mode: enforce, failureMode: allow}
    drivers:                      # how DRA driver DaemonSets are recognised
      autoDetect: true
      selectors: []               # [{namespace: gpu, matchLabels: {app: gpu-driver}, driverName: gpu.example.com}]
    probes:                       # the gRPC liveness probe added to driver containers
      periodSeconds: 10
      timeoutSeconds: 10
      failureThreshold: 3
      service: liveness
      defaultPort: 51515
      assumeDefaultPort: false    # use defaultPort when a driver declares no health port
      startupProbe: {enabled: false, periodSeconds: 1, failureThreshold: 600}
    eviction:                     # drain order: the DRA driver leaves a node last
      maxCacheAgeSeconds: 180     # caches without news for longer answer 429 "not ready, retry"
      maxListedClaims: 10         # claims named in a refusal, then "and N more"
      guardDeletes: false         # also guard DELETE of driver pods (DaemonSet controller exempt)
      daemonSetControllerUsers: [system:serviceaccount:kube-system:daemon-set-controller, system:kube-controller-manager]
    rbac:
      apiGroup: resource.k8s.io
      adminOnlyResources: [deviceclasses]          # only adminSubjects may write these
      driverResources: [resourceslices]            # adminSubjects and driverSubjects may write these
      writeVerbs: [create, update, patch, delete, deletecollection]
      adminSubjects:
        groups: [system:masters]
        users: []
        serviceAccounts: ["kube-system:*"]   # "namespace:name" or "namespace:*"; kube-system: the controllers
      driverSubjects:
        groups: []
        users: []
        serviceAccounts: []
      aggregationControllerUsers:   # whose rule copies into aggregating roles only warn
        - system:serviceaccount:kube-system:clusterrole-aggregation-controller
        - system:kube-controller-manager
    certificates:                 # the serving certificate
      mode: files                 # self | cert-manager | files
      namespace: ""               # self mode: "" = $POD_NAMESPACE, else dra-guard
      service: dra-guard          # the Service whose DNS names the certificate carries
      extraDnsNames: []
      extraIpAddresses: []        # e.g. 127.0.0.1 for a webhook registered by url
      secretName: dra-guard-tls   # self mode: CA and serving certificate, shared by every replica
      leaseName: dra-guard-certs  # self mode: one replica at a time writes
      validatingWebhookConfiguration: dra-guard   # self mode: whose caBundle is kept right
      mutatingWebhookConfiguration: dra-guard
      dir: /tmp/dra-guard-certs   # self mode: where the serving files are written
      caValidityDays: 3650
      leafValidityDays: 365
      renewAfterShare: 0.6666666666666666   # renew once this share of the lifetime has passed
      checkIntervalSeconds: 60    # self mode: reconcile period
      reloadIntervalSeconds: 10   # how often the serving files' digest is checked
    audit:                        # the in-server periodic audit (one replica at a time)
      intervalSeconds: 600        # 0 turns it off
      qps: 10.0                   # its own client-side API rate limit
      burst: 20
      policyReports: true         # write (Cluster)PolicyReports when wgpolicyk8s.io/v1alpha2 is served
    server:
      port: 8443
      maxRequestBytes: 8388608
      workers: 1
      threads: 8
      shutdownDelaySeconds: 5     # on SIGTERM: /readyz says no, keep serving this long, then drain
    cluster:
      requestTimeoutSeconds: 2
"""
from __future__ import annotations

import dataclasses
import ipaddress
import pathlib
from collections.abc import Mapping
from typing import Any, Final, Literal

import yaml

Mode = Literal["enforce", "warn", "audit"]
FailureMode = Literal["deny", "allow"]

MODES: Final = ("enforce", "warn", "audit")
FAILURE_MODES: Final = ("deny", "allow")
POLICY_NAMES: Final = ("rbac", "probes", "eviction")
# What a policy answers when it fails internally: the RBAC guard fails closed (like its
# failurePolicy: Fail); the probes mutation fails open (a missing probe is not worth blocking a
# driver's rollout; `dra-guard audit` is the backstop).
# The eviction guard fails open too (its chart failurePolicy is Ignore): a broken guard must never
# wedge every drain in the cluster; stale caches are handled separately (429, retry).
DEFAULT_FAILURE_MODES: Final = {"rbac": "deny", "probes": "allow", "eviction": "allow"}
CONFIG_API_VERSION: Final = "dra-guard.io/v1alpha1"
CONFIG_KIND: Final = "DraGuardConfiguration"

# Identities that are never admins or drivers, whatever the config says: they stand for everyone
# (or every ServiceAccount), so granting them DRA write would grant it to the whole cluster.
# Source: Kubernetes RBAC docs, "Default roles and role bindings" / "Referring to subjects".
NEVER_PRIVILEGED_GROUPS: Final = frozenset({"system:authenticated", "system:unauthenticated", "system:serviceaccounts"})
NEVER_PRIVILEGED_GROUP_PREFIXES: Final = ("system:serviceaccounts:",)
NEVER_PRIVILEGED_USERS: Final = frozenset({"system:anonymous"})


class ConfigError(ValueError):
    """The configuration is invalid; the message starts with the offending key's dotted path."""


@dataclasses.dataclass(frozen=True)
class SubjectSet:
    """A set of RBAC identities: user names, group names and ServiceAccounts ("ns:name" / "ns:*")."""

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    service_accounts: frozenset[str] = frozenset()

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

    mode: Mode
    failure_mode: FailureMode


@dataclasses.dataclass(frozen=True)
class RbacConfig:
    """Settings of the RBAC guard (policy ``rbac``)."""

    api_group: str = "resource.k8s.io"
    admin_only_resources: frozenset[str] = frozenset({"deviceclasses"})
    driver_resources: frozenset[str] = frozenset({"resourceslices"})
    write_verbs: frozenset[str] = frozenset({"create", "update", "patch", "delete", "deletecollection"})
    # kube-system's ServiceAccounts are the control plane's controllers: the garbage collector, the
    # namespace controller and the storage version migrator hold write on every resource by design
    admin_subjects: SubjectSet = SubjectSet(groups=frozenset({"system:masters"}), service_accounts=frozenset({"kube-system:*"}))
    driver_subjects: SubjectSet = SubjectSet()
    aggregation_controller_users: frozenset[str] = frozenset({
        "system:serviceaccount:kube-system:clusterrole-aggregation-controller", "system:kube-controller-manager"})

    @property
    def protected_resources(self) -> frozenset[str]:
        """Every resource the guard protects (admin-only plus driver resources)."""
        return self.admin_only_resources | self.driver_resources


@dataclasses.dataclass(frozen=True)
class DriverSelector:
    """A configured way to recognise a driver: DaemonSets in `namespace` whose labels include `match_labels`."""

    namespace: str
    match_labels: Mapping[str, str]
    driver_name: str = ""


@dataclasses.dataclass(frozen=True)
class DetectionConfig:
    """How drivers are recognised: configured selectors, and whether auto-detection runs."""

    selectors: tuple[DriverSelector, ...] = ()
    auto_detect: bool = True


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """The probe dra-guard adds (seconds for periods and timeouts) and where its port comes from."""

    period_seconds: int = 10
    timeout_seconds: int = 10
    failure_threshold: int = 3
    service: str = "liveness"
    default_port: int = 51515
    assume_default_port: bool = False
    startup_probe: bool = False
    startup_period_seconds: int = 1
    startup_failure_threshold: int = 600


@dataclasses.dataclass(frozen=True)
class EvictionConfig:
    """Settings of the drain-order guard (policy ``eviction``). Times in seconds."""

    max_cache_age_seconds: int = 180
    max_listed_claims: int = 10
    guard_deletes: bool = False
    daemonset_controller_users: frozenset[str] = frozenset({
        "system:serviceaccount:kube-system:daemon-set-controller", "system:kube-controller-manager"})


@dataclasses.dataclass(frozen=True)
class CertificatesConfig:
    """How the serving certificate is obtained (times in seconds, validity in days).

    mode "files": the user provides tls.crt/tls.key (serve --tls-cert-file/--tls-key-file);
    "cert-manager": the same files, written by cert-manager into a mounted Secret (its CA
    injector fills caBundle); "self": dra-guard keeps a CA and a serving certificate in the Secret
    `secret_name` of `namespace`, writes them to `dir`, and keeps every caBundle of its webhook
    configurations equal to its CA. In every mode the files are reloaded when their digest changes.
    """

    mode: Literal["self", "cert-manager", "files"] = "files"
    namespace: str = ""             # "" = $POD_NAMESPACE, else "dra-guard"
    service: str = "dra-guard"
    extra_dns_names: tuple[str, ...] = ()
    extra_ip_addresses: tuple[str, ...] = ()
    secret_name: str = "dra-guard-tls"
    lease_name: str = "dra-guard-certs"
    validating_webhook: str = "dra-guard"
    mutating_webhook: str = "dra-guard"
    dir: str = "/tmp/dra-guard-certs"
    ca_validity_days: int = 3650
    leaf_validity_days: int = 365
    renew_after_share: float = 2 / 3
    check_interval_seconds: int = 60
    reload_interval_seconds: int = 10


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """The in-server periodic audit (times in seconds; qps/burst limit its own API requests)."""

    interval_seconds: int = 600
    qps: float = 10.0
    burst: int = 20
    policy_reports: bool = True


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """HTTP server settings (gunicorn). Sizes in bytes, times in seconds."""

    port: int = 8443
    max_request_bytes: int = 8 * 1024 * 1024
    workers: int = 1
    threads: int = 8
    shutdown_delay_seconds: int = 5


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Kubernetes API access settings. Times in seconds.

    request_timeout_seconds (cluster.requestTimeoutSeconds): the timeout of each LIST page of the
    caches, and the whole budget of the API reads an admission may make (ClusterState.fetch_cluster_role,
    ClusterState.refresh_bindings); keep it below the RBAC webhook's timeoutSeconds (3)."""

    request_timeout_seconds: float = 2.0


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole validated configuration. Build it with load_config() or from_mapping()."""

    mode: Mode = "enforce"
    policies: Mapping[str, PolicyConfig] = dataclasses.field(default_factory=dict)
    rbac: RbacConfig = RbacConfig()
    detection: DetectionConfig = DetectionConfig()
    probes: ProbeConfig = ProbeConfig()
    eviction: EvictionConfig = EvictionConfig()
    certificates: CertificatesConfig = CertificatesConfig()
    audit: AuditConfig = AuditConfig()
    server: ServerConfig = ServerConfig()
    cluster: ClusterConfig = ClusterConfig()
    ignored: tuple[str, ...] = ()  # "key: reason" lines for entries that were accepted but have no effect

    def policy(self, name: str) -> PolicyConfig:
        """The settings of policy `name` (one of POLICY_NAMES), falling back to the global mode."""
        return self.policies.get(name) or PolicyConfig(mode=self.mode, failure_mode=DEFAULT_FAILURE_MODES.get(name, "deny"))


class _Reader:
    """Walks a mapping, taking typed keys and reporting unknown ones with their dotted path."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path or '<top level>'}: expected a mapping, got {type(data).__name__}")
        self.data = data
        self.path = path
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def take(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.seen.add(name)
        if name not in self.data or self.data[name] is None:
            return default
        value = self.data[name]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise ConfigError(f"{self.key(name)}: expected a number, got a boolean")
        if not isinstance(value, kind):
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ConfigError(f"{self.key(name)}: expected {want}, got {type(value).__name__} {value!r}")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.take(name, str, default)
        if value not in choices:
            raise ConfigError(f"{self.key(name)}: must be one of {', '.join(choices)}; got {value!r}")
        return value

    def strings(self, name: str, default: frozenset[str]) -> frozenset[str]:
        value = self.take(name, list, None)
        if value is None:
            return default
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{self.key(name)}[{i}]: expected a non-empty string, got {item!r}")
        return frozenset(value)

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        value = self.take(name, int, default)
        if not lo <= value <= hi:
            raise ConfigError(f"{self.key(name)}: must be between {lo} and {hi}; got {value}")
        return value

    def sub(self, name: str) -> _Reader:
        self.seen.add(name)
        return _Reader(self.data.get(name), self.key(name))

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.data if k not in self.seen)
        if unknown:
            raise ConfigError(f"{self.key(unknown[0])}: unknown key (known here: {', '.join(sorted(self.seen))})")


def _subjects(reader: _Reader, default: SubjectSet, ignored: list[str]) -> SubjectSet:
    users = reader.strings("users", default.users)
    groups = reader.strings("groups", default.groups)
    sas = reader.strings("serviceAccounts", default.service_accounts)
    for sa in sas:
        ns, sep, name = sa.partition(":")
        if not sep or not ns or not name or ":" in name:
            raise ConfigError(f"{reader.key('serviceAccounts')}: {sa!r} must be 'namespace:name' or 'namespace:*'")
    for g in sorted(groups):
        if g in NEVER_PRIVILEGED_GROUPS or g.startswith(NEVER_PRIVILEGED_GROUP_PREFIXES):
            ignored.append(f"{reader.key('groups')}: {g} stands for many identities and is never trusted")
    for u in sorted(users):
        if u in NEVER_PRIVILEGED_USERS:
            ignored.append(f"{reader.key('users')}: {u} is never trusted")
    reader.done()
    return SubjectSet(users=users, groups=groups, service_accounts=sas)


def from_mapping(data: Any) -> Config:
    """Validate a parsed config document (a dict, or None for all defaults) into a Config.

    Raises ConfigError naming the first offending key.
    """
    top = _Reader(data, "")
    ignored: list[str] = []
    top.choice("apiVersion", (CONFIG_API_VERSION,), CONFIG_API_VERSION)
    top.choice("kind", (CONFIG_KIND,), CONFIG_KIND)
    mode = top.choice("mode", MODES, "enforce")

    pol_reader = top.sub("policies")
    policies: dict[str, PolicyConfig] = {}
    for name in POLICY_NAMES:
        r = pol_reader.sub(name)
        policies[name] = PolicyConfig(mode=r.choice("mode", MODES, mode),
                                      failure_mode=r.choice("failureMode", FAILURE_MODES, DEFAULT_FAILURE_MODES[name]))
        r.done()
    pol_reader.done()

    rr = top.sub("rbac")
    d = RbacConfig()
    rbac = RbacConfig(
        api_group=rr.take("apiGroup", str, d.api_group),
        admin_only_resources=rr.strings("adminOnlyResources", d.admin_only_resources),
        driver_resources=rr.strings("driverResources", d.driver_resources),
        write_verbs=rr.strings("writeVerbs", d.write_verbs),
        admin_subjects=_subjects(rr.sub("adminSubjects"), d.admin_subjects, ignored),
        driver_subjects=_subjects(rr.sub("driverSubjects"), d.driver_subjects, ignored),
        aggregation_controller_users=rr.strings("aggregationControllerUsers", d.aggregation_controller_users),
    )
    rr.done()

    dr = top.sub("drivers")
    selectors = []
    for i, raw in enumerate(dr.take("selectors", list, [])):
        r = _Reader(raw, f"drivers.selectors[{i}]")
        ns = r.take("namespace", str, "")
        if not ns:
            raise ConfigError(f"drivers.selectors[{i}].namespace: required")
        labels = r.take("matchLabels", dict, {})
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ConfigError(f"drivers.selectors[{i}].matchLabels: keys and values must be strings; got {k!r}: {v!r}")
        selectors.append(DriverSelector(namespace=ns, match_labels=dict(labels), driver_name=r.take("driverName", str, "")))
        r.done()
    detection = DetectionConfig(selectors=tuple(selectors), auto_detect=dr.take("autoDetect", bool, True))
    dr.done()

    pr = top.sub("probes")
    dp = ProbeConfig()
    st = pr.sub("startupProbe")
    probes = ProbeConfig(
        period_seconds=pr.integer("periodSeconds", dp.period_seconds, 1, 3600),
        timeout_seconds=pr.integer("timeoutSeconds", dp.timeout_seconds, 1, 3600),
        failure_threshold=pr.integer("failureThreshold", dp.failure_threshold, 1, 1000),
        service=pr.take("service", str, dp.service),
        default_port=pr.integer("defaultPort", dp.default_port, 1, 65535),
        assume_default_port=pr.take("assumeDefaultPort", bool, dp.assume_default_port),
        startup_probe=st.take("enabled", bool, dp.startup_probe),
        startup_period_seconds=st.integer("periodSeconds", dp.startup_period_seconds, 1, 3600),
        startup_failure_threshold=st.integer("failureThreshold", dp.startup_failure_threshold, 1, 100000),
    )
    st.done()
    pr.done()

    er = top.sub("eviction")
    de = EvictionConfig()
    eviction = EvictionConfig(
        max_cache_age_seconds=er.integer("maxCacheAgeSeconds", de.max_cache_age_seconds, 10, 86400),
        max_listed_claims=er.integer("maxListedClaims", de.max_listed_claims, 1, 1000),
        guard_deletes=er.take("guardDeletes", bool, de.guard_deletes),
        daemonset_controller_users=er.strings("daemonSetControllerUsers", de.daemonset_controller_users),
    )
    er.done()

    cr_ = top.sub("certificates")
    dc = CertificatesConfig()
    share = cr_.take("renewAfterShare", (int, float), dc.renew_after_share)
    if not 0.1 <= share <= 0.95:
        raise ConfigError(f"certificates.renewAfterShare: must be between 0.1 and 0.95; got {share}")
    extra = cr_.strings("extraDnsNames", frozenset())
    extra_ips = cr_.strings("extraIpAddresses", frozenset())
    for ip in extra_ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"certificates.extraIpAddresses: {ip!r} is not an IP address") from None
    certificates = CertificatesConfig(
        mode=cr_.choice("mode", ("self", "cert-manager", "files"), dc.mode),  # type: ignore[arg-type]
        namespace=cr_.take("namespace", str, dc.namespace),
        service=cr_.take("service", str, dc.service),
        extra_dns_names=tuple(sorted(extra)),
        extra_ip_addresses=tuple(sorted(extra_ips)),
        secret_name=cr_.take("secretName", str, dc.secret_name),
        lease_name=cr_.take("leaseName", str, dc.lease_name),
        validating_webhook=cr_.take("validatingWebhookConfiguration", str, dc.validating_webhook),
        mutating_webhook=cr_.take("mutatingWebhookConfiguration", str, dc.mutating_webhook),
        dir=cr_.take("dir", str, dc.dir),
        ca_validity_days=cr_.integer("caValidityDays", dc.ca_validity_days, 1, 36500),
        leaf_validity_days=cr_.integer("leafValidityDays", dc.leaf_validity_days, 1, 3650),
        renew_after_share=float(share),
        check_interval_seconds=cr_.integer("checkIntervalSeconds", dc.check_interval_seconds, 1, 86400),
        reload_interval_seconds=cr_.integer("reloadIntervalSeconds", dc.reload_interval_seconds, 1, 3600),
    )
    if certificates.leaf_validity_days >= certificates.ca_validity_days:
        raise ConfigError("certificates.leafValidityDays: must be shorter than certificates.caValidityDays")
    cr_.done()

    ar = top.sub("audit")
    da = AuditConfig()
    audit_qps = ar.take("qps", (int, float), da.qps)
    if not 0 < audit_qps <= 1000:
        raise ConfigError(f"audit.qps: must be > 0 and <= 1000; got {audit_qps}")
    audit = AuditConfig(interval_seconds=ar.integer("intervalSeconds", da.interval_seconds, 0, 86400),
                        qps=float(audit_qps), burst=ar.integer("burst", da.burst, 1, 1000),
                        policy_reports=ar.take("policyReports", bool, da.policy_reports))
    ar.done()

    sr = top.sub("server")
    ds = ServerConfig()
    server = ServerConfig(
        port=sr.integer("port", ds.port, 1, 65535),
        max_request_bytes=sr.integer("maxRequestBytes", ds.max_request_bytes, 1024, 64 * 1024 * 1024),
        workers=sr.integer("workers", ds.workers, 1, 64),
        threads=sr.integer("threads", ds.threads, 1, 256),
        shutdown_delay_seconds=sr.integer("shutdownDelaySeconds", ds.shutdown_delay_seconds, 0, 60),
    )
    sr.done()

    cr = top.sub("cluster")
    timeout = cr.take("requestTimeoutSeconds", (int, float), ClusterConfig().request_timeout_seconds)
    if not 0 < timeout <= 30:
        raise ConfigError(f"cluster.requestTimeoutSeconds: must be > 0 and <= 30; got {timeout}")
    cr.done()
    top.done()
    return Config(mode=mode, policies=policies, rbac=rbac, detection=detection, probes=probes, eviction=eviction,
                  certificates=certificates, audit=audit, server=server,
                  cluster=ClusterConfig(request_timeout_seconds=float(timeout)), ignored=tuple(ignored))


def load_config(path: str | pathlib.Path | None) -> Config:
    """Read and validate a YAML config file; None gives the defaults.

    Raises ConfigError (file unreadable, invalid YAML with its line, or an invalid key).
    """
    if path is None:
        return from_mapping(None)
    try:
        text = pathlib.Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
    try:
        return from_mapping(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
