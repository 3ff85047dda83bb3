"""The Kubernetes API side of `dra-guard drain NODE` and `dra-guard uncordon NODE`.

`NodeApi` makes every request of a drain, each about its node only: the Node by name, its pods by
field selector ``spec.nodeName`` (a list, then watches from its resourceVersion), ResourceClaims
by name (those its pods name; the reserving pods on other nodes by name), the DaemonSets of its
pods by name, its ResourceSlices by field selector; never the cluster's pods. The order and the
rules are webhook.model.drain's (pure); `drain()` runs them, `uncordon()` undoes what a drain changed.

Every write is a merge patch of the Node (taints and ``unschedulable`` with its resourceVersion,
so a concurrent change is read again rather than overwritten), an Eviction (policy/v1: PDBs and
dra-guard's own webhook are asked; a pod is never deleted), or an Event on the Node.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import getpass
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook.config import Config
from webhook.kube.client import RESOURCE_GROUP, ClusterError, count, served_resource_versions, server_of
from webhook.kube.errors import api_failure, calling, cause
from webhook.model import drain as plan
from webhook.model.facts import build_facts
from webhook.model.readers import annotations_of, as_list, as_map, as_str

#: (verb, resource, group, subresource, what for) a drain cannot do without
REQUIRED = (
    ("get", "nodes", "", "", "read the node"),
    ("patch", "nodes", "", "", "cordon, taints, annotations"),
    ("list", "pods", "", "", "the node's pods"),
    ("watch", "pods", "", "", "the node's pods"),
    ("get", "pods", "", "", "pods reserving the node's claims"),
    ("create", "pods", "", "eviction", "evict pods"),
    ("get", "resourceclaims", RESOURCE_GROUP, "", "the claims of the node's pods"),
    ("list", "resourceslices", RESOURCE_GROUP, "", "the node's drivers"),
    ("get", "daemonsets", "apps", "", "recognise DRA drivers"),
)

Emit = Callable[[dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class DrainOptions:
    """The options of `dra-guard drain` (seconds: timeout 0 = no limit; grace_period -1 = the pod's own)."""

    timeout: float = 0.0
    grace_period: int = -1
    dry_run: str = "none"  # none | client | server
    pod_selector: str = ""
    evict_drivers: bool = False
    safety_seconds: float = plan.SAFETY_SECONDS
    request_timeout: float = 30.0
    interval: float = 1.0


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


def _now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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

    def can_i(self, verb: str, resource: str, group: str = "", subresource: str = "", name: str = "") -> bool:
        """A SelfSubjectAccessReview: may the caller `verb` `resource` (cluster-wide)?"""
        count("create", "selfsubjectaccessreviews")
        review = kubernetes.client.V1SelfSubjectAccessReview(
            spec=kubernetes.client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=kubernetes.client.V1ResourceAttributes(
                    verb=verb, resource=resource, group=group, subresource=subresource or None, name=name or None
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
        ("" when evicted)). 201 evicted, 404 gone, 429 a PodDisruptionBudget or a webhook asking to
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
            return exc.status or 0, cause(exc)
        except Exception as exc:
            raise api_failure(f"evict pod {namespace}/{name}", self.server, exc, timeout_seconds=self.timeout) from exc
        return 201, ""

    def node_metrics(self) -> str:
        """The kubelet's /metrics through the apiserver's node proxy (needs nodes/proxy get)."""
        count("get", "nodes/proxy")
        with calling(self.server, f"get /api/v1/nodes/{self.node}/proxy/metrics", timeout_seconds=self.timeout):
            return str(self.core.connect_get_node_proxy_with_path(self.node, "metrics", _request_timeout=self.timeout))

    def event(self, node: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """A core/v1 Event on the Node (namespace default, source dra-guard-drain)."""
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
            self.core.create_namespaced_event("default", event, _request_timeout=self.timeout)


class PodTracker:
    """The node's pods, kept by a list and then watches (so a pod's last state before it was
    deleted is seen: webhook.model.drain.left_unseen). `departed` collects the last state of each
    pod deleted since it was last emptied; a pod missing after a relist (a watch too old) counts as
    departed with an unknown state."""

    def __init__(self, api: NodeApi) -> None:
        self.api = api
        self.pods: dict[str, dict[str, Any]] = {}
        self.departed: list[dict[str, Any]] = []
        self._rv = ""
        self.relist()

    def relist(self) -> None:
        items, self._rv = self.api.list_pods()
        fresh = {as_str(as_map(p.get("metadata")).get("uid")): p for p in items}
        self.departed += [{"metadata": p.get("metadata"), "status": {}} for uid, p in self.pods.items() if uid not in fresh]
        self.pods = fresh

    def poll(self, seconds: float) -> None:
        """Apply the watch events of up to `seconds` seconds (at least 1)."""
        for event in self.api.watch_pods(self._rv, max(1, round(seconds))):
            kind, obj = event.get("type"), as_map(event.get("object"))
            meta = as_map(obj.get("metadata"))
            if kind == "ERROR":
                self.relist()
                return
            if meta.get("resourceVersion"):
                self._rv = as_str(meta.get("resourceVersion"))
            if kind == "BOOKMARK":
                continue
            uid = as_str(meta.get("uid"))
            if kind == "DELETED":
                self.pods.pop(uid, None)
                self.departed.append(dict(obj))
            else:
                self.pods[uid] = dict(obj)

    def take_departed(self) -> list[dict[str, Any]]:
        out, self.departed = self.departed, []
        return out


class Reader:
    """What the plan reads each round besides the pods: claims by name, reserving pods elsewhere and
    DaemonSets by name (both kept for the run), the node's ResourceSlices, RBAC once."""

    def __init__(self, api: NodeApi, config: Config) -> None:
        self.api, self.config = api, config
        self.claim_keys: set[tuple[str, str]] = set()
        self.elsewhere: dict[tuple[str, str], dict[str, Any] | None] = {}
        self.daemonsets: dict[tuple[str, str], dict[str, Any] | None] = {}
        self.rbac: list[dict[str, Any]] | None = None
        #: pod uid -> the drivers of claims that reserved it (kept: a departed pod's claims may be gone)
        self.pod_drivers: dict[str, frozenset[str]] = {}

    def read(self, node: Mapping[str, Any], pods: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
        """(the ClaimIndex of the node as read now, the claims read)."""
        if self.rbac is None:
            self.rbac = self.api.list_rbac()
        for pod in pods:
            ns = as_str(as_map(pod.get("metadata")).get("namespace"))
            self.claim_keys.update((ns, n) for n in plan.claim_names(pod))
            owner = next(
                (o for o in map(as_map, as_list(as_map(pod.get("metadata")).get("ownerReferences"))) if o.get("controller")), {}
            )
            if owner.get("kind") == "DaemonSet" and (ns, as_str(owner.get("name"))) not in self.daemonsets:
                self.daemonsets[(ns, as_str(owner.get("name")))] = self.api.get_daemonset(ns, as_str(owner.get("name")))
        claims = []
        on_node = {as_str(as_map(p.get("metadata")).get("uid")) for p in pods}
        for ns, name in sorted(self.claim_keys):
            claim = self.api.get_claim(ns, name)
            reserved = as_list(as_map((claim or {}).get("status")).get("reservedFor"))
            if claim is None or not reserved:
                self.claim_keys.discard((ns, name))  # released: nobody on this node needs it any more
                if claim is None:
                    continue
            claims.append({**claim, "kind": "ResourceClaim"})
            for ref in map(as_map, reserved):
                key = (ns, as_str(ref.get("name")))
                if ref.get("resource") == "pods" and as_str(ref.get("uid")) not in on_node and key not in self.elsewhere:
                    other = self.api.get_pod(*key)
                    # only a pod on another node is kept for the run: one of this node is in `pods`
                    on_other = other is not None and as_str(as_map(other.get("spec")).get("nodeName")) != self.api.node
                    if on_other:
                        self.elsewhere[key] = other
        self.pod_drivers.update(plan.drivers_by_pod(claims))
        objects = [
            {**node, "kind": "Node"},
            *(self.rbac or []),
            *({**d, "kind": "DaemonSet"} for d in self.daemonsets.values() if d),
            *({**p, "kind": "Pod"} for p in pods),
            *({**p, "kind": "Pod"} for p in self.elsewhere.values() if p),
            *self.api.list_slices(),
            *claims,
        ]
        return build_facts(objects, self.config).claims, claims


class Drain:
    """One run of `dra-guard drain NODE` (see drain())."""

    def __init__(self, api: NodeApi, config: Config, options: DrainOptions, emit: Emit) -> None:
        self.api, self.config, self.opts, self._emit = api, config, options, emit
        self.node = api.node
        self.me = identity()
        self.gauge_allowed = False
        self.events_allowed = False
        self._renewed = 0.0

    def emit(self, event: str, message: str, **data: Any) -> None:
        self._emit({"event": event, "node": self.node, "message": message, **data})

    def note(self, node: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the Node when allowed (the drain goes on when it cannot be written)."""
        if not self.events_allowed:
            return
        try:
            self.api.event(node, reason, message, warning=warning)
        except ClusterError as exc:
            self.events_allowed = False
            self.emit("warning", f"Events on the node are not written any more: {exc}")

    # ---------------------------------------------------------------- preflight

    def preflight(self) -> None:
        """SelfSubjectAccessReviews of REQUIRED; ClusterError naming every missing permission
        before anything changes. Also learns whether nodes/proxy (the kubelet's gauge) and Events
        may be used."""
        missing = [
            f"{verb} {resource}{'/' + sub if sub else ''}{'.' + group if group else ''} ({why})"
            for verb, resource, group, sub, why in REQUIRED
            if not self.api.can_i(verb, resource, group, sub)
        ]
        if missing:
            raise ClusterError(f"cannot drain node {self.node}: missing permission to " + "; ".join(missing))
        self.gauge_allowed = self.api.can_i("get", "nodes", "", "proxy")
        self.events_allowed = self.api.can_i("create", "events")

    # ---------------------------------------------------------------- the node's own changes

    def _update(self, change: Callable[[dict[str, Any]], dict[str, Any] | None], *, dry_run: bool = False) -> dict[str, Any]:
        """Read the Node, patch it with change(node) (None: nothing to do) under its resourceVersion;
        read again and retry on a conflict. Returns the Node as it is now."""
        for _ in range(10):
            node = self.api.get_node()
            body = change(node)
            if body is None:
                return node
            body.setdefault("metadata", {})["resourceVersion"] = as_str(as_map(node.get("metadata")).get("resourceVersion"))
            try:
                return self.api.patch_node(body, dry_run=dry_run)
            except ApiException:  # 409: changed meanwhile (the kubelet's status, another drain)
                continue
        raise ClusterError(f"node {self.node} changed under every one of 10 updates; try again")

    def acquire(self) -> str:
        """Take HOLDER for this run; "" when taken, else the holder (another drain runs)."""
        held: list[str] = []

        def take(node: dict[str, Any]) -> dict[str, Any] | None:
            holder = as_str(annotations_of(node).get(plan.HOLDER))
            verdict = plan.holder_verdict(node, self.me, now=time.time(), alive=holder_alive(holder))
            held[:] = [holder] if verdict == "held" else []
            if held:
                return None
            if verdict == "stale":
                self.emit("lock", f"taking the node over from {holder} (gone or silent for {plan.LOCK_SECONDS} s)")
            return {"metadata": {"annotations": {plan.HOLDER: self.me, plan.RENEWED: _now_text()}}}

        self._update(take)
        self._renewed = time.monotonic()
        return held[0] if held else ""

    def renew(self) -> None:
        if time.monotonic() - self._renewed > plan.LOCK_SECONDS / 3:
            self.api.patch_node({"metadata": {"annotations": {plan.RENEWED: _now_text()}}})
            self._renewed = time.monotonic()

    def cordon(self) -> dict[str, Any]:
        """Cordon the node, remembering in STATE whether it was cordoned before (the first run's
        word is kept: a rerun finds the node cordoned by the drain), and add the autoscalers'
        annotations that are absent (recorded in STATE, removed by finish())."""
        said: list[str] = []

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            state = plan.read_state(node)
            spec, annotations = as_map(node.get("spec")), annotations_of(node)
            if not state:
                state = {"unschedulableBefore": bool(spec.get("unschedulable")), "taints": [], "annotations": []}
            added = [k for k in plan.AUTOSCALER_ANNOTATIONS if k not in annotations]
            state["annotations"] = sorted(set(state.get("annotations", [])) | set(added))
            if spec.get("unschedulable") and not added and plan.STATE in annotations:
                return None
            said[:] = [
                ("cordoned" if not spec.get("unschedulable") else "was cordoned already")
                + (f"; set {', '.join(added)}" if added else "")
            ]
            return {
                "metadata": {
                    "annotations": {
                        plan.STATE: json.dumps(state, sort_keys=True),
                        **{k: plan.AUTOSCALER_ANNOTATIONS[k] for k in added},
                    }
                },
                "spec": {"unschedulable": True},
            }

        node = self._update(change)
        if said:
            self.emit("cordon", said[0])
            self.note(node, "DraGuardDrainStarted", f"dra-guard drain by {self.me}: {said[0]}")
        return node

    def taint(self, taint: Mapping[str, str]) -> None:
        """Put `taint` on the node (recorded in STATE for uncordon) unless it is there."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            if plan.has_taint(node, taint):
                return None
            state = plan.read_state(node)
            state["taints"] = sorted(set(state.get("taints", [])) | {taint["key"]})
            taints = [*as_list(as_map(node.get("spec")).get("taints")), dict(taint)]
            return {"metadata": {"annotations": {plan.STATE: json.dumps(state, sort_keys=True)}}, "spec": {"taints": taints}}

        node = self._update(change)
        self.emit("taint", f"tainted {taint['key']}={taint['value']}:{taint['effect']}")
        self.note(node, "DraGuardDrainTaint", f"taint {taint['key']}:{taint['effect']}")

    def finish(self) -> None:
        """Remove the autoscalers' annotations this drain added and HOLDER (the drain is over)."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            annotations = annotations_of(node)
            if annotations.get(plan.HOLDER) not in (self.me, None):
                return None  # taken over: the other drain removes them
            state = plan.read_state(node)
            drop = [k for k in state.get("annotations", []) if k in annotations]
            patch: dict[str, Any] = {k: None for k in (*drop, plan.HOLDER, plan.RENEWED)}
            if state:
                state["annotations"] = []
                patch[plan.STATE] = json.dumps(state, sort_keys=True)
            return {"metadata": {"annotations": patch}}

        self._update(change)

    # ---------------------------------------------------------------- the run

    def run(self) -> int:
        node = self.api.get_node()
        if self.opts.dry_run == "client":
            return self.plan_only(node)
        self.preflight()
        if self.opts.dry_run == "server":
            return self.server_dry_run(node)
        holder = self.acquire()
        if holder:
            self.emit("stopped", f"node {self.node} is being drained by {holder}; not started", reasons=[f"drained by {holder}"])
            return 1
        try:
            return self.loop()
        finally:
            self.finish()

    def view(self, node: Mapping[str, Any], pods: list[dict[str, Any]], reader: Reader) -> tuple[Any, list[plan.PodEntry]]:
        index, _ = reader.read(node, pods)
        selected = None
        if self.opts.pod_selector:
            items, _ = self.api.list_pods(self.opts.pod_selector)
            selected = frozenset(f"{as_map(p['metadata']).get('namespace')}/{as_map(p['metadata']).get('name')}" for p in items)
        return index, plan.classify(pods, index, selected=selected)

    def loop(self) -> int:
        opts = self.opts
        node = self.cordon()
        deadline = time.monotonic() + opts.timeout if opts.timeout > 0 else None
        tracker, reader = PodTracker(self.api), Reader(self.api, self.config)
        unconfirmed_since: dict[str, float] = {}
        retry: dict[str, tuple[float, float]] = {}  # pod -> (next attempt, delay)
        refusals: dict[str, str] = {}
        evicted: set[str] = set()
        phase = ""
        last_waiting: tuple[str, ...] = ()
        while True:
            self.renew()
            node = self.api.get_node()
            index, entries = self.view(node, list(tracker.pods.values()), reader)
            now = time.monotonic()
            for gone in tracker.take_departed():
                uid = as_str(as_map(gone.get("metadata")).get("uid"))
                if plan.left_unseen(gone):
                    for driver in reader.pod_drivers.get(uid, ()):
                        unconfirmed_since[driver] = now
                        key = f"{as_map(gone.get('metadata')).get('namespace')}/{as_map(gone.get('metadata')).get('name')}"
                        self.emit(
                            "unconfirmed", f"pod {key} left without the kubelet's word that driver {driver} unprepared its claims"
                        )
            drivers = plan.driver_states(index, self.node)
            for d in drivers:
                if d.name in unconfirmed_since and (d.holds or not d.available):
                    unconfirmed_since[d.name] = now  # the safety period counts while the driver can unprepare
            unconfirmed = self.confirm(unconfirmed_since, now)
            step = plan.next_step(entries, drivers, evict_drivers=opts.evict_drivers, unconfirmed=unconfirmed)
            if step.phase != phase:
                phase = step.phase
                if not step.done:
                    self.emit("phase", f"phase {phase}", phase=phase)
                    self.note(node, "DraGuardDrainPhase", f"phase {phase}")
            if step.done:
                word = "drained: its DRA drivers' claims are released" + (
                    " and the driver pods evicted" if opts.evict_drivers else "; the driver pods stay (safe to power off)"
                )
                self.emit("done", word, phase="done")
                self.note(node, "DraGuardDrainDone", word)
                return 0
            if step.taint is not None and step.evict:
                self.taint(step.taint)
            for key in step.evict:
                at, delay = retry.get(key, (0.0, 0.5))
                if at > now:
                    continue
                ns, _, name = key.partition("/")
                try:
                    status, message = self.api.evict(ns, name, grace_period=opts.grace_period, dry_run=False)
                except ClusterError as exc:
                    if not exc.transient:
                        raise
                    status, message = 0, str(exc)
                if status in (201, 404):
                    refusals.pop(key, None)
                    if key not in evicted:
                        evicted.add(key)
                        self.emit("evict", f"evicted pod {key}", pod=key, phase=phase)
                    retry[key] = (now + 5.0, 5.0)  # not Terminating yet in the next round's read: do not ask again at once
                    continue
                delay = min(delay * 2, 10.0)
                retry[key] = (now + delay, delay)
                if refusals.get(key) != message:
                    self.emit("refused", f"eviction of pod {key} refused ({status}): {message}; retrying", pod=key, status=status)
                refusals[key] = message
            waiting = (*step.blocked, *step.waiting, *(f"eviction of pod {k} refused: {m}" for k, m in sorted(refusals.items())))
            if waiting != last_waiting:
                self.emit(
                    "waiting", waiting[0] if waiting else "waiting", phase=phase, reasons=list(waiting), pods=len(step.evict)
                )
                last_waiting = waiting
            if deadline is not None and time.monotonic() > deadline:
                text = "; ".join(waiting) or f"phase {phase} not finished"
                self.emit(
                    "stopped", f"timed out after {opts.timeout:g} s in phase {phase}: {text}", phase=phase, reasons=list(waiting)
                )
                self.note(node, "DraGuardDrainStopped", f"timed out in phase {phase}: {text}", warning=True)
                return 1
            tracker.poll(opts.interval)

    def confirm(self, unconfirmed_since: dict[str, float], now: float) -> dict[str, str]:
        """Driver name -> why it is not yet confirmed that it unprepared what a force-deleted
        consumer held (webhook.model.drain.confirm); confirmed drivers leave `unconfirmed_since`."""
        if not unconfirmed_since:
            return {}
        gauge, why = None, "no permission to get nodes/proxy"
        if self.gauge_allowed:
            try:
                gauge = plan.parse_claims_in_use(self.api.node_metrics())
            except ClusterError as exc:
                why = str(exc)
        out = {}
        for driver, since in list(unconfirmed_since.items()):
            ok, how = plan.confirm(
                driver, since=since, now=now, gauge=gauge, gauge_error=why, safety_seconds=self.opts.safety_seconds
            )
            if ok:
                del unconfirmed_since[driver]
                self.emit("confirmed", f"driver {driver}: {how}", driver=driver)
            else:
                out[driver] = how
        return out

    # ---------------------------------------------------------------- dry runs

    def plan_only(self, node: Mapping[str, Any]) -> int:
        """--dry-run=client: print the plan from what is read; write nothing."""
        tracker_items, _ = self.api.list_pods()
        index, entries = self.view(node, tracker_items, Reader(self.api, self.config))
        cordoned = bool(as_map(node.get("spec")).get("unschedulable"))
        self.emit("plan", "would cordon the node" if not cordoned else "the node is cordoned already")
        for role, phase, what in (
            ("pod", "pods", "would evict"),
            ("daemonset-consumer", "daemonset-consumers", f"would taint {plan.DAEMONSET_TAINT['key']}, then evict"),
        ):
            pods = [e.key for e in entries if e.role == role and not e.finished]
            if pods:
                self.emit("plan", f"phase {phase}: {what} {', '.join(pods)}", phase=phase, pods=pods)
        for d in plan.driver_states(index, self.node):
            held = "; ".join(f"{h.claim} -> {', '.join(h.pods)}" for h in d.holds) or "no claim held"
            self.emit("plan", f"phase release: would wait until driver {d.name} is not needed ({held})", phase="release")
        drivers = [e.key for e in entries if e.role == "driver" and not e.finished]
        if self.opts.evict_drivers and drivers:
            self.emit(
                "plan",
                f"phase drivers: would taint {plan.DRIVER_TAINT['key']}, then evict {', '.join(drivers)}",
                phase="drivers",
                pods=drivers,
            )
        elif drivers:
            self.emit("plan", f"driver pods stay: {', '.join(drivers)} (--evict-drivers evicts them last)")
        for e in entries:
            if e.role in ("static", "unselected", "daemonset") and not e.finished:
                self.emit("plan", f"pod {e.key} stays ({e.role})")
        return 0

    def server_dry_run(self, node: Mapping[str, Any]) -> int:
        """--dry-run=server: the cordon and every eviction sent with dryRun=All; what the
        apiserver, PodDisruptionBudgets and admission webhooks (dra-guard's) answer is reported.
        1 when an eviction of a consumer would be refused; a driver pod's refusal while claims are
        held is what the real drain waits for, and is reported only."""
        self.api.patch_node({"spec": {"unschedulable": True}}, dry_run=True)
        self.emit("cordon", "cordon accepted (dry run)")
        items, _ = self.api.list_pods()
        index, entries = self.view(node, items, Reader(self.api, self.config))
        refused = 0
        roles = ("pod", "daemonset-consumer", "driver") if self.opts.evict_drivers else ("pod", "daemonset-consumer")
        for e in entries:
            if e.role not in roles or e.finished:
                continue
            status, message = self.api.evict(e.namespace, e.name, grace_period=self.opts.grace_period, dry_run=True)
            if status == 201:
                self.emit("evict", f"eviction of pod {e.key} accepted (dry run)", pod=e.key)
                continue
            if e.role == "driver":
                self.emit(
                    "refused",
                    f"eviction of driver pod {e.key} refused now ({status}): {message}; the drain waits for it",
                    pod=e.key,
                )
                continue
            refused += 1
            self.emit("refused", f"eviction of pod {e.key} would be refused ({status}): {message}", pod=e.key, status=status)
        return 1 if refused else 0


def drain(api: NodeApi, config: Config, options: DrainOptions, emit: Emit) -> int:
    """Drain the node of `api` (webhook.model.drain's phases); returns 0 done, 1 stopped (another
    drain holds the node, the timeout with what blocks named). Raises ClusterError (exit 2) for a
    node that does not exist, a missing permission (before anything changes) and API failures
    that are not transient. emit() gets one dict per step: {"event", "node", "message", ...}."""
    return Drain(api, config, options, emit).run()


def uncordon(api: NodeApi, emit: Emit) -> int:
    """Undo what drains changed on the node, as recorded in STATE: the taints they added, the
    autoscalers' annotations, and the cordon unless the node was cordoned before. 1 when a drain
    still runs (HOLDER renewed within LOCK_SECONDS by a live process), else 0."""
    said: list[str] = []
    d = Drain(api, Config(), DrainOptions(), emit)

    def change(node: dict[str, Any]) -> dict[str, Any] | None:
        annotations = annotations_of(node)
        holder = as_str(annotations.get(plan.HOLDER))
        if plan.holder_verdict(node, d.me, now=time.time(), alive=holder_alive(holder)) == "held":
            said[:] = [f"held:{holder}"]
            return None
        state = plan.read_state(node)
        if not state:
            said[:] = ["nothing to restore: no drain by dra-guard is recorded on the node"]
            return None
        keys = set(state.get("taints", []))
        taints = [t for t in map(as_map, as_list(as_map(node.get("spec")).get("taints"))) if t.get("key") not in keys]
        drop = [k for k in state.get("annotations", []) if k in annotations]
        was = bool(state.get("unschedulableBefore"))
        said[:] = [
            ("left cordoned (it was before the drain)" if was else "uncordoned")
            + (f"; removed taints {', '.join(sorted(keys))}" if keys else "")
            + (f"; removed {', '.join(drop)}" if drop else "")
        ]
        return {
            "metadata": {"annotations": {k: None for k in (*drop, plan.STATE, plan.HOLDER, plan.RENEWED)}},
            "spec": {"unschedulable": True if was else None, "taints": taints},
        }

    d._update(change)
    if said and said[0].startswith("held:"):
        emit({"event": "stopped", "node": api.node, "message": f"a drain by {said[0][5:]} still runs; not changed"})
        return 1
    emit({"event": "uncordon", "node": api.node, "message": said[0] if said else "nothing to restore"})
    return 0
