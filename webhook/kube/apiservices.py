"""Is the API dra-guard reads the real one? An APIService with ``spec.service`` makes the
kube-aggregator proxy a whole group/version (e.g. ``v1.resource.k8s.io``) to a Service: whoever
may write APIServices could then feed dra-guard's caches (and the scheduler, kubelets and drivers)
objects of their own. dra-guard is not ready, and judges nothing, while a group it reads is not
served by the apiserver itself (``spec.service`` null, the built-in "Local" APIServices).

Source: Kubernetes "Configure the Aggregation Layer" (APIService spec.service: null means the
group/version is served by kube-apiserver itself).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook import metrics
from webhook.config import Config
from webhook.kube.client import API_ERRORS, RESOURCE_GROUP, count

log = logging.getLogger("dra_guard.cluster")

#: the APIServices of the groups dra-guard's caches read besides resource.k8s.io (core v1 is "v1.")
BASE_API_SERVICES = ("v1.", "v1.apps", "v1.rbac.authorization.k8s.io", "v1.policy")


def names(resource_version: str) -> list[str]:
    """The APIService names to check when resource.k8s.io is read at `resource_version` ("" when
    the cluster serves none)."""
    return [*BASE_API_SERVICES, *([f"{resource_version}.{RESOURCE_GROUP}"] if resource_version else [])]


def redirected(client: kubernetes.client.ApiClient, api_services: Sequence[str], *, timeout_seconds: float) -> list[str]:
    """One line per APIService of `api_services` whose spec.service is set ("APIService
    v1.resource.k8s.io is served by Service ns/name, not by the kube-apiserver"); [] when all are
    local. An APIService that does not exist is not a redirect. Sets dra_guard_api_redirected{apiservice}.
    Raises ApiException (other than 404) and urllib3 errors: the caller treats those as unknown."""
    api = kubernetes.client.ApiregistrationV1Api(client)
    out = []
    for name in api_services:
        count("get", "apiservices")
        try:
            obj: Any = api.read_api_service(name, _request_timeout=timeout_seconds)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        service = obj.spec.service if obj.spec is not None else None
        metrics.API_REDIRECTED.labels(apiservice=name).set(1 if service is not None else 0)
        if service is not None:
            out.append(f"APIService {name} is served by Service {service.namespace}/{service.name}, not by the kube-apiserver")
    return out


class ApiServiceCheck:
    """The APIService check of a running dra-guard: once at start-up (check()), then every
    cluster.apiCheckIntervalSeconds in a daemon thread (start()). `problems` holds redirected()'s
    lines; an API error keeps the last verdict (logged). With client None nothing is checked."""

    def __init__(self, client: kubernetes.client.ApiClient | None, config: Config, *, version: Callable[[], str]) -> None:
        self.client, self.config, self.version = client, config, version
        self.problems: list[str] = []
        self._stop = threading.Event()

    def check(self) -> None:
        """Check every APIService now; a log line when the verdict changes."""
        if self.client is None:
            return
        try:
            found = redirected(self.client, names(self.version()), timeout_seconds=self.config.cluster.request_timeout_seconds)
        except API_ERRORS + (OSError,) as exc:  # urllib3's errors are OSErrors
            log.warning("cannot check the APIServices dra-guard reads", extra={"error": str(exc)[:300]})
            return
        if found != self.problems:
            (log.error if found else log.info)(
                "APIServices of the groups dra-guard reads", extra={"redirected": found, "ready": not found}
            )
        self.problems = found

    def start(self) -> None:
        """Check every cluster.apiCheckIntervalSeconds until stop()."""
        if self.client is not None:
            threading.Thread(target=self._loop, name="apiservice-check", daemon=True).start()

    def stop(self) -> None:
        """End the periodic check."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.cluster.api_check_interval_seconds):
            self.check()
