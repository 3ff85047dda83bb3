"""The docs site (mkdocs.yml, docs/): `mkdocs build --strict` passes, so no internal link or anchor
is broken (and a broken one fails it); the generated reference pages name every config key, Helm
value, metric and command; README is a landing page whose links lead to the site's pages; user docs
carry no development history.

External links (https://...) are not checked: the build has no network here.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
HOOK = REPO / "hack" / "docs_reference.py"


def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(config: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


def nav_pages(nav: list[Any]) -> list[str]:
    out: list[str] = []
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def mkdocs_config() -> dict[str, Any]:
    # mkdocs.yml is plain YAML (no !!python tags)
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_the_site_builds_strict_with_every_page_in_the_nav(tmp_path):
    out = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stderr
    for page in nav_pages(mkdocs_config()["nav"]):
        html = tmp_path / "site" / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert html.exists(), page
    # every hand-written page is in the nav (validation.nav.omitted_files makes --strict fail otherwise)
    written = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert written <= set(nav_pages(mkdocs_config()["nav"]))


@pytest.mark.parametrize(
    "broken", ["[gone](operations/no-such-page.md)", "[gone](operations/sizing.md#no-such-anchor)", "[gone](#no-such-heading)"]
)
def test_a_broken_internal_link_or_anchor_fails_the_build(tmp_path, broken):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + f"\nSee {broken}.\n")
    config = mkdocs_config()
    config.update(docs_dir=str(docs), hooks=[str(HOOK)])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    out = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0 and "index.md" in out.stderr, out.stderr


def test_generated_reference_pages_name_every_config_key_value_metric_and_command():
    ref = reference()
    pages = ref.pages()
    assert set(pages) == {"reference/configuration.md", "reference/helm-values.md", "reference/metrics.md", "reference/cli.md"}
    assert set(pages) <= set(nav_pages(mkdocs_config()["nav"]))

    from webhook.config.schema import config_schema

    keys = [path for path, _ in ref._leaves(config_schema())]
    assert len(keys) > 80 and "probes.startupProbe.failureThreshold" in keys
    for path in keys:
        assert f"| `{path}` |" in pages["reference/configuration.md"], path

    values = yaml.safe_load((REPO / "charts" / "dra-guard" / "values.yaml").read_text())
    leaves = [path for path, _ in ref._value_leaves(values)]
    assert len(leaves) > 50 and "image.repository" in leaves
    for path in leaves:
        row = f"| `{path}` |" if not path.startswith("config.") else f"- `{path}`:"
        assert row in pages["reference/helm-values.md"], path

    from prometheus_client.metrics import MetricWrapperBase

    from webhook import metrics

    exported = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(exported) >= 25
    for metric in exported:
        name = metric._name + ("_total" if metric._type == "counter" else "")
        row = next((r for r in pages["reference/metrics.md"].splitlines() if r.startswith(f"| `{name}` |")), None)
        assert row, name
        assert all(f"`{label}`" in row for label in metric._labelnames), row
        assert metric._documentation.split()[0] in row

    cli = pages["reference/cli.md"]
    for command in (
        "serve",
        "audit",
        "drain-plan",
        "certs generate",
        "certs inspect",
        "hook",
        "config validate",
        "config schema",
        "cleanup",
        "completion",
    ):
        assert f"## `dra-guard {command}`" in cli, command
    assert "--suggest-values" in cli and "--self-signed" in cli  # the flags' help, not only the names


def test_generated_pages_are_not_committed():
    assert not (REPO / "docs" / "reference").exists(), "docs/reference/ is generated at build time by the hook"


def test_readme_is_a_landing_page_that_links_the_site():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(((?:docs/)?[^)#:]+\.md)(?:#[^)]*)?\)", text)
    for link in links:
        assert (REPO / link).exists(), link
    linked = {link.removeprefix("docs/") for link in links if link.startswith("docs/")}
    for section in (
        "getting-started.md",
        "policies/rbac.md",
        "policies/probes.md",
        "policies/eviction.md",
        "operations/sizing.md",
        "operations/upgrades.md",
        "operations/when-down.md",
        "operations/break-glass.md",
        "operations/uninstall.md",
        "runbooks.md",
        "threat-model.md",
        "architecture.md",
        "contributing.md",
        "configuration.md",
    ):
        assert section in linked, section
    for kept in ("## Quick start (set up and first run)", "## Run the tests", "## Code checks"):
        assert kept in text  # CI (.ci/run) and tests/unit/cli/test_quick_start.py follow them


def test_user_docs_carry_no_development_history():
    pages = [REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            assert not re.search(r"\b[Ii]ssues? #?\d+", line), f"{page.relative_to(REPO)}:{number}: {line}"


def test_code_and_chart_comments_carry_no_development_history():
    """Comments and docstrings say why the code is as it is today; issue numbers and review ids
    (\"issue 21\", \"review B3\") belong in commit messages and bench/RESULTS.md."""
    history = re.compile(r"\b[Ii]ssues? #?\d+|\b[Rr]eviews? [A-Z]\d+\b")
    files = [*(REPO / "webhook").rglob("*.py"), *(REPO / "certs").rglob("*.py"), *(REPO / "charts").rglob("*.yaml")]
    files += [*(REPO / "charts").rglob("*.tpl"), *(REPO / "hack").rglob("*.py")]
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if history.search(line)
    ]
    assert not found, "\n".join(found)
