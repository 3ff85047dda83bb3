"""What a user sees of the chart before installing it (`helm show chart|readme`, Artifact Hub): the
project's home, sources and icon in Chart.yaml, a kubeVersion, and a README that the packaged chart
carries and that says how to install it from the OCI registry with the image pinned by digest."""

from __future__ import annotations

import re
import urllib.parse

import yaml

from tests.chart import helm

PROJECT = "https://github.com/dra-guard/dra-guard"
RAW = "https://raw.githubusercontent.com/dra-guard/dra-guard/main/"


def chart_yaml() -> dict:
    return yaml.safe_load(helm.run("show", "chart", str(helm.CHART)).stdout)


def test_chart_names_the_project_home_sources_icon_and_kubernetes_versions():
    chart = chart_yaml()
    assert chart["home"] == PROJECT
    assert chart["sources"] == [PROJECT]
    assert chart["kubeVersion"] == ">=1.30.0-0"
    # the icon is a URL that serves the file itself (raw, not GitHub's HTML page of it), and the
    # file it names is in this repository
    icon = chart["icon"]
    assert icon.startswith(RAW), icon
    path = helm.REPO / urllib.parse.unquote(icon.removeprefix(RAW))
    assert path.is_file() and path.suffix == ".svg", path
    assert path.read_text().lstrip().startswith("<svg"), path


def test_lint_has_no_recommendation_left():
    out = helm.run("lint", "--strict", str(helm.CHART), "--set", "image.repository=registry.example/dra-guard")
    assert "[INFO]" not in out.stdout and "[WARNING]" not in out.stdout, out.stdout


def test_helm_show_readme_prints_the_chart_readme_from_the_packaged_chart(tmp_path):
    packaged = helm.run("package", str(helm.CHART), "-d", str(tmp_path)).stdout.strip().rpartition(": ")[2]
    readme = helm.run("show", "readme", packaged).stdout
    assert readme.rstrip("\n") == (helm.CHART / "README.md").read_text().rstrip("\n")  # helm adds a newline
    assert readme.startswith("# dra-guard\n")
    # install from the OCI chart, the image by digest, and where the documentation is
    assert re.search(r"helm install dra-guard oci://\S+/charts/dra-guard --version \d+\.\d+\.\d+", readme), readme
    assert "--set image.digest=sha256:" in readme
    assert PROJECT in readme
    version = chart_yaml()["version"]
    assert f"--version {version}" in readme, f"the README's install command is not the chart's version {version}"


def test_readme_values_table_names_only_values_the_chart_has():
    readme = (helm.CHART / "README.md").read_text()
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    first_cells = [line.split("|")[1] for line in readme.splitlines() if line.startswith("| `")]
    keys = [k for cell in first_cells for k in re.findall(r"`([^`]+)`", cell)]
    assert len(keys) >= 10, f"no values table in the chart README: {keys}"
    for key_pattern in keys:
        for key in expand(key_pattern):
            node = values
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"README value {key} is not in values.yaml"
                node = node[part]


def expand(key: str) -> list[str]:
    """`a.{b,c}.d` -> [a.b.d, a.c.d]; `<policy>` is any of the chart's policies (rbac)."""
    key = key.replace("<policy>", "rbac")
    m = re.search(r"\{([^}]+)\}", key)
    if not m:
        return [key]
    return [k for alt in m[1].split(",") for k in expand(key[: m.start()] + alt + key[m.end() :])]
