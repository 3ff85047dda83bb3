"""`dra-guard audit` for CI and GitOps: stdin, every input problem collected, kind-less
documents and Helm templates skipped with a note, unresolved roleRefs, the sarif/junit/yaml
formats, PolicyReports with pass results, and the CLI around it (--version, completion,
--context, config validate, drain-plan help)."""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from tests.builders import binding, cluster_role, driver_daemonset, rule, subject
from webhook import audit
from webhook.audit import load
from webhook.cli import main
from webhook.config import from_mapping
from webhook.policies.registry import PAGE

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
WRITER = cluster_role("slice-writer", [rule(["resourceslices"], ["create"])])
BAD = binding("team-a-slices", "slice-writer", [subject("Group", "team-a")])


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: pathlib.Path, name: str, *docs: dict) -> pathlib.Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(list(docs)))
    return path


def test_stdin_is_read_with_dash(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump_all([WRITER, BAD])))
    code, out, err = run_cli(capsys, "audit", "-f", "-", "-o", "json")
    assert code == 1, err
    [finding] = json.loads(out)["findings"]
    assert finding["name"] == "team-a-slices" and finding["file"].startswith("<stdin>:")


def test_every_input_problem_is_reported_with_the_findings_of_what_could_be_read(tmp_path, capsys):
    good = write(tmp_path, "good.yaml", WRITER, BAD)
    (tmp_path / "broken.yaml").write_text("kind: ClusterRole\nmetadata: {name: x\n")
    (tmp_path / "unreadable.yaml").write_bytes(b"\xff\xfe not utf-8")
    code, out, err = run_cli(
        capsys,
        "audit",
        "-f",
        str(tmp_path / "broken.yaml"),
        "-f",
        str(good),
        "-f",
        str(tmp_path / "unreadable.yaml"),
        "-f",
        str(tmp_path / "missing.yaml"),
        "-o",
        "json",
    )
    assert code == 2
    result = json.loads(out)
    assert [f["name"] for f in result["findings"]] == ["team-a-slices"]  # the good file was still judged
    assert result["summary"]["complete"] is False and result["summary"]["inputErrors"] == 3 == len(result["inputErrors"])
    for needle in ("broken.yaml line", "unreadable.yaml: cannot read", "missing.yaml: no such file"):
        assert needle in err, err
    assert "3 input problem(s)" in err


def clean_reading(output: str, text: str) -> bool:
    """Whether `text` in format `output` reads as a clean audit to what parses only stdout."""
    if output == "table":
        return "Incomplete audit" not in text or "No findings" in text
    if output in ("json", "yaml"):
        return yaml.safe_load(text)["summary"]["complete"] is not False
    if output == "sarif":
        return json.loads(text)["runs"][0]["invocations"][0]["executionSuccessful"] is not False
    if output == "junit":
        suites = ET.fromstring(text)
        return suites.get("errors") in (None, "0") or any(c.get("name") == "no findings" for c in suites.iter("testcase"))
    reports = list(yaml.safe_load_all(text))
    return not any((r or {}).get("summary", {}).get("error") for r in reports)


def test_a_binary_input_is_one_line_saying_it_is_not_text(tmp_path, capsys, monkeypatch):
    """A binary file, or binary bytes on stdin (read with surrogateescape, as Python reads a
    POSIX stdin), is named as not UTF-8 text: not a codec's message, never a traceback."""
    binary = b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe\x00 not text"
    (tmp_path / "tool").write_bytes(binary)
    monkeypatch.setattr(sys, "stdin", io.StringIO(binary.decode("utf-8", "surrogateescape")))
    code, _, err = run_cli(capsys, "audit", "-f", str(tmp_path / "tool"), "-f", "-")
    assert code == 2
    assert f"{tmp_path / 'tool'}: cannot read: not UTF-8 text (a binary file?)" in err, err
    assert "<stdin>: cannot read: not UTF-8 text (a binary file?)" in err, err
    assert "codec" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("output", ["table", "json", "yaml", "sarif", "junit", "policyreport", "openreports"])
