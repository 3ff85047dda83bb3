"""README "Metrics" lists every metric dra-guard exports, with its labels: an operator alerting on
a metric finds it there (five metrics had been added without a row before issue 19's review)."""
from __future__ import annotations

import pathlib

from prometheus_client.metrics import MetricWrapperBase

from webhook import metrics

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_every_metric_has_a_readme_row_naming_its_labels():
    table = README.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `dra_guard_")}
    exported = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(exported) >= 25
    for metric in exported:
        name = metric._name + ("_total" if metric._type == "counter" else "")
        assert name in rows, f"README Metrics has no row for {name}"
        for label in metric._labelnames:
            assert f"`{label}`" in rows[name].split("|")[2], f"{name}: label {label} not named in its row"
