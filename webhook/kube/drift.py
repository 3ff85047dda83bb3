"""RbacDrift: every replica re-judges RBAC on each watch event and reports what admission let
through (docs/threat-model.md, path 9: a role and a binding of it written at the same moment, a role created
by an identity the webhook never sees, a binding stored in warn or audit mode).

Called by ClusterState after the RBAC index took the event in. A binding event judges that
binding; a role event judges every binding the role reaches (webhook.policies.rbac). Each new
violation (deduplicated per process until it goes away) is reported within the watch's delay:
- a JSON log line "RBAC violation admission let through" (logger dra_guard.drift, warning);
- dra_guard_rbac_drift_violations_total{kind, action="reported"};
- a Kubernetes Event (reason RbacViolation, type Warning) on the binding, in its namespace
  ("default" for a ClusterRoleBinding, where the apiserver keeps cluster-scoped objects' Events);
- with rbac.driftRemediation (off by default): the binding is deleted (action="remediated").
A finding a live exception of the config covers (webhook.policies.exceptions) is none of these.
The periodic audit and its PolicyReports list the same findings at their next run.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Mapping
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook import metrics
from webhook.config import Config
from webhook.kube.client import count
from webhook.model.rbac_index import RbacIndex
from webhook.model.readers import name_of, namespace_of
from webhook.policies import exceptions, rbac
from webhook.policies.decision import Finding

log = logging.getLogger("dra_guard.drift")

BINDING_KINDS = ("ClusterRoleBinding", "RoleBinding")


class RbacDrift:
    """Re-judges bindings on RBAC watch events (see the module docstring).

    client None: log and metric only (tests, --no-cluster). `seen` keeps the reported
    (kind, namespace, name, subject, resources) keys so an unchanged violation is reported once.
    """

    def __init__(self, index: RbacIndex, config: Config, client: kubernetes.client.ApiClient | None) -> None:
        self.index = index
        self.config = config
        self.client = client
        self._lock = threading.Lock()
        self._seen: set[tuple[str, ...]] = set()

    def __call__(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """Judge one watch event: kind ClusterRole, Role, ClusterRoleBinding or RoleBinding; event
        ADDED, MODIFIED or DELETED; obj the object dict. Never raises (a report that fails is logged)."""
        try:
            if event == "DELETED":
                self._forget(kind, namespace_of(obj), name_of(obj))
                return
            cfg = self.config.rbac
            bindings = [obj] if kind in BINDING_KINDS else rbac.bindings_reaching(self.index, cfg, obj)
            for binding in bindings:
                findings = self._not_excepted(rbac.judge_binding(self.index, cfg, binding))
                key_kind = "RoleBinding" if namespace_of(binding) else "ClusterRoleBinding"
                if not findings:
                    self._forget(key_kind, namespace_of(binding), name_of(binding))
                for f in findings:
                    self._report(f)
        except Exception:  # a broken report must never stop the informer feeding the caches
            log.exception("judging an RBAC watch event failed", extra={"kind": kind, "object": name_of(obj)})

    def _not_excepted(self, findings: list[Finding]) -> list[Finding]:
        """`findings` without those a live exception of the config covers: admission let them
        through on purpose (an expired exception covers nothing: those are reported)."""
        now = datetime.datetime.now(datetime.UTC)
        return [f for f in findings if (e := exceptions.covering(f, self.config.exceptions)) is None or not e.live(now)]

    def _forget(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._seen = {k for k in self._seen if k[:3] != (kind, namespace, name)}

    def _report(self, f: Finding) -> None:
        key = (f.kind, f.namespace, f.name, str(f.details.get("subject")), ",".join(f.details.get("resources", [])))
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        remediate = self.config.rbac.drift_remediation and self.client is not None
        log.warning(
            "RBAC violation admission let through",
            extra={
                "kind": f.kind,
                "namespace": f.namespace,
                "object": f.name,
                "check": f.check,
                "subject": f.details.get("subject"),
                "resources": f.details.get("resources"),
                "remediate": remediate,
                "detail": f.message,
            },
        )
        metrics.RBAC_DRIFT.labels(kind=f.kind, action="reported").inc()
        if self.client is None:
            return
        self._event(f, remediate)
        if remediate:
            self._delete(f)

    def _event(self, f: Finding, remediated: bool) -> None:
        assert self.client is not None
        namespace = f.namespace or "default"
        now = datetime.datetime.now(datetime.UTC)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{f.name}.dra-guard.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": f.kind,
                "name": f.name,
                **({"namespace": f.namespace} if f.namespace else {}),
            },
            "reason": "RbacViolation",
            "type": "Warning",
            "message": (("Deleted by dra-guard (rbac.driftRemediation): " if remediated else "") + f.message)[:1024],
            "source": {"component": "dra-guard"},
            "reportingComponent": "dra-guard",
            "reportingInstance": "dra-guard",
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        count("create", "events")
        try:
            kubernetes.client.CoreV1Api(self.client).create_namespaced_event(namespace, body, _request_timeout=5)
        except ApiException as exc:
            metrics.KUBE_API_ERRORS.labels(resource="events").inc()
            log.warning("writing the Event of an RBAC violation failed: HTTP %s", exc.status, extra={"object": f.name})
        except Exception as exc:  # timeouts and connection errors come in many urllib3 types
            metrics.KUBE_API_ERRORS.labels(resource="events").inc()
            log.warning("writing the Event of an RBAC violation failed: %s", type(exc).__name__, extra={"object": f.name})

    def _delete(self, f: Finding) -> None:
        assert self.client is not None
        api = kubernetes.client.RbacAuthorizationV1Api(self.client)
        resource = "rolebindings" if f.namespace else "clusterrolebindings"
        count("delete", resource)
        try:
            if f.namespace:
                api.delete_namespaced_role_binding(f.name, f.namespace, _request_timeout=5)
            else:
                api.delete_cluster_role_binding(f.name, _request_timeout=5)
        except ApiException as exc:
            if exc.status != 404:
                metrics.KUBE_API_ERRORS.labels(resource=resource).inc()
                log.warning("deleting %s %s failed: HTTP %s", f.kind, f.name, exc.status)
                return
        metrics.RBAC_DRIFT.labels(kind=f.kind, action="remediated").inc()
