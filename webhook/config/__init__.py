"""dra-guard configuration: one YAML file, loaded and validated once at start-up.

The same file is read by ``dra-guard serve --config`` and ``dra-guard audit --config``, and the
Helm chart renders it into a ConfigMap. Every key is optional; an unknown key, a wrong type or an
unknown mode stops start-up with a ConfigError that names the key (``policies.rbac.mode: ...``).

The file may carry ``apiVersion: dra-guard.io/v1alpha1`` and ``kind: DraGuardConfiguration``
(like KubeSchedulerConfiguration); `dra-guard audit` then also finds it among manifest files.

Each key is declared once, on the dataclass field that holds it (webhook.config.types, with
webhook.config.declare.key: name, default, bounds, help); webhook.config.load reads a file by
walking those declarations and ``python -m webhook.config.schema`` prints the JSON schema made from
them (``--write`` updates the Helm chart's values.schema.json).

Example (all defaults shown)::

    apiVersion: dra-guard.io/v1alpha1
    kind: DraGuardConfiguration
    mode: enforce                 # enforce | warn | audit, like validationActions Deny/Warn/Audit
    policies:
      rbac: {mode: enforce, failureMode: deny, reviewDeadlineSeconds: 0}   # 0: server.reviewDeadlineSeconds
      probes: {mode: enforce, failureMode: allow, reviewDeadlineSeconds: 0}
      eviction: {mode: enforce, failureMode: deny, reviewDeadlineSeconds: 0}    # deny: 429, drains retry
    drivers:                      # how DRA driver DaemonSets are recognised
      declared: []                # [{namespace: gpu, name: gpu-driver}]: drivers whose evictions fail closed
      autoDetect: true
      kubeletRootDirs: [/var/lib/kubelet]   # the kubelet --root-dir of your nodes; plugins_registry is found anywhere
      selectors: []               # [{namespace: gpu, matchLabels: {app: gpu-driver}, driverNames: [gpu.example.com],
                                  #   assumeDefaultPort: true}]: unset, probes.assumeDefaultPort
    probes:                       # the gRPC liveness probe added to driver containers
      periodSeconds: 10
      timeoutSeconds: 10
      failureThreshold: 3
      service: liveness
      defaultPort: 51515
      assumeDefaultPort: false    # use defaultPort when a driver declares no health port
      startupProbe: {enabled: true, periodSeconds: 10, failureThreshold: 30}   # 5 min for device discovery
    eviction:                     # drain order: the DRA driver leaves a node last
      maxCacheAgeSeconds: 180     # caches without news for longer answer 429 "not ready, retry"
      maxListedClaims: 10         # claims named in a refusal, then "and N more"
      guardDeletes: true          # also guard DELETE and deletecollection of declared driver pods
      daemonSetControllerUsers: [system:serviceaccount:kube-system:daemon-set-controller, system:kube-controller-manager]
      garbageCollectorUsers: [system:serviceaccount:kube-system:generic-garbage-collector]
    rbac:
      apiGroup: resource.k8s.io
      adminOnlyResources: [deviceclasses, devicetaintrules]  # only adminSubjects may write these
      driverResources: [resourceslices]            # adminSubjects and driverSubjects may write these
      writeVerbs: [create, update, patch, delete, deletecollection]
      adminSubjects:
        groups: [system:masters]
        users: [system:kube-controller-manager, system:kube-scheduler]
        serviceAccounts:            # "namespace:name" ("namespace/name", "system:serviceaccount:namespace:name";
                                    # name *: all of a namespace): the kube-system controllers the v1.37
                                    # bootstrap RBAC gives DRA write or an escalation power
          - kube-system:bootstrap-signer
          - kube-system:certificate-controller
          - kube-system:cronjob-controller
          - kube-system:daemon-set-controller
          - kube-system:deployment-controller
          - kube-system:device-taint-eviction-controller
          - kube-system:endpoint-controller
          - kube-system:endpointslice-controller
          - kube-system:endpointslicemirroring-controller
          - kube-system:generic-garbage-collector
          - kube-system:job-controller
          - kube-system:legacy-service-account-token-cleaner
          - kube-system:namespace-controller
          - kube-system:node-controller
          - kube-system:persistent-volume-binder
          - kube-system:pod-garbage-collector
          - kube-system:replicaset-controller
          - kube-system:replication-controller
          - kube-system:resource-claim-controller
          - kube-system:resourcequota-controller
          - kube-system:root-ca-cert-publisher
          - kube-system:statefulset-controller
          - kube-system:storage-version-migrator-controller
          - kube-system:token-cleaner
      driverSubjects:
        groups: []
        users: []
        serviceAccounts: []
      extraAdminSubjects:           # added to adminSubjects: set these, keep the defaults above
        groups: []
        users: []
        serviceAccounts: []
      extraDriverSubjects:          # added to driverSubjects
        groups: []
        users: []
        serviceAccounts: []
      aggregationControllerUsers:   # whose rule copies into aggregating roles only warn
        - system:serviceaccount:kube-system:clusterrole-aggregation-controller
        - system:kube-controller-manager
      escalationChecks: [admin-access, admission, api-routing, bind-escalate, claim-allocation, guard-rbac, impersonate, namespace-powers, nodes-csr]
      sensitiveNamespaces: [kube-system]  # besides the admin/driver ServiceAccounts' and dra-guard's own
      driftRemediation: false       # delete a binding a watch event shows violating (off: report only)
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
      webhooksConfigMap: ""       # self mode: ConfigMap with webhooks.json; set: configurations kept whole
      dir: /run/dra-guard/certs    # self mode: where the serving files are written (ours, 0700)
      caValidityDays: 3650
      leafValidityDays: 365
      renewAfterShare: 0.6666666666666666   # renew once this share of the lifetime has passed
      checkIntervalSeconds: 60    # self mode: reconcile period
      reloadIntervalSeconds: 10   # how often the serving files' digest is checked
    audit:                        # the in-server periodic audit (one replica at a time)
      intervalSeconds: 600        # 0 turns it off
      qps: 10.0                   # its own client-side API rate limit
      burst: 20
      policyReports: true         # write its reports when their report API is served
      reportFormat: wgpolicyk8s.io  # or openreports.io, or both
      reportOwnerClusterRole: ""  # the reports' owner (the garbage collector deletes them with it); the chart sets it
    server:
      port: 8443
      maxRequestBytes: 8388608
      workers: 1
      threads: 8
      shutdownDelaySeconds: 5     # on SIGTERM: /readyz says no, keep serving this long, then drain
      reviewDeadlineSeconds: 2.5  # every review answered within this (else the overload answer; eviction: 429)
      dropAfterSeconds: 3         # requests queued longer are dropped: the apiserver gave up on them
      clientCAFile: ""            # set: only clients with a certificate of these CAs (the apiserver) are served
      probePort: 0                # a port without client certificates for probes and /metrics (0: off)
      limits:                     # beyond these a review is not judged: its failure mode answers
        maxRules: 2000
        maxSubjects: 2000
        maxSelectorValues: 10000
        maxContainers: 200
    cluster:
      requestTimeoutSeconds: 2
      startupWaitSeconds: 60      # at start-up, retry an API restarting (refused, timeout, 429/5xx) this long
      apiCheckIntervalSeconds: 30   # APIServices of the groups it reads served by the apiserver (else not ready)
      bindingRefreshIntervalSeconds: 2   # at most one full ClusterRoleBinding read per this many seconds
    exceptions: []                # [{policy: rbac, kind: ClusterRoleBinding, name: gpu-ops, roleRef: slice-writer,
                                  #   subjects: {groups: [gpu-ops]}, resources: [resourceslices], reason: ...,
                                  #   owner: team-gpu, expires: "2026-12-31T00:00:00Z"}] (docs/policies/exceptions.md)
"""

