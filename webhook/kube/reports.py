"""ReportWriter: dra-guard's reports in the cluster, in either report API (webhook.audit.reports):
wgpolicyk8s.io/v1alpha2 ClusterPolicyReport/PolicyReports or openreports.io/v1alpha1
ClusterReport/Reports; and delete_reports(), what `dra-guard cleanup` and the chart's pre-delete
hook run to remove them all; ReportOwner, the ClusterRole the reports name as their owner, so that the
Kubernetes garbage collector deletes them with it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from webhook.kube.client import count, server_of
from webhook.kube.errors import calling, cause

MANAGED_BY = "app.kubernetes.io/managed-by=dra-guard"
#: the kind of object that owns dra-guard's reports (config audit.reportOwnerClusterRole)
OWNER_API_VERSION = "rbac.authorization.k8s.io/v1"
OWNER_KIND = "ClusterRole"


@dataclasses.dataclass(frozen=True)
class ReportApi:
    """One report API: group, version, and the plural and kind of its namespaced and cluster-scoped reports."""

    group: str
    version: str
    plural: str
    kind: str
    cluster_plural: str
    cluster_kind: str


#: the report APIs by group (the keys of webhook.audit.reports.FORMATS)
REPORT_APIS = {
    "wgpolicyk8s.io": ReportApi(
        "wgpolicyk8s.io", "v1alpha2", "policyreports", "PolicyReport", "clusterpolicyreports", "ClusterPolicyReport"
    ),
    "openreports.io": ReportApi("openreports.io", "v1alpha1", "reports", "Report", "clusterreports", "ClusterReport"),
}


def served_report_apis(client: kubernetes.client.ApiClient, *, timeout_seconds: float = 10.0) -> set[str]:
    """The groups of REPORT_APIS whose version the cluster serves (their CRDs are installed).
    Raises kubernetes' ApiException and urllib3 errors."""
    count("get", "apis")
    served = set()
    for group in kubernetes.client.ApisApi(client).get_api_versions(_request_timeout=timeout_seconds).groups or []:
        api = REPORT_APIS.get(group.name)
        if api is not None and any(v.version == api.version for v in group.versions or []):
            served.add(api.group)
    return served


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    """The ownerReference (metadata.ownerReferences item) naming ClusterRole `name` of uid `uid`:
    controller false (no controller manages a report) and blockOwnerDeletion false (setting it true
    needs delete permission on the owner, else 422; and the owner's deletion never waits for the
    reports)."""
    return {
        "apiVersion": OWNER_API_VERSION,
        "kind": OWNER_KIND,
        "name": name,
        "uid": uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }


def merged_owner_references(new: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ownerReferences a report is updated with: `new` (what dra-guard sets now: its owner, or
    nothing), then those of `current` (the stored report's) that name neither an object of `new` (by
    uid) nor, with another uid, the same ClusterRole (a replaced one). With `new` empty (no owner
    configured, or unreadable this time) `current`'s are kept whole: one failed read never takes
    the garbage collection away, and references someone else set are never dropped."""
    names = {(r.get("kind"), r.get("name")) for r in new if r.get("kind") == OWNER_KIND}
    uids = {r.get("uid") for r in new}
    return [*new, *(r for r in current if r.get("uid") not in uids and (r.get("kind"), r.get("name")) not in names)]


class ReportOwner:
    """The ClusterRole dra-guard's reports name as their owner (config audit.reportOwnerClusterRole;
    the chart renders its own ClusterRole `<fullname>` there), read once and cached.

    What this relies on:
    - "Namespaced dependents can specify cluster-scoped or namespaced owners"; "Cluster-scoped
      dependents can only specify cluster-scoped owners" (Kubernetes docs, Garbage Collection,
      https://kubernetes.io/docs/concepts/architecture/garbage-collection/): a ClusterRole may own
      the cluster-scoped report and every namespaced one.
    - An owner reference whose object is not found, or is found with another uid, is dangling, and
      the garbage collector deletes a dependent once all its owners are absent (same page: "the
      dependent is subject to deletion once all owners are verified absent"; kube-controller-manager
      pkg/controller/garbagecollector/garbagecollector.go, isDangling compares the uid): the reports
      go when the ClusterRole is deleted, and so does a report written with the uid of a ClusterRole
      that was since replaced (it is written again, with the new uid, at the next audit).
    - `helm uninstall` deletes with propagation background by default (its --cascade,
      https://helm.sh/docs/helm/helm_uninstall/), so the garbage collector deletes the dependents;
      with `--cascade orphan` it removes the references instead and the reports stay
      (`dra-guard cleanup` removes them).

    Why that ClusterRole: the release deletes it on uninstall, dra-guard already depends on it (it
    is what lets dra-guard write its reports, so no report of the chart's ServiceAccount can be
    written once it is gone), and no documented procedure deletes it while dra-guard stays (the
    break-glass deletes the webhook configurations, which must not take the reports with them)."""

    def __init__(self, client: kubernetes.client.ApiClient, name: str, *, timeout_seconds: float = 10.0) -> None:
        """name: the ClusterRole's name ("": no owner configured)."""
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        self.name = name
        self.timeout = timeout_seconds
        self._reference: dict[str, Any] | None = None
        #: why reference() is None: "" while it is not, else one line for the log
        self.problem = ""

    def reference(self) -> dict[str, Any] | None:
        """The owner's ownerReference (owner_reference()), its uid read by one GET of the ClusterRole
        the first time and cached until forget(). None when no name is configured, or when the
        ClusterRole cannot be read (not found, forbidden, API unreachable); `problem` then says why.
        Never raises: the reports are written without an owner rather than not at all."""
        if self._reference is not None:
            return self._reference
        if not self.name:
            self.problem = "no owner configured (audit.reportOwnerClusterRole)"
            return None
        count("get", "clusterroles")
        try:
            role = self.rbac.read_cluster_role(self.name, _request_timeout=self.timeout)
        except (ApiException, HTTPError, OSError) as exc:
            self.problem = f"cannot read ClusterRole {self.name}: {cause(exc, timeout_seconds=self.timeout)}"
            return None
        uid = str(getattr(role.metadata, "uid", "") or "")
        if not uid:
            self.problem = f"ClusterRole {self.name} has no uid"
            return None
        self.problem = ""
        self._reference = owner_reference(self.name, uid)
        return self._reference

    def forget(self) -> None:
        """Drop the cached uid: the next reference() reads the ClusterRole again (after a write
        failed: the owner may have been replaced meanwhile)."""
        self._reference = None


class ReportWriter:
    """Writes dra-guard's reports of one API (REPORT_APIS key `group`), replacing its previous ones
    (the namespaced reports of namespaces without results any more are deleted)."""

    def __init__(
        self, client: kubernetes.client.ApiClient, group: str = "wgpolicyk8s.io", *, timeout_seconds: float = 10.0
    ) -> None:
        self.client = client
        self.api = REPORT_APIS[group]
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.timeout = timeout_seconds

    def served(self) -> bool:
        """Whether the cluster serves this report API (its CRDs are installed)."""
        return self.api.group in served_report_apis(self.client, timeout_seconds=self.timeout)

    def _call(self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        count(verb, resource)
        try:
            return fn(self.api.group, self.api.version, *args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and verb in ("get", "delete"):
                return None
            raise

    def apply(self, reports: list[dict[str, Any]]) -> None:
        """Create or replace each report (dicts of this API); delete dra-guard's namespaced reports
        not among `reports`. A replaced report gets the ownerReferences of updated(): an existing
        report takes the owner of `reports` at its next write."""
        api, keep = self.api, set()
        for report in reports:
            meta = report["metadata"]
            namespace, name = meta.get("namespace"), meta["name"]
            if namespace:
                keep.add(namespace)
                current = self._call("get", api.plural, self.custom.get_namespaced_custom_object, namespace, api.plural, name)
                if current is None:
                    self._call("create", api.plural, self.custom.create_namespaced_custom_object, namespace, api.plural, report)
                else:
                    self._call(
                        "update",
                        api.plural,
                        self.custom.replace_namespaced_custom_object,
                        namespace,
                        api.plural,
                        name,
                        updated(report, current),
                    )
            else:
                current = self._call("get", api.cluster_plural, self.custom.get_cluster_custom_object, api.cluster_plural, name)
                if current is None:
                    self._call("create", api.cluster_plural, self.custom.create_cluster_custom_object, api.cluster_plural, report)
                else:
                    self._call(
                        "update",
                        api.cluster_plural,
                        self.custom.replace_cluster_custom_object,
                        api.cluster_plural,
                        name,
                        updated(report, current),
                    )
        for _, namespace, name in self.listed(cluster=False):
            if namespace not in keep:
                self._call("delete", api.plural, self.custom.delete_namespaced_custom_object, namespace, api.plural, name)

    def listed(self, *, cluster: bool = True) -> list[tuple[str, str, str]]:
        """(kind, namespace, name) of dra-guard's reports of this API (label MANAGED_BY): the
        cluster-scoped ones first (cluster False: only the namespaced ones)."""
        api, out = self.api, []
        kinds = ((api.cluster_plural, api.cluster_kind),) if cluster else ()
        for plural, kind in (*kinds, (api.plural, api.kind)):
            listed = self._call("list", plural, self.custom.list_cluster_custom_object, plural, label_selector=MANAGED_BY) or {}
            for item in listed.get("items") or []:
                meta = item.get("metadata") or {}
                out.append((kind, str(meta.get("namespace") or ""), str(meta.get("name") or "")))
        return out

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete one report of this API; False when it was already gone."""
        api = self.api
        if kind == api.cluster_kind:
            return (
                self._call("delete", api.cluster_plural, self.custom.delete_cluster_custom_object, api.cluster_plural, name)
                is not None
            )
        return (
            self._call("delete", api.plural, self.custom.delete_namespaced_custom_object, namespace, api.plural, name) is not None
        )

    def delete_all(self) -> list[tuple[str, str, str]]:
        """Delete every report of this API that dra-guard wrote; (kind, namespace, name) of those deleted."""
        return [ref for ref in self.listed() if self.delete(*ref)]


def updated(report: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The body that replaces stored report `current` with `report` (an update, PUT): `current`'s
    resourceVersion (a concurrent write fails with 409, never overwritten) and ownerReferences
    merged_owner_references(report's, current's)."""
    meta = dict(report["metadata"])
    stored = current.get("metadata") or {}
    meta["resourceVersion"] = stored["resourceVersion"]
    owners = merged_owner_references(list(meta.get("ownerReferences") or []), list(stored.get("ownerReferences") or []))
    meta.pop("ownerReferences", None)
    if owners:
        meta["ownerReferences"] = owners
    return {**report, "metadata": meta}


def delete_reports(
    client: kubernetes.client.ApiClient,
    *,
    dry_run: bool = False,
    timeout_seconds: float = 10.0,
    report: Callable[[str], None] | None = None,
) -> list[tuple[str, str, str, str]]:
    """Delete every report dra-guard wrote (label MANAGED_BY), of each report API the cluster serves.

    Returns (group, kind, namespace, name) of each report deleted (dry_run: of each that would be).
    report(line) is called for each, and once for each report API not served ("openreports.io is
    not served (no CRDs): nothing to delete there").
    Raises webhook.kube.errors.ClusterError ("cannot <action> from <server>: <cause>") on API and
    network errors (401/403 included)."""
    server = server_of(client)
    say = report or (lambda line: None)
    with calling(server, "read the served API groups", timeout_seconds=timeout_seconds):
        served = served_report_apis(client, timeout_seconds=timeout_seconds)
    out = []
    for group in REPORT_APIS:
        if group not in served:
            say(f"{group} is not served (no CRDs): nothing to delete there")
            continue
        writer = ReportWriter(client, group, timeout_seconds=timeout_seconds)
        api = writer.api
        with calling(server, f"list {api.cluster_plural} and {api.plural} ({group})", timeout_seconds=timeout_seconds):
            found = writer.listed()
        for kind, namespace, name in found:
            where = f"{kind} {namespace + '/' if namespace else ''}{name} ({group})"
            if dry_run:
                say(f"would delete {where}")
                out.append((group, kind, namespace, name))
                continue
            with calling(server, f"delete {where}", timeout_seconds=timeout_seconds):
                gone = writer.delete(kind, namespace, name)
            say(f"deleted {where}" if gone else f"{where} already absent")
            if gone:
                out.append((group, kind, namespace, name))
    return out
