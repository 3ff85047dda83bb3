"""Reading dra-guard's /metrics in tests: one parser (prometheus_client's), one way to match samples.

scrape(server) -> the text exposition of a running server (tests.serve.DraGuardProcess, or anything
with .session() and .url). metric(text, sample) -> one number from it.
"""

from __future__ import annotations

import re
from typing import Any

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
