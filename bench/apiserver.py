"""The same `create` through the real kube-apiserver: no admission, a ValidatingAdmissionPolicy,
a no-op webhook, and dra-guard.

vegeta POSTs a compliant ClusterRole (generateName, so every request creates one) to the
apiserver as the cluster admin, at a constant rate, for each variant in turn:

* ``none``: no admission beyond the apiserver's built-in plugins;
* ``vap``: a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, in-process CEL) doing
  the simplest form of the RBAC check: refuse a ClusterRole with a write verb (or ``*``) on
  ``resourceslices`` (or ``*``) in ``resource.k8s.io`` (or ``*``);
* ``noop-webhook``: a ValidatingWebhookConfiguration calling dra-guard's /validate/noop (what
  any webhook costs: the apiserver's HTTPS round trip and JSON);
* ``dra-guard``: the chart's webhook configurations (tests/e2e/guard.py), full RBAC check.

The created roles are deleted (deletecollection by label) after each variant, so dra-guard's
cache has the same size for all. Variants rotate order between repeats.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

from bench.common import Target, attack

LABEL_KEY = "bench.dra-guard.io/apiserver"
VAP_NAME = "bench-dra-write"
NOOP_WEBHOOK = "bench-noop"
VARIANTS = ("none", "vap", "noop-webhook", "dra-guard")

ROLE_BODY = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"generateName": "bench-api-", "labels": {LABEL_KEY: "true"}},
    "rules": [
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list"]},
    ],
}

#: The probe the VAP and dra-guard both refuse; used to wait until each is in effect.
VIOLATING_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "bench-api-probe", "labels": {LABEL_KEY: "true"}},
    "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["*"]}],
}

WRITE_VERBS = ["*", "create", "update", "patch", "delete", "deletecollection"]


def vap_objects() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (validationActions Deny)."""
    verbs = ", ".join(f"'{v}'" for v in WRITE_VERBS)
    expression = (
        "!has(object.rules) || !object.rules.exists(r, "
        "has(r.apiGroups) && r.apiGroups.exists(g, g == 'resource.k8s.io' || g == '*') && "
        "has(r.resources) && r.resources.exists(x, x == 'resourceslices' || x == '*') && "
        f"r.verbs.exists(v, v in [{verbs}]))"
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": VAP_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["rbac.authorization.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["clusterroles"],
                    }
                ]
            },
            "validations": [{"expression": expression, "message": "ClusterRoles may not grant write access to ResourceSlices"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": VAP_NAME},
        "spec": {"policyName": VAP_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def noop_webhook(url: str, ca_bundle_b64: str) -> dict[str, Any]:
    """A ValidatingWebhookConfiguration sending ClusterRole creates to dra-guard's /validate/noop."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": NOOP_WEBHOOK},
        "webhooks": [
            {
                "name": "noop.bench.dra-guard.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {"url": url + "/validate/noop", "caBundle": ca_bundle_b64},
                "rules": [
                    {
                        "apiGroups": ["rbac.authorization.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["clusterroles"],
                        "scope": "*",
                    }
                ],
            }
        ],
    }


def _wait(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise TimeoutError(f"{what} not in effect after {timeout:.0f} s")


def _probe_refused(cp: Any, needle: str) -> bool:
    """A server-side dry-run create of VIOLATING_ROLE is refused with `needle` in the message."""
    resp = cp.session("admin").post(
        f"{cp.url}/apis/rbac.authorization.k8s.io/v1/clusterroles?dryRun=All", json=VIOLATING_ROLE, timeout=10
    )
    return resp.status_code >= 400 and needle in resp.text


def _webhook_calls(cp: Any, name: str) -> float:
    """apiserver_admission_webhook_request_total for webhook `name`, summed (from /metrics)."""
    text = cp.session("admin").get(f"{cp.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_admission_webhook_request_total{") and f'name="{name}"' in line
    )


def _apply(cp: Any, objects: list[dict[str, Any]]) -> None:
    cp.kubectl("admin", "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def set_variant(cp: Any, guard: Any, variant: str) -> None:
    """Remove every other variant's admission objects, install `variant`'s, wait until in effect."""
    cp.kubectl(
        "admin",
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        VAP_NAME,
        "--ignore-not-found",
        "--wait=true",
    )
    cp.kubectl("admin", "delete", "validatingwebhookconfiguration", NOOP_WEBHOOK, "--ignore-not-found")
    guard.unregister()
    if variant == "none":
        _wait("no admission", lambda: not _probe_refused(cp, ""))
    elif variant == "vap":
        _apply(cp, vap_objects())
        _wait("the ValidatingAdmissionPolicy", lambda: _probe_refused(cp, VAP_NAME))
    elif variant == "noop-webhook":
        import base64

        _apply(cp, [noop_webhook(guard.url, base64.b64encode(guard.proc.ca_file.read_bytes()).decode())])
        before = _webhook_calls(cp, "noop.bench.dra-guard.io")
        _wait(
            "the no-op webhook",
            lambda: (_probe_refused(cp, "x-never"), _webhook_calls(cp, "noop.bench.dra-guard.io"))[1] > before,
        )
    elif variant == "dra-guard":
        guard.register()  # returns once the apiserver calls dra-guard
    else:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")


def delete_created(cp: Any) -> None:
    """Delete every ClusterRole this benchmark created (one deletecollection)."""
    cp.session("admin").delete(
        f"{cp.url}/apis/rbac.authorization.k8s.io/v1/clusterroles", params={"labelSelector": f"{LABEL_KEY}=true"}, timeout=120
    ).raise_for_status()


def measure(
    cp: Any,
    guard: Any,
    *,
    workdir: pathlib.Path,
    repeats: int,
    rate: float = 50,
    seconds: float = 15,
    warmup_seconds: float = 2,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Latency of ClusterRole creates through the apiserver under each variant, `repeats` times
    (variant order rotated), each after a `warmup_seconds` attack that is not counted. Returns {"runs": [{variant, repeat, p50, p99, ...}], "rate", "seconds"}."""
    body = workdir / "clusterrole.json"
    workdir.mkdir(parents=True, exist_ok=True)
    body.write_text(json.dumps(ROLE_BODY))
    target = Target(
        url=f"{cp.url}/apis/rbac.authorization.k8s.io/v1/clusterroles",
        body=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {cp.token('admin')}"},
    )
    runs = []
    try:
        for repeat in range(repeats):
            order = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]
            for variant in order:
                set_variant(cp, guard, variant)
                attack(
                    [target], rate=rate, seconds=warmup_seconds, workdir=workdir, ca_file=cp.ca_file
                )  # warm-up: connections, CEL
                result = attack([target], rate=rate, seconds=seconds, workdir=workdir, ca_file=cp.ca_file)
                summary = result.summary()
                summary.update(variant=variant, repeat=repeat, created=sum(1 for c in result.codes if c == 201))
                runs.append(summary)
                log(
                    f"    {variant:13} p50 {summary['p50']:.2f}  p99 {summary['p99']:.2f} ms  created {summary['created']}"
                    f"/{summary['requests']}"
                )
                delete_created(cp)
    finally:
        set_variant(cp, guard, "none")
    return {"rate": rate, "seconds": seconds, "runs": runs}
