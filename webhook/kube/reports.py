"""PolicyReportWriter: dra-guard's wgpolicyk8s.io/v1alpha2 (Cluster)PolicyReports."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook.kube.client import count

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
        count("get", "apis")
        for group in kubernetes.client.ApisApi(self.client).get_api_versions(_request_timeout=self.timeout).groups or []:
            if group.name == POLICY_REPORT_GROUP:
                return any(v.version == POLICY_REPORT_VERSION for v in group.versions or [])
        return False

    def _call(self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        count(verb, resource)
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
