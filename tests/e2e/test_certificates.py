"""certificates.mode self against the real apiserver: two replicas
share one Secret and CA, a stale caBundle is corrected, and the webhook keeps being called while
the CA rotates. docs/threat-model.md, path 5: the webhook configurations are kept whole (a matchCondition
added by someone who may write them is reported and removed), and the chart's webhooks read back
from the real apiserver compare equal (its defaults are what certs.webhookspec assumes)."""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
import sys
import threading
import time

import pytest
from cryptography import x509

import certs
from tests.e2e.kube import dra_guard, wait_for
from tests.scrape import metric, scrape
from tests.serve import DraGuardProcess

NS = "dra-guard-certs"
CONFIG_NAME = "e2e-certs"
CHECK = 2  # seconds between reconcile rounds in this test

RBAC = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: dra-guard-certs, namespace: {NS}}}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, create, update]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, list, create, update, delete]
  - apiGroups: [""]
    resources: [configmaps]
    resourceNames: [dra-guard-webhooks]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: dra-guard-certs, namespace: {NS}}}
subjects: [{{kind: User, name: dra-guard, apiGroup: rbac.authorization.k8s.io}}]
roleRef: {{kind: Role, name: dra-guard-certs, apiGroup: rbac.authorization.k8s.io}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: dra-guard-certs-e2e}}
rules:
  - apiGroups: [admissionregistration.k8s.io]
    resources: [validatingwebhookconfigurations, mutatingwebhookconfigurations]
    resourceNames: [{CONFIG_NAME}]
    verbs: [get, patch]
  - apiGroups: [rbac.authorization.k8s.io]
    resources: [clusterroles, clusterrolebindings, roles, rolebindings]
    verbs: [list, watch]
  - apiGroups: [""]
    resources: [events]
    verbs: [create]
  - apiGroups: [apps]
    resources: [daemonsets]
    verbs: [list, watch]
  - apiGroups: [""]
    resources: [pods, nodes]
    verbs: [list, watch]
  - apiGroups: [resource.k8s.io]
    resources: [resourceclaims, resourceslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: dra-guard-certs-e2e}}
subjects: [{{kind: User, name: dra-guard, apiGroup: rbac.authorization.k8s.io}}]
roleRef: {{kind: ClusterRole, name: dra-guard-certs-e2e, apiGroup: rbac.authorization.k8s.io}}
"""

PROBE = json.dumps(
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-certs-probe"},
        "subjects": [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "ClusterRole", "name": "cluster-admin", "apiGroup": "rbac.authorization.k8s.io"},
    }
)


def desired_webhooks(url: str) -> dict:
    """The webhooks of webhook_config() as the chart's webhooks.json carries them (no caBundle)."""
    items = json.loads(webhook_config(url, b""))["items"]
    out = {}
    for item, kind in zip(items, ("mutating", "validating"), strict=True):
        hooks = item["webhooks"]
        for hook in hooks:
            hook["clientConfig"].pop("caBundle")
        out[kind] = hooks
    return out


def webhook_config(url: str, ca_bundle: bytes) -> str:
    # only the probe objects of this module reach these replicas; the mutating one matches nothing
    # real (dra-guard keeps its caBundle too)
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG_NAME},
        "webhooks": [
            {
                "name": "probes.e2e-certs.dra-guard.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
                "clientConfig": {"url": f"{url}/mutate/daemonsets", "caBundle": base64.b64encode(ca_bundle).decode()},
                "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["daemonsets"]}],
                "matchConditions": [{"name": "probe-only", "expression": "object.metadata.name.startsWith('e2e-certs-')"}],
            }
        ],
    }
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                mutating,
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": CONFIG_NAME},
                    "webhooks": [
                        {
                            "name": "rbac.e2e-certs.dra-guard.io",
                            "admissionReviewVersions": ["v1"],
                            "sideEffects": "None",
                            "failurePolicy": "Fail",
                            "timeoutSeconds": 5,
                            "clientConfig": {"url": f"{url}/validate/rbac", "caBundle": base64.b64encode(ca_bundle).decode()},
                            "rules": [
                                {
                                    "apiGroups": ["rbac.authorization.k8s.io"],
                                    "apiVersions": ["v1"],
                                    "operations": ["CREATE"],
                                    "resources": ["clusterrolebindings"],
                                }
                            ],
                            "matchConditions": [
                                {"name": "probe-only", "expression": "object.metadata.name.startsWith('e2e-certs-')"}
                            ],
                        }
                    ],
                },
            ],
        }
    )


