"""ReportWriter: dra-guard's reports in the cluster, in either report API (webhook.audit.reports):
wgpolicyk8s.io/v1alpha2 ClusterPolicyReport/PolicyReports or openreports.io/v1alpha1
ClusterReport/Reports; and delete_reports(), what `dra-guard cleanup` and the chart's pre-delete
hook run to remove them all."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook.kube.client import count, server_of
from webhook.kube.errors import calling

MANAGED_BY = "app.kubernetes.io/managed-by=dra-guard"


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
    "wgpolicyk8s.io": ReportApi("wgpolicyk8s.io", "v1alpha2", "policyreports", "PolicyReport",
                                "clusterpolicyreports", "ClusterPolicyReport"),
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


class ReportWriter:
    """Writes dra-guard's reports of one API (REPORT_APIS key `group`), replacing its previous ones
    (the namespaced reports of namespaces without results any more are deleted)."""

    def __init__(self, client: kubernetes.client.ApiClient, group: str = "wgpolicyk8s.io", *,
                 timeout_seconds: float = 10.0) -> None:
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
        not among `reports`."""
        api, keep = self.api, set()
        for report in reports:
            meta = report["metadata"]
            namespace, name = meta.get("namespace"), meta["name"]
            if namespace:
                keep.add(namespace)
                current = self._call("get", api.plural, self.custom.get_namespaced_custom_object,
                                     namespace, api.plural, name)
                if current is None:
                    self._call("create", api.plural, self.custom.create_namespaced_custom_object,
                               namespace, api.plural, report)
                else:
                    body = {**report, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
                    self._call("update", api.plural, self.custom.replace_namespaced_custom_object,
                               namespace, api.plural, name, body)
            else:
                current = self._call("get", api.cluster_plural, self.custom.get_cluster_custom_object,
                                     api.cluster_plural, name)
                if current is None:
                    self._call("create", api.cluster_plural, self.custom.create_cluster_custom_object,
                               api.cluster_plural, report)
                else:
                    body = {**report, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
                    self._call("update", api.cluster_plural, self.custom.replace_cluster_custom_object,
                               api.cluster_plural, name, body)
        for _, namespace, name in self.listed(cluster=False):
            if namespace not in keep:
                self._call("delete", api.plural, self.custom.delete_namespaced_custom_object,
                           namespace, api.plural, name)

    def listed(self, *, cluster: bool = True) -> list[tuple[str, str, str]]:
        """(kind, namespace, name) of dra-guard's reports of this API (label MANAGED_BY): the
        cluster-scoped ones first (cluster False: only the namespaced ones)."""
        api, out = self.api, []
        kinds = ((api.cluster_plural, api.cluster_kind),) if cluster else ()
        for plural, kind in (*kinds, (api.plural, api.kind)):
            listed = self._call("list", plural, self.custom.list_cluster_custom_object, plural,
                                label_selector=MANAGED_BY) or {}
            for item in listed.get("items") or []:
                meta = item.get("metadata") or {}
                out.append((kind, str(meta.get("namespace") or ""), str(meta.get("name") or "")))
        return out

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete one report of this API; False when it was already gone."""
        api = self.api
        if kind == api.cluster_kind:
            return self._call("delete", api.cluster_plural, self.custom.delete_cluster_custom_object,
                              api.cluster_plural, name) is not None
        return self._call("delete", api.plural, self.custom.delete_namespaced_custom_object,
                          namespace, api.plural, name) is not None

    def delete_all(self) -> list[tuple[str, str, str]]:
        """Delete every report of this API that dra-guard wrote; (kind, namespace, name) of those deleted."""
        return [ref for ref in self.listed() if self.delete(*ref)]


def delete_reports(client: kubernetes.client.ApiClient, *, dry_run: bool = False, timeout_seconds: float = 10.0,
                   report: Callable[[str], None] | None = None) -> list[tuple[str, str, str, str]]:
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
