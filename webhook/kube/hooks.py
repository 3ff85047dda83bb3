"""What the Helm chart's hooks do, as `dra-guard hook pre-delete` and `dra-guard hook test`.

pre-delete: delete dra-guard's webhook configurations before anything else of the release goes.
Without it an uninstall could delete the Service first and leave a failurePolicy Fail webhook
pointing at nothing, which refuses every RBAC write in the cluster until someone deletes the
configuration by hand. Then (--delete-reports) dra-guard's reports, so no stale FAIL result stays
in a policy UI after the uninstall; a failure there is reported and never stops the uninstall.

test (`helm test`): does the apiserver really get dra-guard's answer for RBAC writes? A server-side
dry run (nothing is stored) of a ClusterRoleBinding that gives a made-up group a ClusterRole with
write on resourceslices, which the RBAC guard exists to refuse:
- rbac mode enforce: passes only if the rbac.dra-guard.io webhook denied it;
- warn: passes only if the request was allowed with a warning from dra-guard;
- audit: passes if the apiserver got an answer (with failurePolicy Fail, an allowed request means
  dra-guard answered; nothing else is visible to a client in audit mode).
A "failed calling webhook" error (dra-guard unreachable, bad caBundle) always fails the test.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from webhook.kube.client import count, server_of
from webhook.kube.errors import ClusterError, api_failure
from webhook.kube.reports import delete_reports as _delete_all_reports

RETRY_SECONDS = 60  # pre-delete: transient errors are retried for this long
REQUEST_TIMEOUT = 10.0  # seconds per API request of a hook


def delete_webhook_configurations(
    client: kubernetes.client.ApiClient,
    name: str,
    *,
    retry_seconds: float = RETRY_SECONDS,
    timeout_seconds: float = REQUEST_TIMEOUT,
) -> None:
    """Delete the Validating- and MutatingWebhookConfiguration called `name` (admissionregistration.k8s.io/v1).

    Prints one line per configuration ("deleted ..." or "... already absent") on stdout; each
    request may take `timeout_seconds`. Returns when both are gone (already absent counts).
    Raises ClusterError (one line naming the server and the cause, webhook.kube.errors) on 401/403,
    or when other failures (network, 5xx, timeouts: an apiserver restarting during an uninstall)
    last beyond `retry_seconds` (seconds).
    """
    api = kubernetes.client.AdmissionregistrationV1Api(client)
    pending = [
        ("validatingwebhookconfiguration", api.delete_validating_webhook_configuration),
        ("mutatingwebhookconfiguration", api.delete_mutating_webhook_configuration),
    ]
    deadline = time.monotonic() + retry_seconds
    while pending:
        kind, delete = pending[0]
        count("delete", kind + "s")
        try:
            delete(name, _request_timeout=timeout_seconds)
            print(f"deleted {kind} {name}", flush=True)
            pending.pop(0)
        except Exception as exc:  # ApiException for answers; network errors come in many urllib3 types
            if isinstance(exc, ApiException) and exc.status == 404:
                print(f"{kind} {name} already absent", flush=True)
                pending.pop(0)
                continue
            if (isinstance(exc, ApiException) and exc.status in (401, 403)) or time.monotonic() > deadline:
                raise api_failure(f"delete {kind} {name}", server_of(client), exc, timeout_seconds=timeout_seconds) from exc
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))


def delete_reports(client: kubernetes.client.ApiClient, *, timeout_seconds: float = REQUEST_TIMEOUT) -> bool:
    """Delete every report dra-guard wrote (webhook.kube.reports.delete_reports), one line each on
    stdout. Returns False, with the reason on stderr, when the API failed: the uninstall goes on
    (stale reports are not worth a failed uninstall; `dra-guard cleanup` removes them later)."""
    try:
        done = _delete_all_reports(client, timeout_seconds=timeout_seconds, report=lambda line: print(line, flush=True))
    except ClusterError as exc:
        print(f"reports not deleted: {exc}; run `dra-guard cleanup` after the uninstall", file=sys.stderr, flush=True)
        return False
    print(f"{len(done)} report(s) deleted", flush=True)
    return True


def refused_binding(name: str, role: str, group: str) -> dict[str, Any]:
    """The ClusterRoleBinding (rbac.authorization.k8s.io/v1 dict) the RBAC guard must refuse:
    Group `group` bound to ClusterRole `role`."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "helm-test"}},
        "subjects": [{"kind": "Group", "name": group, "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "ClusterRole", "name": role, "apiGroup": "rbac.authorization.k8s.io"},
    }


def judge_test(mode: str, failure_policy: str, status: int, body: str, warnings: str) -> tuple[bool, str]:
    """(passed, explanation) for the apiserver's answer to the dry run: HTTP `status`, the error
    message or body text, and the Warning header(s)."""
    if 'failed calling webhook "rbac.dra-guard.io"' in body:
        return False, f"the apiserver could not reach dra-guard: {body}"
    denied = 'admission webhook "rbac.dra-guard.io" denied the request' in body
    if mode == "enforce":
        if denied:
            return True, "dra-guard refused the binding, as it must in enforce mode"
        return False, f"expected dra-guard to refuse the binding (enforce mode); got HTTP {status}: {body[:500]}"
    if status >= 300:
        return False, f"expected the binding to be allowed in {mode} mode; got HTTP {status}: {body[:500]}"
    if mode == "warn":
        if "dra-guard" in warnings:
            return True, f"dra-guard allowed the binding with a warning: {warnings}"
        return False, f"expected a warning from dra-guard in warn mode; got warnings {warnings!r}"
    note = "" if failure_policy == "Fail" else " (failurePolicy is not Fail: this does not prove dra-guard answered)"
    return True, "allowed in audit mode: the apiserver got an answer" + note


def dry_run_binding(
    client: kubernetes.client.ApiClient, binding: dict[str, Any], *, timeout_seconds: float = 30.0
) -> tuple[int, str, str]:
    """Create `binding` with dryRun=All: (HTTP status, the error message or body, Warning header).

    An admission webhook's answer (allowed, or denied with any status) is returned to be judged.
    Raises ClusterError (one line naming the server and the cause) when the apiserver cannot be
    reached or answers in `timeout_seconds`, or refuses the caller itself (401, or a 403 that is
    RBAC's, not a webhook's): the test then says nothing about dra-guard.
    """
    api = kubernetes.client.RbacAuthorizationV1Api(client)
    count("create", "clusterrolebindings")
    action = "create clusterrolebindings (dry run)"
    try:
        resp = api.create_cluster_role_binding(binding, dry_run="All", _preload_content=False, _request_timeout=timeout_seconds)
        return int(resp.status), resp.data.decode(), str(resp.headers.get("Warning", ""))
    except ApiException as exc:
        raw = exc.body or ""
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        try:
            text = str(json.loads(text).get("message", text))
        except (ValueError, AttributeError):
            pass
        if exc.status == 401 or (exc.status == 403 and "admission webhook" not in text):
            raise api_failure(action, server_of(client), exc, timeout_seconds=timeout_seconds) from exc
        return int(exc.status or 0), text, str((exc.headers or {}).get("Warning", ""))
    except Exception as exc:  # network errors come in many urllib3 types
        raise api_failure(action, server_of(client), exc, timeout_seconds=timeout_seconds) from exc
