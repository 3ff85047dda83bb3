"""`dra-guard audit --cluster` and the periodic in-server audit on the real control plane."""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import re
import signal
import subprocess
import time

import pytest

from tests.builders import binding, cluster_role, rule, subject
from tests.e2e import objects
from tests.e2e.kube import apply_objects, dra_guard, wait_for
from tests.scrape import metric, scrape
from tests.serve import DraGuardProcess
from webhook.serve.periodic import LEASE_POLL_SECONDS

BAD_BINDING = json.dumps(
    {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "e2e-audit-dc-writer"},
                "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create", "update"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "e2e-audit-devs"},
                "subjects": [{"kind": "Group", "name": "devs", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "ClusterRole", "name": "e2e-audit-dc-writer", "apiGroup": "rbac.authorization.k8s.io"},
            },
        ],
    }
)


def kcm_pod(name, qps, burst):
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "kube-system", "labels": {"component": "kube-controller-manager"}},
            "spec": {
                "nodeName": "no-such-node",
                "containers": [
                    {
                        "name": "kube-controller-manager",
                        "image": "registry.k8s.io/kube-controller-manager:v1.37.2",
                        "command": ["kube-controller-manager", f"--kube-api-qps={qps}", f"--kube-api-burst={burst}"],
                    }
                ],
            },
        }
    )


def run_audit(cp, *args: str) -> subprocess.CompletedProcess[str]:
    """`dra-guard audit --cluster ARGS` as admin (text output captured)."""
    return dra_guard(cp, "audit", "--cluster", *args)


def audit_cluster(cp, *args, installed_config=False):
    """`dra-guard audit --cluster -o json` as admin: (exit code, its AuditResult's findings). Without
    installed_config the built-in defaults are used (other tests may install releases)."""
    extra = [] if installed_config else ["--no-installed-config"]
    out = run_audit(cp, "--output", "json", *extra, *args)
    assert out.returncode in (0, 1), out.stderr
    result = json.loads(out.stdout)
    assert result["kind"] == "AuditResult" and result["summary"]["findings"] == len(result["findings"]), result["summary"]
    return out.returncode, result["findings"]


def test_existing_binding_is_reported_until_removed(control_plane):
    cp = control_plane
    cp.kubectl("admin", "apply", "-f", "-", input=BAD_BINDING)
    try:
        code, findings = audit_cluster(cp)
        ours = [f for f in findings if f["name"] == "e2e-audit-devs"]
        assert code == 1 and ours and "Group devs" in ours[0]["message"] and "deviceclasses" in ours[0]["message"]
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=BAD_BINDING)
    code, findings = audit_cluster(cp)
    assert not [f for f in findings if f["name"] == "e2e-audit-devs"]
    # other tests of the session leave grants of their own (the test servers' RoleBindings): exit 1
    # exactly when some finding is one enforce mode would refuse
    assert code == (1 if any(f["enforced"] for f in findings) else 0), findings


@pytest.mark.parametrize("qps, burst, reported", [(20, 30, True), (100, 200, False)])
def test_controller_manager_qps_floor(control_plane, qps, burst, reported):
    cp = control_plane
    name = f"kube-controller-manager-e2e-{qps}"
    cp.kubectl("admin", "apply", "-f", "-", input=kcm_pod(name, qps, burst))
    try:
        _, findings = audit_cluster(cp)
        checks = {(f["check"], f["name"]) for f in findings if f["policy"] == "controlplane"}
        assert (("controller-manager-qps", name) in checks) is reported
        assert ("controller-manager-qps-unknown", "kube-controller-manager") not in checks  # it is visible now
        if reported:
            msg = next(f["message"] for f in findings if f["name"] == name)
            assert "--kube-api-qps=75" in msg and "--kube-api-burst=150" in msg
    finally:
        cp.kubectl("admin", "delete", "pod", "-n", "kube-system", name, "--grace-period=0", "--force", check=False)


def test_policyreport_output_is_accepted_by_the_apiserver(report_crds_established):
    cp = report_crds_established  # the chart's report CRDs, Established
    cp.kubectl("admin", "apply", "-f", "-", input=BAD_BINDING)
    try:
        out = dra_guard(cp, "audit", "--cluster", "--output", "policyreport")
        assert out.returncode == 1 and "ClusterPolicyReport" in out.stdout
        assert cp.kubectl("admin", "apply", "--dry-run=server", "-f", "-", input=out.stdout).returncode == 0
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=BAD_BINDING)


