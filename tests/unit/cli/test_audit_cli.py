"""`dra-guard audit` over manifest files: findings, output formats, exit codes, input errors."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from webhook.cli import main

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_examples_non_compliant_findings_and_exit_1(capsys):
    code, out, _ = run_cli(capsys, "audit", "-f", str(EXAMPLES))
    assert code == 1
    for name in ("team-gpu", "ci-deployer-everything", "team-b-edit"):
        assert name in out
    # the compliant examples (and the configured driver ServiceAccount) produce nothing
    for name in ("team-a-dra-users", "dra-example-driver-role-binding", "platform-admins-device-classes"):
        assert name not in out


def test_compliant_examples_exit_0(capsys):
    """The folder is self-contained: its configuration (the driver's ServiceAccount, the declared
    driver) is among its own manifests."""
    code, out, err = run_cli(capsys, "audit", "-f", str(EXAMPLES / "compliant"))
    assert code == 0 and "No findings" in out
    assert "config: the DraGuardConfiguration among the manifests" in err


def test_json_output_shape(capsys):
    code, out, _ = run_cli(capsys, "audit", "-f", str(EXAMPLES), "--output", "json")
    result = json.loads(out)
    assert code == 1
    assert (result["apiVersion"], result["kind"]) == ("dra-guard.io/v1alpha1", "AuditResult")
    findings = result["findings"]
    assert sorted((f["policy"], f["name"]) for f in findings) == [
        ("eviction", "gpu-example-driver"),
        ("probes", "gpu-example-driver"),
        ("rbac", "ci-deployer-everything"),
        ("rbac", "team-b-edit"),
        ("rbac", "team-gpu"),
    ]
    for f in findings:
        assert {"policy", "kind", "namespace", "name", "message", "mode", "check"} <= f.keys()


def test_list_kind_and_json_files(tmp_path, capsys):
    items = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "w"},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "b"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "w"},
            "subjects": [{"kind": "User", "name": "eve"}],
        },
    ]
    (tmp_path / "list.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    code, out, _ = run_cli(capsys, "audit", "-f", str(tmp_path / "list.json"))
    assert code == 1 and "User eve" in out


def test_config_flag_overrides_found_config(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("rbac:\n  adminSubjects:\n    groups: [team-a, team-b]\n    serviceAccounts: ['ci:deployer']\n")
    code, out, _ = run_cli(capsys, "audit", "-f", str(EXAMPLES / "non-compliant" / "rbac.yaml"), "--config", str(cfg))
    assert code == 0, out


def test_input_errors_exit_2_and_name_the_file(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("kind: ClusterRole\nmetadata: {name: x\n")
    code, _, err = run_cli(capsys, "audit", "-f", str(path))
    assert code == 2
    assert "bad.yaml line" in err and "invalid YAML" in err


@pytest.mark.parametrize(
    "content, needle",
    [
        ("- just\n- a list\n", "not a Kubernetes object (a list)"),
        ("metadata: {name: x}\n", "no kind (not a Kubernetes object)"),
        ("foo: bar\n", "no kind (not a Kubernetes object)"),  # a values.yaml or a CI file
    ],
)
def test_documents_that_are_not_objects_are_skipped_with_a_note(tmp_path, capsys, content, needle):
    path = tmp_path / "other.yaml"
    path.write_text(content)
    code, out, err = run_cli(capsys, "audit", "-f", str(path))
    assert code == 2, err  # and no object was there to judge
    assert f"note: {path} document 1: skipped: {needle}" in err


def test_usage_errors_exit_2(tmp_path, capsys):
    assert run_cli(capsys, "audit")[0] == 2
    assert run_cli(capsys, "audit", "-f", str(tmp_path / "missing"))[0] == 2
    (tmp_path / "c.yaml").write_text("mode: nope\n")
    code, _, err = run_cli(capsys, "audit", "-f", str(EXAMPLES), "--config", str(tmp_path / "c.yaml"))
    assert code == 2 and "mode" in err


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "webhook.cli", "audit", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--output" in out.stdout and "exit" in out.stdout.lower()


def test_driver_daemonset_without_probe_is_reported(capsys):
    code, out, _ = run_cli(capsys, "audit", "-f", str(EXAMPLES / "non-compliant" / "driver-daemonset.yaml"))
    assert code == 1
    assert "missing-liveness-probe" in out and "gpu-example-driver" in out


def test_advisory_findings_alone_exit_0(tmp_path, capsys):
    import yaml

    ds = yaml.safe_load((EXAMPLES / "compliant" / "driver-daemonset.yaml").read_text())
    ds["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump(ds))
    code, out, _ = run_cli(
        capsys, "audit", "-f", str(tmp_path / "ds.yaml"), "-f", str(EXAMPLES / "compliant" / "dra-guard-config.yaml")
    )
    assert code == 0
    assert "seamless-upgrade" in out and "1 advisory" in out


def test_deep_yaml_and_date_names(tmp_path, capsys):
    (tmp_path / "deep.yaml").write_text("[" * 5000)
    code, _, err = run_cli(capsys, "audit", "-f", str(tmp_path / "deep.yaml"))
    assert code == 2 and "deep.yaml" in err
    import yaml

    ds = yaml.safe_load((EXAMPLES / "non-compliant" / "driver-daemonset.yaml").read_text())
    text = yaml.safe_dump(ds).replace("name: plugin", "name: 2024-01-01")
    (tmp_path / "ds.yaml").write_text(text)
    code, out, _ = run_cli(capsys, "audit", "-f", str(tmp_path / "ds.yaml"), "-o", "json")
    assert code == 1 and json.loads(out)["findings"]


def test_json_summary_counts_each_policy_by_what_enforce_mode_does(capsys):
    """The summary agrees with the findings and the exit code: refuse and patch are what exit 1 means;
    pass counts the objects a policy judged without a finding (as PolicyReports do)."""
    _, out, _ = run_cli(capsys, "audit", "-f", str(EXAMPLES), "-o", "json")
    result = json.loads(out)
    assert list(result) == ["apiVersion", "kind", "summary", "inputErrors", "findings"]
    summary = result["summary"]
    assert summary["complete"] is True and summary["inputErrors"] == 0 and result["inputErrors"] == []
    assert summary["findings"] == len(result["findings"]) == 5
    assert summary["byPolicy"] == {
        "eviction": {"refuse": 0, "patch": 0, "advisory": 1, "skip": 0, "pass": 1},
        "probes": {"refuse": 0, "patch": 1, "advisory": 0, "skip": 0, "pass": 1},
        "rbac": {"refuse": 3, "patch": 0, "advisory": 0, "skip": 0, "pass": 3},
    }
    assert summary["results"] == {"refuse": 3, "patch": 1, "advisory": 1, "skip": 0, "pass": 5}
    code, out, _ = run_cli(capsys, "audit", "-f", str(EXAMPLES / "compliant"), "-o", "json")
    clean = json.loads(out)
    assert code == 0 and clean["findings"] == [] and clean["summary"]["findings"] == 0
    assert clean["summary"]["results"]["refuse"] == clean["summary"]["results"]["patch"] == 0


def test_json_says_which_findings_a_patch_fixes(capsys):
    _, out, err = run_cli(capsys, "audit", "-f", str(EXAMPLES), "-o", "json")
    by_policy = {f["policy"]: f for f in json.loads(out)["findings"]}
    assert by_policy["probes"]["patch"] is True and by_policy["rbac"]["patch"] is False
    assert "config: the DraGuardConfiguration among the manifests" in err


def test_kubeconfig_environment_variable_is_honoured(tmp_path, monkeypatch):
    from webhook.kube import client as cluster

    kc = tmp_path / "kc"
    kc.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kc))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    client = cluster.api_client(None, timeout_seconds=1)
    assert client.configuration.host == "https://127.0.0.1:1"


def test_certs_generate_refuses_to_replace_a_ca(tmp_path, capsys):
    assert run_cli(capsys, "certs", "generate", "--service", "s", "--namespace", "n", "--out", str(tmp_path))[0] == 0
    first = (tmp_path / "ca.crt").read_bytes()
    code, _, err = run_cli(capsys, "certs", "generate", "--service", "s", "--namespace", "n", "--out", str(tmp_path))
    assert code == 2 and "--force" in err and (tmp_path / "ca.crt").read_bytes() == first
    assert run_cli(capsys, "certs", "generate", "--service", "s", "--namespace", "n", "--out", str(tmp_path), "--force")[0] == 0
    assert (tmp_path / "ca.crt").read_bytes() != first


def test_self_signed_and_self_mode_exclude_each_other(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("certificates: {mode: self}\n")
    code, _, err = run_cli(capsys, "serve", "--config", str(tmp_path / "c.yaml"), "--self-signed", str(tmp_path / "t"))
    assert code == 2 and "exclude each other" in err


# ---------------------------------------------------------------- objects judged as the apiserver stores them
def audit_stdin(capsys, monkeypatch, text, *args):
    """`dra-guard audit -f - -o sarif` over `text` (what `helm template` prints): (exit code, results by ruleId)."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code, out, err = run_cli(capsys, "audit", "-f", "-", "-o", "sarif", *args)
    results: dict[str, list[dict]] = {}
    for r in json.loads(out)["runs"][0]["results"]:
        results.setdefault(r["ruleId"], []).append(r)
    return code, results


