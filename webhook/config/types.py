"""The configuration's frozen dataclasses; each field declares its config key (webhook.config.declare)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Final, Literal, get_args

from webhook.config.declare import Key, key
from webhook.config.exceptions import PolicyException
from webhook.config.process import AuditConfig, CertificatesConfig, ClusterConfig, ServerConfig
from webhook.config.subjects import CONTROL_PLANE_USERS, ESCALATION_CHECKS, KUBE_SYSTEM_CONTROLLERS, SubjectSet

Mode = Literal["enforce", "warn", "audit"]
FailureMode = Literal["deny", "allow"]

MODES: Final[tuple[str, ...]] = get_args(Mode)
FAILURE_MODES: Final[tuple[str, ...]] = get_args(FailureMode)
POLICY_NAMES: Final = ("rbac", "probes", "eviction")
# What a policy answers when it fails internally: the RBAC guard fails closed (like its
# failurePolicy: Fail); the probes mutation fails open (a missing probe is not worth blocking a
# driver's rollout; `dra-guard audit` is the backstop).
# The eviction guard fails closed: its webhook only sees the pods of declared drivers
# (drivers.declared, failurePolicy Fail), and an internal error there answers 429 (retry), which
# drains wait out like a PodDisruptionBudget; every other eviction never reaches dra-guard.
DEFAULT_FAILURE_MODES: Final = {"rbac": "deny", "probes": "allow", "eviction": "deny"}
CONFIG_API_VERSION: Final = "dra-guard.io/v1alpha1"
CONFIG_KIND: Final = "DraGuardConfiguration"

#: the file's optional header (like KubeSchedulerConfiguration); `dra-guard audit` finds the file by it
HEADER_KEYS: Final = (
    Key(
        "apiVersion",
        choices=(CONFIG_API_VERSION,),
        chart=False,
        help="the config file's API version; lets `dra-guard audit` find the file among manifests",
    ),
    Key("kind", choices=(CONFIG_KIND,), chart=False, help="the config file's kind"),
)

_STRINGS = "a list of non-empty strings"


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Per-policy settings: the mode its findings are enforced in, what an internal error answers, and
    the review deadline when it differs from server.reviewDeadlineSeconds (seconds; 0: that one)."""

    mode: Mode = dataclasses.field(
        metadata=key(
            "mode",
            inherit="mode",
            help="enforce refuses and patches, warn allows with a kubectl warning, audit only records; unset: the top-level mode",
        )
    )
    failure_mode: FailureMode = dataclasses.field(
        metadata=key(
            "failureMode",
            per_name=DEFAULT_FAILURE_MODES,
            help="what an internal policy error answers: deny refuses the request, allow admits it",
        )
    )
    review_deadline_seconds: float = dataclasses.field(
        default=0.0,
        metadata=key(
            "reviewDeadlineSeconds",
            lo=0,
            hi=29,
            help="each review of this policy is answered within this many seconds of its arrival, else the overload "
            "answer (eviction: 429 retry); keep below this webhook's timeoutSeconds. 0: server.reviewDeadlineSeconds",
        ),
    )

    def deadline_key(self, name: str) -> str:
        """The config key whose value bounds policy `name`'s reviews (for messages)."""
        return f"policies.{name}.reviewDeadlineSeconds" if self.review_deadline_seconds else "server.reviewDeadlineSeconds"