def config(workdir, name):
    return f"""
certificates:
  mode: self
  namespace: {NS}
  service: dra-guard
  extraIpAddresses: [127.0.0.1]
  validatingWebhookConfiguration: {CONFIG_NAME}
  mutatingWebhookConfiguration: {CONFIG_NAME}
  webhooksConfigMap: dra-guard-webhooks
  dir: {workdir / name / "certs"}
  checkIntervalSeconds: {CHECK}
  reloadIntervalSeconds: 1
"""


def secret(cp):
    out = json.loads(cp.kubectl("admin", "get", "secret", "-n", NS, "dra-guard-tls", "-o", "json").stdout)
    return {k: base64.b64decode(v) for k, v in out["data"].items()}


def cluster_bundle(cp):
    return base64.b64decode(live_validating(cp)["webhooks"][0]["clientConfig"]["caBundle"])


def live_validating(cp):
    """The ValidatingWebhookConfiguration CONFIG_NAME as the apiserver has it."""
    return json.loads(cp.kubectl("admin", "get", "validatingwebhookconfiguration", CONFIG_NAME, "-o", "json").stdout)


def patch_validating(cp, *operations: dict) -> None:
    """JSON-patch the ValidatingWebhookConfiguration CONFIG_NAME as admin (as an admin tampering with it would)."""
    cp.kubectl("admin", "patch", "validatingwebhookconfiguration", CONFIG_NAME, "--type=json", "-p", json.dumps(list(operations)))


@pytest.fixture(scope="module")
def replicas(control_plane, tmp_path_factory):
    cp = control_plane
    workdir = tmp_path_factory.mktemp("certs-self")
    cp.kubectl("admin", "apply", "-f", "-", input=RBAC)
    stale = certs.generate_ca(common_name="stale").cert_pem()
    procs = []
    for name in ("replica-a", "replica-b"):  # both start at once
        procs.append(
            DraGuardProcess(
                workdir / name,
                "--kubeconfig",
                str(cp.kubeconfig("dra-guard")),
                config=config(workdir, name),
                env={"POD_NAME": name},
                ca_file=workdir / name / "certs" / "ca.crt",
            )
        )
    cp.kubectl("admin", "apply", "-f", "-", input=webhook_config(procs[0].url, stale))
    cp.kubectl(
        "admin",
        "create",
        "configmap",
        "-n",
        NS,
        "dra-guard-webhooks",
        f"--from-literal=webhooks.json={json.dumps(desired_webhooks(procs[0].url))}",
    )
    try:
        for p in procs:
            p.wait("/readyz", timeout=60)
        yield procs
    finally:
        cp.kubectl(
            "admin", "delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", CONFIG_NAME, "--ignore-not-found"
        )
        for p in procs:
            p.stop()
        # its cluster-scoped RBAC too: write on webhook configurations (self mode) is an escalation
        # power for the test's User dra-guard, which later cluster audits would report
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", "dra-guard-certs-e2e", "--ignore-not-found")
        cp.kubectl("admin", "delete", "namespace", NS, "--wait=false", check=False)


def test_two_replicas_share_one_secret_and_ca(control_plane, replicas):
    cp = control_plane
    secrets = json.loads(cp.kubectl("admin", "get", "secrets", "-n", NS, "-o", "json").stdout)["items"]
    assert [s["metadata"]["name"] for s in secrets] == ["dra-guard-tls"]
    ca = x509.load_pem_x509_certificate(secret(cp)["ca.crt"])
    for p in replicas:
        leaf = x509.load_pem_x509_certificate((p.ca_file.parent / "tls.crt").read_bytes())
        leaf.verify_directly_issued_by(ca)
        # and that is what the server presents, with the Service's DNS name
        presented = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "certs", "inspect", "--url", f"127.0.0.1:{p.port}"],
            capture_output=True,
            text=True,
        ).stdout
        assert "dra-guard.dra-guard-certs.svc" in presented and ca.subject.rfc4514_string() in presented


