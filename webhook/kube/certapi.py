"""KubeCertApi: the certs.ports.CertApi port over the Kubernetes API (Secrets, Leases,
webhook configurations' caBundles)."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from certs.ports import Conflict
from webhook.kube import leases
from webhook.kube.client import count, server_of
from webhook.kube.errors import api_failure

#: every object dra-guard creates at run time carries it (docs/operations/uninstall.md)
MANAGED_BY_LABEL = {"app.kubernetes.io/managed-by": "dra-guard"}


class KubeCertApi:
    """certs.ports.CertApi over the Kubernetes API, in `namespace`.

    Secrets' data is exchanged as bytes (base64 on the wire); Leases as coordination.k8s.io/v1
    dicts; webhook caBundles of admissionregistration.k8s.io/v1 configurations ("validating" or
    "mutating"). A 409 raises certs.ports.Conflict; any other failure webhook.kube.errors.ClusterError
    ("cannot <verb> <resource> from <server>: <cause>").
    """

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str, *, timeout_seconds: float = 5.0) -> None:
        self.namespace = namespace
        self.core = kubernetes.client.CoreV1Api(client)
        self.coordination = kubernetes.client.CoordinationV1Api(client)
        self.admission = kubernetes.client.AdmissionregistrationV1Api(client)
        self.timeout = timeout_seconds
        self.server = server_of(client)

    def _call(self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        count(verb, resource)
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and verb in ("get", "delete"):
                return None
            if exc.status == 409:
                raise Conflict(f"{verb} {resource}: {exc.reason}") from exc
            raise api_failure(f"{verb} {resource}", self.server, exc, timeout_seconds=self.timeout) from exc
        except Exception as exc:  # network errors come in many urllib3 types
            raise api_failure(f"{verb} {resource}", self.server, exc, timeout_seconds=self.timeout) from exc
        return json.loads(resp.data) if resp.data else {}

    def get_secret(self, name: str) -> dict[str, Any] | None:
        obj = self._call("get", "secrets", self.core.read_namespaced_secret, name, self.namespace)
        if obj is None:
            return None
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        return {"data": data, "resourceVersion": obj["metadata"].get("resourceVersion", "")}

    def _secret_body(self, name: str, data: Mapping[str, bytes], resource_version: str = "") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": dict(MANAGED_BY_LABEL)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": meta,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }

    def create_secret(self, name: str, data: Mapping[str, bytes]) -> None:
        self._call("create", "secrets", self.core.create_namespaced_secret, self.namespace, self._secret_body(name, data))

    def update_secret(self, name: str, data: Mapping[str, bytes], resource_version: str) -> None:
        self._call(
            "update",
            "secrets",
            self.core.replace_namespaced_secret,
            name,
            self.namespace,
            self._secret_body(name, data, resource_version),
        )

    def get_lease(self, name: str) -> dict[str, Any] | None:
        lease: dict[str, Any] | None = self._call("get", "leases", self.coordination.read_namespaced_lease, name, self.namespace)
        return lease

    @staticmethod
    def _lease_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
        """Lease metadata with the label docs/operations/uninstall.md removes run-time objects by."""
        return {**metadata, "labels": {**(metadata.get("labels") or {}), **MANAGED_BY_LABEL}}

    def create_lease(self, lease: Mapping[str, Any]) -> None:
        """Create a Lease (coordination.k8s.io/v1 dict: metadata, spec) in the namespace, labelled
        app.kubernetes.io/managed-by=dra-guard; raises certs.ports.Conflict on 409."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            **lease,
            "metadata": {**self._lease_metadata(lease["metadata"]), "namespace": self.namespace},
        }
        self._call("create", "leases", self.coordination.create_namespaced_lease, self.namespace, body)

    def update_lease(self, lease: Mapping[str, Any]) -> None:
        """Replace a Lease (with its resourceVersion), keeping the managed-by label; Conflict on 409."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            **lease,
            "metadata": self._lease_metadata(lease["metadata"]),
        }
        self._call(
            "update", "leases", self.coordination.replace_namespaced_lease, lease["metadata"]["name"], self.namespace, body
        )

    def list_leases(self, label_selector: str) -> list[dict[str, Any]]:
        out = self._call("list", "leases", self.coordination.list_namespaced_lease, self.namespace, label_selector=label_selector)
        return list((out or {}).get("items") or [])

    def delete_lease(self, name: str) -> None:
        self._call("delete", "leases", self.coordination.delete_namespaced_lease, name, self.namespace)

    def hold_lease(self, name: str, *, identity: str, now: datetime.datetime, duration_seconds: int) -> bool:
        """Take or renew the Lease `name` for `identity` (webhook.kube.leases.hold_lease)."""
        return leases.hold_lease(self, name, identity=identity, now=now, duration_seconds=duration_seconds)

    def release_lease(self, name: str, *, identity: str) -> bool:
        """Give up the Lease `name` if `identity` holds it (webhook.kube.leases.release_lease)."""
        return leases.release_lease(self, name, identity=identity)

    def _config_api(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any], str]:
        if kind == "validating":
            return (
                self.admission.read_validating_webhook_configuration,
                self.admission.patch_validating_webhook_configuration,
                "validatingwebhookconfigurations",
            )
        return (
            self.admission.read_mutating_webhook_configuration,
            self.admission.patch_mutating_webhook_configuration,
            "mutatingwebhookconfigurations",
        )

    def webhook_ca_bundles(self, kind: str, name: str) -> list[bytes] | None:
        read, _, resource = self._config_api(kind)
        obj = self._call("get", resource, read, name)
        if obj is None:
            return None
        return [base64.b64decode((w.get("clientConfig") or {}).get("caBundle") or "") for w in obj.get("webhooks") or []]

    def set_webhook_ca_bundles(self, kind: str, name: str, bundle: bytes) -> None:
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

    def get_config_map(self, name: str) -> dict[str, str] | None:
        """The data of ConfigMap `name` in the namespace (the chart's webhooks.json), None on 404."""
        obj = self._call("get", "configmaps", self.core.read_namespaced_config_map, name, self.namespace)
        return None if obj is None else {str(k): str(v) for k, v in (obj.get("data") or {}).items()}

    def webhook_configuration(self, kind: str, name: str) -> dict[str, Any] | None:
        """The live admissionregistration.k8s.io/v1 configuration dict ("validating" or
        "mutating"), None on 404."""
        read, _, resource = self._config_api(kind)
        obj: dict[str, Any] | None = self._call("get", resource, read, name)
        return obj

    def replace_webhooks(self, kind: str, name: str, webhooks: list[dict[str, Any]], resource_version: str) -> None:
        """Set the configuration's whole `webhooks` list: a JSON merge patch (lists are replaced
        whole, RFC 7386) carrying metadata.resourceVersion, so a configuration changed since it was
        read gets 409 and raises certs.ports.Conflict instead of being overwritten."""
        _, patch, resource = self._config_api(kind)
        body: dict[str, Any] = {"webhooks": webhooks}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self._call("patch", resource, patch, name, body, _content_type="application/merge-patch+json")