@dataclasses.dataclass(frozen=True)
class RbacConfig:
    """Settings of the RBAC guard (policy ``rbac``)."""

    api_group: str = dataclasses.field(
        default="resource.k8s.io", metadata=key("apiGroup", min_length=1, help="the API group of the protected resources")
    )
    admin_only_resources: frozenset[str] = dataclasses.field(
        default=frozenset({"deviceclasses", "devicetaintrules"}),
        metadata=key(
            "adminOnlyResources", help="resources only adminSubjects may write (a NoExecute DeviceTaintRule evicts pods)"
        ),
    )
    driver_resources: frozenset[str] = dataclasses.field(
        default=frozenset({"resourceslices"}),
        metadata=key(
            "driverResources",
            help="DRA resources of apiGroup (bare or group-qualified: resourceslices, devicetaintrules, deviceclasses, or an adminOnlyResources kind) adminSubjects and driverSubjects may write",
        ),
    )
    write_verbs: frozenset[str] = dataclasses.field(
        default=frozenset({"create", "update", "patch", "delete", "deletecollection"}),
        metadata=key("writeVerbs", help="the verbs that count as write"),
    )
    # only the named kube-system controllers (KUBE_SYSTEM_CONTROLLERS): the garbage collector, the
    # namespace controller and the storage version migrator hold write on every resource by design
    admin_subjects: SubjectSet = dataclasses.field(
        default=SubjectSet(
            groups=frozenset({"system:masters"}), users=CONTROL_PLANE_USERS, service_accounts=KUBE_SYSTEM_CONTROLLERS
        ),
        metadata=key("adminSubjects", help="who may write the admin-only and the driver resources and hold escalation powers"),
    )
    driver_subjects: SubjectSet = dataclasses.field(
        default=SubjectSet(),
        metadata=key(
            "driverSubjects", help="DRA drivers: who may write the driver resources (ResourceSlices), not DeviceClasses"
        ),
    )
    # The extra lists are added to the two above by the loader (and by the chart's matchConditions),
    # so that `helm --set` of one extra admin or driver, which replaces a whole list, never drops
    # the default admins; admin_subjects and driver_subjects hold the unions after loading.
    extra_admin_subjects: SubjectSet = dataclasses.field(
        default=SubjectSet(),
        metadata=key("extraAdminSubjects", help="more adminSubjects, added to that list (set these, keep its defaults)"),
    )
    extra_driver_subjects: SubjectSet = dataclasses.field(
        default=SubjectSet(), metadata=key("extraDriverSubjects", help="more driverSubjects, added to that list")
    )
    aggregation_controller_users: frozenset[str] = dataclasses.field(
        default=frozenset(
            {"system:serviceaccount:kube-system:clusterrole-aggregation-controller", "system:kube-controller-manager"}
        ),
        metadata=key("aggregationControllerUsers", help="users whose rule copies into aggregating roles only warn"),
    )
    escalation_checks: frozenset[str] = dataclasses.field(
        default=frozenset(ESCALATION_CHECKS),
        metadata=key(
            "escalationChecks",
            help="escalation powers judged like DRA write: impersonate, admission (webhook configurations and "
            "admission policies), guard-rbac (dra-guard's own ClusterRole/Binding), bind-escalate (on roles "
            "that hold any of these), namespace-powers (tokens, pods, exec, workloads, secrets in sensitive "
            "namespaces; ConfigMaps, Services and EndpointSlices in dra-guard's own), nodes-csr "
            "(nodes/proxy, CSR approval, kubelet client CSRs), api-routing (APIServices, FlowSchemas and "
            "PriorityLevelConfigurations), admin-access (updating Namespaces and their status and finalize "
            "subresources: the DRA admin-access label), claim-allocation (resourceclaims/status and "
            "resourceclaims/binding update: allocating devices, DRA drivers excepted)",
        ),
    )
    sensitive_namespaces: frozenset[str] = dataclasses.field(
        default=frozenset({"kube-system"}),
        metadata=key(
            "sensitiveNamespaces",
            help="namespaces where acting as a ServiceAccount is a power, besides those of the admin and driver "
            "ServiceAccounts and dra-guard's own",
        ),
    )
    drift_remediation: bool = dataclasses.field(
        default=False,
        metadata=key(
            "driftRemediation",
            help="delete a binding that a watch event shows giving a subject DRA write or a power admission let "
            "through (a race, a writer the webhook never sees); off: report it only (log, metric, Event)",
        ),
    )
    # not config keys: dra-guard's own identity, filled from the certificates section (namespace,
    # service and webhook configuration names, which the chart renders from its release)
    guard_namespace: str = "dra-guard"
    guard_names: frozenset[str] = frozenset({"dra-guard"})
    # not a config key: the namespaces of the other identities that may write DRA objects, filled
    # by Config.with_guard from the rest of the config (the ServiceAccounts rbac exceptions name,
    # the namespaces of drivers.declared, whose pods run as ServiceAccounts that write ResourceSlices)
    writer_namespaces: frozenset[str] = frozenset()
    # not a config key either: where DRA drivers run, the namespaces of drivers.declared and of the
    # driverSubjects ServiceAccounts (deleting a pod there takes a driver off its node:
    # webhook.model.powers.DRIVER_NAMESPACE_POWERS)
    driver_namespaces: frozenset[str] = frozenset()

    @property
    def protected_resources(self) -> frozenset[str]:
        """Every resource the guard protects (admin-only plus driver resources)."""
        return self.admin_only_resources | self.driver_resources

    @property
    def sensitive(self) -> frozenset[str]:
        """Namespaces whose ServiceAccounts hold (or may hold) DRA write: sensitiveNamespaces, the
        namespaces of the admin and driver ServiceAccounts, dra-guard's own, and writer_namespaces
        (the ServiceAccounts of rbac exceptions, the declared drivers' namespaces)."""
        spaces = {
            entry.split(":", 1)[0] for entry in self.admin_subjects.service_accounts | self.driver_subjects.service_accounts
        }
        return frozenset(self.sensitive_namespaces | spaces | self.writer_namespaces | {self.guard_namespace})

    def is_guard(self, kind: str, name: str, namespace: str = "") -> bool:
        """Whether an RBAC subject is dra-guard's own ServiceAccount (trusted in its namespace)."""
        if kind == "User" and name.startswith("system:serviceaccount:") and name.count(":") == 3:
            _, _, namespace, name = name.split(":")
            kind = "ServiceAccount"
        return kind == "ServiceAccount" and namespace == self.guard_namespace and name in self.guard_names


