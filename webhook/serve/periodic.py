"""The in-server periodic audit: `dra-guard audit --cluster` every audit.intervalSeconds, run by
one replica at a time (the holder of the Lease `<certificates.leaseName>-audit`), publishing the
gauge dra_guard_violations{policy,mode} and, when the wgpolicyk8s.io/v1alpha2 CRDs are installed,
dra-guard's ClusterPolicyReport and PolicyReports (replacing its previous ones).

The worker keeps the Lease and the gauges; the audit itself runs in a process of its own
(webhook.serve.audit_child), so its CPU and memory never stall the reviews.

After a `helm upgrade` the reports follow the new configuration within about LEASE_POLL_SECONDS
plus one audit of the moment the old holder stops: it gives the Lease up when its worker drains,
and a replica that does not hold it asks again every LEASE_POLL_SECONDS (not every interval), so
the first new replica to find it free audits at once.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from webhook import metrics
from webhook.config import Config
from webhook.kube import client as kube_client
from webhook.kube.certapi import KubeCertApi
from webhook.serve.audit_child import AuditChildError, AuditRequest, AuditSummary, run_in_child

log = logging.getLogger("dra_guard.audit")

#: a run that fails with one of these is logged in one line and retried (next_wait)
SKIPPED: tuple[type[Exception], ...] = (*kube_client.API_ERRORS, AuditChildError)
#: seconds between two tries of a replica that does not hold the audit Lease (at most the interval)
LEASE_POLL_SECONDS = 10.0


def next_wait(*, held: bool, failures: int, interval: float) -> float:
    """Seconds until the next try: the interval after a run (this replica holds the Lease);
    LEASE_POLL_SECONDS while another replica holds it; after `failures` failed runs in a row,
    LEASE_POLL_SECONDS doubled per failure, at most the interval (an apiserver back after a minute
    gives fresh reports within about a minute, not one interval later; one that stays away is not
    asked more than every interval). Never more than `interval`."""
    if failures:
        return min(interval, LEASE_POLL_SECONDS * float(2 ** min(failures - 1, 16)))
    return interval if held else min(LEASE_POLL_SECONDS, interval)


#: what PeriodicAudit waits on before its first run: () -> (in sync, why not)
Synced = Callable[[], tuple[bool, str]]


class PeriodicAudit:
    """One replica's periodic audit. run_once() audits if this replica holds the audit Lease."""

    def __init__(
        self,
        client: Any,
        config: Config,
        *,
        identity: str,
        kubeconfig: str | None = None,
        synced: Synced | None = None,
        log_level: str = "info",
    ) -> None:
        """client: the worker's ApiClient (the Lease); kubeconfig: what the audit process loads
        (None: in-cluster or $KUBECONFIG, as the worker); synced: the worker's caches' synced()
        (webhook.kube.state.ClusterState): the first audit waits for them, so a starting replica
        does not list the cluster twice at once."""
        self.config = config
        self.identity = identity
        self.synced = synced
        self.request = AuditRequest(
            config=config,
            kubeconfig=kubeconfig,
            request_timeout_seconds=config.cluster.request_timeout_seconds,
            log_level=log_level,
        )
        self.lease_api = KubeCertApi(client, config.certificates.namespace)
        self.lease_name = f"{config.certificates.lease_name}-audit"
        #: the report owner problem last logged: each is logged once, not every interval
        self.owner_problem_logged = ""

    def lease_seconds(self) -> int:
        """How long the audit Lease is held (seconds): 1.5 intervals and 30 s; the audit process is
        killed past it, so two replicas never audit at once."""
        return int(self.config.audit.interval_seconds * 1.5) + 30

    def run_once(self) -> AuditSummary | None:
        """Audit the live cluster now, in a process of its own, if this replica holds the Lease;
        its summary, or None. Raises AuditChildError or kube_client.API_ERRORS."""
        now = datetime.datetime.now(datetime.UTC)
        if not self.lease_api.hold_lease(self.lease_name, identity=self.identity, now=now, duration_seconds=self.lease_seconds()):
            return None
        summary = run_in_child(
            self.request,
            timeout_seconds=self.lease_seconds(),
            started=lambda pid: log.info(
                "periodic audit started", extra={"auditPid": pid, "timeoutSeconds": self.lease_seconds()}
            ),
        )
        metrics.AUDIT_VIOLATIONS.clear()
        for (policy, mode), n in summary.counts.items():
            metrics.AUDIT_VIOLATIONS.labels(policy=policy, mode=mode).set(n)
        for state in ("active", "expired"):
            metrics.AUDIT_EXCEPTED.labels(state=state).set(summary.excepted.get(state, 0))
        for check, n in summary.doors.items():
            metrics.DRIVER_DOORS.labels(check=check).set(n)
        if summary.excepted.get("expired"):
            log.warning(
                "periodic audit: expired exceptions still cover findings (reported as exception-expired)",
                extra={"expiredExceptions": summary.excepted["expired"]},
            )
        self.log_owner_problem(summary.report_owner_problem)
        metrics.AUDIT_LAST_RUN.set(now.timestamp())
        metrics.ADMIN_ACCESS_NAMESPACES.set(summary.admin_access_namespaces)
        metrics.AUDIT_LAST_SECONDS.set(summary.seconds)
        metrics.AUDIT_PEAK_RSS.set(summary.peak_rss_mib * 2**20)
        log.info(
            "periodic audit done",
            extra={
                "findings": summary.findings,
                "objects": summary.objects,
                "seconds": summary.seconds,
                "auditPid": summary.pid,
                "auditPeakRssMiB": summary.peak_rss_mib,
            },
        )
        return summary

    def log_owner_problem(self, problem: str) -> None:
        """Warn once that the reports carry no owner (`problem` says why; config
        audit.reportOwnerClusterRole): not again while the same problem lasts, and once more when
        it changes; "" (the reports have their owner again) resets it."""
        if problem and problem != self.owner_problem_logged:
            log.warning(
                "periodic audit: its reports carry no owner, so nothing deletes them when dra-guard is "
                "uninstalled (`dra-guard cleanup` does)",
                extra={"reason": problem[:300]},
            )
        self.owner_problem_logged = problem

    def loop(self, stop: threading.Event) -> None:
        """run_once() once the worker's caches are in sync (checked every second), then every
        interval while this replica holds the Lease, every LEASE_POLL_SECONDS while another does,
        until `stop` is set (the worker drains). Errors are logged and retried with a backoff
        (next_wait)."""
        while self.synced is not None and not self.synced()[0]:
            if stop.wait(1.0):
                return
        failures = 0
        interval = float(self.config.audit.interval_seconds)
        while True:
            held = True
            try:
                held = self.run_once() is not None
                failures = 0
            except SKIPPED as exc:  # one line, no traceback
                failures += 1
                metrics.KUBE_API_ERRORS.labels(resource="audit").inc()
                reason = str(exc) if isinstance(exc, AuditChildError) else kube_client.describe_error(exc)
                log.warning(
                    "periodic audit skipped; retrying",
                    extra={
                        "error": reason[:300],
                        "leaseNamespace": self.config.certificates.namespace,
                        "retryInSeconds": next_wait(held=held, failures=failures, interval=interval),
                    },
                )
            except Exception:
                failures += 1
                metrics.KUBE_API_ERRORS.labels(resource="audit").inc()
                log.exception(
                    "periodic audit failed; retrying",
                    extra={"retryInSeconds": next_wait(held=held, failures=failures, interval=interval)},
                )
            if stop.wait(next_wait(held=held, failures=failures, interval=interval)):
                return  # the worker gives the Lease up once drained (webhook.serve.draining.at_exit)

    def release(self) -> None:
        """Give the audit Lease up if this replica holds it, so that another audits at once
        instead of waiting out lease_seconds(); an API error is logged in one line (the Lease then
        expires as before)."""
        try:
            if self.lease_api.release_lease(self.lease_name, identity=self.identity):
                log.info("periodic audit lease given up", extra={"lease": self.lease_name})
        except kube_client.API_ERRORS as exc:
            log.warning("periodic audit lease not given up; it expires", extra={"error": kube_client.describe_error(exc)[:300]})
