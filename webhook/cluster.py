"""The one place that talks to the Kubernetes API: watch-based caches with indexes, and readiness.

Each cache is an Informer: a paged LIST followed by a WATCH from the list's resourceVersion
(``kubernetes.watch.Watch``), relisting when the watch expires (HTTP 410 "resource version too
old") and backing off on errors. Admission requests read the resulting indexes only; in steady
state they never cause an API request. Every API request made here is counted in the metric
``dra_guard_kube_api_requests_total{verb,resource}``.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook import metrics
from webhook.config import Config
from webhook.policies.eviction import ClaimIndex
from webhook.policies.rbac import RbacIndex

log = logging.getLogger("dra_guard.cluster")

LIST_PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = 300  # server-side watch timeout; the informer re-watches from the last resourceVersion


class ClusterError(RuntimeError):
    """The Kubernetes API could not be configured or reached; the message says why."""


def api_client(kubeconfig: str | None, *, timeout_seconds: float) -> kubernetes.client.ApiClient:
    """An ApiClient from `kubeconfig` if given, else $KUBECONFIG, else in-cluster config, else ~/.kube/config.

    Raises ClusterError when none of them is usable.
    """
    configuration = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        elif os.environ.get("KUBECONFIG"):
            # passed explicitly: the library reads $KUBECONFIG once at import; a ':'-list is merged
            kubernetes.config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            default = pathlib.Path.home() / ".kube" / "config"
            if not default.exists():
                raise ClusterError("no --kubeconfig given, no $KUBECONFIG, not running in a cluster, and "
                                   "~/.kube/config does not exist; pass --kubeconfig FILE (serve: or --no-cluster to "
                                   "run without the Kubernetes API)")
            kubernetes.config.load_kube_config(config_file=str(default), client_configuration=configuration)
    except ClusterError:
        raise
    except Exception as exc:  # the kubernetes config loaders raise several unrelated types
        raise ClusterError(f"cannot load Kubernetes client configuration ({kubeconfig or 'default'}): {exc}") from exc
    configuration.retries = 0
    client = kubernetes.client.ApiClient(configuration)
    client.dra_guard_timeout = timeout_seconds  # type: ignore[attr-defined]
    return client


class Informer:
    """List-then-watch one resource into callbacks, in a daemon thread.

    list_func: a kubernetes client list function (e.g. RbacAuthorizationV1Api.list_cluster_role).
    on_replace(objects): called with every object (plain dicts) after each (re)list.
    on_event(type, object): called for each ADDED / MODIFIED / DELETED watch event (plain dict).
    """

    def __init__(self, *, name: str, list_func: Callable[..., Any], on_replace: Callable[[list[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None], timeout_seconds: float) -> None:
        self.name = name
        self._list = list_func
        self._on_replace = on_replace
        self._on_event = on_event
        self._timeout = timeout_seconds
        self._stop = threading.Event()
        self._watch: kubernetes.watch.Watch | None = None
        self.synced = threading.Event()
        self.last_sync = 0.0  # time.monotonic() of the last successful list or watch event
        self.thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> None:
        """Start the list/watch thread."""
        self.thread.start()

    def stop(self) -> None:
        """Stop watching (returns at once; the thread ends at the next event or timeout)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _count(self, verb: str) -> None:
        metrics.KUBE_API_REQUESTS.labels(verb=verb, resource=self.name).inc()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                started = time.monotonic()
                pages = Pages(self._list, resource=self.name, timeout_seconds=max(self._timeout, 10))
                self._on_replace(pages)  # consumes the pages as they come
                if pages.resource_version is None:
                    raise ClusterError(f"cache {self.name}: the list was not read to its end")
                rv = pages.resource_version
                self.last_sync = time.monotonic()
                seconds = self.last_sync - started
                metrics.CACHE_LIST_SECONDS.labels(cache=self.name).set(seconds)
                # logged before readiness can turn on: whoever sees /readyz 200 finds every line
                log.info("cache synced", extra={"cache": self.name, "objects": pages.count, "seconds": round(seconds, 3)})
                self.synced.set()
                metrics.CACHE_SYNCED.labels(cache=self.name).set(1)
                backoff = 0.5
                self._watch_from(rv)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch expired, relisting", extra={"cache": self.name})
                    continue
                self._failed(f"API error {exc.status} {exc.reason}")
            except Exception as exc:  # network errors come in many urllib3 types
                self._failed(f"{type(exc).__name__}: {exc}")
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 5.0)

    def _failed(self, why: str) -> None:
        metrics.CACHE_SYNCED.labels(cache=self.name).set(0)
        metrics.KUBE_API_ERRORS.labels(resource=self.name).inc()
        self.synced.clear()
        log.warning("cache lost its watch, will relist: %s", why, extra={"cache": self.name})

    def age(self) -> float:
        """Seconds since the cache last heard from the apiserver (list, watch start, event or bookmark)."""
        return time.monotonic() - self.last_sync if self.last_sync else float("inf")

    def _watch_from(self, rv: str) -> None:
        while not self._stop.is_set():
            # return_type given and deserialize=False: events stay plain dicts (no model objects)
            self._watch = kubernetes.watch.Watch(return_type="object")
            self._count("watch")
            self.last_sync = time.monotonic()
            try:
                for event in self._watch.stream(self._list, resource_version=rv, timeout_seconds=WATCH_TIMEOUT_SECONDS,
                                                allow_watch_bookmarks=True, deserialize=False,
                                                _request_timeout=WATCH_TIMEOUT_SECONDS + 30):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("message")))
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._on_event(kind, obj)
                    self.last_sync = time.monotonic()
                    if self._stop.is_set():
                        return
            except KeyError as exc:
                # kubernetes.watch with deserialize=False reads event["raw_object"] on ERROR events
                # (a 410 "too old resource version", usually): relist
                raise ApiException(status=410, reason="watch error event") from exc


