"""ClusterState: the watch-fed caches dra-guard keeps of the cluster (implements
webhook.model.facts.Facts), and what readiness needs to know about them.

Admission requests read its indexes only; in steady state they never cause an API request. The two
bounded reads the RBAC guard may ask for (a ClusterRole missing from the cache, the
ClusterRoleBindings before a ClusterRole with DRA write is judged) are here too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook import metrics
from webhook.config import Config
from webhook.kube import apiservices
from webhook.kube.client import RESOURCE_GROUP, ClusterError, count, served_resource_versions, server_of
from webhook.kube.drift import RbacDrift
from webhook.kube.informer import Informer
from webhook.kube.pages import Pages
from webhook.model import drivers
from webhook.model.claim_index import ClaimIndex
from webhook.model.rbac_index import RbacIndex
from webhook.policies.eviction import declared_value

log = logging.getLogger("dra_guard.cluster")

#: refresh_bindings starts a read only with at least this share of cluster.requestTimeoutSeconds left
MIN_READ_SHARE = 0.25


def events(
    upsert: Callable[[Mapping[str, Any]], None], delete: Callable[[str, str], None]
) -> Callable[[str, Mapping[str, Any]], None]:
    """A watch-event handler: DELETED deletes (namespace, name), anything else upserts the object."""

    def on_event(kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            delete(*ClusterState._name(obj))
        else:
            upsert(obj)

    return on_event


class ClusterState:
    """The caches dra-guard keeps of the cluster, and what readiness needs to know about them.

    rbac: ClusterRoles, ClusterRoleBindings, Roles and RoleBindings (RBAC guard; driver detection by
    ServiceAccount).
    claims: DaemonSets, DaemonSet-owned and claim-using Pods, allocated ResourceClaims (drain
    order), compact (driver, nodeName, pool), ResourceSlices (which drivers serve which node),
    read through the newest resource.k8s.io version the cluster serves, and Nodes' labels.

    With `client` None (``--no-cluster``) nothing is watched, the indexes stay empty and the
    state counts as synced: policies then see an empty cluster.
    """

    def __init__(self, client: kubernetes.client.ApiClient | None, *, config: Config | None = None) -> None:
        config = config or Config()
        self.client = client
        self.config = config
        self.rbac = RbacIndex()
        self.claims = ClaimIndex(config.detection, self.service_account_writes_slices)
        self.informers: list[Informer] = []
        # re-judges RBAC on each watch event: what admission let through is reported within seconds
        self.drift = RbacDrift(self.rbac, config, client)
        self.resource_version = ""
        self._refresh_lock = threading.Lock()  # one ClusterRoleBinding read at a time (refresh_bindings)
        self._bindings_read_from = float("-inf")  # monotonic start of the last complete read
        self._undeclared: set[tuple[str, str]] = set()  # drivers reported by report_undeclared
        self._undeclared_lock = threading.Lock()
        # APIServices redirected away from the apiserver: not ready while any is
        self.api = apiservices.ApiServiceCheck(client, config, version=lambda: self.resource_version)
        if client is None:
            return
        timeout = config.cluster.request_timeout_seconds
        rbac_api = kubernetes.client.RbacAuthorizationV1Api(client)
        apps_api = kubernetes.client.AppsV1Api(client)
        core_api = kubernetes.client.CoreV1Api(client)
        self.informers = [
            Informer(
                name="clusterroles",
                list_func=rbac_api.list_cluster_role,
                on_replace=self._roles_replaced,
                on_event=self._role_event,
                timeout_seconds=timeout,
            ),
            Informer(
                name="clusterrolebindings",
                list_func=rbac_api.list_cluster_role_binding,
                on_replace=self._bindings_replaced,
                on_event=self._binding_event,
                timeout_seconds=timeout,
            ),
            # Roles and RoleBindings (slimmed): namespaced powers in the sensitive namespaces (docs/threat-model.md)
            Informer(
                name="roles",
                list_func=rbac_api.list_role_for_all_namespaces,
                on_replace=lambda items: self.rbac.replace_roles(items, namespaced=True),
                on_event=self._role_event,
                timeout_seconds=timeout,
            ),
            Informer(
                name="rolebindings",
                list_func=rbac_api.list_role_binding_for_all_namespaces,
                on_replace=lambda items: self.rbac.replace_bindings(items, namespaced=True),
                on_event=self._binding_event,
                timeout_seconds=timeout,
            ),
            Informer(
                name="daemonsets",
                list_func=apps_api.list_daemon_set_for_all_namespaces,
                on_replace=self._daemonsets_replaced,
                on_event=self._daemonset_event,
                timeout_seconds=timeout,
            ),
            Informer(
                name="pods",
                list_func=core_api.list_pod_for_all_namespaces,
                on_replace=self.claims.replace_pods,
                on_event=events(self.claims.upsert_pod, self.claims.delete_pod),
                timeout_seconds=timeout,
            ),
            Informer(
                name="resourceclaims",
                list_func=self._list_claims,
                on_replace=self.claims.replace_claims,
                on_event=events(self.claims.upsert_claim, self.claims.delete_claim),
                timeout_seconds=timeout,
            ),
            Informer(
                name="resourceslices",
                list_func=self._list_slices,
                on_replace=self.claims.slices.replace,
                on_event=events(self.claims.slices.upsert, lambda ns, name: self.claims.slices.delete(name)),
                timeout_seconds=timeout,
            ),
            # Nodes (name and labels kept): which nodes a claim's allocation selects by label
            Informer(
                name="nodes",
                list_func=core_api.list_node,
                on_replace=self.claims.nodes.replace,
                on_event=events(self.claims.nodes.upsert, lambda ns, name: self.claims.nodes.delete(name)),
                timeout_seconds=timeout,
            ),
        ]

    def fetch_cluster_role(self, name: str) -> dict[str, Any] | None:
        """GET ClusterRole `name` from the API (a role created a moment ago may not have reached the
        watch yet) and add it to the index; None when it does not exist or with --no-cluster.
        Used only for a binding whose roleRef is missing from the cache: steady state makes no call.
        Waits at most cluster.requestTimeoutSeconds; raises ClusterError on any other outcome, so the
        policy answers with its failureMode in time instead of guessing."""
        if self.client is None:
            return None

        # a LIST by field selector: dra-guard's RBAC already allows list on ClusterRoles, not get
        count("list", "clusterroles")
        try:
            resp = kubernetes.client.RbacAuthorizationV1Api(self.client).list_cluster_role(
                field_selector=f"metadata.name={name}",
                _preload_content=False,
                _request_timeout=self.config.cluster.request_timeout_seconds,
            )
            items = json.loads(resp.data).get("items") or []
        except ApiException as exc:
            metrics.KUBE_API_ERRORS.labels(resource="clusterroles").inc()
            raise ClusterError(f"reading ClusterRole {name} failed: HTTP {exc.status}") from exc
        except Exception as exc:  # timeouts and connection errors come in many urllib3 types
            metrics.KUBE_API_ERRORS.labels(resource="clusterroles").inc()
            raise ClusterError(f"reading ClusterRole {name} failed: {type(exc).__name__}") from exc
        if not items:
            return None
        role = dict(items[0], kind="ClusterRole")
        self.rbac.upsert_role(role)
        return role

    def refresh_bindings(self) -> str | None:
        """Read every ClusterRoleBinding from the API into the index before a ClusterRole that grants
        protected write is judged: a binding created a moment ago may not have reached the watch.

        The whole read, waiting for a concurrent one included, is bounded by
        cluster.requestTimeoutSeconds (below the RBAC webhook's timeoutSeconds). Concurrent reviews
        share one read: a read that began after this review arrived serves it. Returns None when
        the bindings were read in full (or with --no-cluster); when the budget ran out while the
        apiserver was answering (tens of thousands of bindings), returns a note for a warning: the
        review is then judged from the watch-fed cache plus the pages read, which lags the API by
        the watch's delay only. Raises ClusterError when the apiserver gave no page in time or
        answered with an error, so the policy answers with its failureMode.
        At most one full read per cluster.bindingRefreshIntervalSeconds (a forged ClusterRole
        review must not make each its own LIST of every binding): a review within that time of the start of
        the last complete read is judged from it plus the watch, which delivers later bindings
        within milliseconds.
        Counted in dra_guard_binding_refreshes_total{outcome}: read, shared, recent, partial, failed."""
        if self.client is None:
            return None
        budget = self.config.cluster.request_timeout_seconds
        asked = time.monotonic()
        deadline = asked + budget
        if asked - self._bindings_read_from < self.config.cluster.binding_refresh_interval_seconds:
            # rate limit: one full read per cluster.bindingRefreshIntervalSeconds, however many
            # ClusterRole reviews (forged ones included) ask; the watch adds what came since
            metrics.BINDING_REFRESHES.labels(outcome="recent").inc()
            return None
        if not self._refresh_lock.acquire(timeout=budget):
            return self._bindings_from_cache("another read of them took the whole budget", budget)
        try:
            if self._bindings_read_from >= asked or (
                time.monotonic() - self._bindings_read_from < self.config.cluster.binding_refresh_interval_seconds
            ):
                metrics.BINDING_REFRESHES.labels(outcome="shared").inc()
                return None
            if deadline - time.monotonic() < MIN_READ_SHARE * budget:
                # a concurrent read (partial, so not shared) used up the time: no read of our own
                # could finish, and starting one with no time would only fail
                return self._bindings_from_cache("a concurrent read took the budget", budget)
            started = time.monotonic()
            api = kubernetes.client.RbacAuthorizationV1Api(self.client)
            pages = Pages(
                api.list_cluster_role_binding, resource="clusterrolebindings", timeout_seconds=budget, deadline=deadline
            )
            try:
                for binding in pages:
                    self.rbac.upsert_binding(binding)
            except Exception as exc:  # timeouts and connection errors come in many urllib3 types
                if not (pages.count and time.monotonic() >= deadline - 0.05):
                    metrics.BINDING_REFRESHES.labels(outcome="failed").inc()
                    metrics.KUBE_API_ERRORS.labels(resource="clusterrolebindings").inc()
                    detail = f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else type(exc).__name__
                    raise ClusterError(f"reading ClusterRoleBindings failed: {detail}") from exc
                pages.truncated = True  # the page in flight when the budget ran out
            if pages.truncated:
                return self._bindings_from_cache(
                    "the API read did not finish in time", budget, read=pages.count, seconds=time.monotonic() - started
                )
            self._bindings_read_from = started
            metrics.BINDING_REFRESHES.labels(outcome="read").inc()
            return None
        finally:
            self._refresh_lock.release()

    @staticmethod
    def _bindings_from_cache(why: str, budget: float, *, read: int | None = None, seconds: float | None = None) -> str:
        """Count and log a partial binding read (refresh_bindings); the note for the review's warning."""
        metrics.BINDING_REFRESHES.labels(outcome="partial").inc()
        log.warning(
            f"ClusterRoleBindings judged from the cache: {why}",
            extra={"objects": read, "seconds": round(seconds if seconds is not None else budget, 3)},
        )
        counted = "" if read is None else f"; {read} read"
        return (
            f"ClusterRoleBindings judged from the watch cache: reading them from the API did not "
            f"finish within cluster.requestTimeoutSeconds ({budget:g} s{counted})"
        )

    def service_account_writes_slices(self, namespace: str, name: str) -> bool:
        """Whether RBAC lets ServiceAccount namespace/name write ResourceSlices (a DRA driver sign)."""
        return self.rbac.service_account_may_write(namespace, name, "resourceslices", self.config.rbac)

    def _list_claims(self, **kwargs: Any) -> Any:
        """list/watch ResourceClaims in the newest served resource.k8s.io version (found on first use)."""
        return self._list_resource("resourceclaims", **kwargs)

    def _list_slices(self, **kwargs: Any) -> Any:
        """list/watch ResourceSlices (which drivers serve which node) in the newest served version."""
        return self._list_resource("resourceslices", **kwargs)

    def _list_resource(self, plural: str, **kwargs: Any) -> Any:
        """list/watch a cluster-wide resource.k8s.io resource in the newest served version (found
        again at each fresh list)."""
        assert self.client is not None
        if not self.resource_version or (not kwargs.get("watch") and not kwargs.get("_continue")):
            versions = served_resource_versions(self.client, timeout_seconds=kwargs.get("_request_timeout") or 10.0)
            if not versions:
                raise ClusterError("the cluster serves no resource.k8s.io version (DRA is not enabled)")
            self.resource_version = versions[0]
        api = kubernetes.client.CustomObjectsApi(self.client)
        return api.list_cluster_custom_object(RESOURCE_GROUP, self.resource_version, plural, **kwargs)

    @staticmethod
    def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace", "")), str(meta.get("name", ""))

    def report_undeclared(self) -> None:
        """Name every DRA driver DaemonSet recognised but missing from drivers.declared: a warning
        log line "undeclared DRA driver" once per DaemonSet (with the Helm value that declares it)
        and dra_guard_undeclared_drivers{daemonset_namespace,daemonset} 1 while it stays undeclared."""
        with self._undeclared_lock:
            found = set(
                drivers.undeclared(
                    self.claims.daemonset_drivers(), self.config.detection, guard_namespace=self.config.rbac.guard_namespace
                )
            )
            if found == self._undeclared:
                return
            for namespace, name in sorted(found - self._undeclared):
                value = declared_value(self.config.detection, [(namespace, name)])  # its own: not every driver's
                metrics.UNDECLARED_DRIVERS.labels(daemonset_namespace=namespace, daemonset=name).set(1)
                log.warning(
                    "undeclared DRA driver",
                    extra={
                        "namespace": namespace,
                        "daemonset": name,
                        "helm": value,
                        "why": "its pods' evictions are not sent to dra-guard (not in drivers.declared)",
                    },
                )
            for namespace, name in self._undeclared - found:
                metrics.UNDECLARED_DRIVERS.remove(namespace, name)
            self._undeclared = found

    def _redetect(self) -> None:
        self.claims.redetect()
        self.report_undeclared()

    def _daemonsets_replaced(self, items: Iterable[dict[str, Any]]) -> None:
        self.claims.replace_daemonsets(items)
        self.report_undeclared()

    def _roles_replaced(self, items: Iterable[dict[str, Any]]) -> None:
        self.rbac.replace_roles(items)
        self._redetect()

    def _bindings_replaced(self, items: Iterable[dict[str, Any]]) -> None:
        self.rbac.replace_bindings(items)
        self._redetect()

    def _role_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        namespace, name = self._name(obj)
        if kind == "DELETED":
            self.rbac.delete_role(name, namespace)
        else:
            self.rbac.upsert_role(obj)
        self.drift("Role" if namespace else "ClusterRole", kind, obj)
        if not namespace:
            self._redetect()

    def _binding_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        namespace, name = self._name(obj)
        if kind == "DELETED":
            self.rbac.delete_binding(name, namespace)
        else:
            self.rbac.upsert_binding(obj)
        self.drift("RoleBinding" if namespace else "ClusterRoleBinding", kind, obj)
        if not namespace:
            self._redetect()

    def _daemonset_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.claims.delete_daemonset(*self._name(obj))
        else:
            self.claims.upsert_daemonset(obj)
        self.report_undeclared()

    def sizes(self) -> dict[str, int]:
        """Objects each cache holds now, by informer name (dra_guard_cache_objects)."""
        return {**self.rbac.sizes(), **self.claims.sizes()}

    def check_access(self) -> None:
        """One LIST of at most one object per cache, each bounded by cluster.requestTimeoutSeconds
        (nothing with --no-cluster): what `serve` checks before it starts, so an unreachable API, a
        rejected credential or a missing list permission is one error naming the server and the
        cause, not caches that never sync. Raises ClusterError."""
        if self.client is None:
            return
        server = server_of(self.client)
        for informer in self.informers:
            informer.check(server)

    def start(self) -> None:
        """Check the APIServices once, then start every informer and the periodic APIService
        check (non-blocking)."""
        self.api.check()
        for informer in self.informers:
            informer.start()
        self.api.start()

    def stop(self) -> None:
        """Stop every informer and the APIService check."""
        self.api.stop()
        for informer in self.informers:
            informer.stop()

    def synced(self, names: tuple[str, ...] | None = None) -> tuple[bool, str]:
        """(True, "") when every cache (or those named) has synced and keeps its watch, else
        (False, which caches not)."""
        if self.api.problems:  # the caches may hold what someone else's server said
            return False, "the API is redirected: " + "; ".join(self.api.problems)
        missing = [i.name for i in self.informers if not i.synced.is_set() and (names is None or i.name in names)]
        return (not missing, "caches not synced: " + ", ".join(missing) if missing else "")

    def fresh(self, max_age_seconds: float) -> tuple[bool, str]:
        """synced(), and no cache has been without news from the apiserver for more than max_age_seconds."""
        ok, why = self.synced()
        if not ok:
            return ok, why
        stale = [f"{i.name} ({i.age():.0f} s)" for i in self.informers if i.age() > max_age_seconds]
        return (not stale, "caches without news: " + ", ".join(stale) if stale else "")