@dataclasses.dataclass(frozen=True)
class DriverSelector:
    """A configured way to recognise a driver: DaemonSets in `namespace` whose labels include `match_labels`."""

    namespace: str = dataclasses.field(
        metadata=key("namespace", required=True, min_length=1, help="the namespace of the driver's DaemonSets")
    )
    match_labels: Mapping[str, str] = dataclasses.field(
        default_factory=dict, metadata=key("matchLabels", help="labels a driver DaemonSet carries (all of them)")
    )
    driver_name: str = dataclasses.field(
        default="",
        metadata=key("driverName", help="the DRA driver name it publishes (e.g. gpu.example.com); several: comma-separated"),
    )
    driver_names: tuple[str, ...] = dataclasses.field(
        default=(), metadata=key("driverNames", help="the DRA driver names it publishes, when one DaemonSet runs several drivers")
    )
    assume_default_port: bool | None = dataclasses.field(
        default=None,
        metadata=key("assumeDefaultPort", help="probes.assumeDefaultPort for these DaemonSets; unset: the global value"),
    )

    @property
    def names(self) -> tuple[str, ...]:
        """driverName (comma-separated) and driverNames, in order, without repeats."""
        found = [n.strip() for n in self.driver_name.split(",")] + [n.strip() for n in self.driver_names]
        return tuple(dict.fromkeys(n for n in found if n))


#: a Kubernetes namespace (DNS label) and object name (DNS subdomain): the chart renders both into
#: the eviction webhook's CEL matchConditions, so nothing else may get there
DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


@dataclasses.dataclass(frozen=True)
class DeclaredDriver:
    """A DRA driver DaemonSet the admin declared by name: recognised as a driver, and the evictions
    of its pods (named ``<name>-<suffix>`` by the DaemonSet controller) go to the chart's
    fail-closed webhook (failurePolicy Fail: refused while dra-guard is slow or down)."""

    namespace: str = dataclasses.field(
        metadata=key(
            "namespace",
            required=True,
            pattern=DNS_LABEL,
            pattern_help="a namespace name (DNS label)",
            help="the DaemonSet's namespace (never dra-guard's own)",
        )
    )
    name: str = dataclasses.field(
        metadata=key(
            "name",
            required=True,
            pattern=DNS_SUBDOMAIN,
            pattern_help="a DaemonSet name (DNS subdomain)",
            help="the DaemonSet's name (its pods are named <name>-<suffix>)",
        )
    )

    @property
    def pod_prefix(self) -> str:
        """The prefix of its pods' names: the DaemonSet controller's generateName."""
        return f"{self.name}-"


