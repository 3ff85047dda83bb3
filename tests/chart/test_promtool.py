"""The chart's Prometheus rules checked by the real promtool.

The rules are charts/dra-guard/files/prometheus-rules.yaml rendered by `helm template` into the
PrometheusRule; its spec (plain rule-file format) goes to `promtool check rules` as is, and to
`promtool test rules` with tests/chart/rules-tests.yaml (synthetic series: every alert fires when
it should and stays silent when it should). For the unit tests the long `description` and the
`runbook_url` annotations are left out (they are checked by `check rules`, below and in
test_runbooks.py); summaries stay and are compared, so Prometheus' templating of $labels and $value
is tested.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.chart import helm
from tests.e2e import binaries

pytestmark = pytest.mark.e2e  # runs the real helm and promtool (built from Go modules)

HERE = pathlib.Path(__file__).resolve().parent
RULE_TESTS = HERE / "rules-tests.yaml"

#: The source page's queries (seed-digest.md), as the chart's rules and dashboard must carry them.
#: The page's depth query also has endpoint="kube-controller-manager", a scrape-target label that
#: differs between Prometheus set-ups (dra-facts.md), so the chart matches on name= only.
PAGE_QUERIES = [
    'sum(rate(workqueue_adds_total{name="resource_claim"}[5m]))',
    'sum(workqueue_depth{name="resource_claim"})',
    'histogram_quantile(0.99, sum(rate(workqueue_work_duration_seconds_bucket{name="resource_claim"}[5m])) by (le))',
    "histogram_quantile(0.99, sum(increase(scheduler_pod_scheduling_sli_duration_seconds_bucket[5m])) by (le))",
    "histogram_quantile(0.99, sum(increase(scheduler_scheduling_algorithm_duration_seconds_bucket[5m])) by (le))",
    'histogram_quantile(0.99, sum(rate(dra_operations_duration_seconds_bucket{operation_name="PrepareResources"}[5m])) by (le))',
    'histogram_quantile(0.99, sum(rate(dra_operations_duration_seconds_bucket{operation_name="UnprepareResources"}[5m])) by (le))',
    'histogram_quantile(0.99, sum(rate(dra_grpc_operations_duration_seconds_bucket{method_name=~".*NodePrepareResources"}[5m])) by (le))',
    'histogram_quantile(0.99, sum(rate(dra_grpc_operations_duration_seconds_bucket{method_name=~".*NodeUnprepareResources"}[5m])) by (le))',
]
DRA_GUARD_METRICS = [
    "dra_guard_admission_requests_total",
    "dra_guard_policy_errors_total",
    "dra_guard_review_age_seconds_bucket",
    "dra_guard_cache_synced",
    "dra_guard_accept_queue_connections",
    "dra_guard_requests_dropped_total",
    "dra_guard_certificate_expiry_timestamp_seconds",
]


@pytest.fixture(scope="module")
def promtool() -> pathlib.Path:
    """The real promtool (built once with `go install`, then cached)."""
    try:
        return binaries.promtool_dir() / "promtool"
    except binaries.BinariesError as exc:
        pytest.fail(f"cannot provide promtool: {exc}", pytrace=False)


def rule_groups(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The PrometheusRule's spec ({"groups": [...]}) as the chart renders it with `values`."""
    merged = {"monitoring": {"prometheusRule": {"enabled": True}}}
    for key, value in (values or {}).items():
        merged[key] = value
    docs = helm.template(values=merged, show_only=["templates/prometheusrule.yaml"])
    return docs[0]["spec"]


def alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"]}


def run_promtool(promtool: pathlib.Path, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def write_unit_test_files(folder: pathlib.Path, spec: dict[str, Any]) -> pathlib.Path:
    """rules.yaml (descriptions and runbook URLs left out) and a copy of rules-tests.yaml in `folder`;
    returns the latter."""
    stripped = json.loads(json.dumps(spec))
    for group in stripped["groups"]:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("description", None)
            rule.get("annotations", {}).pop("runbook_url", None)
    (folder / "rules.yaml").write_text(yaml.safe_dump(stripped, sort_keys=False))
    return pathlib.Path(shutil.copy(RULE_TESTS, folder / "rules-tests.yaml"))


def norm(expr: str) -> str:
    return re.sub(r"\s+", " ", expr).strip()


def test_check_rules_on_the_rendered_text(promtool, tmp_path):
    spec = rule_groups()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts(spec))} rules found" in out.stdout


