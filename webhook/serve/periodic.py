"""The in-server periodic audit: `dra-guard audit --cluster` every audit.intervalSeconds, run by
one replica at a time (the holder of the Lease `<certificates.leaseName>-audit`), publishing the
gauge dra_guard_violations{policy,mode} and, when the wgpolicyk8s.io/v1alpha2 CRDs are installed,
dra-guard's ClusterPolicyReport and PolicyReports (replacing its previous ones).
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
from typing import Any

from certs.selfmanaged import hold_lease
from webhook import audit, metrics
from webhook.config import Config
from webhook.kube import client as kube_client
from webhook.kube import lists
from webhook.kube.certapi import KubeCertApi
from webhook.kube.pages import RateLimiter
from webhook.kube.reports import PolicyReportWriter
from webhook.model.facts import Facts, StaticFacts

log = logging.getLogger("dra_guard.audit")


class PeriodicAudit:
    """One replica's periodic audit. run_once() audits if this replica holds the audit Lease."""

    def __init__(self, client: Any, config: Config, *, identity: str, facts: Facts | None = None) -> None:
        """facts: the worker's caches (webhook.kube.state.ClusterState): RBAC, Pods and
        ResourceClaims are judged from them instead of listed again (issue 19: at 100,000 pods a
        fresh list held ~1 GiB more in the serving process every interval); None: list everything."""
        self.client = client
        self.config = config
        self.facts = facts
        self.identity = identity
        self.lease_api = KubeCertApi(client, config.certificates.namespace)
        self.reports = PolicyReportWriter(client)
        self.lease_name = f"{config.certificates.lease_name}-audit"

    def run_once(self) -> list[tuple[Any, str]] | None:
        """Audit the live cluster now if this replica holds the Lease; the findings, or None."""
        now = datetime.datetime.now(datetime.UTC)
        duration = int(self.config.audit.interval_seconds * 1.5) + 30
        if not hold_lease(self.lease_api, self.lease_name, identity=self.identity, now=now, duration_seconds=duration):
            return None
        started = time.monotonic()
        limiter = RateLimiter(qps=self.config.audit.qps, burst=self.config.audit.burst)
        served = kube_client.served_resource_versions(self.client)
        if self.facts is not None:
            synced, why = self.facts.synced()
            if not synced:
                log.info("periodic audit skipped until the caches are in sync", extra={"reason": why})
                return None
        facts = self.facts if self.facts is not None else StaticFacts(self.config)
        objects = lists.stream_audit_cluster(self.client, facts, served_versions=served, limiter=limiter,
                                             fill=self.facts is None)
        result = audit.audit(objects, self.config, served_versions=served, online=True, facts=facts)
        findings = result.findings
        counts: dict[tuple[str, str], int] = {}
        for f, mode in findings:
            counts[(f.policy, mode)] = counts.get((f.policy, mode), 0) + 1
        metrics.AUDIT_VIOLATIONS.clear()
        for (policy, mode), n in counts.items():
            metrics.AUDIT_VIOLATIONS.labels(policy=policy, mode=mode).set(n)
        metrics.AUDIT_LAST_RUN.set(now.timestamp())
        if self.config.audit.policy_reports and self.reports.served():
            reports = audit.policy_reports(findings, judged=result.judged)
            if not any(r["kind"] == "ClusterPolicyReport" for r in reports):  # an empty one says the audit ran
                reports.insert(0, audit.empty_cluster_report())
            self.reports.apply(reports)
        log.info("periodic audit done", extra={"findings": len(findings), "objects": len(objects),
                                               "seconds": round(time.monotonic() - started, 3)})
        return findings

    def loop(self, stop: threading.Event) -> None:
        """run_once() now and then every interval until `stop` is set; errors are logged and retried.
        With the worker's caches as facts, the first run waits until they are in sync (checked
        every second) instead of skipping a whole interval."""
        while self.facts is not None and not self.facts.synced()[0]:
            if stop.wait(1.0):
                return
        while True:
            try:
                self.run_once()
            except kube_client.API_ERRORS as exc:  # expected outside a cluster: one line, no traceback
                metrics.KUBE_API_ERRORS.labels(resource="audit").inc()
                reason = kube_client.describe_error(exc)
                log.warning("periodic audit skipped; retrying next interval",
                            extra={"error": reason[:300], "leaseNamespace": self.config.certificates.namespace})
            except Exception:
                metrics.KUBE_API_ERRORS.labels(resource="audit").inc()
                log.exception("periodic audit failed; retrying next interval")
            if stop.wait(self.config.audit.interval_seconds):
                return
