"""Every alert of the chart links a runbook: its `runbook_url` is monitoring.prometheusRule.runbookBaseURL
plus an anchor that docs/runbooks.md really has, and that section says what a responder needs.

Anchors are computed as GitHub computes a heading's (lower case, punctuation dropped, spaces to
hyphens), the default base being the page on GitHub.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.chart import helm
from tests.chart.test_promtool import alerts, rule_groups

pytestmark = pytest.mark.e2e  # renders the rules with the real helm

RUNBOOKS = helm.REPO / "docs" / "runbooks.md"
#: What each section must say, as its bold lead-ins.
PARTS = ("**Meaning.**", "**Impact.**", "**Diagnosis.**", "**Mitigation.**", "**While it fires.**")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, characters other than letters, digits,
    spaces, hyphens and underscores dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections() -> dict[str, str]:
    """{anchor: text} of the level-2 sections of docs/runbooks.md."""
    parts = re.split(r"^## (.+)$", RUNBOOKS.read_text(), flags=re.M)
    return {slug(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def default_base() -> str:
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    base: str = values["monitoring"]["prometheusRule"]["runbookBaseURL"]
    return base


def test_the_default_base_is_the_runbooks_page_of_the_project():
    assert default_base() == "https://github.com/dra-guard/dra-guard/blob/main/docs/runbooks.md"


def test_every_alert_links_its_own_section_of_the_runbooks():
    rules = alerts(rule_groups())
    assert len(rules) >= 20  # dra-guard's and the DRA control plane's (draControlPlane is on by default)
    anchors = sections()
    for name, rule in rules.items():
        url = rule["annotations"].get("runbook_url")
        assert url, f"{name} has no runbook_url"
        base, _, anchor = url.partition("#")
        assert base == default_base(), name
        assert anchor == name.lower(), f"{name}: anchor {anchor!r}"
        assert anchor in anchors, f"{name}: docs/runbooks.md has no section with anchor #{anchor}"


def test_every_section_says_what_it_means_what_breaks_how_to_find_and_fix_it_and_how_the_guarantee_fails():
    for anchor, text in sections().items():
        for part in PARTS:
            assert part in text, f"#{anchor} lacks {part}"
        diagnosis = text.split("**Diagnosis.**", 1)[1].split("**Mitigation.**", 1)[0]
        assert "```sh" in diagnosis, f"#{anchor}: diagnosis without commands"


def test_the_runbooks_have_no_section_without_an_alert():
    """A section whose alert was renamed or removed is stale: every section is one alert's."""
    names = {n.lower() for n in alerts(rule_groups())}
    assert set(sections()) == names


def test_links_inside_the_runbooks_resolve():
    anchors = set(sections())
    for link in re.findall(r"\]\(#([^)]+)\)", RUNBOOKS.read_text()):
        assert link in anchors, f"#{link}"


def test_readme_and_the_monitoring_page_link_the_runbooks():
    assert "(docs/runbooks.md)" in (helm.REPO / "README.md").read_text()
    assert "(../runbooks.md)" in (helm.REPO / "docs" / "operations" / "monitoring.md").read_text()