def test_stdout_never_reads_clean_when_an_input_failed(tmp_path, capsys, output):
    """The error is on stderr and the exit code is 2; stdout, which CI steps and scripts often read
    alone, says the audit is incomplete in every format, with or without findings in the rest."""
    code, out, err = run_cli(capsys, "audit", "-f", str(tmp_path / "missing.yaml"), "-o", output)
    assert code == 2 and "missing.yaml: no such file" in err
    assert not clean_reading(output, out), out
    good = write(tmp_path, "good.yaml", WRITER, BAD)
    code, out, _ = run_cli(capsys, "audit", "-f", str(good), "-f", str(tmp_path / "missing.yaml"), "-o", output)
    assert code == 2 and not clean_reading(output, out), out
    code, out, _ = run_cli(capsys, "audit", "-f", str(write(tmp_path, "ok.yaml", WRITER)), "-o", output)
    assert code == 0 and clean_reading(output, out), out  # and a complete clean audit still reads clean


def test_a_helm_template_is_skipped_with_the_way_to_render_it(tmp_path, capsys):
    tpl = tmp_path / "templates"
    tpl.mkdir()
    (tpl / "binding.yaml").write_text(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {{ .Release.Name }}\n"
    )
    code, _, err = run_cli(capsys, "audit", "-f", str(tmp_path))
    assert code == 2  # nothing else to judge: never a clean result
    assert "skipped: a Helm template" in err and "helm template CHART | dra-guard audit -f -" in err


def test_literal_braces_in_a_valid_manifest_are_audited_not_skipped(tmp_path, capsys):
    """Prometheus rules and Go templates in ConfigMaps hold {{ }} in strings: valid YAML, judged."""
    role = dict(WRITER, metadata={"name": "slice-writer", "annotations": {"summary": "{{ $labels.pod }}"}})
    code, out, _ = run_cli(capsys, "audit", "-f", str(write(tmp_path, "m.yaml", role, BAD)), "-o", "json")
    assert code == 1 and json.loads(out)["findings"][0]["name"] == "team-a-slices"


def test_a_binding_whose_role_is_not_among_the_files_is_a_finding_not_a_clean_result(tmp_path, capsys):
    code, out, err = run_cli(capsys, "audit", "-f", str(write(tmp_path, "b.yaml", BAD)))
    assert code == 0  # advisory: offline dra-guard cannot tell
    assert "No findings" not in out
    assert "unresolved-roleref" in out and "ClusterRole slice-writer" in out and "--cluster" in out


def test_sarif_2_1_0_with_rules_levels_and_file_locations(tmp_path, capsys):
    path = write(tmp_path, "m.yaml", WRITER, BAD, driver_daemonset())
    code, out, _ = run_cli(capsys, "audit", "-f", str(path), "-o", "sarif")
    assert code == 1
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    run = sarif["runs"][0]
    assert run["tool"]["driver"]["name"] == "dra-guard"
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert rules["rbac/rbac-write"]["helpUri"].startswith(PAGE)
    by_rule = {r["ruleId"]: r for r in run["results"]}
    write_result = by_rule["rbac/rbac-write"]
    assert write_result["level"] == "error"
    location = write_result["locations"][0]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == str(path)
    lines = path.read_text().splitlines()
    second = lines.index("---") + 2  # 1-based: the line after the first separator starts the binding
    assert location["physicalLocation"]["region"]["startLine"] == second
    assert location["logicalLocations"][0]["name"] == "ClusterRoleBinding/team-a-slices"
    assert by_rule["probes/missing-liveness-probe"]["level"] == "error"  # enforce mode would patch it


def test_junit_counts_failures_and_reports_a_clean_run(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "audit", "-f", str(write(tmp_path, "m.yaml", WRITER, BAD)), "-o", "junit")
    suites = ET.fromstring(out)
    assert code == 1 and suites.get("failures") == "1"
    [case] = suites.iter("testcase")
    assert case.get("name") == "ClusterRoleBinding/team-a-slices" and case.find("failure") is not None
    code, out, _ = run_cli(capsys, "audit", "-f", str(write(tmp_path, "ok.yaml", WRITER)), "-o", "junit")
    suites = ET.fromstring(out)
    assert code == 0 and suites.get("failures") == "0"
    assert [c.get("name") for c in suites.iter("testcase")] == ["no findings"]


def test_yaml_output_equals_json_output(tmp_path, capsys):
    path = str(write(tmp_path, "m.yaml", WRITER, BAD))
    _, as_json, _ = run_cli(capsys, "audit", "-f", path, "-o", "json")
    _, as_yaml, _ = run_cli(capsys, "audit", "-f", path, "-o", "yaml")
    assert yaml.safe_load(as_yaml) == json.loads(as_json)