def test_periodic_audit_writes_and_updates_the_cluster_policy_report(report_crds_established, tmp_path):
    cp = report_crds_established  # the chart's report CRDs, Established
    cp.kubectl("admin", "create", "namespace", "dra-guard-audit", check=False)
    cp.kubectl("admin", "apply", "-f", "-", input=BAD_BINDING)
    config = "audit:\n  intervalSeconds: 2\ncertificates:\n  namespace: dra-guard-audit\n"
    # the periodic audit lists widely and writes reports and its Lease: run it as admin here; the
    # chart grants its ServiceAccount exactly these permissions (tests/chart checks them)
    proc = DraGuardProcess(tmp_path, "--kubeconfig", str(cp.kubeconfig("admin")), config=config)
    try:
        proc.wait("/readyz", timeout=60)

        def report():
            out = cp.kubectl("admin", "get", "clusterpolicyreport", "dra-guard", "-o", "json", check=False)
            return json.loads(out.stdout) if out.returncode == 0 else None

        def has_finding():
            r = report()
            return r and any(res.get("resources", [{}])[0].get("name") == "e2e-audit-devs" for res in r["results"])

        deadline = time.monotonic() + 30
        while not has_finding():
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.5)
        # the report is written by the audit's own process; the worker sets the gauge from that
        # process's summary once it has exited, a moment later: wait for the gauge itself
        wait_for(
            "the dra_guard_violations gauge",
            lambda: 'dra_guard_violations{mode="enforce",policy="rbac"}' in proc.session().get(proc.url + "/metrics").text,
            timeout=10,
        )

        cp.kubectl("admin", "delete", "-f", "-", input=BAD_BINDING)
        deadline = time.monotonic() + 30
        while has_finding():
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.5)
        reports = json.loads(cp.kubectl("admin", "get", "clusterpolicyreports", "-o", "json").stdout)["items"]
        assert [r["metadata"]["name"] for r in reports] == ["dra-guard"]  # replaced, never piled up
        # the audits (at least two: the finding came and went) ran in processes of their own, which
        # have exited: the serving worker made no RBAC list beyond its informers' (an audit
        # in the worker would hold its GIL for seconds at the envelope, and its memory every interval)
        text = scrape(proc)
        for resource in ("clusterroles", "clusterrolebindings"):
            assert metric(text, "dra_guard_kube_api_requests_total", resource=resource, verb="list") <= 2, resource

        def audits_done() -> list[dict]:
            lines = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
            done = [line for line in lines if line.get("msg") == "periodic audit done"]
            return done if len(done) >= 2 else []

        audits = wait_for("two periodic audits done", audits_done, timeout=10)
        text = scrape(proc)
        workers = {int(m) for m in re.findall(r"Booting worker with pid: (\d+)", proc.log())}
        assert len(audits) >= 2 and workers, proc.log()
        pids = {a["auditPid"] for a in audits}
        assert len(pids) == len(audits) and not pids & (workers | {proc.proc.pid})
        assert not any(pathlib.Path(f"/proc/{pid}").exists() for pid in pids)
        # what an operator alerts on: the audit process's memory counts in the container's limit
        assert 20 * 2**20 < metric(text, "dra_guard_audit_process_peak_rss_bytes") < 2**30
        assert re.search(r"^dra_guard_audit_last_duration_seconds [0-9.]+(e[-+]?\d+)?$", text, re.M)
        deadline = time.monotonic() + 10
        while 'dra_guard_violations{mode="enforce",policy="rbac"}' in proc.session().get(proc.url + "/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        proc.stop()
        cp.kubectl("admin", "delete", "-f", "-", input=BAD_BINDING, check=False)


def test_after_an_upgrade_the_report_follows_the_new_configuration_without_waiting_out_the_lease(
    report_crds_established, tmp_path
):
    """The holder of the audit Lease (the old configuration: group devs may not write
    DeviceClasses) gives it up when it drains; the replica of the new configuration (devs is an
    admin), which asks for the Lease every LEASE_POLL_SECONDS, audits at once: the report drops the
    finding within the poll plus one audit, not after the old Lease's 1.5 intervals + 30 s (930 s)."""
    cp = report_crds_established
    ns = "dra-guard-upgrade"
    cp.kubectl("admin", "create", "namespace", ns, check=False)
    cp.kubectl("admin", "apply", "-f", "-", input=BAD_BINDING)
    common = f"audit:\n  intervalSeconds: 600\ncertificates:\n  namespace: {ns}\nserver:\n  shutdownDelaySeconds: 0\n"
    old = DraGuardProcess(tmp_path / "old", "--kubeconfig", str(cp.kubeconfig("admin")), config=common)
    new = None

    def devs_reported():
        out = cp.kubectl("admin", "get", "clusterpolicyreport", "dra-guard", "-o", "json", check=False)
        report = json.loads(out.stdout) if out.returncode == 0 else {"results": []}
        return any(
            res.get("resources", [{}])[0].get("name") == "e2e-audit-devs" and res.get("result") != "pass"
            for res in report["results"]
        )

    try:
        old.wait("/readyz", timeout=60)
        wait_for("the old configuration's report (devs reported)", devs_reported, timeout=60)
        new = DraGuardProcess(
            tmp_path / "new",
            "--kubeconfig",
            str(cp.kubeconfig("admin")),
            config=common + "rbac:\n  adminSubjects:\n    groups: [system:masters, devs]\n",
        )
        new.wait("/readyz", timeout=60)
        time.sleep(LEASE_POLL_SECONDS + 2)  # the new replica asked and was refused: the old one holds it
        assert devs_reported(), new.log()
        old.stop(signal.SIGTERM)  # a rolling update ends the old pod
        assert "periodic audit lease given up" in old.log(), old.log()
        try:
            wait_for(
                "the new configuration's report (devs not reported)",
                lambda: not devs_reported(),
                timeout=LEASE_POLL_SECONDS + 60,  # the poll, then one audit
            )
        except TimeoutError as exc:
            report = cp.kubectl("admin", "get", "clusterpolicyreport", "dra-guard", "-o", "json", check=False).stdout
            raise AssertionError(f"{exc}:\n{report[-3000:]}\n{new.log()}") from None
    finally:
        old.stop()
        if new is not None:
            new.stop()
        cp.kubectl("admin", "delete", "-f", "-", input=BAD_BINDING, check=False)
        cp.kubectl("admin", "delete", "clusterpolicyreport", "dra-guard", check=False)


RBAC = "/apis/rbac.authorization.k8s.io/v1"


def create_scale_objects(cp, count: int) -> None:
    """Create `count` ClusterRoles and as many ClusterRoleBindings (label e2e=scale), 8 requests at a
    time through the API (kubectl create sends them one by one). Raises
    AssertionError naming the first object the apiserver refused."""
    session = cp.session("admin")

    def create(i: int) -> None:
        name = f"e2e-scale-{i}"
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"e2e": "scale"}},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"e2e": "scale"}},
            "subjects": [{"kind": "Group", "name": f"g{i}", "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "ClusterRole", "name": name, "apiGroup": "rbac.authorization.k8s.io"},
        }
        for plural, body in (("clusterroles", role), ("clusterrolebindings", binding)):
            r = session.post(f"{cp.url}{RBAC}/{plural}", json=body, timeout=30)
            assert r.status_code == 201, f"creating {plural}/{name}: HTTP {r.status_code} {r.text[:300]}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, range(count)))


def test_audit_of_5000_rbac_objects_reads_them_in_pages(control_plane):
    """How fast it is belongs to bench/ (python -m bench.scale, a ratio to the floor of the same
    run); here: the requests it makes are bounded by pages, not by objects."""
    cp = control_plane
    create_scale_objects(cp, 2500)
    try:
        before = {e["auditID"] for e in cp.audit_events("admin", stage=None)}
        code, _ = audit_cluster(cp, "--qps", "50", "--burst", "100")
        time.sleep(0.5)
        lists = [e for e in cp.audit_events("admin", stage=None) if e["auditID"] not in before and e["verb"] == "list"]
        # paged by 500: about 6 pages each of ClusterRoles and ClusterRoleBindings plus one or two for
        # every other resource; nothing per object
        assert len({e["auditID"] for e in lists}) <= 30, len(lists)
    finally:
        # one deletecollection request per resource (kubectl delete -l sends one DELETE per object)
        session = cp.session("admin")
        for plural in ("clusterrolebindings", "clusterroles"):
            session.delete(f"{cp.url}{RBAC}/{plural}", params={"labelSelector": "e2e=scale"}, timeout=120)


def test_the_installed_release_configuration_is_used_by_default(control_plane, tmp_path):
    """`audit --cluster` judges with the installed release's configuration (its
    ConfigMap, as the chart labels it) and says which one it used."""
    cp = control_plane
    ns = "e2e-installed-config"
    cp.kubectl("admin", "create", "namespace", ns, check=False)
    config = (
        "apiVersion: dra-guard.io/v1alpha1\nkind: DraGuardConfiguration\nmode: audit\n"
        "rbac:\n  adminSubjects:\n    groups: [system:masters, devs]\n"
    )
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dra-guard",
            "namespace": ns,
            "labels": {"app.kubernetes.io/name": "dra-guard", "app.kubernetes.io/managed-by": "Helm"},
        },
        "data": {"config.yaml": config},
    }
    apply_objects(cp, cm)
    cp.kubectl("admin", "apply", "-f", "-", input=BAD_BINDING)
    try:
        out = run_audit(cp, "-o", "json", "--release-namespace", ns)
        assert f"config: ConfigMap {ns}/dra-guard (the installed release)" in out.stderr
        findings = json.loads(out.stdout)["findings"]
        # group devs is an admin in the installed configuration: its binding is no finding
        assert not [f for f in findings if f["name"] == "e2e-audit-devs"], findings
        # the built-in defaults would report it
        _, defaults = audit_cluster(cp)
        assert [f for f in defaults if f["name"] == "e2e-audit-devs"]
        # a mistyped --release-namespace is one line and exit 2 naming where the release is, never
        # the built-in defaults' other verdicts
        typo = run_audit(cp, "--release-namespace", ns + "-typo")
        assert typo.returncode == 2 and not typo.stdout, typo
        assert f"no dra-guard release in namespace '{ns}-typo' (--release-namespace); one is installed in {ns}" in typo.stderr
        assert "Traceback" not in typo.stderr
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=BAD_BINDING)
        cp.kubectl("admin", "delete", "namespace", ns, "--wait=false")


