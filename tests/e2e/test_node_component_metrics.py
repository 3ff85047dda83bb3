"""The chart's DRA alert and dashboard queries return series on metrics
scraped from the real kubelet, kube-scheduler and kube-controller-manager.

A real node (tests/e2e/node.py) runs the test DRA driver; two pods with a ResourceClaim each are
scheduled, prepared, deleted and unprepared. /metrics of the three components is scraped after
each pod (two samples of every series, one minute apart in promtool's time), written as a
`promtool test rules` input, and every query of the chart's PrometheusRule and dashboard that names
one of those components' metrics (everything but dra_guard_*) is evaluated by the real promtool as
`clamp_max(count(QUERY), 1)`, expected to be 1: at least one series. An alert's expression is split
at its `and on()` / `or` and its thresholds are dropped, so each selector is checked whether or not
the alert would fire. A query naming a metric or label value the components do not export fails.
"""

from __future__ import annotations

import json
import math
import re
import warnings

import urllib3
from prometheus_client.parser import text_string_to_metric_families

from tests.chart import helm
from tests.chart.test_promtool import alerts, norm, rule_groups
from tests.e2e import testdriver
from tests.e2e.kube import get_json, wait_for
from tests.e2e.node import node_address
from tests.scrape import queries_return_series

METRIC = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=[{\[])")


def component_queries() -> list[str]:
    """The chart's queries on the components' metrics: dashboard targets and alert expressions
    (split at `and on()` / `or`, thresholds dropped), without dra-guard's own, deduplicated."""
    parts = []
    for rule in alerts(rule_groups()).values():
        for part in re.split(r"\s+(?:and on\(\)|or)\s+", norm(rule["expr"])):
            parts.append(re.sub(r"\s*(?:>=|<=|==|!=|>|<)\s*[0-9.e+]+\s*$", "", part))
    dashboard = json.loads((helm.CHART / "files" / "dashboard.json").read_text())
    parts += [norm(t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    return sorted({p for p in parts if "dra_guard_" not in p})


def scrape(cp) -> dict[str, str]:
    """{job: /metrics text} of the three components (the kubelet with the admin token; the scheduler
    and controller-manager allow /metrics without one, tests/e2e/cluster.py)."""
    sess = cp.session("admin")
    texts = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        for job, url in (
            ("kubelet", f"https://{node_address()}:10250"),
            ("kube-scheduler", cp.scheduler_url),
            ("kube-controller-manager", cp.controller_manager_url),
        ):
            resp = sess.get(url + "/metrics", verify=False, timeout=10)
            assert resp.status_code == 200, (job, resp.status_code, resp.text[:300])
            texts[job] = resp.text
    return texts


def samples(texts: dict[str, str], names: set[str]) -> dict[str, float]:
    """{'name{job="...",label="value",...}': value} for the samples of the metrics in `names` (a
    histogram's _bucket/_sum/_count by their sample names), with the `job` label a Prometheus
    scrape would add; non-finite values left out."""
    out: dict[str, float] = {}
    for job, text in texts.items():
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name not in names or not math.isfinite(s.value):
                    continue
                labels = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted({**s.labels, "job": job}.items()))
                out[f"{s.name}{{{labels}}}"] = float(s.value)
    return out


def run_pod_with_claim(cp, name: str) -> None:
    """A pod with a ResourceClaim from a template: scheduled, prepared by the driver, Ready, then
    deleted and unprepared (gone)."""
    testdriver.apply(cp, testdriver.consumer_objects(name))
    wait_for(f"pod {name} Ready", lambda: testdriver.ready(get_json(cp, "pod", "-n", "work", name)), timeout=90)
    cp.kubectl("admin", "delete", "pod", "-n", "work", name, "--wait=true", "--timeout=90s")


def test_chart_dra_queries_return_series_on_the_real_components_metrics(real_node, tmp_path):
    cp = real_node.cp
    queries = component_queries()
    names = {m for q in queries for m in METRIC.findall(q)} - {"sum", "rate", "increase", "histogram_quantile", "by"}
    assert {
        "workqueue_depth",
        "scheduler_scheduling_algorithm_duration_seconds_bucket",
        "dra_operations_duration_seconds_bucket",
        "dra_grpc_operations_duration_seconds_bucket",
    } <= names, names

    testdriver.apply(cp, testdriver.driver_objects(cp))
    wait_for("the driver's ResourceSlice", lambda: (get_json(cp, "resourceslices") or {}).get("items"), timeout=90)
    run_pod_with_claim(cp, "metrics-1")
    first = samples(scrape(cp), names)
    run_pod_with_claim(cp, "metrics-2")
    second = samples(scrape(cp), names)

    series = [{"series": key, "values": f"{first[key]!r} {second[key]!r}"} for key in sorted(first.keys() & second.keys())]
    assert series, "none of the queried metrics was scraped"
    out = queries_return_series(queries, series, tmp_path, name="component-metrics-test.yaml")
    assert out.returncode == 0, (
        f"a chart query returned no series on the real components' metrics "
        f"(files in {tmp_path}):\n{out.stdout[-6000:]}\n{out.stderr[-2000:]}"
    )
    print(f"\n{len(queries)} queries, each with >= 1 series, over {len(series)} scraped series")


def test_a_query_on_a_metric_the_components_do_not_export_fails_the_same_check(tmp_path):
    """The check above can fail: the same test file passes with the metric's real name and fails
    with a misspelled one (no series), and promtool names the query."""
    for metric, passes in (("workqueue_depth", True), ("workqueue_dept", False)):
        series = [{"series": 'workqueue_depth{name="resource_claim"}', "values": "0 0"}]
        out = queries_return_series([f'sum({metric}{{name="resource_claim"}})'], series, tmp_path)
        assert (out.returncode == 0) is passes, (metric, out.stdout, out.stderr)
        if not passes:
            assert metric in out.stdout + out.stderr, out.stdout
