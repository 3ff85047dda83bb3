"""The requests of `dra-guard drain NODE` (webhook.kube.nodedrain), each about its node only.

The Node by name; its pods by field selector ``spec.nodeName`` (a list, then watches from its
resourceVersion); ResourceClaims, pods and DaemonSets by name; its ResourceSlices by field
selector; SelfSubjectAccessReviews; Evictions; the kubelet's /metrics through the node proxy;
Events on the Node. Every request is counted (webhook.kube.client.count).
"""

from __future__ import annotations

import datetime
import functools
import getpass
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from webhook.kube.client import RESOURCE_GROUP, ClusterError, count, served_resource_versions, server_of
from webhook.kube.errors import api_failure, calling, cause
from webhook.model.readers import as_list, as_map, as_str

#: where the drain's Events on the Node go (a Node has no namespace; kubectl describe node finds
#: them in any namespace, and the kubelet's own go to default)
EVENTS_NAMESPACE = "default"


def identity() -> str:
    """Who drains: "<local user>@<host>/<pid>" (HOLDER's value)."""
    return f"{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}"


def holder_alive(holder: str) -> bool:
    """False when `holder` (identity()) ran on this host and its process is gone; else True."""
    host_pid = holder.rpartition("@")[2]
    host, _, pid = host_pid.rpartition("/")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def now_text() -> str:
    """Now, as RFC 3339 in UTC to the second (an annotation's timestamp)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: the kubelet's gauge of prepared ResourceClaims by driver (k8s.io/kubernetes pkg/kubelet/cm/dra,
#: claimInfoCollector; since v1.34): one sample per driver with a claim prepared on the node (a
#: driver with none is left out) and the total under driver_name "<any>", always present
CLAIMS_IN_USE = "dra_resource_claims_in_use"
ANY_DRIVER = "<any>"


def parse_claims_in_use(metrics_text: str) -> dict[str, float]:
    """The kubelet gauge ``dra_resource_claims_in_use{driver_name="D"} N`` from the kubelet's
    /metrics (Prometheus text exposition): driver name -> N, the "<any>" total left out; a driver
    absent from it has no claim prepared on the node.

    Raises ValueError when the text is not a Prometheus text exposition (prometheus_client's
    parser), and when it has no "<any>" sample: not the gauge of a kubelet that exports
    it (older than v1.34, the metric disabled, or not a kubelet's /metrics), whose silence must not
    be read as "nothing prepared"."""
    out: dict[str, float] = {}
    total = False
    for family in text_string_to_metric_families(metrics_text):  # ValueError on a malformed exposition
        if family.name != CLAIMS_IN_USE:
            continue
        for sample in family.samples:
            name = sample.labels.get("driver_name", "")
            if name == ANY_DRIVER:
                total = True
            elif name:
                out[name] = float(sample.value)
    if not total:
        raise ValueError(
            f'no {CLAIMS_IN_USE}{{driver_name="{ANY_DRIVER}"}} sample in the kubelet\'s /metrics (kubelet older than v1.34, or the metric disabled)'
        )
    return out


class NodeApi:
    """The requests of one drain of `node` (dicts in, dicts out). Raises ClusterError naming the
    request and the server on API and network failures (webhook.kube.errors)."""

    def __init__(self, client: kubernetes.client.ApiClient, node: str, *, timeout_seconds: float) -> None:
        self.client, self.node, self.timeout = client, node, timeout_seconds
        self.core = kubernetes.client.CoreV1Api(client)
        self.server = server_of(client)
        self._version = ""

    def _json(self, action: str, verb: str, resource: str, call: Callable[[], Any]) -> dict[str, Any]:
        count(verb, resource)
        with calling(self.server, action, timeout_seconds=self.timeout):
            return dict(json.loads(call().data))

    def get_node(self) -> dict[str, Any]:
        """The Node; ClusterError "node N not found in SERVER" when it does not exist."""
        try:
            return self._json(
                f"get node {self.node}",
                "get",
                "nodes",
                lambda: self.core.read_node(self.node, _preload_content=False, _request_timeout=self.timeout),
            )
        except ClusterError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                raise ClusterError(f"node {self.node} not found in {self.server}") from exc.__cause__
            raise

    def patch_node(self, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """A JSON merge patch of the Node (dryRun=All when dry_run); ApiException 409 leaves as is
        (a resourceVersion in `body` that is no longer the Node's)."""
        count("patch", "nodes")
        try:
            resp = self.core.patch_node(
                self.node,
                body,
                dry_run="All" if dry_run else None,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise
            raise api_failure(f"patch node {self.node}", self.server, exc, timeout_seconds=self.timeout) from exc
        except Exception as exc:
            raise api_failure(f"patch node {self.node}", self.server, exc, timeout_seconds=self.timeout) from exc
        return dict(json.loads(resp.data))

    def update(self, change: Callable[[dict[str, Any]], dict[str, Any] | None], *, dry_run: bool = False) -> dict[str, Any]:
        """Read the Node, patch it with change(node) (None: nothing to do) under its resourceVersion;
        read again and retry on a conflict. Returns the Node as it is now."""
        for _ in range(10):
            node = self.get_node()
            body = change(node)
            if body is None:
                return node
            body.setdefault("metadata", {})["resourceVersion"] = as_str(as_map(node.get("metadata")).get("resourceVersion"))
            try:
                return self.patch_node(body, dry_run=dry_run)
            except ApiException:  # 409: changed meanwhile (the kubelet's status, another drain)
                continue
        raise ClusterError(f"node {self.node} changed under every one of 10 updates; try again")

    def can_i(
        self, verb: str, resource: str, group: str = "", subresource: str = "", name: str = "", namespace: str = ""
    ) -> bool:
        """A SelfSubjectAccessReview: may the caller `verb` `resource` (in `namespace`; "" cluster-wide)?"""
        count("create", "selfsubjectaccessreviews")
        review = kubernetes.client.V1SelfSubjectAccessReview(
            spec=kubernetes.client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=kubernetes.client.V1ResourceAttributes(
                    verb=verb,
                    resource=resource,
                    group=group,
                    subresource=subresource or None,
                    name=name or None,
                    namespace=namespace or None,
                )
            )
        )
        api = kubernetes.client.AuthorizationV1Api(self.client)
        with calling(self.server, "create selfsubjectaccessreviews", timeout_seconds=self.timeout):
            out = api.create_self_subject_access_review(review, _request_timeout=self.timeout)
        return bool(out.status and out.status.allowed)

    def list_pods(self, label_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        """The node's pods (field selector spec.nodeName) and the list's resourceVersion."""
        listed = self._json(
            f"list pods on node {self.node}",
            "list",
            "pods",
            lambda: self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}",
                label_selector=label_selector or None,
                _preload_content=False,
                _request_timeout=self.timeout,
            ),
        )
        return [dict(i) for i in as_list(listed.get("items"))], as_str(as_map(listed.get("metadata")).get("resourceVersion"))

    def watch_pods(self, resource_version: str, seconds: int) -> Iterable[dict[str, Any]]:
        """The watch events ({type, object}) of the node's pods from `resource_version` for at most
        `seconds` seconds; an ERROR event (410: too old) is passed on."""
        count("watch", "pods")
        with calling(self.server, f"watch pods on node {self.node}", timeout_seconds=seconds + self.timeout):
            resp = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}",
                watch=True,
                resource_version=resource_version,
                timeout_seconds=seconds,
                allow_watch_bookmarks=True,
                _preload_content=False,
                _request_timeout=seconds + self.timeout,
            )
            try:
                for line in resp:
                    if line.strip():
                        yield json.loads(line)
            finally:
                resp.release_conn()

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Pod namespace/name, None when it does not exist."""
        return self._maybe(
            f"get pod {namespace}/{name}",
            "pods",
            lambda: self.core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=self.timeout),
        )

    def get_daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        """DaemonSet namespace/name, None when it does not exist."""
        apps = kubernetes.client.AppsV1Api(self.client)
        return self._maybe(
            f"get daemonset {namespace}/{name}",
            "daemonsets",
            lambda: apps.read_namespaced_daemon_set(name, namespace, _preload_content=False, _request_timeout=self.timeout),
        )

    def _dra_version(self) -> str:
        if not self._version:
            versions = served_resource_versions(self.client, timeout_seconds=self.timeout)
            if not versions:
                raise ClusterError("the cluster serves no resource.k8s.io version (DRA is not enabled)")
            self._version = versions[0]
        return self._version

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """ResourceClaim namespace/name, None when it does not exist."""
        custom = kubernetes.client.CustomObjectsApi(self.client)
        version = self._dra_version()
        return self._maybe(
            f"get resourceclaim {namespace}/{name}",
            "resourceclaims",
            lambda: custom.get_namespaced_custom_object(
                RESOURCE_GROUP, version, namespace, "resourceclaims", name, _preload_content=False, _request_timeout=self.timeout
            ),
        )

    def list_slices(self) -> list[dict[str, Any]]:
        """The node's ResourceSlices (field selector spec.nodeName)."""
        custom = kubernetes.client.CustomObjectsApi(self.client)
        version = self._dra_version()
        listed = self._json(
            f"list resourceslices of node {self.node}",
            "list",
            "resourceslices",
            lambda: custom.list_cluster_custom_object(
                RESOURCE_GROUP,
                version,
                "resourceslices",
                field_selector=f"spec.nodeName={self.node}",
                _preload_content=False,
                _request_timeout=self.timeout,
            ),
        )
        return [{**i, "kind": "ResourceSlice"} for i in as_list(listed.get("items"))]

    def list_rbac(self) -> list[dict[str, Any]]:
        """ClusterRoles and ClusterRoleBindings (driver detection: who may write ResourceSlices);
        [] when the caller may not list them."""
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.client)
        out: list[dict[str, Any]] = []
        calls: tuple[tuple[str, str, Callable[..., Any]], ...] = (
            ("clusterroles", "ClusterRole", rbac.list_cluster_role),
            ("clusterrolebindings", "ClusterRoleBinding", rbac.list_cluster_role_binding),
        )
        for resource, kind, call in calls:
            try:
                listed = self._json(
                    f"list {resource}",
                    "list",
                    resource,
                    functools.partial(call, _preload_content=False, _request_timeout=self.timeout),
                )
            except ClusterError as exc:
                if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 403:
                    return []
                raise
            out += [{**i, "kind": kind} for i in as_list(listed.get("items"))]
        return out

    def _maybe(self, action: str, resource: str, call: Callable[[], Any]) -> dict[str, Any] | None:
        try:
            return self._json(action, "get", resource, call)
        except ClusterError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                return None
            raise

    def evict(self, namespace: str, name: str, *, grace_period: int, dry_run: bool) -> tuple[int, str]:
        """POST an Eviction (policy/v1) of pod namespace/name: (HTTP status, the refusal's message
        ("" when evicted; a PodDisruptionBudget's names the budget)). 201 evicted, 404 gone, 429 a PodDisruptionBudget or a webhook asking to
        retry, 500 a webhook that did not answer, other codes as the server gave them. Network
        failures raise ClusterError (transient: retried by the caller)."""
        count("create", "pods/eviction")
        body = kubernetes.client.V1Eviction(
            metadata=kubernetes.client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=kubernetes.client.V1DeleteOptions(grace_period_seconds=grace_period) if grace_period >= 0 else None,
        )
        try:
            self.core.create_namespaced_pod_eviction(
                name, namespace, body, dry_run="All" if dry_run else None, _request_timeout=self.timeout
            )
        except ApiException as exc:
            # details: a PodDisruptionBudget's refusal names the budget only in its causes
            return exc.status or 0, cause(exc, details=True)
        except Exception as exc:
            raise api_failure(f"evict pod {namespace}/{name}", self.server, exc, timeout_seconds=self.timeout) from exc
        return 201, ""

    def node_metrics(self) -> str:
        """The kubelet's /metrics through the apiserver's node proxy (needs nodes/proxy get)."""
        count("get", "nodes/proxy")
        with calling(self.server, f"get /api/v1/nodes/{self.node}/proxy/metrics", timeout_seconds=self.timeout):
            return str(self.core.connect_get_node_proxy_with_path(self.node, "metrics", _request_timeout=self.timeout))

    def event(self, node: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """A core/v1 Event on the Node (namespace EVENTS_NAMESPACE, source dra-guard-drain)."""
        count("create", "events")
        now = datetime.datetime.now(datetime.UTC)
        meta = as_map(node.get("metadata"))
        event = kubernetes.client.CoreV1Event(
            metadata=kubernetes.client.V1ObjectMeta(generate_name=f"{self.node}.dra-guard-drain."),
            involved_object=kubernetes.client.V1ObjectReference(
                kind="Node", api_version="v1", name=self.node, uid=as_str(meta.get("uid")) or None
            ),
            reason=reason,
            message=message[:1000],
            type="Warning" if warning else "Normal",
            source=kubernetes.client.V1EventSource(component="dra-guard-drain"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        with calling(self.server, "create events", timeout_seconds=self.timeout):
            self.core.create_namespaced_event(EVENTS_NAMESPACE, event, _request_timeout=self.timeout)
