"""Prometheus metrics of dra-guard (prometheus-client), defined once for the whole process.

Names follow anchors.md: dra_guard_admission_requests_total{policy,operation,decision,mode},
dra_guard_admission_duration_seconds{policy} (buckets up to 10 s, above any webhook timeout),
dra_guard_admission_violations_total{policy,mode}, cache and Kubernetes API counters.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ADMISSION_REQUESTS = Counter(
    "dra_guard_admission_requests_total",
    "AdmissionReviews answered, by policy, operation, decision (allow, deny, warn, audit, error) and mode.",
    ["policy", "operation", "decision", "mode"],
)
ADMISSION_DURATION = Histogram(
    "dra_guard_admission_duration_seconds",
    "Time to judge one AdmissionReview (parse, policy, serialise), in seconds; the wait before it is in "
    "dra_guard_review_age_seconds.",
    ["policy"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
REVIEW_AGE = Histogram(
    "dra_guard_review_age_seconds",
    "Seconds from a review's arrival (its bytes reaching the host; the worker's queue included) to its answer, "
    "by policy: what the apiserver's timeoutSeconds is measured against. dra_guard_admission_duration_seconds "
    "is the judging alone.",
    ["policy"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 10.0),
)
VIOLATIONS = Counter(
    "dra_guard_admission_violations_total",
    "Findings at admission that enforce mode refuses, by policy and the mode they were decided under.",
    ["policy", "mode"],
)
FINDINGS = Counter(
    "dra_guard_findings_total",
    "Every finding at admission (refusals and advisories), by policy, check and mode.",
    ["policy", "check", "mode"],
)
PATCHES = Counter(
    "dra_guard_patches_total",
    "Reviews answered with a JSON patch (enforce mode of mutating policies), by policy.",
    ["policy"],
)
BAD_REQUESTS = Counter(
    "dra_guard_bad_requests_total",
    "Requests answered with HTTP 400 because the body was not a usable AdmissionReview.",
    ["path"],
)
POLICY_ERRORS = Counter(
    "dra_guard_policy_errors_total",
    "Internal errors inside a policy (answered by the policy's failureMode).",
    ["policy"],
)
KUBE_API_REQUESTS = Counter(
    "dra_guard_kube_api_requests_total",
    "Requests dra-guard made to the Kubernetes API, by verb and resource.",
    ["verb", "resource"],
)
KUBE_API_ERRORS = Counter(
    "dra_guard_kube_api_errors_total",
    "Failed list/watch requests to the Kubernetes API, by resource.",
    ["resource"],
)
CLIENT_TIMEOUTS = Counter(
    "dra_guard_client_timeouts_total",
    "Connections closed because the client stalled (2 s per operation, 5 s per request).",
)
TLS_HANDSHAKES = Counter(
    "dra_guard_tls_handshakes_total",
    "TLS handshakes completed (new connections). Against dra_guard_admission_requests_total: how many reviews "
    "arrive on a new connection; each costs about as much CPU as judging a review.",
)
BINDING_REFRESHES = Counter(
    "dra_guard_binding_refreshes_total",
    "Reads of every ClusterRoleBinding before judging a ClusterRole with DeviceClass/ResourceSlice write, by "
    "outcome: read (in full), shared (served by a concurrent read), recent (within cluster.bindingRefreshIntervalSeconds of the last read), partial (budget ran out: judged from the "
    "cache), failed (answered by the failureMode).",
    ["outcome"],
)
RBAC_DRIFT = Counter(
    "dra_guard_rbac_drift_violations_total",
    "RBAC violations seen on a watch event that admission let through (a race, a writer the webhook "
    "never sees, warn/audit mode), by kind of the offending binding and action: reported, remediated.",
    ["kind", "action"],
)
CACHE_LIST_SECONDS = Gauge(
    "dra_guard_cache_list_seconds",
    "Seconds the last full LIST of a cache took, pages and indexing included (start-up and every relist).",
    ["cache"],
)
CACHE_OBJECTS = Gauge(
    "dra_guard_cache_objects",
    "Objects a cache holds now (compact index entries; Pods only those that are DaemonSet-owned or use "
    "ResourceClaims), by cache. Worker memory grows with these: alert before the container's limit (docs/operations/sizing.md).",
    ["cache"],
)
CACHE_SYNCED = Gauge(
    "dra_guard_cache_synced",
    "1 when the cache has listed and keeps its watch, 0 otherwise.",
    ["cache"],
)
DRIVER_EVICTIONS = Counter(
    "dra_guard_driver_evictions_total",
    "Evictions of DRA driver pods, by driver and decision (refused with 429 while claims need the driver, or allowed).",
    ["driver", "decision"],
)
EVICTION_RECORDS = Counter(
    "dra_guard_eviction_records_total",
    "Writes of the shared record (a Lease per DaemonSet and node) that must be owned before a DRA driver pod leaves "
    "on the strength of a Ready peer while claims need its driver, by result: created, renewed (a retried "
    "eviction), taken_over (a stale record), conflict (another pod is leaving: 429), error (not written: 429 in "
    "enforce mode).",
    ["result"],
)
UNDECLARED_DRIVERS = Gauge(
    "dra_guard_undeclared_drivers",
    "1 for each DaemonSet dra-guard recognises as a DRA driver that drivers.declared does not list (its pods' "
    "evictions are not sent to dra-guard), by the DaemonSet's namespace (daemonset_namespace: `namespace` is the "
    "scrape target's) and name.",
    ["daemonset_namespace", "daemonset"],
)
BLOCKING_CLAIMS = Gauge(
    "dra_guard_blocking_claims",
    "ResourceClaims that held a node's DRA driver at the last refused eviction there, by node.",
    ["node"],
)
CERT_EXPIRY = Gauge(
    "dra_guard_certificate_expiry_timestamp_seconds",
    "When a certificate dra-guard serves or manages expires (Unix time, seconds), by cert (serving, ca).",
    ["cert"],
)
CERT_RECONCILE = Counter(
    "dra_guard_certificate_reconciles_total",
    "Rounds of the self-managed certificate reconciler (certificates.mode self), by result (ok, error).",
    ["result"],
)
WEBHOOK_DRIFT = Gauge(
    "dra_guard_webhook_configuration_drift",
    "Differences between dra-guard's live webhook configuration and the webhooks the chart rendered "
    "(certificates.mode self with webhooksConfigMap) at this replica's last check, by kind (validating, mutating).",
    ["kind"],
)
WEBHOOK_RESTORES = Counter(
    "dra_guard_webhook_configuration_restores_total",
    "Times this replica restored a drifted webhook configuration to the chart's webhooks, by kind.",
    ["kind"],
)
API_REDIRECTED = Gauge(
    "dra_guard_api_redirected",
    "1 when an APIService of a group dra-guard reads is served by a Service instead of the kube-apiserver "
    "(dra-guard is then not ready), by apiservice.",
    ["apiservice"],
)
ADMIN_ACCESS_NAMESPACES = Gauge(
    "dra_guard_admin_access_namespaces",
    "Namespaces labelled resource.kubernetes.io/admin-access=true (their ResourceClaims may use any device) at "
    "the last periodic cluster audit (only on the replica that ran it).",
)
AUDIT_VIOLATIONS = Gauge(
    "dra_guard_violations",
    "Findings of the last periodic cluster audit, by policy and mode (only on the replica that ran it).",
    ["policy", "mode"],
)
DRIVER_DOORS = Gauge(
    "dra_guard_driver_doors_open",
    "Findings of the last periodic cluster audit about ways a declared DRA driver's pod can leave its node "
    "that admission cannot refuse, by check: driver-preemptible (its priority is below system-node-critical), "
    "driver-taint-evictable (it does not tolerate NoExecute taints), status-writer (a non-admin may write "
    "pods/status or nodes), declared-driver-missing, declared-driver-unmatched (docs/policies/eviction.md, "
    "'Every way off the node'); only on the replica that ran it.",
    ["check"],
)
AUDIT_EXCEPTED = Gauge(
    "dra_guard_audit_excepted_findings",
    "Findings of the last periodic cluster audit covered by an exception of the config, by state: active "
    "(reported as skip) or expired (reported again, with an exception-expired finding); only on the replica "
    "that ran it.",
    ["state"],
)
EXCEPTIONS = Gauge(
    "dra_guard_exceptions",
    "Exceptions in the config (key exceptions), by state: active (before their expires) or expired; read at each scrape.",
    ["state"],
)
EXCEPTION_MATCHES = Counter(
    "dra_guard_admission_excepted_total",
    "Admission reviews whose findings an exception covered, by policy and the exception's state: active (let "
    "through with a warning naming it) or expired (judged as without it).",
    ["policy", "state"],
)
AUDIT_LAST_RUN = Gauge(
    "dra_guard_audit_last_run_timestamp_seconds",
    "When this replica last completed the periodic cluster audit (Unix time, seconds).",
)
AUDIT_LAST_SECONDS = Gauge(
    "dra_guard_audit_last_duration_seconds",
    "Wall time of this replica's last periodic cluster audit (seconds; it runs in a process of its own).",
)
AUDIT_PEAK_RSS = Gauge(
    "dra_guard_audit_process_peak_rss_bytes",
    "Peak resident memory of the last periodic audit's process (bytes): it counts in the container's memory "
    "limit beside the worker's while it runs.",
)
NOT_JUDGED = Counter(
    "dra_guard_reviews_not_judged_total",
    "Reviews answered without being judged (server.limits, overload, server.reviewDeadlineSeconds), "
    "by policy and cause (limit, overload, deadline): eviction 429, else the policy's failureMode.",
    ["policy", "cause"],
)
DROPPED_REQUESTS = Counter(
    "dra_guard_requests_dropped_total",
    "Requests closed unanswered because they had waited longer than server.dropAfterSeconds (in the kernel's "
    "accept queue and the worker's queue): their apiserver has given up on them.",
)
CONNECTIONS_RECLAIMED = Counter(
    "dra_guard_idle_connections_reclaimed_total",
    "Idle connections a worker closed at its connection limit to accept connections waiting in the accept queue "
    "(those that never sent a byte or a request first, then the longest idle).",
)
CONNECTIONS_REFUSED = Counter(
    "dra_guard_connections_refused_total",
    "New connections to the webhook port a worker reset at once, without a TLS handshake, "
    "because it was overloaded: its held connections get the overload answer; a new one would cost a handshake.",
)
ACCEPT_QUEUE = Gauge(
    "dra_guard_accept_queue_connections",
    "Connections the kernel has completed on this worker's listening sockets that the worker has not accepted "
    "yet. Above 0 for long: past the worker's capacity or its connection limit; once the listen backlog is full "
    "the kernel drops new connections and clients retry after 1 s, 3 s, ... (unseen by the worker).",
)

GC_PAUSES = Histogram(
    "dra_guard_gc_pause_seconds",
    "Collections of Python's cyclic garbage collector in this worker, by generation, in seconds: "
    "every thread waits while one runs (a cause of review latency with large caches).",
    ["generation"],
    buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2.0),
)
