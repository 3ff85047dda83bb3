"""Reading dra-guard's /metrics in tests: one parser (prometheus_client's), one way to match samples.

scrape(server) -> the text exposition of a running server (tests.serve.DraGuardProcess, or anything
with .session() and .url). metric(text, sample) -> one number from it.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
from collections.abc import Iterable
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families


def scrape(server: Any, *, timeout: float = 10) -> str:
    """GET `server.url`/metrics over `server.session()` (its CA, no proxy): the text exposition."""
    text: str = server.session().get(server.url + "/metrics", timeout=timeout).text
    return text


def metric(text: str, sample: str, *, default: float | None = None, **labels: str) -> float:
    """The sum of the samples of Prometheus text exposition `text` named like `sample` whose labels
    include the given ones (prometheus_client's parser).

    sample: a sample name, optionally with labels as exposed, e.g. 'x_bucket{le="0.5",policy="eviction"}';
    labels: more labels to match, e.g. metric(text, "x_total", policy="rbac"). Samples carrying
    labels besides these count too (summed, like PromQL's sum()). A name alone sums every series.
    default: the value when no sample matches (a labelled counter is exposed only once counted);
    None (the default): fail the test, naming the sample."""
    name, _, rest = sample.partition("{")
    wanted = {**dict(re.findall(r'(\w+)="([^"]*)"', rest)), **labels}
    found = [
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and wanted.items() <= s.labels.items()
    ]
    if found:
        return sum(found)
    if default is None:
        raise AssertionError(f"no sample {name}{wanted or ''} in the scrape")
    return default


def queries_return_series(
    queries: Iterable[str], series: list[dict[str, str]], folder: pathlib.Path, *, name: str = "queries-test.yaml"
) -> subprocess.CompletedProcess[str]:
    """Whether each PromQL query returns at least one series over `series` (promtool's
    input_series: {"series": 'name{labels}', "values": "v0 v1 ..."}, one value a minute): a
    `promtool test rules` file `name` in `folder` expects clamp_max(count(query), 1) == 1 for each at
    1m. The promtool run (tests/e2e/binaries.py builds it): exit 0 when every query does; else its
    output names the queries that returned nothing."""
    from tests.e2e import binaries

    expected = [
        {"expr": f"clamp_max(count({q}), 1)", "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 1}]} for q in queries
    ]
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": expected}],
    }
    (folder / name).write_text(yaml.safe_dump(tests, sort_keys=False, width=1000))
    promtool = binaries.promtool_dir() / "promtool"
    return subprocess.run([str(promtool), "test", "rules", name], cwd=folder, capture_output=True, text=True, timeout=120)