#: refresh_bindings starts a read only with at least this share of cluster.requestTimeoutSeconds left
MIN_READ_SHARE = 0.25

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preferred first


def served_resource_versions(client: kubernetes.client.ApiClient) -> list[str]:
    """The resource.k8s.io versions the apiserver serves, preferred first ([] when none)."""
    metrics.KUBE_API_REQUESTS.labels(verb="get", resource="apis").inc()
    groups = kubernetes.client.ApisApi(client).get_api_versions(_request_timeout=10)
    for group in groups.groups or []:
        if group.name == RESOURCE_GROUP:
            served = [v.version for v in group.versions or []]
            preferred = group.preferred_version.version if group.preferred_version else ""
            return sorted(served, key=lambda v: (v != preferred, RESOURCE_VERSIONS.index(v) if v in RESOURCE_VERSIONS else 99))
    return []


class ClusterState:
    """The caches dra-guard keeps of the cluster, and what readiness needs to know about them.

    rbac: ClusterRoles and ClusterRoleBindings (RBAC guard; driver detection by ServiceAccount).
    claims: DaemonSets, DaemonSet-owned and claim-using Pods, and allocated ResourceClaims
    (drain order), read through the newest resource.k8s.io version the cluster serves.

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
        self.resource_version = ""
        self._refresh_lock = threading.Lock()  # one ClusterRoleBinding read at a time (refresh_bindings)
        self._bindings_read_from = float("-inf")  # monotonic start of the last complete read
        if client is None:
            return
        timeout = config.cluster.request_timeout_seconds
        rbac_api = kubernetes.client.RbacAuthorizationV1Api(client)
        apps_api = kubernetes.client.AppsV1Api(client)
        core_api = kubernetes.client.CoreV1Api(client)
        self.informers = [
            Informer(name="clusterroles", list_func=rbac_api.list_cluster_role, on_replace=self._roles_replaced,
                     on_event=self._role_event, timeout_seconds=timeout),
            Informer(name="clusterrolebindings", list_func=rbac_api.list_cluster_role_binding,
                     on_replace=self._bindings_replaced, on_event=self._binding_event, timeout_seconds=timeout),
            Informer(name="daemonsets", list_func=apps_api.list_daemon_set_for_all_namespaces,
                     on_replace=self.claims.replace_daemonsets, on_event=self._daemonset_event, timeout_seconds=timeout),
            Informer(name="pods", list_func=core_api.list_pod_for_all_namespaces,
                     on_replace=self.claims.replace_pods, on_event=self._pod_event, timeout_seconds=timeout),
            Informer(name="resourceclaims", list_func=self._list_claims,
                     on_replace=self.claims.replace_claims, on_event=self._claim_event, timeout_seconds=timeout),
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
        metrics.KUBE_API_REQUESTS.labels(verb="list", resource="clusterroles").inc()
        try:
            resp = kubernetes.client.RbacAuthorizationV1Api(self.client).list_cluster_role(
                field_selector=f"metadata.name={name}", _preload_content=False,
                _request_timeout=self.config.cluster.request_timeout_seconds)
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
        Counted in dra_guard_binding_refreshes_total{outcome}: read, shared, partial, failed."""
        if self.client is None:
            return None
        budget = self.config.cluster.request_timeout_seconds
        asked = time.monotonic()
        deadline = asked + budget
        if not self._refresh_lock.acquire(timeout=budget):
            return self._bindings_from_cache("another read of them took the whole budget", budget)
        try:
            if self._bindings_read_from >= asked:
                metrics.BINDING_REFRESHES.labels(outcome="shared").inc()
                return None
            if deadline - time.monotonic() < MIN_READ_SHARE * budget:
                # a concurrent read (partial, so not shared) used up the time: no read of our own
                # could finish, and starting one with no time would only fail
                return self._bindings_from_cache("a concurrent read took the budget", budget)
            started = time.monotonic()
            api = kubernetes.client.RbacAuthorizationV1Api(self.client)
            pages = Pages(api.list_cluster_role_binding, resource="clusterrolebindings", timeout_seconds=budget,
                          deadline=deadline)
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
                return self._bindings_from_cache("the API read did not finish in time", budget, read=pages.count,
                                                 seconds=time.monotonic() - started)
            self._bindings_read_from = started
            metrics.BINDING_REFRESHES.labels(outcome="read").inc()
            return None
        finally:
            self._refresh_lock.release()

    @staticmethod
    def _bindings_from_cache(why: str, budget: float, *, read: int | None = None,
                             seconds: float | None = None) -> str:
        """Count and log a partial binding read (refresh_bindings); the note for the review's warning."""
        metrics.BINDING_REFRESHES.labels(outcome="partial").inc()
        log.warning(f"ClusterRoleBindings judged from the cache: {why}",
                    extra={"objects": read, "seconds": round(seconds if seconds is not None else budget, 3)})
        counted = "" if read is None else f"; {read} read"
        return (f"ClusterRoleBindings judged from the watch cache: reading them from the API did not "
                f"finish within cluster.requestTimeoutSeconds ({budget:g} s{counted})")

    def service_account_writes_slices(self, namespace: str, name: str) -> bool:
        """Whether RBAC lets ServiceAccount namespace/name write ResourceSlices (a DRA driver sign)."""
        return self.rbac.service_account_may_write(namespace, name, "resourceslices", self.config.rbac)

    def _list_claims(self, **kwargs: Any) -> Any:
        """list/watch ResourceClaims in the newest served resource.k8s.io version (found on first use)."""
        assert self.client is not None
        if not self.resource_version or (not kwargs.get("watch") and not kwargs.get("_continue")):
            versions = served_resource_versions(self.client)
            if not versions:
                raise ClusterError("the cluster serves no resource.k8s.io version (DRA is not enabled)")
            self.resource_version = versions[0]
        api = kubernetes.client.CustomObjectsApi(self.client)
        return api.list_cluster_custom_object(RESOURCE_GROUP, self.resource_version, "resourceclaims", **kwargs)

    @staticmethod
    def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace", "")), str(meta.get("name", ""))

    def _roles_replaced(self, items: list[dict[str, Any]]) -> None:
        self.rbac.replace_roles(items)
        self.claims.redetect()

    def _bindings_replaced(self, items: list[dict[str, Any]]) -> None:
        self.rbac.replace_bindings(items)
        self.claims.redetect()

    def _role_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.rbac.delete_role(self._name(obj)[1])
        else:
            self.rbac.upsert_role(obj)
        self.claims.redetect()

    def _binding_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.rbac.delete_binding(self._name(obj)[1])
        else:
            self.rbac.upsert_binding(obj)
        self.claims.redetect()

    def _daemonset_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.claims.delete_daemonset(*self._name(obj))
        else:
            self.claims.upsert_daemonset(obj)

    def _pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.claims.delete_pod(*self._name(obj))
        else:
            self.claims.upsert_pod(obj)

    def _claim_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.claims.delete_claim(*self._name(obj))
        else:
            self.claims.upsert_claim(obj)

    def start(self) -> None:
        """Start every informer (non-blocking)."""
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        """Stop every informer."""
        for informer in self.informers:
            informer.stop()

    def synced(self, names: tuple[str, ...] | None = None) -> tuple[bool, str]:
        """(True, "") when every cache (or those named) has synced and keeps its watch, else
        (False, which caches not)."""
        missing = [i.name for i in self.informers if not i.synced.is_set() and (names is None or i.name in names)]
        return (not missing, "caches not synced: " + ", ".join(missing) if missing else "")

    def fresh(self, max_age_seconds: float) -> tuple[bool, str]:
        """synced(), and no cache has been without news from the apiserver for more than max_age_seconds."""
        ok, why = self.synced()
        if not ok:
            return ok, why
        stale = [f"{i.name} ({i.age():.0f} s)" for i in self.informers if i.age() > max_age_seconds]
        return (not stale, "caches without news: " + ", ".join(stale) if stale else "")

    def wait_synced(self, timeout_seconds: float) -> bool:
        """Block until every cache has synced or `timeout_seconds` pass; True when synced."""
        deadline = time.monotonic() + timeout_seconds
        return all(i.synced.wait(max(0.0, deadline - time.monotonic())) for i in self.informers)


