"""Every metric dra-guard exports is documented twice: a hand-written row in the "Metrics" table of
docs/operations/monitoring.md that says what it means for an operator and names its labels (an
operator alerting on a metric finds it there; five metrics had once been added without a row), and
a row of the reference page generated from webhook/metrics.py (tests/docs checks that one)."""

from __future__ import annotations

import pathlib

from prometheus_client.metrics import MetricWrapperBase

from webhook import metrics

MONITORING = pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations" / "monitoring.md"


def test_every_metric_has_a_hand_written_row_naming_its_labels():
    table = MONITORING.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `dra_guard_")}
    exported = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(exported) >= 25
    for metric in exported:
        name = metric._name + ("_total" if metric._type == "counter" else "")
        assert name in rows, f"docs/operations/monitoring.md Metrics has no row for {name}"
        for label in metric._labelnames:
            assert f"`{label}`" in rows[name].split("|")[2], f"{name}: label {label} not named in its row"
        assert len(rows[name].split("|")[3].strip()) > 10, f"{name}: its row says nothing of what it means"
