"""The benchmark harness itself (`python -m bench suite --quick`): it must keep working and keep telling the truth.

About a minute: its own small control plane, filled, dra-guard started, every endpoint and its
floor under vegeta at 200/s for 3 s, and the four apiserver variants. Speed is not asserted here
(bench/RESULTS.md records it); what is asserted is that the harness measures what it claims.
"""

from __future__ import annotations

import json

from bench import __main__ as bench_cli
from bench import endpoints


def test_quick_bench_runs_and_checks_what_it_measures(tmp_path):
    assert bench_cli.main(["suite", "--quick", "--only", "endpoints,apiserver", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench-quick.json").read_text())
    part = results["endpoints_part"]
    assert part["fill"]["objects"] > 1000
    assert {"clusterroles", "clusterrolebindings", "daemonsets", "pods", "resourceclaims"} <= set(part["cache_sync"])
    (repeat,) = part["endpoints"]
    for name in ("rbac", "daemonsets", "evictions"):
        answers = repeat[name]["answers"]
        assert answers["checked"] >= 500 and answers["wrong"] == 0, (name, answers)
        assert repeat[name]["rates"]["200"]["success"] == 1.0
        assert repeat[name]["floor"]["200"]["success"] == 1.0
    # the common reviews make no API request; the rare protected-role review reads the bindings, at
    # most once per cluster.bindingRefreshIntervalSeconds (2 s; the bench sends 2 such reviews/s)
    assert endpoints.per_review_requests(part["api_requests_during_load"]) == 0
    assert 0 < part["protected_role"]["api_requests_per_review"] <= 1
    variants = {run["variant"]: run for run in part["apiserver"]["runs"]}
    assert set(variants) == {"none", "vap", "noop-webhook", "dra-guard"}
    assert all(run["created"] == run["requests"] > 0 for run in variants.values())
    report = (tmp_path / "report-quick.md").read_text()
    assert "## Targets" in report and "| dra-guard |" in report