VENDOR_CHART = """\
---
# Source: vendor-driver/templates/clusterrole.yaml
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: vendor-driver
  namespace: vendor-system
rules:
- apiGroups: [resource.k8s.io]
  resources: [deviceclasses]
  verbs: [create, update]
---
# Source: vendor-driver/templates/clusterrolebinding.yaml
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: vendor-driver
  namespace: vendor-system
subjects:
- kind: ServiceAccount
  name: vendor-driver
  namespace: vendor-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: vendor-driver
"""


def test_a_namespace_on_cluster_scoped_kinds_is_dropped_as_the_apiserver_does(capsys, monkeypatch):
    """Vendor charts set metadata.namespace on their ClusterRole and ClusterRoleBinding; the apiserver
    ignores it, so the binding's roleRef is the ClusterRole of the chart and the grant is judged."""
    code, results = audit_stdin(capsys, monkeypatch, VENDOR_CHART)
    assert code == 1 and "rbac/unresolved-roleref" not in results
    [refusal] = results["rbac/rbac-write"]
    assert refusal["level"] == "error" and "deviceclasses" in refusal["message"]["text"]
    assert refusal["locations"][0]["logicalLocations"][0]["name"] == "ClusterRoleBinding/vendor-driver"


def test_only_built_in_cluster_scoped_kinds_lose_their_namespace():
    from webhook.audit import load

    out = load.Manifests()
    load.read_text(
        "m.yaml",
        "\n---\n".join(
            [
                "{apiVersion: v1, kind: Node, metadata: {name: n, namespace: x}}",
                "{apiVersion: resource.k8s.io/v1, kind: DeviceClass, metadata: {name: d, namespace: x}}",
                "{kind: ClusterRole, metadata: {name: c, namespace: x}}",  # no apiVersion: the kind decides
                "{apiVersion: rbac.authorization.k8s.io/v1, kind: Role, metadata: {name: r, namespace: x}}",
                "{apiVersion: example.com/v1, kind: Node, metadata: {name: crd, namespace: x}}",  # a namespaced CRD
            ]
        ),
        out,
    )
    assert [load.object_key(o) for o in out.objects] == [
        ("Node", "", "n"),
        ("DeviceClass", "", "d"),
        ("ClusterRole", "", "c"),
        ("Role", "x", "r"),
        ("Node", "x", "crd"),
    ]