def test_check_rules_with_other_values(promtool, tmp_path):
    spec = rule_groups(
        {
            "webhooks": {"rbac": {"timeoutSeconds": 10}},
            "monitoring": {
                "prometheusRule": {
                    "enabled": True,
                    "controlPlaneSelector": 'cluster="prod"',
                    "thresholds": {"errorRatio": 0.01, "claimQueueDepth": 500},
                }
            },
        }
    )
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    rules = alerts(spec)
    assert 'policy="rbac"}[5m]))) > 5' in rules["DraGuardLatencyNearTimeout"]["expr"]
    assert "> 0.01" in rules["DraGuardAdmissionErrors"]["expr"]
    assert "> 500" in rules["DRAResourceClaimControllerBacklog"]["expr"]
    for name, rule in rules.items():
        if name.startswith("DRA"):
            assert 'cluster="prod"' in rule["expr"], name


def test_every_alert_fires_and_stays_silent(promtool, tmp_path):
    test_file = write_unit_test_files(tmp_path, rule_groups())
    out = run_promtool(promtool, "test", "rules", test_file.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_unit_tests_fail_when_the_rules_do_not_match(promtool, tmp_path):
    """The synthetic series really exercise the thresholds: other thresholds break the tests."""
    spec = rule_groups(
        {"monitoring": {"prometheusRule": {"enabled": True, "thresholds": {"errorRatio": 0.5, "kubeletPrepareSeconds": 60}}}}
    )
    test_file = write_unit_test_files(tmp_path, spec)
    out = run_promtool(promtool, "test", "rules", test_file.name, cwd=tmp_path)
    assert out.returncode != 0
    assert "alertname: DraGuardAdmissionErrors" in out.stdout + out.stderr
    assert "alertname: DRAKubeletPrepareResourcesSlow" in out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_silent_case():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fires, silent = set(), set()
    for group in tests:
        for case in group["alert_rule_test"]:
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    names = set(alerts(rule_groups()))
    assert names == fires, f"never fire: {names - fires}"
    assert names == silent, f"never silent: {names - silent}"


def test_page_queries_are_in_the_rules_and_the_dashboard():
    exprs = " ".join(norm(r["expr"]) for r in alerts(rule_groups()).values())
    dashboard = json.loads((helm.CHART / "files" / "dashboard.json").read_text())
    targets = " ".join(norm(t["expr"]) for p in dashboard["panels"] for t in p.get("targets", []))
    for query in PAGE_QUERIES:
        assert query in exprs, query
        assert query in targets, query
    for metric in DRA_GUARD_METRICS:
        assert metric in exprs and metric in targets, metric


def test_descriptions_say_what_to_tune():
    rules = alerts(rule_groups())
    for name, rule in rules.items():
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80, name
    kcm = ["DRAResourceClaimControllerBacklog", "DRAResourceClaimControllerSlowWork"]
    for name in kcm:
        text = rules[name]["annotations"]["description"]
        assert "--kube-api-qps" in text and "--kube-api-burst" in text and "75" in text and "150" in text, name
        assert "CPU" in text, name
    assert "lower the pod creation rate" in rules["DRAResourceClaimControllerSaturated"]["annotations"]["description"]
    assert "hard-coded" in rules["DRAResourceClaimControllerSaturated"]["annotations"]["description"]
    assert "QPS and Burst" in rules["DRASchedulerPodSchedulingSlow"]["annotations"]["description"]
    for name in ("DRAKubeletPrepareResourcesSlow", "DRADriverNodePrepareResourcesSlow", "DRASchedulerAlgorithmSlow"):
        text = rules[name]["annotations"]["description"]
        assert "CPU" in text and "pod creation rate" in text.replace("\n", " "), name
    assert {r.get("labels", {}).get("severity") for r in rules.values()} <= {"warning", "critical"}