class RateLimiter:
    """A token bucket for client-side API rate limits: `qps` requests per second, `burst` at once
    (like client-go's QPS/Burst). wait() blocks until a request may go."""

    def __init__(self, *, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps, self.burst = qps, burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Take one token, sleeping until one is available."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            delay = 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.qps
            self._tokens -= 1
        if delay:
            time.sleep(delay)


class Pages:
    """A LIST of one resource in pages of LIST_PAGE_SIZE, iterated item by item: only the current
    page's raw objects are in memory, so a consumer that keeps a compact form of each object (the
    informers' indexes) never holds the whole list (issue 9: peak RSS at start-up).

    Iterate once; afterwards `resource_version` is the list's resourceVersion and `count` the
    number of items. Each page is counted in dra_guard_kube_api_requests_total; API errors
    propagate as they come (the informers need a 410 as such).

    `deadline` (a time.monotonic() value) bounds the whole list, not just each page: every page
    waits at most until then, and when it has passed before the next page is asked for, the
    iteration ends early with `truncated` True and `resource_version` None.
    """

    def __init__(self, list_func: Callable[..., Any], *, resource: str, timeout_seconds: float,
                 limiter: RateLimiter | None = None, deadline: float | None = None) -> None:
        self._list = list_func
        self.resource = resource
        self.timeout_seconds = timeout_seconds
        self.limiter = limiter
        self.deadline = deadline
        self.resource_version: str | None = None  # set when the last page has been read
        self.count = 0
        self.truncated = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        cont: str | None = None
        while True:
            if self.limiter is not None:
                self.limiter.wait()
            timeout = self.timeout_seconds
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0 and cont:
                    self.truncated = True
                    return
                timeout = min(timeout, max(left, 0.001))
            metrics.KUBE_API_REQUESTS.labels(verb="list", resource=self.resource).inc()
            kwargs: dict[str, Any] = {"limit": LIST_PAGE_SIZE, "_preload_content": False,
                                      "_request_timeout": timeout}
            if cont:
                kwargs["_continue"] = cont
            page = json.loads(self._list(**kwargs).data)
            meta = page.get("metadata") or {}
            items = page.get("items") or []
            del page
            self.count += len(items)
            yield from items
            del items  # this page's raw objects go before the next page is read
            cont = meta.get("continue")
            if not cont:
                self.resource_version = str(meta.get("resourceVersion", ""))
                return


def list_pages(list_func: Callable[..., Any], *, resource: str, timeout_seconds: float,
               limiter: RateLimiter | None = None) -> tuple[list[dict[str, Any]], str]:
    """LIST one resource in pages of LIST_PAGE_SIZE: (every item as a plain dict, the list's
    resourceVersion). See Pages for a consumer that should not hold them all."""
    pages = Pages(list_func, resource=resource, timeout_seconds=timeout_seconds, limiter=limiter)
    items = list(pages)
    return items, pages.resource_version or ""


def list_all(list_func: Callable[..., Any], *, resource: str, kind: str, timeout_seconds: float = 30.0,
             limiter: RateLimiter | None = None) -> list[dict[str, Any]]:
    """Every object of one resource as plain dicts with `kind` set (list items carry none), for
    audits: list_pages with a client-side rate limit. Raises ClusterError on API errors."""
    try:
        items, _ = list_pages(list_func, resource=resource, timeout_seconds=timeout_seconds, limiter=limiter)
    except ApiException as exc:
        raise ClusterError(f"listing {resource} failed: HTTP {exc.status} {exc.reason}") from exc
    except Exception as exc:
        raise ClusterError(f"listing {resource} failed: {type(exc).__name__}: {exc}") from exc
    for item in items:
        item.setdefault("kind", kind)
    return items


def list_audit_objects(client: kubernetes.client.ApiClient, *, served_versions: list[str] | None = None,
                       limiter: RateLimiter | None = None) -> list[dict[str, Any]]:
    """What `dra-guard audit --cluster` judges, as plain dicts with kind set, in paged lists:
    ClusterRoles, ClusterRoleBindings, DaemonSets, Pods, Nodes, kube-system ConfigMaps and, when
    resource.k8s.io is served, ResourceSlices and ResourceClaims."""
    rbac_api = kubernetes.client.RbacAuthorizationV1Api(client)
    apps_api = kubernetes.client.AppsV1Api(client)
    core_api = kubernetes.client.CoreV1Api(client)

    def system_configmaps(**kwargs: Any) -> Any:
        return core_api.list_namespaced_config_map("kube-system", **kwargs)

    out = (list_all(rbac_api.list_cluster_role, resource="clusterroles", kind="ClusterRole", limiter=limiter)
           + list_all(rbac_api.list_cluster_role_binding, resource="clusterrolebindings", kind="ClusterRoleBinding",
                      limiter=limiter)
           + list_all(apps_api.list_daemon_set_for_all_namespaces, resource="daemonsets", kind="DaemonSet", limiter=limiter)
           + list_all(core_api.list_pod_for_all_namespaces, resource="pods", kind="Pod", limiter=limiter)
           + list_all(core_api.list_node, resource="nodes", kind="Node", limiter=limiter)
           + list_all(system_configmaps, resource="configmaps", kind="ConfigMap", limiter=limiter))
    if served_versions:
        custom = kubernetes.client.CustomObjectsApi(client)
        for plural, kind in (("resourceslices", "ResourceSlice"), ("resourceclaims", "ResourceClaim")):
            def lister(plural: str = plural, **kwargs: Any) -> Any:
                return custom.list_cluster_custom_object(RESOURCE_GROUP, served_versions[0], plural, **kwargs)
            out += list_all(lister, resource=plural, kind=kind, limiter=limiter)
    return out


def list_drain_objects(client: kubernetes.client.ApiClient, node: str) -> list[dict[str, Any]]:
    """What `dra-guard drain-plan NODE` needs: RBAC (driver detection), DaemonSets, the node's Pods
    (field selector spec.nodeName) and every ResourceClaim, in paged lists."""
    rbac_api = kubernetes.client.RbacAuthorizationV1Api(client)
    apps_api = kubernetes.client.AppsV1Api(client)
    core_api = kubernetes.client.CoreV1Api(client)
    metrics.KUBE_API_REQUESTS.labels(verb="get", resource="nodes").inc()
    try:
        core_api.read_node(node, _preload_content=False, _request_timeout=10)
    except ApiException as exc:
        if exc.status == 404:
            raise ClusterError(f"node {node} not found") from exc
        raise ClusterError(f"reading node {node} failed: HTTP {exc.status} {exc.reason}") from exc
    versions = served_resource_versions(client)
    if not versions:
        raise ClusterError("the cluster serves no resource.k8s.io version (DRA is not enabled)")
    custom = kubernetes.client.CustomObjectsApi(client)

    def claims(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(RESOURCE_GROUP, versions[0], "resourceclaims", **kwargs)

    def node_pods(**kwargs: Any) -> Any:
        return core_api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", **kwargs)

    return (list_all(rbac_api.list_cluster_role, resource="clusterroles", kind="ClusterRole")
            + list_all(rbac_api.list_cluster_role_binding, resource="clusterrolebindings", kind="ClusterRoleBinding")
            + list_all(apps_api.list_daemon_set_for_all_namespaces, resource="daemonsets", kind="DaemonSet")
            + list_all(node_pods, resource="pods", kind="Pod")
            + list_all(claims, resource="resourceclaims", kind="ResourceClaim"))


class KubeCertApi:
    """certs.selfmanaged.CertApi over the Kubernetes API, in `namespace`.

    Secrets' data is exchanged as bytes (base64 on the wire); Leases as coordination.k8s.io/v1
    dicts; webhook caBundles of admissionregistration.k8s.io/v1 configurations ("validating" or
    "mutating"). A 409 raises certs.selfmanaged.Conflict.
    """

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str, *, timeout_seconds: float = 5.0) -> None:
        self.namespace = namespace
        self.core = kubernetes.client.CoreV1Api(client)
        self.coordination = kubernetes.client.CoordinationV1Api(client)
        self.admission = kubernetes.client.AdmissionregistrationV1Api(client)
        self.timeout = timeout_seconds

    def _call(self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from certs.selfmanaged import Conflict

        metrics.KUBE_API_REQUESTS.labels(verb=verb, resource=resource).inc()
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and verb in ("get", "delete"):
                return None
            if exc.status == 409:
                raise Conflict(f"{verb} {resource}: {exc.reason}") from exc
            raise
        return json.loads(resp.data) if resp.data else {}

    def get_secret(self, name: str) -> dict[str, Any] | None:
        import base64

        obj = self._call("get", "secrets", self.core.read_namespaced_secret, name, self.namespace)
        if obj is None:
            return None
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        return {"data": data, "resourceVersion": obj["metadata"].get("resourceVersion", "")}

    def _secret_body(self, name: str, data: Mapping[str, bytes], resource_version: str = "") -> dict[str, Any]:
        import base64

        meta: dict[str, Any] = {"name": name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/managed-by": "dra-guard"}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}

    def create_secret(self, name: str, data: Mapping[str, bytes]) -> None:
        self._call("create", "secrets", self.core.create_namespaced_secret, self.namespace, self._secret_body(name, data))

    def update_secret(self, name: str, data: Mapping[str, bytes], resource_version: str) -> None:
        self._call("update", "secrets", self.core.replace_namespaced_secret, name, self.namespace,
                   self._secret_body(name, data, resource_version))

    def get_lease(self, name: str) -> dict[str, Any] | None:
        return self._call("get", "leases", self.coordination.read_namespaced_lease, name, self.namespace)

    def create_lease(self, lease: Mapping[str, Any]) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **lease,
                "metadata": {**lease["metadata"], "namespace": self.namespace}}
        self._call("create", "leases", self.coordination.create_namespaced_lease, self.namespace, body)

    def update_lease(self, lease: Mapping[str, Any]) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **lease}
        self._call("update", "leases", self.coordination.replace_namespaced_lease, lease["metadata"]["name"],
                   self.namespace, body)

    def list_leases(self, label_selector: str) -> list[dict[str, Any]]:
        out = self._call("list", "leases", self.coordination.list_namespaced_lease, self.namespace,
                         label_selector=label_selector)
        return list((out or {}).get("items") or [])

    def delete_lease(self, name: str) -> None:
        self._call("delete", "leases", self.coordination.delete_namespaced_lease, name, self.namespace)

    def _config_api(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any], str]:
        if kind == "validating":
            return (self.admission.read_validating_webhook_configuration,
                    self.admission.patch_validating_webhook_configuration, "validatingwebhookconfigurations")
        return (self.admission.read_mutating_webhook_configuration,
                self.admission.patch_mutating_webhook_configuration, "mutatingwebhookconfigurations")

    def webhook_ca_bundles(self, kind: str, name: str) -> list[bytes] | None:
        import base64

        read, _, resource = self._config_api(kind)
        obj = self._call("get", resource, read, name)
        if obj is None:
            return None
        return [base64.b64decode((w.get("clientConfig") or {}).get("caBundle") or "") for w in obj.get("webhooks") or []]

    def set_webhook_ca_bundles(self, kind: str, name: str, bundle: bytes) -> None:
        import base64

        read, patch, resource = self._config_api(kind)
        obj = self._call("get", resource, read, name)
        if obj is None:
            return
        value = base64.b64encode(bundle).decode()
        ops: list[dict[str, Any]] = []
        for i, webhook in enumerate(obj.get("webhooks") or []):
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": webhook["name"]})
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": value})
        if ops:
            self._call("patch", resource, patch, name, ops, _content_type="application/json-patch+json")


