"""The chart's Grafana dashboard (charts/dra-guard/files/dashboard.json): every query parses with the
real promtool, names only metrics and labels dra-guard exports (webhook/metrics.py) and the
docs/operations/monitoring.md "Metrics" documents, and the rows that show what only dra-guard does are there.

Parsing: each target's expression, with the dashboard's template variables replaced by a value,
becomes a recording rule of a rule file given to `promtool check rules`, promtool's public way to
parse PromQL without a server.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.chart import helm
from tests.e2e import binaries
from webhook import metrics

pytestmark = pytest.mark.e2e  # runs the real promtool (built from Go modules)

DASHBOARD = helm.CHART / "files" / "dashboard.json"
METRICS_PAGE = helm.REPO / "docs" / "operations" / "monitoring.md"  # its "Metrics" table
SOURCES = helm.REPO / "webhook"

#: Labels Prometheus adds to every series of a scrape (the ServiceMonitor's target), besides the
#: metric's own; `le` is a histogram bucket's.
TARGET_LABELS = {"job", "namespace", "pod", "instance", "service", "endpoint", "container"}
#: A value for each template variable, so that the expression is PromQL promtool can parse.
VARIABLE_VALUES = {"job": "dra-guard", "namespace": "dra-guard"}

SELECTOR = re.compile(r"\b(dra_guard_[a-z0-9_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def targets(board: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of the dashboard (rows hold none: they are not collapsed)."""
    return [(p, t) for p in board["panels"] for t in p.get("targets", [])]


def substitute(expr: str) -> str:
    """`expr` with $var and ${var} replaced by VARIABLE_VALUES; KeyError names an unknown variable."""
    return VARIABLE.sub(lambda m: VARIABLE_VALUES[m.group(1) or m.group(2)], expr)


def exported() -> dict[str, tuple[str, ...]]:
    """{sample name: label names} of every metric webhook/metrics.py defines (counters with _total,
    histograms with _bucket, _sum and _count)."""
    out: dict[str, tuple[str, ...]] = {}
    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        labels = tuple(metric._labelnames)
        if metric._type == "counter":
            out[metric._name + "_total"] = labels
        elif metric._type == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[metric._name + suffix] = labels + (("le",) if suffix == "_bucket" else ())
        else:
            out[metric._name] = labels
    return out