def test_policyreports_have_pass_results_and_severities_that_match_enforce_mode(tmp_path):
    ok_binding = binding("team-a-view", "view-claims", [subject("Group", "team-a")])
    viewer = cluster_role("view-claims", [rule(["resourceclaims"], ["get"])])
    objects = [WRITER, BAD, viewer, ok_binding, driver_daemonset()]
    result = audit.audit([dict(o) for o in objects], from_mapping(None))
    [cluster, namespaced] = audit.policy_reports(result.findings, refs=result.refs, judged=result.judged, now=1)
    by_name = {r["resources"][0]["name"]: r for r in cluster["results"]}
    assert by_name["team-a-view"]["result"] == "pass"
    assert (by_name["team-a-slices"]["result"], by_name["team-a-slices"]["severity"]) == ("fail", "high")
    assert cluster["summary"]["pass"] == 1 and cluster["summary"]["fail"] == 1
    probe = next(r for r in namespaced["results"] if r["rule"] == "missing-liveness-probe")
    assert (probe["result"], probe["severity"]) == ("warn", "low")  # enforce mode adds it by patch


def test_the_report_crds_have_the_usual_printer_columns():
    for crd in yaml.safe_load_all((REPO / "charts/dra-guard/files/policyreport-crds.yaml").read_text()):
        columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
        for name in ("Pass", "Fail", "Warn", "Error", "Skip"):
            assert columns[name] == f".summary.{name.lower()}"


def test_the_compiled_yaml_loader_and_progress_lines(tmp_path):
    if hasattr(yaml, "CSafeLoader"):
        assert load.LOADER is yaml.CSafeLoader
    lines: list[str] = []
    load.read(
        [str(write(tmp_path, "a.yaml", WRITER)), str(write(tmp_path, "b.yaml", BAD))], progress=lines.append, progress_seconds=0
    )
    assert lines and lines[-1].startswith("read 2 file(s)")


def test_version_completion_and_config_commands(tmp_path, capsys):
    out = subprocess.run([sys.executable, "-m", "webhook.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("dra-guard 0.")
    code, out, _ = run_cli(capsys, "completion", "bash")
    assert code == 0 and "complete" in out and "dra-guard" in out
    good = tmp_path / "c.yaml"
    good.write_text("mode: audit\n")
    code, out, _ = run_cli(capsys, "config", "validate", str(good))
    assert code == 0 and "valid DraGuardConfiguration" in out and "rbac audit" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("probes: {periodSeconds: 0}\n")
    code, _, err = run_cli(capsys, "config", "validate", str(bad))
    assert code == 2 and "probes.periodSeconds: must be between 1 and 3600" in err
    code, out, _ = run_cli(capsys, "config", "schema")
    assert code == 0 and "properties" in json.loads(out)


def test_shell_completion_completes_subcommands_and_flags():
    """What `source <(dra-guard completion bash)` asks dra-guard: argcomplete's protocol."""
    env = {
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_SHELL": "bash",
        "COMP_LINE": "dra-guard audit --sc",
        "COMP_POINT": str(len("dra-guard audit --sc")),
        "_ARGCOMPLETE_STDOUT_FILENAME": "/dev/stdout",
        "PATH": "/usr/bin:/bin",
    }
    script = pathlib.Path(sys.executable).parent / "dra-guard"
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert "--scope" in out.stdout, (out.stdout, out.stderr)


def test_context_selects_the_kubeconfig_context(tmp_path):
    from webhook.kube.client import ClusterError, api_client

    kc = tmp_path / "kc"
    kc.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "a",
                "clusters": [
                    {"name": "a", "cluster": {"server": "https://127.0.0.1:1"}},
                    {"name": "b", "cluster": {"server": "https://127.0.0.2:2"}},
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "a", "context": {"cluster": "a", "user": "u"}},
                    {"name": "b", "context": {"cluster": "b", "user": "u"}},
                ],
            }
        )
    )
    assert api_client(str(kc), timeout_seconds=1).configuration.host == "https://127.0.0.1:1"
    assert api_client(str(kc), timeout_seconds=1, context="b").configuration.host == "https://127.0.0.2:2"
    with pytest.raises(ClusterError):
        api_client(str(kc), timeout_seconds=1, context="nope")


def test_drain_plan_help_has_examples_and_explains_node(capsys):
    with pytest.raises(SystemExit):
        main(["drain-plan", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "the node's name" in out and "--context" in out
