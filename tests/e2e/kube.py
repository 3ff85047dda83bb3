"""Small helpers of the end-to-end tests: waiting for a real effect, reading objects, evicting."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.e2e import objects as objects_module


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0, interval: float = 0.3) -> Any:
    """fn()'s first truthy value, polled every `interval` seconds (the one poll of the e2e and chart
    tests: a real effect is waited for, never slept for); TimeoutError naming `what`, the timeout
    and fn()'s last value after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")


def dra_guard(cp: Any, *args: str, user: str = "admin", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real `dra-guard ARGS --kubeconfig <user's kubeconfig>` (python -m webhook.cli, this
    checkout's code) against the control plane `cp`: its exit code, stdout and stderr as text;
    subprocess.TimeoutExpired after `timeout` seconds."""
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args, "--kubeconfig", str(cp.kubeconfig(user))],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def audit_findings(cp: Any, *args: str, user: str = "admin") -> list[dict[str, Any]]:
    """`dra-guard audit --cluster -o json ARGS` as `user`: the AuditResult's findings; fails the
    test when the audit did not end with exit 0 (clean) or 1 (findings), naming its stderr."""
    out = dra_guard(cp, "audit", "--cluster", "-o", "json", *args, user=user)
    assert out.returncode in (0, 1), out.stderr
    findings: list[dict[str, Any]] = json.loads(out.stdout)["findings"]
    return findings


def get_json(cp: Any, *args: str) -> Any:
    """`kubectl get ARGS -o json` as admin, parsed; None when kubectl fails (e.g. not found)."""
    out = cp.kubectl("admin", "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def evict(cp: Any, namespace: str, name: str, *, grace: int | None = None) -> Any:
    """POST a policy/v1 Eviction of pod namespace/name as admin; the requests.Response."""
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    if grace is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace}
    return cp.session("admin").post(f"{cp.url}/api/v1/namespaces/{namespace}/pods/{name}/eviction", json=body, timeout=10)


#: dra-guard's requests on clocks of their own, never caused by a review: the APIService check
#: (cluster.apiCheckIntervalSeconds) and the Lease writers (certificates, periodic audit, shared records)
OWN_CLOCK_RESOURCES = ("apiservices", "leases")


def review_caused(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audit events (dra-guard's) a review could have caused: not watches (renewed by the
    informers) nor requests on OWN_CLOCK_RESOURCES."""
    return [ev for ev in events if ev["verb"] != "watch" and ev.get("objectRef", {}).get("resource") not in OWN_CLOCK_RESOURCES]


def apply_objects(cp: Any, *objects: dict[str, Any], user: str = "admin") -> None:
    """`kubectl apply -f -` of the objects as `user`; fails the test (CalledProcessError) when kubectl does."""
    cp.kubectl(user, "apply", "-f", "-", input=objects_module.manifests(*objects))


def create_as_aggregation_controller(cp: Any, obj: dict[str, Any]) -> None:
    """`kubectl create` of `obj` as kube-controller-manager's ClusterRole aggregation controller
    (impersonated by admin, with system:masters as the controller has): a write dra-guard lets
    through as the control plane's own; fails the test, naming kubectl's stderr, when refused."""
    out = cp.kubectl(
        "admin",
        "create",
        "-f",
        "-",
        "--as=system:serviceaccount:kube-system:clusterrole-aggregation-controller",
        "--as-group=system:masters",
        input=json.dumps(obj),
        check=False,
    )
    assert out.returncode == 0, out.stderr