def _bootstrap_binding(role: str, group: str, *, namespace: str = "") -> str:
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    ns = f"\n  namespace: {namespace}" if namespace else ""
    return (
        f"---\n# Source: platform/templates/{role}.yaml\napiVersion: rbac.authorization.k8s.io/v1\nkind: {kind}\n"
        f"metadata:\n  name: {group}-{role}{ns}\nsubjects:\n- kind: Group\n  name: {group}\n"
        f"  apiGroup: rbac.authorization.k8s.io\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n"
        f"  kind: ClusterRole\n  name: {role}\n"
    )


@pytest.mark.parametrize(
    "role, namespace, via",
    [
        ("cluster-admin", "", ["cluster-admin"]),
        ("edit", "", ["edit", "system:aggregate-to-edit"]),
        ("admin", "kube-system", ["admin", "system:aggregate-to-edit"]),  # edit's members, aggregated into admin
    ],
)
def test_a_bootstrap_role_the_files_do_not_define_is_judged_by_its_defaults(capsys, monkeypatch, role, namespace, via):
    code, results = audit_stdin(capsys, monkeypatch, _bootstrap_binding(role, "platform-team", namespace=namespace))
    assert code == 1 and "rbac/unresolved-roleref" not in results
    [refusal] = results["rbac/rbac-write"]
    text = refusal["message"]["text"]
    assert refusal["level"] == "error" and "Group platform-team" in text
    assert f"{', '.join(via)} {'is' if len(via) == 1 else 'are'} not among the manifests: judged by" in text, text
    assert "Kubernetes default rules" in text