from __future__ import annotations

from webhook.config.declare import ConfigError
from webhook.config.exceptions import EXCEPTABLE, PolicyException
from webhook.config.load import from_mapping, load_config
from webhook.config.process import AuditConfig, CertificatesConfig, ClusterConfig, ServerConfig
from webhook.config.subjects import (
    ESCALATION_CHECKS,
    KUBE_SYSTEM_CONTROLLERS,
    NEVER_PRIVILEGED_GROUP_PREFIXES,
    NEVER_PRIVILEGED_GROUPS,
    NEVER_PRIVILEGED_USERS,
    SubjectSet,
)
from webhook.config.types import (
    CONFIG_API_VERSION,
    CONFIG_KIND,
    DEFAULT_FAILURE_MODES,
    FAILURE_MODES,
    MODES,
    POLICY_NAMES,
    Config,
    DeclaredDriver,
    DetectionConfig,
    DriverSelector,
    EvictionConfig,
    FailureMode,
    Mode,
    PolicyConfig,
    ProbeConfig,
    RbacConfig,
)

__all__ = [
    "CONFIG_API_VERSION",
    "CONFIG_KIND",
    "DEFAULT_FAILURE_MODES",
    "ESCALATION_CHECKS",
    "EXCEPTABLE",
    "FAILURE_MODES",
    "KUBE_SYSTEM_CONTROLLERS",
    "MODES",
    "NEVER_PRIVILEGED_GROUPS",
    "NEVER_PRIVILEGED_GROUP_PREFIXES",
    "NEVER_PRIVILEGED_USERS",
    "POLICY_NAMES",
    "AuditConfig",
    "CertificatesConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DeclaredDriver",
    "DetectionConfig",
    "DriverSelector",
    "EvictionConfig",
    "FailureMode",
    "Mode",
    "PolicyConfig",
    "PolicyException",
    "ProbeConfig",
    "RbacConfig",
    "ServerConfig",
    "SubjectSet",
    "from_mapping",
    "load_config",
]
