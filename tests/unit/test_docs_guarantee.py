"""The failure-mode guarantee table is one table: the operations page "When dra-guard is slow, hung or
down" (docs/operations/when-down.md) and docs/reliability.md carry it word for word, and it names
every webhook the chart can render."""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
START, END = "<!-- guarantee table:", "<!-- end guarantee table -->"


def table(path: pathlib.Path) -> str:
    text = path.read_text()
    assert text.count(START) == 1 and text.count(END) == 1, path
    return text.split(START, 1)[1].split(END, 1)[0]


def test_operations_and_reliability_carry_the_same_guarantee_table():
    readme, reliability = table(REPO / "docs" / "operations" / "when-down.md"), table(REPO / "docs" / "reliability.md")
    assert readme == reliability
    rows = [line for line in readme.splitlines() if line.startswith("| (")]
    assert [re.match(r"\| \((\w)\)", r).group(1) for r in rows] == ["a", "b", "c", "d"]
    header = next(line for line in readme.splitlines() if line.startswith("| What is written"))
    for state in ("fast", "slow", "hung", "down", "not yet installed", "break-glass"):
        assert state in header
    for row in rows:
        assert row.count("|") == 8, row