def readme_metrics() -> set[str]:
    table = METRICS_PAGE.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    return {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `dra_guard_")}


def family(sample: str) -> str:
    """The metric a sample name belongs to, as the Metrics table names it (a histogram without its suffix)."""
    base = re.sub(r"_(bucket|sum|count)$", "", sample)
    return base if base != sample and base + "_bucket" in exported() else sample


def parse_with_promtool(exprs: dict[str, str], folder: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on one recording rule per expression ({record name: expr})."""
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": name, "expr": expr} for name, expr in exprs.items()]}]}
    (folder / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    try:
        promtool = binaries.promtool_dir() / "promtool"
    except binaries.BinariesError as exc:
        pytest.fail(f"cannot provide promtool: {exc}", pytrace=False)
    return subprocess.run(
        [str(promtool), "check", "rules", "dashboard-rules.yaml"], capture_output=True, text=True, cwd=folder, timeout=120
    )


def panel_queries(board: dict[str, Any]) -> dict[str, str]:
    return {f"dashboard:panel_{p['id']}_{t['refId']}": substitute(t["expr"]) for p, t in targets(board)}


def rows(board: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """{row title: the panels under it, up to the next row}."""
    out: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    for p in board["panels"]:
        if p["type"] == "row":
            current = out.setdefault(p["title"], [])
        else:
            current.append(p)
    return out


def row_exprs(board: dict[str, Any], prefix: str) -> str:
    found = [title for title in rows(board) if title.startswith(prefix)]
    assert len(found) == 1, f"no row (or several) titled {prefix!r}: {list(rows(board))}"
    return "\n".join(" ".join(t["expr"].split()) for p in rows(board)[found[0]] for t in p.get("targets", []))


# ---------------------------------------------------------------- PromQL
def test_every_panel_query_parses_with_promtool(tmp_path):
    queries = panel_queries(dashboard())
    assert len(queries) >= 30
    out = parse_with_promtool(queries, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(queries)} rules found" in out.stdout


def test_a_query_that_does_not_parse_fails_the_same_check(tmp_path):
    """The check above can fail: one unbalanced parenthesis in one panel is reported by promtool."""
    board = dashboard()
    broken = next(t for p, t in targets(board) if "dra_guard_driver_evictions_total" in t["expr"])
    broken["expr"] = broken["expr"].rstrip(")")
    out = parse_with_promtool(panel_queries(board), tmp_path)
    assert out.returncode != 0
    assert re.search(r'"dashboard:panel_\d+_A": could not parse expression: .*parse error', out.stdout + out.stderr), (
        out.stdout + out.stderr
    )


def test_template_variables_are_declared_and_every_dra_guard_query_uses_them():
    board = dashboard()
    declared = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "namespace"} <= declared
    for panel, target in targets(board):
        used = {a or b for a, b in VARIABLE.findall(target["expr"])}
        assert used <= declared, f"panel {panel['title']!r} uses undeclared {used - declared}"
        for ds in (panel["datasource"], target["datasource"]):
            assert ds == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for metric, selector in SELECTOR.findall(target["expr"]):
            assert 'job=~"$job"' in selector and 'namespace=~"$namespace"' in selector, (
                f"panel {panel['title']!r}: {metric} is not filtered by the job and namespace variables"
            )


# ---------------------------------------------------------------- metrics and labels
def test_every_metric_a_panel_uses_is_exported_and_in_readme_metrics():
    names, documented = exported(), readme_metrics()
    used = set()
    for panel, target in targets(dashboard()):
        for metric in re.findall(r"\bdra_guard_[a-z0-9_]+\b", target["expr"]):
            assert metric in names, f"panel {panel['title']!r}: {metric} is not in webhook/metrics.py"
            assert family(metric) in documented, (
                f"panel {panel['title']!r}: {family(metric)} has no row in the Metrics table of docs/operations/monitoring.md"
            )
            used.add(family(metric))
    # the metrics that make dra-guard's rows: their absence is what the dashboard lacked
    assert {
        "dra_guard_driver_evictions_total",
        "dra_guard_blocking_claims",
        "dra_guard_patches_total",
        "dra_guard_rbac_drift_violations_total",
        "dra_guard_findings_total",
        "dra_guard_undeclared_drivers",
        "dra_guard_admin_access_namespaces",
        "dra_guard_api_redirected",
    } <= used


def label_problems(expr: str, legend: str, source: str) -> list[str]:
    """What is wrong with the labels of one query: a matcher on a label its metric lacks (scrape
    target labels aside) or with a value webhook/ never writes (`source`: its Python text); a
    `by (...)` label no metric of the query has; a legend {{label}} the query does not keep."""
    names, problems, own = exported(), [], set()
    for metric, selector in SELECTOR.findall(expr):
        labels = set(names.get(metric, ()))
        own |= labels
        for label, _, value in MATCHER.findall(selector):
            if label not in labels | TARGET_LABELS:
                problems.append(f"{metric} has no label {label!r}")
            elif label in labels and label != "le":
                problems += [
                    f"webhook/ never writes {metric}{{{label}={alt!r}}}" for alt in value.split("|") if f'"{alt}"' not in source
                ]
    if "dra_guard_" in expr:
        grouped = {g.strip() for clause in GROUPING.findall(expr) for g in clause.split(",") if g.strip()}
        if grouped - own - TARGET_LABELS:
            problems.append(f"groups by {sorted(grouped - own - TARGET_LABELS)}, not labels of its metrics")
        shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        if shown - (grouped - {"le"}):
            problems.append(f"legend shows {sorted(shown - grouped)}, which the query does not keep")
    return problems


def webhook_source() -> str:
    return "\n".join(p.read_text() for p in SOURCES.rglob("*.py"))


def test_every_label_a_panel_filters_groups_or_shows_exists_on_its_metric():
    """Matchers name a label of their metric (or a scrape target's), with a value dra-guard's code
    writes; `by (...)` and the legend's {{label}} name labels of the query's metrics."""
    source = webhook_source()
    problems = [
        f"panel {p['title']!r} {t['refId']}: {problem}"
        for p, t in targets(dashboard())
        for problem in label_problems(t["expr"], t.get("legendFormat", ""), source)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "expr,legend,problem",
    [
        ('sum by (node) (increase(dra_guard_driver_evictions_total{job=~"$job"}[10m]))', "{{node}}", "groups by ['node']"),
        (
            'sum by (driver) (increase(dra_guard_driver_evictions_total{job=~"$job", result="refused"}[10m]))',
            "{{driver}}",
            "has no label 'result'",
        ),
        (
            'sum(increase(dra_guard_findings_total{job=~"$job", policy="eviction", check="cache-stale"}[10m]))',
            "",
            "never writes dra_guard_findings_total{check='cache-stale'}",
        ),
        (
            'sum by (driver) (increase(dra_guard_driver_evictions_total{job=~"$job"}[10m]))',
            "{{driver}} {{decision}}",
            "legend shows ['decision']",
        ),
    ],
)
def test_a_wrong_label_fails_the_same_check(expr, legend, problem):
    """The label check can fail: a label the metric lacks, a value never written, a legend label
    the aggregation drops."""
    found = label_problems(expr, legend, webhook_source())
    assert any(problem in p for p in found), found


# ---------------------------------------------------------------- rows
def test_the_eviction_guard_row():
    exprs = row_exprs(dashboard(), "Eviction guard")
    assert re.search(r"sum by \(driver, decision\) \(increase\(dra_guard_driver_evictions_total\{", exprs)
    assert re.search(r"max by \(node\) \(dra_guard_blocking_claims\{", exprs)
    assert 'policy="eviction", check="cache-not-ready"' in exprs  # refused while the caches are not fresh
    assert 'dra_guard_reviews_not_judged_total{job=~"$job", namespace=~"$namespace", policy="eviction"}' in exprs
    assert "dra_guard_cache_synced{" in exprs and "dra_guard_kube_api_errors_total{" in exprs
    assert "by (daemonset_namespace, daemonset) (dra_guard_undeclared_drivers{" in exprs


def test_the_probe_patches_row():
    exprs = row_exprs(dashboard(), "Probe patches")
    assert 'dra_guard_patches_total{job=~"$job", namespace=~"$namespace", policy="probes"}' in exprs
    # the reasons a probe is not added, by check
    assert re.search(
        r'sum by \(check, mode\) \(increase\(dra_guard_findings_total\{[^}]*policy="probes", '
        r'check=~"[^"]*no-healthcheck-port[^"]*"',
        exprs,
    )
    assert "healthcheck-disabled" in exprs and 'check="missing-liveness-probe"' in exprs


def test_the_rbac_row():
    exprs = row_exprs(dashboard(), "RBAC")
    assert re.search(r'sum by \(check, mode\) \(increase\(dra_guard_findings_total\{[^}]*policy="rbac"\}', exprs)
    assert re.search(r"sum by \(kind, action\) \(increase\(dra_guard_rbac_drift_violations_total\{", exprs)
    assert "dra_guard_admin_access_namespaces{" in exprs
    assert "max by (apiservice) (dra_guard_api_redirected{" in exprs


def test_panels_have_unique_ids_and_do_not_overlap():
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    for p in board["panels"]:
        if p["type"] != "row":
            assert p.get("targets") and p["fieldConfig"]["defaults"].get("unit"), p["title"]