POLICY_REPORT_GROUP = "wgpolicyk8s.io"
POLICY_REPORT_VERSION = "v1alpha2"
MANAGED_BY = "app.kubernetes.io/managed-by=dra-guard"


class PolicyReportWriter:
    """Writes dra-guard's wgpolicyk8s.io/v1alpha2 ClusterPolicyReport and PolicyReports, replacing
    its previous ones (reports of namespaces without findings any more are deleted)."""

    def __init__(self, client: kubernetes.client.ApiClient, *, timeout_seconds: float = 10.0) -> None:
        self.client = client
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.timeout = timeout_seconds

    def served(self) -> bool:
        """Whether the cluster serves wgpolicyk8s.io/v1alpha2 (the CRDs are installed)."""
        metrics.KUBE_API_REQUESTS.labels(verb="get", resource="apis").inc()
        for group in kubernetes.client.ApisApi(self.client).get_api_versions(_request_timeout=self.timeout).groups or []:
            if group.name == POLICY_REPORT_GROUP:
                return any(v.version == POLICY_REPORT_VERSION for v in group.versions or [])
        return False

    def _call(self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        metrics.KUBE_API_REQUESTS.labels(verb=verb, resource=resource).inc()
        try:
            return fn(POLICY_REPORT_GROUP, POLICY_REPORT_VERSION, *args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and verb in ("get", "delete"):
                return None
            raise

    def apply(self, reports: list[dict[str, Any]]) -> None:
        """Create or replace each report; delete dra-guard's PolicyReports not among `reports`."""
        keep = set()
        for report in reports:
            meta = report["metadata"]
            namespace, name = meta.get("namespace"), meta["name"]
            if namespace:
                keep.add(namespace)
                current = self._call("get", "policyreports", self.custom.get_namespaced_custom_object,
                                     namespace, "policyreports", name)
                if current is None:
                    self._call("create", "policyreports", self.custom.create_namespaced_custom_object,
                               namespace, "policyreports", report)
                else:
                    body = {**report, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
                    self._call("update", "policyreports", self.custom.replace_namespaced_custom_object,
                               namespace, "policyreports", name, body)
            else:
                current = self._call("get", "clusterpolicyreports", self.custom.get_cluster_custom_object,
                                     "clusterpolicyreports", name)
                if current is None:
                    self._call("create", "clusterpolicyreports", self.custom.create_cluster_custom_object,
                               "clusterpolicyreports", report)
                else:
                    body = {**report, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
                    self._call("update", "clusterpolicyreports", self.custom.replace_cluster_custom_object,
                               "clusterpolicyreports", name, body)
        listed = self._call("list", "policyreports", self.custom.list_cluster_custom_object, "policyreports",
                            label_selector=MANAGED_BY) or {}
        for item in listed.get("items") or []:
            meta = item.get("metadata") or {}
            if meta.get("namespace") not in keep:
                self._call("delete", "policyreports", self.custom.delete_namespaced_custom_object,
                           meta.get("namespace"), "policyreports", meta.get("name"))
