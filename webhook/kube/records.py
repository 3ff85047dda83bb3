"""The shared records of driver pods leaving on the strength of a Ready peer (webhook.model.leaving):
coordination.k8s.io/v1 Leases in dra-guard's namespace, written with optimistic concurrency, so
that two replicas asked about the two pods of a surge pair at the same moment cannot both allow.

LeaseRecords.own(record, deadline), before such an allow is answered:

* create the Lease ``record.name`` (holderIdentity: the leaving pod) -> "created";
* 409, it exists: read it and judge it (webhook.model.leaving.judge). Its holder is this pod (a
  retried eviction) -> renew it, "renewed"; another pod still leaving -> "conflict" (429: this pod
  has no peer now); stale (holder gone or Terminating in the cache, or expired) -> take it over:
  "taken_over". Both writes carry the resourceVersion read: a 409 there means another replica
  wrote first -> "conflict";
* any other failure, or no time left before the review's deadline -> "error" (the caller answers
  429 in enforce mode, allows in warn and audit);
* once written, the pod's peer must still be Ready and not Terminating in this replica's cache:
  the peer was found before the record was read, and may have left meanwhile on the strength of
  this very pod (another replica held the record, its pod was evicted, the cache saw it go and
  the record turned stale). If it left -> "conflict", and the record is given up (holder cleared)
  so that nobody waits for its TTL. Seen on the real control plane: both pods of a pair evicted
  within 50 ms without this check.

Each call is bounded by cluster.requestTimeoutSeconds and by the review's deadline. A result other
than created/renewed/taken_over also withdraws the pod from this replica's own Leaving record (the
allow it stood for is not given). Counted in dra_guard_eviction_records_total{result}.

One Lease per (DaemonSet, node), reused by every rollout, never deleted by dra-guard: a delete
would race with the next writer and need one more API call per eviction. They are bounded by
driver DaemonSets x live nodes: each carries an ownerReference to its Node (uid from the node
cache), so the garbage collector deletes it with the Node (autoscaled nodes come and go; their
Leases go with them). Labelled app.kubernetes.io/managed-by=dra-guard (docs/operations/uninstall.md).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import kubernetes
from kubernetes.client.rest import ApiException

from certs.replicas import micro_time
from webhook import metrics
from webhook.kube.certapi import MANAGED_BY_LABEL
from webhook.kube.client import count, describe_error, server_of
from webhook.kube.errors import api_failure
from webhook.model.claim_index import ClaimIndex
from webhook.model.leaving import LeaveRecord, judge

log = logging.getLogger("dra_guard.records")

#: seconds a write needs at least before the review's deadline; with less, none is started ("error")
MIN_WRITE_SECONDS = 0.05
#: the label every shared record carries besides managed-by (kubectl get leases -l dra-guard.io/record)
RECORD_LABEL = {"dra-guard.io/record": "leaving"}


class Conflict(Exception):
    """409 Conflict: the Lease exists (create) or changed since it was read (update)."""


class NoTime(Exception):
    """Less than MIN_WRITE_SECONDS left before the review's deadline: no call is started."""


class LeaseApi(Protocol):
    """The three Lease calls LeaseRecords makes, each with a timeout in seconds. Leases are
    coordination.k8s.io/v1 dicts. create and replace raise Conflict on 409 (replace also on 404:
    the Lease went meanwhile) and return the Lease written; get returns None on 404; anything else raises."""

    def create(self, lease: Mapping[str, Any], *, timeout: float) -> dict[str, Any]: ...
    def get(self, name: str, *, timeout: float) -> dict[str, Any] | None: ...
    def replace(self, lease: Mapping[str, Any], *, timeout: float) -> dict[str, Any]: ...


