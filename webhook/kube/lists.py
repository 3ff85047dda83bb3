"""The one-shot reads of `dra-guard audit --cluster` and `dra-guard drain-plan NODE`."""

from __future__ import annotations

import json
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook.kube.client import RESOURCE_GROUP, ClusterError, count, served_resource_versions, server_of
from webhook.kube.errors import calling
from webhook.kube.informer import settle_page
from webhook.kube.pages import Pages, RateLimiter, list_all, listing
from webhook.model.facts import Facts
from webhook.model.rbac_index import ref_key
from webhook.model.slim import audit_view
from webhook.policies import admin_access


def stream_audit_cluster(
    client: kubernetes.client.ApiClient,
    facts: Facts,
    *,
    served_versions: list[str] | None = None,
    limiter: RateLimiter | None = None,
    timeout_seconds: float = 30.0,
) -> list[dict[str, Any]]:
    """What `dra-guard audit --cluster` and the in-server periodic audit judge, without holding the
    large kinds twice (the audit of a 5,000-node cluster stays within 1 GiB).

    ClusterRoles, Roles, ClusterRoleBindings, RoleBindings, every Pod and (when resource.k8s.io is
    served) ResourceClaims are streamed page by page into the indexes of `facts` (a
    webhook.model.facts.StaticFacts), keeping only their index entries.
    Returns the objects the checks read whole, as plain dicts with kind set (audit_view):
    DaemonSets, kube-system Pods, Nodes, kube-system ConfigMaps, ResourceSlices, the Namespaces
    labelled for DRA admin access and the ResourceClaims/Templates asking for it, and the indexed
    ClusterRoleBindings (their slimmed form: the unresolved roleRef check and PolicyReports read
    name and roleRef). DaemonSets, ResourceSlices and Nodes also go into `facts`.
    timeout_seconds: the timeout of each page.
    Raises ClusterError ("cannot list <resource> from <server>: <cause>") on API and network errors."""
    rbac_api = kubernetes.client.RbacAuthorizationV1Api(client)
    apps_api = kubernetes.client.AppsV1Api(client)
    core_api = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    version = served_versions[0] if served_versions else None
    server = server_of(client)

    def dra(plural: str) -> Any:
        def lister(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(RESOURCE_GROUP, version, plural, **kwargs)

        return lister

    def system(list_func: Any) -> Any:
        def lister(**kwargs: Any) -> Any:
            return list_func("kube-system", **kwargs)

        return lister

    def stream(list_func: Any, resource: str, into: Any) -> None:
        with listing(resource, server, timeout_seconds=timeout_seconds):
            into(Pages(list_func, resource=resource, timeout_seconds=timeout_seconds, limiter=limiter, after_page=settle_page))

    def whole(list_func: Any, resource: str, kind: str) -> list[dict[str, Any]]:
        return list_all(
            list_func,
            resource=resource,
            kind=kind,
            limiter=limiter,
            view=audit_view,
            timeout_seconds=timeout_seconds,
            server=server,
        )

    stream(rbac_api.list_cluster_role, "clusterroles", facts.rbac.replace_roles)
    stream(rbac_api.list_role_for_all_namespaces, "roles", lambda p: facts.rbac.replace_roles(p, namespaced=True))
    stream(rbac_api.list_cluster_role_binding, "clusterrolebindings", facts.rbac.replace_bindings)
    stream(
        rbac_api.list_role_binding_for_all_namespaces, "rolebindings", lambda p: facts.rbac.replace_bindings(p, namespaced=True)
    )
    read_missing_roles(client, facts, limiter=limiter, timeout_seconds=timeout_seconds)
    out = whole(apps_api.list_daemon_set_for_all_namespaces, "daemonsets", "DaemonSet")
    facts.claims.replace_daemonsets(out)
    stream(core_api.list_pod_for_all_namespaces, "pods", facts.claims.replace_pods)
    out += whole(system(core_api.list_namespaced_pod), "pods", "Pod")
    nodes = whole(core_api.list_node, "nodes", "Node")
    out += nodes
    facts.claims.nodes.replace(nodes)  # before the claims: the ones placed by node labels
    out += whole(system(core_api.list_namespaced_config_map), "configmaps", "ConfigMap")
    # DRA admin access: the labelled Namespaces, and the claims and templates that ask for it
    out += list_all(
        core_api.list_namespace,
        resource="namespaces",
        kind="Namespace",
        limiter=limiter,
        view=lambda o: o if admin_access.labelled(o) else None,
    )
    if version:
        slices = whole(dra("resourceslices"), "resourceslices", "ResourceSlice")
        out += slices
        facts.claims.slices.replace(slices)
        admin_claims: list[dict[str, Any]] = []

        def claims_into(items: Any) -> None:
            def tap() -> Any:
                for claim in items:
                    if admin_access.claim_requests_admin_access(claim):
                        admin_claims.append(
                            {"kind": "ResourceClaim", "metadata": claim.get("metadata"), "spec": claim.get("spec")}
                        )
                    yield claim

            facts.claims.replace_claims(tap())

        stream(dra("resourceclaims"), "resourceclaims", claims_into)
        out += admin_claims
        out += list_all(
            dra("resourceclaimtemplates"),
            resource="resourceclaimtemplates",
            kind="ResourceClaimTemplate",
            limiter=limiter,
            view=lambda o: o if admin_access.claim_requests_admin_access(o) else None,
        )
    out += [{"kind": "ClusterRoleBinding", **b} for b in facts.rbac.bindings()]
    return out


#: missing roles read one by one at most; past this many (bindings left behind by deleted roles are
#: common), one more listing of the roles costs fewer requests and a bounded time at any rate limit
MAX_SINGLE_ROLE_READS = 16


def read_missing_roles(
    client: kubernetes.client.ApiClient, facts: Facts, *, limiter: RateLimiter | None = None, timeout_seconds: float = 30.0
) -> list[tuple[str, str]]:
    """Read once, from the API, each role a binding in facts.rbac refers to that facts.rbac lacks,
    and add those found to facts.rbac: the roles were listed before the bindings, so a role created
    after its binding (the usual order of `kubectl apply` of a folder) is missing from the listing
    while its binding is not; the audit would call the binding unresolved.
    Up to MAX_SINGLE_ROLE_READS missing roles: one LIST by field selector each (dra-guard's RBAC
    allows list, not get); more: the ClusterRoles and/or Roles listed again, page by page. Both at
    `limiter`'s rate. Returns the (namespace, name) of the roles still missing ("" namespace: a
    ClusterRole). Raises ClusterError ("cannot list clusterroles from <server>: <cause>")."""
    rbac_api = kubernetes.client.RbacAuthorizationV1Api(client)
    server = server_of(client)
    wanted: dict[tuple[str, str], None] = {}
    for binding in [*facts.rbac.bindings(), *facts.rbac.bindings(namespaced=True)]:
        key = ref_key(binding)
        if key[1] and facts.rbac.role(key[1], key[0]) is None:
            wanted[key] = None
    if len(wanted) > MAX_SINGLE_ROLE_READS:
        listers = (
            (False, rbac_api.list_cluster_role, "clusterroles"),
            (True, rbac_api.list_role_for_all_namespaces, "roles"),
        )
        for namespaced, list_func, resource in listers:
            if any(bool(namespace) == namespaced for namespace, _ in wanted):
                with listing(resource, server, timeout_seconds=timeout_seconds):
                    pages = Pages(
                        list_func, resource=resource, timeout_seconds=timeout_seconds, limiter=limiter, after_page=settle_page
                    )
                    facts.rbac.replace_roles(pages, namespaced=namespaced)
        return [(namespace, name) for namespace, name in wanted if facts.rbac.role(name, namespace) is None]
    missing = []
    for namespace, name in wanted:
        resource = "roles" if namespace else "clusterroles"
        if limiter is not None:
            limiter.wait()
        count("list", resource)
        with calling(server, f"list {resource}", timeout_seconds=timeout_seconds):
            if namespace:
                resp = rbac_api.list_namespaced_role(
                    namespace, field_selector=f"metadata.name={name}", _preload_content=False, _request_timeout=timeout_seconds
                )
            else:
                resp = rbac_api.list_cluster_role(
                    field_selector=f"metadata.name={name}", _preload_content=False, _request_timeout=timeout_seconds
                )
            items = json.loads(resp.data).get("items") or []
        if items:
            facts.rbac.upsert_role(dict(items[0], kind="Role" if namespace else "ClusterRole"))
        else:
            missing.append((namespace, name))
    return missing


def list_drain_objects(client: kubernetes.client.ApiClient, node: str, *, timeout_seconds: float = 30.0) -> list[dict[str, Any]]:
    """What `dra-guard drain-plan NODE` needs: the Node (its labels: claims of devices selected by
    node labels), RBAC (driver detection), DaemonSets, the node's Pods (field selector
    spec.nodeName), the node's ResourceSlices (field selector spec.nodeName: which drivers serve
    it) and every ResourceClaim, in paged lists; timeout_seconds per request. The plan asks only
    about NODE, so no other Node is read.
    Raises ClusterError when the node does not exist, DRA is not served, or a request fails
    ("cannot <verb> <resource> from <server>: <cause>")."""
    rbac_api = kubernetes.client.RbacAuthorizationV1Api(client)
    apps_api = kubernetes.client.AppsV1Api(client)
    core_api = kubernetes.client.CoreV1Api(client)
    server = server_of(client)
    count("get", "nodes")
    try:
        with calling(server, f"get node {node}", timeout_seconds=timeout_seconds):
            read = core_api.read_node(node, _preload_content=False, _request_timeout=timeout_seconds)
            node_object = {**json.loads(read.data), "kind": "Node"}
    except ClusterError as exc:
        if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
            raise ClusterError(f"node {node} not found in {server}") from exc.__cause__
        raise
    versions = served_resource_versions(client, timeout_seconds=timeout_seconds)
    if not versions:
        raise ClusterError("the cluster serves no resource.k8s.io version (DRA is not enabled)")
    custom = kubernetes.client.CustomObjectsApi(client)

    def claims(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(RESOURCE_GROUP, versions[0], "resourceclaims", **kwargs)

    def node_slices(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(
            RESOURCE_GROUP, versions[0], "resourceslices", field_selector=f"spec.nodeName={node}", **kwargs
        )

    def node_pods(**kwargs: Any) -> Any:
        return core_api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", **kwargs)

    def every(list_func: Any, resource: str, kind: str) -> list[dict[str, Any]]:
        return list_all(list_func, resource=resource, kind=kind, timeout_seconds=timeout_seconds, server=server)

    return (
        [node_object]
        + every(rbac_api.list_cluster_role, "clusterroles", "ClusterRole")
        + every(rbac_api.list_cluster_role_binding, "clusterrolebindings", "ClusterRoleBinding")
        + every(apps_api.list_daemon_set_for_all_namespaces, "daemonsets", "DaemonSet")
        + every(node_pods, "pods", "Pod")
        + every(node_slices, "resourceslices", "ResourceSlice")
        + every(claims, "resourceclaims", "ResourceClaim")
    )


#: the labels the chart puts on its ConfigMap (templates/_helpers.tpl "dra-guard.labels")
INSTALLED_CONFIG_SELECTOR = "app.kubernetes.io/name=dra-guard,app.kubernetes.io/managed-by=Helm"


def installed_config(
    client: kubernetes.client.ApiClient, *, namespace: str | None = None, timeout_seconds: float = 10.0
) -> tuple[str, str] | None:
    """The configuration of the dra-guard release installed in the cluster: (config.yaml text,
    "ConfigMap <namespace>/<name>"), from the chart's ConfigMap (label selector
    INSTALLED_CONFIG_SELECTOR, key config.yaml), in `namespace` or in any namespace. None when no
    release is installed. Raises ClusterError when several are (name the namespace) or the read fails."""
    core = kubernetes.client.CoreV1Api(client)
    count("list", "configmaps")
    what = "list configmaps" + (f" in {namespace}" if namespace else "")
    try:
        with calling(server_of(client), f"{what} (the installed dra-guard configuration)", timeout_seconds=timeout_seconds):
            if namespace:
                listed = core.list_namespaced_config_map(
                    namespace, label_selector=INSTALLED_CONFIG_SELECTOR, _preload_content=False, _request_timeout=timeout_seconds
                )
            else:
                listed = core.list_config_map_for_all_namespaces(
                    label_selector=INSTALLED_CONFIG_SELECTOR, _preload_content=False, _request_timeout=timeout_seconds
                )
            found = [i for i in json.loads(listed.data).get("items") or [] if "config.yaml" in (i.get("data") or {})]
    except ClusterError as exc:
        if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 403:
            raise ClusterError(f"{exc}; pass --config FILE or --no-installed-config") from exc.__cause__
        raise
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in found)
        raise ClusterError(f"several dra-guard releases are installed ({names}); pass --release-namespace NS or --config FILE")
    meta = found[0]["metadata"]
    return str(found[0]["data"]["config.yaml"]), f"ConfigMap {meta['namespace']}/{meta['name']}"
