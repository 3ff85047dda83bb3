"""`helm test`: does the apiserver really get dra-guard's answer for RBAC writes?

Runs in dra-guard's own image (Python with the `kubernetes` package) as a ServiceAccount that may
only create ClusterRoleBindings and bind the ClusterRole $SLICE_WRITER_ROLE (write on
resourceslices). It makes a server-side dry run (nothing is stored) of a ClusterRoleBinding that
gives the made-up group $TEST_GROUP that role, which the RBAC guard exists to refuse:

- rbac mode enforce: passes only if the rbac.dra-guard.io webhook denied it;
- warn: passes only if the request was allowed with a warning from dra-guard;
- audit: passes if the apiserver got an answer (with failurePolicy Fail, an allowed request means
  dra-guard answered; nothing else is visible to a client in audit mode).

A "failed calling webhook" error (dra-guard unreachable, bad caBundle) always fails the test.
Environment: RBAC_MODE, FAILURE_POLICY, SLICE_WRITER_ROLE, TEST_GROUP, BINDING_NAME.
"""
import json
import os
import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException


def load() -> None:
    """In-cluster credentials in the test pod, else the local kubeconfig (tests)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def binding(name: str, role: str, group: str) -> dict:
    """The ClusterRoleBinding the RBAC guard must refuse."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "helm-test"}},
            "subjects": [{"kind": "Group", "name": group, "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "ClusterRole", "name": role, "apiGroup": "rbac.authorization.k8s.io"}}


def judge(mode: str, failure_policy: str, status: int, body: str, warnings: str) -> tuple[bool, str]:
    """(passed, explanation) for the apiserver's answer to the dry run."""
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


def main() -> int:
    """Entry point: make the dry run and judge the answer; 0 passed, 1 failed."""
    load()
    api = client.RbacAuthorizationV1Api()
    body = binding(os.environ["BINDING_NAME"], os.environ["SLICE_WRITER_ROLE"], os.environ["TEST_GROUP"])
    try:
        resp = api.create_cluster_role_binding(body, dry_run="All", _preload_content=False)
        status, text, warnings = resp.status, resp.data.decode(), resp.headers.get("Warning", "")
    except ApiException as exc:
        status, text, warnings = exc.status, exc.body or "", (exc.headers or {}).get("Warning", "")
        if isinstance(text, bytes):
            text = text.decode()
        try:
            text = json.loads(text).get("message", text)
        except ValueError:
            pass
    passed, why = judge(os.environ.get("RBAC_MODE", "enforce"), os.environ.get("FAILURE_POLICY", "Fail"),
                        status, text, warnings)
    print(("PASS: " if passed else "FAIL: ") + why, flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