class KubeLeases:
    """LeaseApi over the Kubernetes API, in `namespace` (each call counted in dra_guard_kube_api_requests_total)."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.api = kubernetes.client.CoordinationV1Api(client)
        self.server = server_of(client)

    def _call(self, verb: str, fn: Callable[..., Any], *args: Any, timeout: float, **kwargs: Any) -> dict[str, Any] | None:
        count(verb, "leases")
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and verb == "get":
                return None
            if exc.status == 409 or (exc.status == 404 and verb == "update"):
                raise Conflict(f"{verb} lease: {exc.status} {exc.reason}") from exc
            raise api_failure(f"{verb} leases", self.server, exc, timeout_seconds=timeout) from exc
        except Exception as exc:  # network errors and timeouts come in many urllib3 types
            raise api_failure(f"{verb} leases", self.server, exc, timeout_seconds=timeout) from exc
        data: dict[str, Any] = json.loads(resp.data) if resp.data else {}
        return data

    def create(self, lease: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:
        return self._call("create", self.api.create_namespaced_lease, self.namespace, lease, timeout=timeout) or {}

    def get(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        return self._call("get", self.api.read_namespaced_lease, name, self.namespace, timeout=timeout)

    def replace(self, lease: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:
        return (
            self._call(
                "update", self.api.replace_namespaced_lease, lease["metadata"]["name"], self.namespace, lease, timeout=timeout
            )
            or {}
        )


class LeaseRecords:
    """Owns shared records for one replica: own() is the `records` writer of webhook.serve.app.

    api: a LeaseApi (KubeLeases in dra-guard's namespace). index: this replica's claim index (which
    holders are live; its Leaving record; node uids). timeout_seconds: the longest one call may
    take (cluster.requestTimeoutSeconds). now: wall clock (Lease times are wall-clock times).
    """

    def __init__(
        self,
        api: LeaseApi,
        index: ClaimIndex,
        *,
        namespace: str,
        timeout_seconds: float,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.api = api
        self.index = index
        self.namespace = namespace
        self.timeout = timeout_seconds
        self.now = now

    def lease(
        self, record: LeaveRecord, now: datetime.datetime, *, resource_version: str = "", acquired: str = ""
    ) -> dict[str, Any]:
        """The Lease dict for `record` renewed at `now` (acquired: an earlier acquireTime to keep)."""
        meta: dict[str, Any] = {
            "name": record.name,
            "namespace": self.namespace,
            "labels": {**MANAGED_BY_LABEL, **RECORD_LABEL},
            "annotations": {
                "dra-guard.io/daemonset": record.daemonset,
                "dra-guard.io/node": record.node,
                "dra-guard.io/peer": record.peer,
            },
        }
        node_uid = self.index.nodes.uid(record.node)
        if node_uid:  # garbage-collected with its Node (see the module docstring)
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": record.node, "uid": node_uid}]
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": record.seconds,
                "acquireTime": acquired or micro_time(now),
                "renewTime": micro_time(now),
            },
        }

    def live(self, namespace: str, name: str, uid: str) -> bool:
        """Whether pod namespace/name (uid, if given) is in this replica's cache, not Terminating nor finished."""
        found = self.index.driver_of_pod(namespace, name)
        if found is None:
            return False
        pod = found[0]
        return (not uid or pod.uid == uid) and not pod.terminating and not pod.finished

    def peer_stays(self, record: LeaveRecord) -> bool:
        """Whether record.peer is in this replica's cache, Ready, not Terminating nor finished."""
        namespace, _, name = record.peer.partition("/")
        found = self.index.driver_of_pod(namespace, name)
        return found is not None and found[0].ready and not found[0].terminating and not found[0].finished

    def own(self, record: LeaveRecord, deadline: float) -> tuple[str, str]:
        """Write `record`'s Lease before `deadline` (time.monotonic()); (result, why) as in the
        module docstring. Never raises for an API failure (that is "error", why naming it)."""

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining < MIN_WRITE_SECONDS:
                raise NoTime(f"less than {MIN_WRITE_SECONDS:g} s left before the review's deadline")
            return min(self.timeout, remaining)

        now = self.now()
        where = f"Lease {self.namespace}/{record.name}"
        try:
            try:
                written = self.api.create(self.lease(record, now), timeout=left())
                result, why = "created", ""
            except Conflict:
                existing = self.api.get(record.name, timeout=left())
                if existing is None:  # gone between the two calls (its Node's garbage collection)
                    return self._done(record, "conflict", f"{where} changed while it was read; retry")
                spec, meta = existing.get("spec") or {}, existing.get("metadata") or {}
                verdict = judge(spec, record, now=now, live=self.live)
                if verdict == "held":
                    return self._done(record, "conflict", f"{where} names {spec.get('holderIdentity')} as leaving")
                acquired = str(spec.get("acquireTime") or "") if verdict == "same" else ""
                written = self.api.replace(
                    self.lease(record, now, resource_version=str(meta.get("resourceVersion") or ""), acquired=acquired),
                    timeout=left(),
                )
                result = "renewed" if verdict == "same" else "taken_over"
                why = "" if verdict == "same" else f"from {spec.get('holderIdentity') or 'no holder'}"
            if not self.peer_stays(record):
                self._give_up(written, left)
                return self._done(record, "conflict", f"its peer {record.peer} left while {where} was written")
            return self._done(record, result, why)
        except Conflict:
            return self._done(record, "conflict", f"{where} was written by another replica at the same moment")
        except NoTime as exc:
            return self._done(record, "error", f"{where} not written: {exc}")
        except Exception as exc:  # API errors, timeouts: never an allow in enforce mode (the caller's 429)
            return self._done(record, "error", f"{where} not written: {describe_error(exc)}")

    def _give_up(self, written: Mapping[str, Any], left: Callable[[], float]) -> None:
        """Clear the holder of a record just written (its resourceVersion): its pod stays after all.
        Best effort: when it fails the record expires after leaseDurationSeconds."""
        spec = {k: v for k, v in (written.get("spec") or {}).items() if k != "holderIdentity"}
        try:
            self.api.replace({**written, "spec": spec}, timeout=left())
        except (Conflict, NoTime) as exc:  # a later writer owns it, or no time: the TTL ends it
            log.info("shared record not given up", extra={"why": str(exc)})
        except Exception as exc:  # API failures
            log.info("shared record not given up", extra={"why": describe_error(exc)})

    def _done(self, record: LeaveRecord, result: str, why: str) -> tuple[str, str]:
        metrics.EVICTION_RECORDS.labels(result=result).inc()
        fields = {
            "pod": f"{record.namespace}/{record.pod}",
            "node": record.node,
            "lease": record.name,
            "result": result,
            "why": why,
        }
        if result in ("conflict", "error"):
            self.index.leaving.settle(record.namespace, record.pod)  # not allowed: nobody's leaving here
            (log.warning if result == "error" else log.info)("shared record not owned", extra=fields)
        elif result == "taken_over":
            log.info("shared record taken over", extra=fields)
        return result, why