@dataclasses.dataclass(frozen=True)
class DetectionConfig:
    """How drivers are recognised: declared DaemonSets, configured selectors, and whether
    auto-detection runs."""

    declared: tuple[DeclaredDriver, ...] = dataclasses.field(
        default=(),
        metadata=key(
            "declared",
            help="DRA driver DaemonSets by namespace and name: always drivers, and their pods' evictions "
            "fail closed (the chart's webhook with failurePolicy Fail); list every driver of the "
            "cluster here (dra-guard reports the ones it recognises that are missing)",
        ),
    )
    selectors: tuple[DriverSelector, ...] = dataclasses.field(
        default=(), metadata=key("selectors", help="DaemonSets that are DRA drivers, besides the auto-detected ones")
    )
    auto_detect: bool = dataclasses.field(
        default=True, metadata=key("autoDetect", help="recognise DRA drivers by what their DaemonSets mount and publish")
    )
    kubelet_root_dirs: tuple[str, ...] = dataclasses.field(
        default=("/var/lib/kubelet",),
        metadata=key(
            "kubeletRootDirs",
            help="the kubelet root directories (--root-dir) of your nodes; a plugins_registry "
            "mount is recognised under any folder too",
        ),
    )

    def is_declared(self, namespace: str, name: str) -> bool:
        """Whether DaemonSet namespace/name is in drivers.declared."""
        return any(d.namespace == namespace and d.name == name for d in self.declared)


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """The probe dra-guard adds (seconds for periods and timeouts) and where its port comes from."""

    key_groups: ClassVar[Mapping[str, str]] = {
        "startupProbe": "a gRPC startupProbe added with the liveness probe, for slow-starting drivers"
    }

    period_seconds: int = dataclasses.field(
        default=10, metadata=key("periodSeconds", lo=1, hi=3600, help="seconds between liveness probes")
    )
    timeout_seconds: int = dataclasses.field(
        default=10, metadata=key("timeoutSeconds", lo=1, hi=3600, help="seconds a probe may take")
    )
    failure_threshold: int = dataclasses.field(
        default=3, metadata=key("failureThreshold", lo=1, hi=1000, help="failed probes in a row before the container restarts")
    )
    service: str = dataclasses.field(default="liveness", metadata=key("service", help="the gRPC health service name probed"))
    default_port: int = dataclasses.field(
        default=51515, metadata=key("defaultPort", lo=1, hi=65535, help="the health port assumed when assumeDefaultPort is set")
    )
    assume_default_port: bool = dataclasses.field(
        default=False, metadata=key("assumeDefaultPort", help="use defaultPort when a driver declares no health port")
    )
    # on by default: device discovery on a real node can take minutes, and a liveness-only probe
    # restarts such a driver before it ever serves (a vendor replaced one for that reason)
    startup_probe: bool = dataclasses.field(
        default=True,
        metadata=key("startupProbe.enabled", help="add the startupProbe (its budget is periodSeconds x failureThreshold)"),
    )
    startup_period_seconds: int = dataclasses.field(
        default=10, metadata=key("startupProbe.periodSeconds", lo=1, hi=3600, help="seconds between startup probes")
    )
    startup_failure_threshold: int = dataclasses.field(
        default=30,
        metadata=key(
            "startupProbe.failureThreshold", lo=1, hi=100000, help="failed startup probes before the container restarts"
        ),
    )