def test_scope_files_judges_only_what_the_files_change(control_plane, tmp_path):
    """A pull-request check against the cluster fails for what the change adds, not for
    what the cluster already holds."""
    cp = control_plane
    cp.kubectl("admin", "apply", "-f", "-", input=BAD_BINDING)  # already in the cluster: not the PR's fault
    harmless = tmp_path / "harmless.yaml"
    harmless.write_text(
        json.dumps(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "e2e-pr-view"},
                "subjects": [{"kind": "Group", "name": "pr-team", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "ClusterRole", "name": "view", "apiGroup": "rbac.authorization.k8s.io"},
            }
        )
    )
    adds = tmp_path / "adds.yaml"
    adds.write_text(
        json.dumps(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "e2e-pr-writer"},
                "subjects": [{"kind": "Group", "name": "pr-team", "apiGroup": "rbac.authorization.k8s.io"}],
                "roleRef": {"kind": "ClusterRole", "name": "e2e-audit-dc-writer", "apiGroup": "rbac.authorization.k8s.io"},
            }
        )
    )
    try:
        code, findings = audit_cluster(cp, "-f", str(harmless))
        assert code == 1 and [f for f in findings if f["name"] == "e2e-audit-devs"]  # scope all: everything
        code, findings = audit_cluster(cp, "--scope", "files", "-f", str(harmless))
        assert code == 0 and not [f for f in findings if f.get("enforced")], findings
        code, findings = audit_cluster(cp, "--scope", "files", "-f", str(adds))
        assert code == 1 and [f["name"] for f in findings if f["enforced"]] == ["e2e-pr-writer"]
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=BAD_BINDING)


