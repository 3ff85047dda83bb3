"""The chart against the real control plane.

- Every object of every case in tests/chart/cases.py is accepted by the real kube-apiserver
  (`kubectl apply --dry-run=server`). The kinds whose CRDs are not installed here (ServiceMonitor,
  PrometheusRule from prometheus-operator; Issuer, Certificate from cert-manager) get the small
  stand-in CRDs in tests/chart/crds/ first (any field accepted: only their envelope is checked).
- `helm install` succeeds. No kubelet runs, so the pods stay Pending (no --wait); the webhook
  configurations it creates point with the development value `webhooks.url` at a real
  `dra-guard serve` on loopback, so they work and break no other test. The hooks' scripts
  (`dra-guard hook test`, `dra-guard hook pre-delete`) run here as the hooks' own ServiceAccounts (tokens
  from the TokenRequest API), since no kubelet could run their pods; then `helm uninstall
  --no-hooks` removes the release.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml

from tests.chart import helm
from tests.chart.cases import case_ids, cases
from tests.e2e.guard import PROBE, Guard
from webhook.config import from_mapping

pytestmark = pytest.mark.e2e

HERE = pathlib.Path(__file__).resolve().parent
CASES = dict(cases())
RENDER_NAMESPACE = "dra-guard"  # namespace of the dry runs
RELEASE, NAMESPACE = "chart-e2e", "dra-guard-e2e"  # the installed release
FULLNAME = f"{RELEASE}-dra-guard"


def as_list(objs: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})


@pytest.fixture(scope="module")
def crds(control_plane):
    """The stand-in CRDs, established; removed at the end of the module."""
    cp = control_plane
    cp.kubectl("admin", "apply", "-f", str(HERE / "crds"))
    cp.kubectl("admin", "wait", "--for=condition=Established", "--timeout=30s", "-f", str(HERE / "crds"))
    cp.kubectl("admin", "create", "namespace", RENDER_NAMESPACE, check=False)
    yield
    cp.kubectl("admin", "delete", "-f", str(HERE / "crds"), "--wait=false", check=False)


@pytest.mark.parametrize("case", case_ids())
def test_every_rendered_object_is_accepted_by_the_apiserver(control_plane, crds, case):
    objs = helm.template(values=CASES[case], namespace=RENDER_NAMESPACE)  # hooks and tests included
    out = control_plane.kubectl("admin", "apply", "--dry-run=server", "-f", "-", input=as_list(objs), check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("(server dry run)") == len(objs), out.stdout
    # nothing was stored
    assert control_plane.kubectl("admin", "get", "deployment", "-n", RENDER_NAMESPACE, "-o", "name").stdout == ""


# ---------------------------------------------------------------- helm install
def kubeconfig_for_service_account(cp, tmp_path: pathlib.Path, namespace: str, name: str) -> pathlib.Path:
    """A kubeconfig authenticating as ServiceAccount namespace/name (a TokenRequest token)."""
    token = cp.kubectl("admin", "create", "token", name, "-n", namespace, "--duration=10m").stdout.strip()
    path = tmp_path / f"{namespace}-{name}.kubeconfig"
    ca = base64.b64encode(cp.ca_file.read_bytes()).decode()
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "e2e", "cluster": {"server": cp.url, "certificate-authority-data": ca}}],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
                "current-context": name,
            }
        )
    )
    return path


def run_hook(container: dict[str, Any], kubeconfig: pathlib.Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a hook container's rendered command (`dra-guard hook ...`) as its pod would, with a
    kubeconfig instead of in-cluster config."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    assert container["command"] == ["dra-guard"], container["command"]
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *container["args"]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "KUBECONFIG": str(kubeconfig), **env},
    )


def pod_env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


@pytest.fixture(scope="module")
def installed(control_plane, tmp_path_factory):
    """The chart installed as release chart-e2e in dra-guard-e2e, its webhooks calling a real dra-guard."""
    cp = control_plane
    guard = Guard(cp, tmp_path_factory.mktemp("chart-install"))
    guard.start(mode="enforce")
    # preDelete on: its ServiceAccount and RBAC are installed, so the hook's command can run as it below
    values = {
        "webhooks": {"url": guard.url, "caBundle": base64.b64encode(guard.proc.ca_file.read_bytes()).decode()},
        "preDelete": {"enabled": True},
    }
    folder = tmp_path_factory.mktemp("chart-values")
    try:
        out = helm.run(
            "install",
            RELEASE,
            str(helm.CHART),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--timeout",
            "60s",
            *helm.values_args(values, folder),
            env=cp.env("admin"),
            check=False,
        )
        yield {"guard": guard, "values": values, "install": out, "folder": folder}
    finally:
        # never leave a Fail webhook pointing at a stopped server
        cp.kubectl(
            "admin", "delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", FULLNAME, "--ignore-not-found"
        )
        helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks", env=cp.env("admin"), check=False)
        guard.stop()


def test_helm_install_succeeds(control_plane, installed):
    out = installed["install"]
    assert out.returncode == 0, out.stderr
    assert "STATUS: deployed" in out.stdout
    assert "webhook failurePolicy Fail" in out.stdout  # NOTES
    cp = control_plane
    status = json.loads(helm.run("status", RELEASE, "-n", NAMESPACE, "-o", "json", env=cp.env("admin")).stdout)
    assert status["info"]["status"] == "deployed"
    dep = json.loads(cp.kubectl("admin", "get", "deployment", FULLNAME, "-n", NAMESPACE, "-o", "json").stdout)
    assert dep["spec"]["replicas"] == 3
    cm = json.loads(cp.kubectl("admin", "get", "configmap", FULLNAME, "-n", NAMESPACE, "-o", "json").stdout)
    config = from_mapping(yaml.safe_load(cm["data"]["config.yaml"]))
    assert config.certificates.namespace == NAMESPACE and config.certificates.validating_webhook == FULLNAME
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration", "clusterrole", "clusterrolebinding"):
        assert cp.kubectl("admin", "get", kind, FULLNAME, "-o", "name").stdout.strip()
    names = set(
        cp.kubectl("admin", "get", "pdb,service,serviceaccount,role,rolebinding", "-n", NAMESPACE, "-o", "name").stdout.split()
    )
    assert {
        f"poddisruptionbudget.policy/{FULLNAME}",
        f"service/{FULLNAME}",
        f"serviceaccount/{FULLNAME}",
        f"serviceaccount/{FULLNAME}-pre-delete",
        f"role.rbac.authorization.k8s.io/{FULLNAME}",
        f"rolebinding.rbac.authorization.k8s.io/{FULLNAME}",
    } <= names


def test_installed_webhooks_answer(control_plane, installed):
    """The installed ValidatingWebhookConfiguration sends RBAC writes to dra-guard, which refuses this one."""
    guard = installed["guard"]
    guard.wait_called()
    out = control_plane.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=PROBE, check=False)
    assert out.returncode != 0 and 'admission webhook "rbac.dra-guard.io" denied the request' in out.stderr


def test_service_account_can_do_nothing_beyond_what_dra_guard_uses(control_plane, installed):
    # (before the pre-delete test, which uninstalls the release)
    """`kubectl auth can-i --list` as the chart's ServiceAccount: reads are list/watch (and the
    Secret, ConfigMap and Lease gets of self mode, the get of its own ClusterRole), writes only its Secret, Leases, PolicyReports and
    the patch of its own two webhook configurations; no wildcard anywhere."""
    cp = control_plane

    def can_list(who: str) -> dict[str, set[str]]:
        out = cp.kubectl(
            "admin",
            "auth",
            "can-i",
            "--list",
            "--as",
            who,
            "--as-group",
            "system:serviceaccounts",
            "--as-group",
            f"system:serviceaccounts:{NAMESPACE}",
            "--as-group",
            "system:authenticated",
            "-n",
            NAMESPACE,
        ).stdout
        grants: dict[str, set[str]] = {}
        for line in out.splitlines()[1:]:
            cols = line.split()
            if not cols or cols[0].startswith("/") or line.startswith(" "):
                continue  # non-resource URLs (discovery)
            groups = re.findall(r"\[([^\]]*)\]", line)  # [non-resource URLs] [resource names] [verbs]
            grants.setdefault(cols[0], set()).update(groups[-1].split())
        return grants

    # what every ServiceAccount gets from the default roles is not the chart's doing
    baseline = can_list(f"system:serviceaccount:{NAMESPACE}:no-such-account")
    grants = {r: v - baseline.get(r, set()) for r, v in can_list(f"system:serviceaccount:{NAMESPACE}:{FULLNAME}").items()}
    grants = {r: v for r, v in grants.items() if v}
    assert all("*" not in r and "*" not in v for r, v in grants.items()), grants
    allowed_writes = {
        "events": {"create"},  # the Event of an RBAC violation a watch event shows
        "secrets": {"get", "create", "update"},
        "configmaps": {"get"},  # self mode: its own ConfigMap's webhooks.json (docs/threat-model.md, path 5)
        "leases.coordination.k8s.io": {"get", "list", "create", "update", "delete"},
        "validatingwebhookconfigurations.admissionregistration.k8s.io": {"get", "patch"},
        "mutatingwebhookconfigurations.admissionregistration.k8s.io": {"get", "patch"},
        # its own reports in both report APIs (config.audit.reportFormat; the other's are deleted)
        "policyreports.wgpolicyk8s.io": {"get", "list", "create", "update", "delete"},
        "clusterpolicyreports.wgpolicyk8s.io": {"get", "list", "create", "update", "delete"},
        "reports.openreports.io": {"get", "list", "create", "update", "delete"},
        "clusterreports.openreports.io": {"get", "list", "create", "update", "delete"},
        "apiservices.apiregistration.k8s.io": {"get"},  # readiness: the groups it reads are served locally
        # its own ClusterRole by name: the uid its reports name as their owner (garbage collection)
        "clusterroles.rbac.authorization.k8s.io": {"get"},
    }
    for resource, verbs in grants.items():
        extra = verbs - {"list", "watch"} - allowed_writes.get(resource, set())
        assert not extra, f"{resource}: {sorted(extra)}"
    for needed in (
        "clusterroles.rbac.authorization.k8s.io",
        "clusterrolebindings.rbac.authorization.k8s.io",
        "roles.rbac.authorization.k8s.io",
        "rolebindings.rbac.authorization.k8s.io",
        "daemonsets.apps",
        "pods",
        "resourceclaims.resource.k8s.io",
        "resourceslices.resource.k8s.io",
    ):
        assert {"list", "watch"} <= grants.get(needed, set()), needed


def test_rendered_container_args_and_config_start_the_real_server(control_plane, installed, tmp_path):
    """The Deployment's args and ConfigMap (files mode) start the real `dra-guard serve`: with the
    chart's paths moved under tmp_path, the chart's ClusterRole (bound to User dra-guard) and a
    certificate from `dra-guard certs generate`, it becomes ready (caches synced)."""
    cp = control_plane
    objs = helm.template(values={**CASES["certs-files"], "config": {"server": {"port": 8443}}}, namespace=NAMESPACE)
    dep = next(o for o in objs if o["kind"] == "Deployment")
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "certs",
            "generate",
            "--service",
            FULLNAME,
            "--namespace",
            NAMESPACE,
            "--out",
            str(tmp_path / "tls"),
            "--ip",
            "127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    args = [
        a.replace("/etc/dra-guard/config.yaml", str(tmp_path / "config.yaml")).replace(
            "/etc/dra-guard/tls", str(tmp_path / "tls")
        )
        for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    ]
    assert args[0] == "serve"
    from tests.serve import free_port

    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--kubeconfig",
            str(cp.kubeconfig("dra-guard")),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "POD_NAMESPACE": NAMESPACE, "POD_NAME": "dra-guard-test-0"},
    )
    try:
        import requests

        session = requests.Session()
        session.trust_env = False
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                if (
                    session.get(
                        f"https://127.0.0.1:{port}/readyz", verify=str(tmp_path / "tls" / "ca.crt"), timeout=2
                    ).status_code
                    == 200
                ):
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-4000:]
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_helm_test_script_with_the_test_hook_identity(control_plane, installed, tmp_path):
    """`dra-guard hook test`, run as the test hook's ServiceAccount with the hook's RBAC, passes only
    when dra-guard refuses the dry run (enforce), or warns (warn)."""
    cp = control_plane
    hooks = helm.template(
        values=installed["values"], release=RELEASE, namespace=NAMESPACE, show_only=["templates/tests/test-webhook.yaml"]
    )
    pod = next(o for o in hooks if o["kind"] == "Pod")
    rbac = [o for o in hooks if o["kind"] != "Pod"]
    cp.kubectl("admin", "apply", "-f", "-", input=as_list(rbac))
    guard = installed["guard"]
    try:
        kubeconfig = kubeconfig_for_service_account(cp, tmp_path, NAMESPACE, pod["spec"]["serviceAccountName"])
        env = pod_env(pod)
        assert env["RBAC_MODE"] == "enforce"
        out = run_hook(pod["spec"]["containers"][0], kubeconfig, env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "PASS: dra-guard refused the binding" in out.stdout
        # nothing was stored: it was a dry run
        assert not cp.kubectl(
            "admin", "get", "clusterrolebinding", env["BINDING_NAME"], "--ignore-not-found", "-o", "name"
        ).stdout.strip()

        guard.start(mode="warn")
        guard.wait_called()
        out = run_hook(pod["spec"]["containers"][0], kubeconfig, env)
        assert out.returncode == 1 and "FAIL: expected dra-guard to refuse" in out.stdout, out.stdout + out.stderr
        out = run_hook(pod["spec"]["containers"][0], kubeconfig, {**env, "RBAC_MODE": "warn"})
        assert out.returncode == 0 and "PASS: dra-guard allowed the binding with a warning" in out.stdout, out.stdout

        guard.stop_server()  # dra-guard down, failurePolicy Fail: the test must say so
        out = run_hook(pod["spec"]["containers"][0], kubeconfig, {**env, "RBAC_MODE": "audit"})
        assert out.returncode == 1 and "FAIL: the apiserver could not reach dra-guard" in out.stdout, out.stdout
    finally:
        if guard.proc is None or guard.mode != "enforce":
            guard.start(mode="enforce")
        cp.kubectl("admin", "delete", "--wait=false", "-f", "-", input=as_list(rbac), check=False)


def test_pre_delete_script_with_the_hook_identity_then_uninstall(control_plane, installed, tmp_path):
    """`dra-guard hook pre-delete`, as the pre-delete ServiceAccount (installed with the release), deletes
    exactly the release's two webhook configurations; then `helm uninstall` removes the rest."""
    cp = control_plane
    job = next(
        o
        for o in helm.template(
            values=installed["values"], release=RELEASE, namespace=NAMESPACE, show_only=["templates/pre-delete.yaml"]
        )
        if o["kind"] == "Job"
    )
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    who = f"system:serviceaccount:{NAMESPACE}:{account}"
    can = cp.kubectl("admin", "auth", "can-i", "delete", "validatingwebhookconfigurations/other", "--as", who, check=False)
    assert can.stdout.strip() == "no"
    kubeconfig = kubeconfig_for_service_account(cp, tmp_path, NAMESPACE, account)
    env = pod_env({"spec": job["spec"]["template"]["spec"]})
    assert env["WEBHOOK_CONFIGURATION"] == FULLNAME
    out = run_hook(job["spec"]["template"]["spec"]["containers"][0], kubeconfig, env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"deleted validatingwebhookconfiguration {FULLNAME}" in out.stdout
    assert f"deleted mutatingwebhookconfiguration {FULLNAME}" in out.stdout
    assert not cp.kubectl(
        "admin",
        "get",
        "validatingwebhookconfiguration,mutatingwebhookconfiguration",
        FULLNAME,
        "--ignore-not-found",
        "-o",
        "name",
    ).stdout.strip()
    again = run_hook(job["spec"]["template"]["spec"]["containers"][0], kubeconfig, env)
    assert again.returncode == 0 and "already absent" in again.stdout

    # no kubelet would run the Job, so the hook is skipped here; its work was done above
    out = helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks", env=cp.env("admin"), check=False)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 30
    while cp.kubectl("admin", "get", "clusterrole", FULLNAME, "--ignore-not-found", "-o", "name").stdout.strip():
        assert time.monotonic() < deadline, "the release's ClusterRole was not removed"
        time.sleep(0.5)
    assert not cp.kubectl("admin", "get", "deployment", "-n", NAMESPACE, "-o", "name").stdout.strip()