def test_the_offline_verdict_on_cluster_admin_is_the_webhooks():
    """The finding is the refusal the webhook gives when cluster-admin exists as the apiserver keeps it."""
    import yaml

    from tests.builders import review
    from webhook import audit
    from webhook.config import from_mapping
    from webhook.model import bootstrap
    from webhook.policies import rbac

    crb = yaml.safe_load(_bootstrap_binding("cluster-admin", "platform-team"))
    config = from_mapping(None)
    stored = bootstrap.stored_role("cluster-admin")
    refused = rbac.review(review(crb)["request"], index=rbac.RbacIndex.from_objects([stored]), config=config.rbac)
    [(finding, _)] = audit.run([crb], config)
    assert not refused.allowed and finding.message.startswith(refused.findings[0].message)
    assert finding.details["judgedByDefaults"] == ["cluster-admin"]


def test_view_is_known_and_an_unknown_role_stays_advisory(capsys, monkeypatch):
    code, results = audit_stdin(capsys, monkeypatch, _bootstrap_binding("view", "platform-team"))
    assert code == 0 and results == {}  # view's defaults grant no DRA write and no power
    code, results = audit_stdin(capsys, monkeypatch, _bootstrap_binding("vendor-operator", "platform-team"))
    assert code == 0 and [r["level"] for r in results["rbac/unresolved-roleref"]] == ["warning"]


def test_an_unforeseen_failure_exits_2_never_1(capsys, monkeypatch):
    """1 means "would refuse" / "must wait": a crash must not read as either."""
    from webhook.cli import commands

    def crash(args):
        raise RuntimeError("boom")

    monkeypatch.setitem(commands.COMMANDS, "drain-plan", crash)
    code, out, err = run_cli(capsys, "drain-plan", "node-a")
    assert code == 2 and out == ""
    assert "RuntimeError: boom" in err and err.rstrip().endswith("internal error (the traceback above); please report it")


@pytest.mark.parametrize("source", ["empty-stdin", "templates"])
def test_nothing_judged_is_exit_2_not_no_findings(capsys, monkeypatch, tmp_path, source):
    """An empty stdin or a folder of unrendered Helm templates judges nothing: exit 2 naming why
    (never "No findings", which reads as clean); --allow-empty makes it exit 0 with a note."""
    import io

    if source == "empty-stdin":
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        paths = ["-"]
    else:
        for i in range(5):
            (tmp_path / f"t{i}.yaml").write_text(
                "kind: ClusterRoleBinding\nmetadata:\n  name: {{ .Release.Name }}\n{{- if .x }}\n"
            )
        paths = [str(tmp_path)]
    code, out, err = run_cli(capsys, "audit", "-f", *paths)
    assert code == 2 and "No findings" not in out, (out, err)
    assert "error: nothing to judge: no Kubernetes object in the input" in err and "--allow-empty" in err
    if source == "templates":
        # five notes of one reason are one line with their count, not five
        assert err.count("a Helm template") == 1 and "5 documents skipped: a Helm template" in err, err
    if source == "empty-stdin":
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, err = run_cli(capsys, "audit", "-f", *paths, "--allow-empty")
    assert code == 0 and "note: nothing to judge" in err


def test_audit_says_how_many_objects_it_judged(capsys):
    code, _, err = run_cli(capsys, "audit", "-f", str(EXAMPLES / "compliant"))
    assert code == 0
    assert "audit: judged 9 object(s) of the files: 3 ClusterRoleBinding(s), 1 DRA driver DaemonSet(s) among them" in err