def test_report_crds_show_the_summary_columns(report_crds_established):
    cp = report_crds_established  # the chart's report CRDs, Established
    report = {
        "apiVersion": "wgpolicyk8s.io/v1alpha2",
        "kind": "ClusterPolicyReport",
        "metadata": {"name": "e2e-columns"},
        "summary": {"pass": 3, "fail": 1, "warn": 2, "error": 0, "skip": 0},
        "results": [],
    }
    apply_objects(cp, report)
    try:
        out = cp.kubectl("admin", "get", "clusterpolicyreport", "e2e-columns").stdout.split("\n")
        assert out[0].split()[:6] == ["NAME", "PASS", "FAIL", "WARN", "ERROR", "SKIP"]
        assert out[1].split()[:6] == ["e2e-columns", "3", "1", "2", "0", "0"]
    finally:
        cp.kubectl("admin", "delete", "clusterpolicyreport", "e2e-columns")


ALICE = [subject("User", "alice")]
ESCALATIONS = objects.manifests(
    # path 1: impersonation of admins
    cluster_role("e2e-audit-imp", [rule(["groups"], ["impersonate"], [""], resourceNames=["system:masters"])]),
    binding("e2e-audit-imp", "e2e-audit-imp", ALICE),
    # path 2: edit in kube-system
    binding("e2e-audit-edit", "edit", ALICE, kind="RoleBinding", namespace="kube-system"),
    # path 5: write on webhook configurations
    cluster_role(
        "e2e-audit-vwc",
        [rule(["validatingwebhookconfigurations"], ["update", "patch"], ["admissionregistration.k8s.io"])],
    ),
    binding("e2e-audit-vwc", "e2e-audit-vwc", ALICE),
)