def test_stale_ca_bundle_is_corrected_within_a_reconcile_period(control_plane, replicas):
    cp = control_plane
    wanted = secret(cp)["ca-bundle.crt"]
    wait_for("the initial stale caBundle to be replaced", lambda: cluster_bundle(cp) == wanted, 3 * CHECK + 5)
    stale = base64.b64encode(certs.generate_ca(common_name="stale-again").cert_pem()).decode()
    patch_validating(
        cp,
        {"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": stale},
    )
    started = time.monotonic()
    wait_for("the stale caBundle to be corrected", lambda: cluster_bundle(cp) == wanted, 2 * CHECK + 5)
    assert time.monotonic() - started <= 2 * CHECK + 5
    # certs inspect --cluster agrees
    out = dra_guard(
        cp,
        "certs",
        "inspect",
        "--url",
        f"127.0.0.1:{replicas[0].port}",
        "--cluster",
        "--config",
        str(replicas[0].workdir / "config.yaml"),
    )
    assert out.returncode == 0 and "caBundle trusts" in out.stdout, out.stdout + out.stderr


def test_webhook_keeps_being_called_across_a_ca_rotation(control_plane, replicas):
    cp = control_plane
    wait_for("caBundle in place", lambda: cluster_bundle(cp) == secret(cp)["ca-bundle.crt"], 3 * CHECK + 5)
    results: list[str] = []
    stop = threading.Event()

    def call_webhook():
        while not stop.is_set():
            out = cp.kubectl("admin", "create", "--dry-run=server", "-f", "-", input=PROBE, check=False)
            results.append(
                "ok"
                if "rbac.e2e-certs.dra-guard.io" in out.stderr and "denied the request" in out.stderr
                else out.stderr.strip()[-300:]
            )
            time.sleep(0.2)

    caller = threading.Thread(target=call_webhook)
    caller.start()
    try:
        time.sleep(1)
        # make the CA due: replace it with one issued 9 of its 10 years ago (and a leaf from it)
        old_now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=9 * 365)
        old_ca = certs.generate_ca(common_name="old-ca", now=old_now)
        old_leaf = certs.generate_serving(
            old_ca,
            dns_names=certs.service_dns_names("dra-guard", NS),
            ip_addresses=["127.0.0.1"],
            now=datetime.datetime.now(datetime.UTC),
        )
        # the CA in use stays trusted next to it, as after a restore of an older Secret
        current = secret(cp)["ca.crt"]
        data = {
            "ca.crt": old_ca.cert_pem(),
            "ca.key": old_ca.key_pem(),
            "ca-bundle.crt": old_ca.cert_pem() + current,
            "tls.crt": old_leaf.cert_pem(),
            "tls.key": old_leaf.key_pem(),
        }
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "dra-guard-tls", "namespace": NS},
            "type": "Opaque",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        cp.kubectl("admin", "replace", "-f", "-", input=json.dumps(body))

        first_ca = x509.load_pem_x509_certificate(current)

        def rotated():
            s = secret(cp)
            bundle = x509.load_pem_x509_certificates(s["ca-bundle.crt"])
            ca = x509.load_pem_x509_certificate(s["ca.crt"])
            return (
                len(bundle) == 1
                and ca.subject.rfc4514_string() != "CN=old-ca"
                and ca != first_ca
                and cluster_bundle(cp) == s["ca-bundle.crt"]
                and ca
            )

        new_ca = wait_for("the CA rotation to finish (steps A, B, C)", rotated, 60)
        time.sleep(2)
    finally:
        stop.set()
        caller.join(30)
    failures = [r for r in results if r != "ok"]
    assert not failures, failures[:3]
    assert len(results) >= 10
    for p in replicas:
        x509.load_pem_x509_certificate((p.ca_file.parent / "tls.crt").read_bytes()).verify_directly_issued_by(new_ca)


