"""The Kubernetes API client dra-guard uses, and the one place its requests are counted.

Every request dra-guard makes to the API is counted by count() in
``dra_guard_kube_api_requests_total{verb,resource}``.
"""

from __future__ import annotations

import difflib
import os
import pathlib

import kubernetes
from kubernetes.client.rest import ApiException

from webhook import metrics
from webhook.kube.errors import ClusterError, calling, cause

__all__ = [
    "API_ERRORS",
    "RESOURCE_GROUP",
    "RESOURCE_VERSIONS",
    "ClusterError",
    "api_client",
    "count",
    "describe_error",
    "served_resource_versions",
    "server_of",
]

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preferred first


def api_client(kubeconfig: str | None, *, timeout_seconds: float, context: str | None = None) -> kubernetes.client.ApiClient:
    """An ApiClient from `kubeconfig` if given, else $KUBECONFIG, else in-cluster config, else ~/.kube/config.

    context: the kubeconfig context to use (kubectl's --context); None = its current-context.
    timeout_seconds is the callers' budget per request (they pass it to each call).
    Raises ClusterError when none of them is usable or the context does not exist.
    """
    configuration = kubernetes.client.Configuration()
    if context:
        _check_context(kubeconfig or os.environ.get("KUBECONFIG") or str(pathlib.Path.home() / ".kube" / "config"), context)
    try:
        if kubeconfig:
            kubernetes.config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
        elif os.environ.get("KUBECONFIG"):
            # passed explicitly: the library reads $KUBECONFIG once at import; a ':'-list is merged
            kubernetes.config.load_kube_config(
                config_file=os.environ["KUBECONFIG"], context=context, client_configuration=configuration
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST") and not context:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            default = pathlib.Path.home() / ".kube" / "config"
            if not default.exists():
                raise ClusterError(
                    "no --kubeconfig given, no $KUBECONFIG, not running in a cluster, and "
                    "~/.kube/config does not exist; pass --kubeconfig FILE (serve: or --no-cluster to "
                    "run without the Kubernetes API)"
                )
            kubernetes.config.load_kube_config(config_file=str(default), context=context, client_configuration=configuration)
    except ClusterError:
        raise
    except Exception as exc:  # the kubernetes config loaders raise several unrelated types
        raise ClusterError(f"cannot load Kubernetes client configuration ({kubeconfig or 'default'}): {exc}") from exc
    configuration.retries = 0
    client = kubernetes.client.ApiClient(configuration)
    return client


def _check_context(files: str, context: str) -> None:
    """Raise ClusterError, one line naming the contexts there are, when the kubeconfig `files` (a
    path, or $KUBECONFIG's ':'-list) has no context `context` (the client library's own error reads
    as if the file were invalid). A file that cannot be read is left to the loader's error."""
    try:
        contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=files)
    except Exception:  # the loader raises several unrelated types: api_client reports them
        return
    names = sorted(str(c.get("name")) for c in contexts or [])
    if context not in names:
        close = [n for n in names if n.startswith(context)] or difflib.get_close_matches(context, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ClusterError(f"no context {context!r} in {files} (its contexts: {', '.join(names) or 'none'}){hint}")


#: what an API call may raise that callers outside webhook.kube handle (they never import kubernetes)
API_ERRORS: tuple[type[Exception], ...] = (ApiException, ClusterError)


def describe_error(exc: BaseException) -> str:
    """A one-line description of an API error: a ClusterError's text, else webhook.kube.errors.cause()."""
    return str(exc) if isinstance(exc, ClusterError) else cause(exc)


def count(verb: str, resource: str) -> None:
    """Count one request to the Kubernetes API (verb: get, list, watch, create, update, patch,
    delete; resource: the plural name, e.g. "clusterrolebindings") in dra_guard_kube_api_requests_total."""
    metrics.KUBE_API_REQUESTS.labels(verb=verb, resource=resource).inc()


def server_of(client: kubernetes.client.ApiClient) -> str:
    """The API server's URL `client` talks to (e.g. "https://127.0.0.1:6443"), for error messages."""
    return str(client.configuration.host)


def served_resource_versions(client: kubernetes.client.ApiClient, *, timeout_seconds: float = 10.0) -> list[str]:
    """The resource.k8s.io versions the apiserver serves, preferred first ([] when none).
    Raises ClusterError (webhook.kube.errors.api_failure) when the discovery request fails."""
    count("get", "apis")
    with calling(server_of(client), "discover the served API groups", timeout_seconds=timeout_seconds):
        groups = kubernetes.client.ApisApi(client).get_api_versions(_request_timeout=timeout_seconds)
    for group in groups.groups or []:
        if group.name == RESOURCE_GROUP:
            served = [v.version for v in group.versions or []]
            preferred = group.preferred_version.version if group.preferred_version else ""
            return sorted(served, key=lambda v: (v != preferred, RESOURCE_VERSIONS.index(v) if v in RESOURCE_VERSIONS else 99))
    return []