def test_escalation_paths_1_2_5_are_reported(control_plane):
    """`dra-guard audit --cluster` reported none of paths 1, 2 and 5; stored here with no
    webhook registered, each is a finding naming the subject and the power."""
    cp = control_plane
    cp.kubectl("admin", "apply", "-f", "-", input=ESCALATIONS)
    try:
        code, findings = audit_cluster(cp)
        ours = {(f["kind"], f["namespace"], f["name"]): f["message"] for f in findings if f["policy"] == "rbac"}
        # a wide role's message names the first powers and a count; details name every one
        powers = {(f["kind"], f["namespace"], f["name"]): f["details"]["resources"] for f in findings if f["policy"] == "rbac"}
        assert code == 1
        assert "impersonate:groups" in ours["ClusterRoleBinding", "", "e2e-audit-imp"]
        assert "pods" in powers["RoleBinding", "kube-system", "e2e-audit-edit"]
        assert "User alice" in ours["RoleBinding", "kube-system", "e2e-audit-edit"]
        assert "validatingwebhookconfigurations" in ours["ClusterRoleBinding", "", "e2e-audit-vwc"]
        out = dra_guard(cp, "audit", "--cluster", "--output", "policyreport")
        assert "e2e-audit-edit" in out.stdout and "e2e-audit-imp" in out.stdout
    finally:
        cp.kubectl("admin", "delete", "-f", "-", input=ESCALATIONS, check=False)


def test_suggest_values_from_the_live_cluster_clear_its_driver_findings(control_plane, tmp_path):
    """`audit --cluster --suggest-values` on the real apiserver: a driver installed as its chart does
    (ServiceAccount with ResourceSlice write through a ClusterRoleBinding, a kubelet plugin
    DaemonSet) is an `rbac-write` and an `undeclared-driver` finding; the printed values, merged
    into the config, clear exactly those two."""
    import yaml

    cp = control_plane
    ns, name = "e2e-suggest", "vendor-driver"
    objs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "e2e-suggest-slices"},
            "rules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "e2e-suggest-slices"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            "roleRef": {"kind": "ClusterRole", "name": "e2e-suggest-slices", "apiGroup": "rbac.authorization.k8s.io"},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "serviceAccountName": name,
                        "nodeSelector": {"e2e-suggest": "no-node-has-this"},
                        "containers": [
                            {
                                "name": "plugin",
                                "image": "registry.example/vendor-driver:v1",
                                "volumeMounts": [
                                    {"name": "plugins", "mountPath": "/var/lib/kubelet/plugins"},
                                    {"name": "registry", "mountPath": "/var/lib/kubelet/plugins_registry"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "plugins", "hostPath": {"path": "/var/lib/kubelet/plugins"}},
                            {"name": "registry", "hostPath": {"path": "/var/lib/kubelet/plugins_registry"}},
                        ],
                    },
                },
            },
        },
    ]
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    cp.kubectl("admin", "apply", "-f", "-", input=document)
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")

    def ours(findings):
        return sorted(
            (f["check"], f["name"])
            for f in findings
            if (f["check"] == "rbac-write" and f["name"] == "e2e-suggest-slices")
            or (f["check"] == "undeclared-driver" and f["name"] == name)
        )

    try:
        _, before = audit_cluster(cp, "--config", str(config))
        assert ours(before) == [("rbac-write", "e2e-suggest-slices"), ("undeclared-driver", name)], before
        out = dra_guard(cp, "audit", "--cluster", "--config", str(config), "--suggest-values")
        assert out.returncode == 1, out.stderr  # the findings still stand until the values are used
        values = yaml.safe_load(out.stdout)["config"]
        assert f"{ns}:{name}" in values["rbac"]["extraDriverSubjects"]["serviceAccounts"], out.stdout
        assert {"namespace": ns, "name": name} in values["drivers"]["declared"], out.stdout
        config.write_text(yaml.safe_dump(values))
        _, after = audit_cluster(cp, "--config", str(config))
        assert ours(after) == [], [f for f in after if f["name"] in ("e2e-suggest-slices", name)]
    finally:
        cp.kubectl("admin", "delete", "-f", "-", "--wait=false", input=document, check=False)