def test_no_secret_material_in_logs(control_plane, replicas):
    """Self mode handles a CA key, serving keys and a bearer token: none of it reaches the logs."""
    token = control_plane.token("dra-guard")
    for p in replicas:
        log = p.log_file.read_text(errors="replace")
        assert "PRIVATE KEY" not in log and "BEGIN CERTIFICATE" not in log
        assert token not in log


def test_a_match_condition_added_to_skip_the_guard_is_reported_and_removed(control_plane, replicas):
    """docs/threat-model.md, path 5: a user who can write the ValidatingWebhookConfiguration adds a
    matchCondition that skips her own requests; a replica reports the drift and the Lease holder
    restores the chart's webhooks (caBundle kept) within a few reconcile rounds."""
    cp = control_plane
    wanted = secret(cp)["ca-bundle.crt"]
    wait_for("the caBundle to be set", lambda: cluster_bundle(cp) == wanted, 3 * CHECK + 5)
    before = sum(
        metric(scrape(p), "dra_guard_webhook_configuration_restores_total", kind="validating", default=0.0) for p in replicas
    )
    skip = {"name": "skip-alice", "expression": "request.userInfo.username != 'alice'"}
    patch_validating(
        cp,
        {"op": "add", "path": "/webhooks/0/matchConditions/-", "value": skip},
    )
    assert "skip-alice" in json.dumps(live_validating(cp))  # the tampering really landed
    started = time.monotonic()
    wait_for("the added matchCondition to be removed", lambda: "skip-alice" not in json.dumps(live_validating(cp)), 3 * CHECK + 5)
    assert time.monotonic() - started <= 3 * CHECK + 5
    hooks = live_validating(cp)["webhooks"]
    assert [c["name"] for c in hooks[0]["matchConditions"]] == ["probe-only"]
    assert cluster_bundle(cp) == wanted
    wait_for(
        "a restore counted",
        lambda: (
            sum(
                metric(scrape(p), "dra_guard_webhook_configuration_restores_total", kind="validating", default=0.0)
                for p in replicas
            )
            > before
        ),
        10,
    )
    assert any(
        "webhook configuration differs from the chart" in p.log() and "matchConditions differ" in p.log() for p in replicas
    )
    # the restored webhook is still called (caBundle intact): the probe binding is refused by it
    out = cp.kubectl("admin", "create", "--dry-run=server", "-f", "-", input=PROBE, check=False)
    assert "rbac.e2e-certs.dra-guard.io" in out.stderr and "denied the request" in out.stderr, out.stderr


def test_the_charts_webhooks_read_back_from_the_apiserver_are_no_drift(control_plane):
    """The chart's webhooks.json (self mode), created through the real apiserver (server-side dry
    run: defaulted, not stored), compares equal to itself: certs.webhookspec fills in exactly the
    defaults the apiserver adds, so an untouched installation never reports drift."""
    from certs import webhookspec
    from tests.chart import helm

    docs = helm.template(
        values={
            "certificates": {"mode": "self"},
            "config": {"eviction": {"guardDeletes": True}, "drivers": {"declared": [{"namespace": "gpu", "name": "gpu-driver"}]}},
            "webhooks": {"eviction": {"bestEffort": {"enabled": True}}},
        },
        namespace="dra-guard",
        show_only=["templates/configmap.yaml"],
    )
    desired = webhookspec.parse_desired(docs[0]["data"]["webhooks.json"])
    assert desired["validating"] and desired["mutating"]
    for kind, resource in (("validating", "ValidatingWebhookConfiguration"), ("mutating", "MutatingWebhookConfiguration")):
        obj = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": resource,
            "metadata": {"name": "e2e-drift-dry-run"},
            "webhooks": desired[kind],
        }
        out = cp_create_dry_run(control_plane, obj)
        assert webhookspec.drift(out["webhooks"], desired[kind], kind) == []
        changed = json.loads(json.dumps(out["webhooks"]))
        changed[0]["timeoutSeconds"] = 29
        assert webhookspec.drift(changed, desired[kind], kind) != []


def cp_create_dry_run(cp, obj):
    return json.loads(cp.kubectl("admin", "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj)).stdout)