@dataclasses.dataclass(frozen=True)
class EvictionConfig:
    """Settings of the drain-order guard (policy ``eviction``). Times in seconds."""

    max_cache_age_seconds: int = dataclasses.field(
        default=180,
        metadata=key("maxCacheAgeSeconds", lo=10, hi=86400, help="caches without news for longer answer 429 'not ready, retry'"),
    )
    max_listed_claims: int = dataclasses.field(
        default=10, metadata=key("maxListedClaims", lo=1, hi=1000, help="claims named in a refusal, then 'and N more'")
    )
    guard_deletes: bool = dataclasses.field(
        default=True,
        metadata=key(
            "guardDeletes",
            help="also guard DELETE (and deletecollection) of declared driver pods; off: only evictions are judged",
        ),
    )
    daemonset_controller_users: frozenset[str] = dataclasses.field(
        default=frozenset({"system:serviceaccount:kube-system:daemon-set-controller", "system:kube-controller-manager"}),
        metadata=key(
            "daemonSetControllerUsers",
            help="the DaemonSet controller's user names: their DELETE of a driver pod of an older template is a "
            "rolling update, allowed (with a warning) when a new pod will come back on the node",
        ),
    )
    garbage_collector_users: frozenset[str] = dataclasses.field(
        default=frozenset({"system:serviceaccount:kube-system:generic-garbage-collector"}),
        metadata=key(
            "garbageCollectorUsers",
            help="the garbage collector's user names: its DELETEs (the pods of a deleted DaemonSet) are never sent to dra-guard",
        ),
    )


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole validated configuration. Build it with load_config() or from_mapping()."""

    mode: Mode = dataclasses.field(
        default="enforce",
        metadata=key("mode", help="enforce refuses and patches, warn allows with a kubectl warning, audit only records"),
    )
    policies: Mapping[str, PolicyConfig] = dataclasses.field(
        default_factory=dict,
        metadata=key("policies", names=POLICY_NAMES, help="per-policy mode, failureMode and reviewDeadlineSeconds"),
    )
    rbac: RbacConfig = dataclasses.field(
        default=RbacConfig(), metadata=key("rbac", help="the RBAC guard: who may write DeviceClasses and ResourceSlices")
    )
    detection: DetectionConfig = dataclasses.field(
        default=DetectionConfig(), metadata=key("drivers", help="how DRA driver DaemonSets are recognised")
    )
    probes: ProbeConfig = dataclasses.field(
        default=ProbeConfig(), metadata=key("probes", help="the gRPC liveness probe added to driver containers")
    )
    eviction: EvictionConfig = dataclasses.field(
        default=EvictionConfig(), metadata=key("eviction", help="the drain-order guard: the DRA driver leaves a node last")
    )
    certificates: CertificatesConfig = dataclasses.field(
        default=CertificatesConfig(), metadata=key("certificates", chart=False, help="the serving certificate")
    )
    audit: AuditConfig = dataclasses.field(
        default=AuditConfig(), metadata=key("audit", help="the in-server periodic audit (one replica at a time)")
    )
    server: ServerConfig = dataclasses.field(default=ServerConfig(), metadata=key("server", help="the HTTPS server (gunicorn)"))
    cluster: ClusterConfig = dataclasses.field(default=ClusterConfig(), metadata=key("cluster", help="Kubernetes API access"))
    exceptions: tuple[PolicyException, ...] = dataclasses.field(
        default=(),
        metadata=key(
            "exceptions",
            help="findings an admin excepts on one named object, with a reason, an owner and an expiry "
            "(docs/policies/exceptions.md): not enforced at admission, skip in audits, findings once expired",
        ),
    )
    ignored: tuple[str, ...] = ()  # "key: reason" lines for entries that were accepted but have no effect

    def with_guard(self, namespace: str) -> Config:
        """This config with dra-guard's own identity (namespace, ClusterRole/Binding and
        ServiceAccount names) filled into rbac from the certificates section, and the declared
        drivers' namespaces (sensitive: webhook.config.RbacConfig.sensitive)."""
        names = frozenset({self.certificates.service, self.certificates.validating_webhook} - {""})
        # an exception lets its ServiceAccounts write DRA objects, and a declared driver's pods run as
        # ServiceAccounts of its namespace that do: acting as any of them is as good as that write
        writers = {
            entry.split(":", 1)[0] for e in self.exceptions if e.policy == "rbac" for entry in e.subjects.service_accounts
        } | {d.namespace for d in self.detection.declared}
        return dataclasses.replace(
            self,
            rbac=dataclasses.replace(
                self.rbac,
                guard_namespace=namespace or "dra-guard",
                guard_names=names or frozenset({"dra-guard"}),
                writer_namespaces=frozenset(writers),
                driver_namespaces=frozenset(d.namespace for d in self.detection.declared)
                | {entry.split(":", 1)[0] for entry in self.rbac.driver_subjects.service_accounts},
            ),
        )

    def policy(self, name: str) -> PolicyConfig:
        """The settings of policy `name` (one of POLICY_NAMES), falling back to the global mode."""
        return self.policies.get(name) or PolicyConfig(mode=self.mode, failure_mode=DEFAULT_FAILURE_MODES.get(name, "deny"))  # type: ignore[arg-type]