def test_declared_drivers_the_webhooks_cannot_keep_on_their_nodes_are_reported(control_plane, tmp_path):
    """`audit --cluster` reports what admission cannot close: a stale drivers.declared entry (the
    release renamed, its DaemonSet under a new name) guards nothing; a declared driver that
    scheduler preemption or a NoExecute taint can remove; a non-admin who may write pods/status
    (mark a running consumer finished) or nodes (taint them)."""
    cp = control_plane
    ns = "e2e-declared"
    cp.kubectl("admin", "create", "namespace", ns, check=False)
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "renamed-driver", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": "renamed-driver"}},
            "template": {
                "metadata": {"labels": {"app": "renamed-driver"}},
                "spec": {
                    "nodeSelector": {"e2e": "no-such-node"},
                    "containers": [{"name": "c", "image": "registry.example/d:v1"}],
                },
            },
        },
    }
    apply_objects(cp, ds)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"drivers:\n  declared: [{{namespace: {ns}, name: old-driver}}, {{namespace: {ns}, name: renamed-driver}}]\n"
    )
    writer = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "e2e-status-writer"},
            "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "e2e-status-writer"},
            "subjects": [{"kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "ClusterRole", "name": "e2e-status-writer", "apiGroup": "rbac.authorization.k8s.io"},
        },
    ]
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": writer})
    cp.kubectl("admin", "apply", "-f", "-", input=document)
    try:
        _, findings = audit_cluster(cp, "--config", str(config))
        ours = sorted((f["check"], f["name"]) for f in findings if f.get("namespace") == ns)
        assert ours == [
            ("declared-driver-missing", "old-driver"),
            ("driver-preemptible", "renamed-driver"),
            ("driver-taint-evictable", "renamed-driver"),
        ], ours
        writers = [f["name"] for f in findings if f["check"] == "status-writer"]
        # the bootstrap RBAC's own writers (controllers, scheduler, nodes) are the control plane
        assert writers == ["e2e-status-writer"], writers
        # the periodic audit counts them for the alert DraGuardDriverDoorsOpen
        cp.kubectl("admin", "create", "namespace", "dra-guard-doors", check=False)
        config.write_text(
            config.read_text()
            + "audit:\n  intervalSeconds: 600\n  policyReports: false\ncertificates:\n  namespace: dra-guard-doors\n"
        )
        proc = DraGuardProcess(tmp_path / "serve", "--kubeconfig", str(cp.kubeconfig("admin")), "--config", str(config))
        try:
            proc.wait("/readyz", timeout=60)
            expected = {"declared-driver-missing": 1.0, "driver-preemptible": 1.0, "driver-taint-evictable": 1.0}

            def doors() -> dict[str, float] | None:
                text = scrape(proc)
                seen = {c: metric(text, "dra_guard_driver_doors_open", check=c, default=-1.0) for c in expected}
                return seen if seen == expected else None

            wait_for("dra_guard_driver_doors_open from the periodic audit", doors, timeout=60)
            assert metric(scrape(proc), "dra_guard_driver_doors_open", check="status-writer") >= 1
        finally:
            proc.stop()
    finally:
        cp.kubectl("admin", "delete", "-f", "-", "--wait=false", input=document, check=False)
        cp.kubectl("admin", "delete", "namespace", ns, "--wait=false", check=False)
