"""constraints.txt pins every dependency dra-guard declares (pyproject.toml: runtime, test and bench
extras) to one version that satisfies the declaration, and every install path uses it: CI
(.ci/run), README's set-up commands and the image's build stage (Dockerfile). A dependency added
or a floor raised in pyproject.toml without regenerating the file (the command in its header)
fails here."""

from __future__ import annotations

import pathlib
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    """name (canonical) -> pinned version, from constraints.txt."""
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            out[canonicalize_name(name)] = version
    return out


def declared() -> list[Requirement]:
    """The runtime dependencies and those of the test and bench extras, following the extras they
    name of the project itself (test takes dra-guard[docs] and dra-guard[release])."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    own = canonicalize_name(project["name"])
    reqs = [Requirement(r) for r in project["dependencies"]]
    todo, seen = ["test", "bench"], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in map(Requirement, project["optional-dependencies"][extra]):
            if canonicalize_name(req.name) == own:
                todo += sorted(req.extras)
            else:
                reqs.append(req)
    assert {"docs", "release"} <= seen
    return reqs


def test_every_declared_dependency_is_pinned_to_a_version_it_allows():
    pinned = pins()
    for req in declared():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is declared in pyproject.toml but not pinned in constraints.txt: regenerate it"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, which pyproject.toml's {req} does not allow: regenerate it"
        )


def test_ci_readme_and_the_image_install_with_the_constraints():
    assert re.search(r"^pip install -q -c constraints\.txt -e '\.\[test\]'$", (REPO / ".ci" / "run").read_text(), re.M)
    readme = (REPO / "README.md").read_text()
    # the set-up commands (a venv, then pip install -e): prose that mentions pip install is not one
    for line in [line for line in readme.splitlines() if re.search(r"&& pip install (-\S+ )*-e ", line)]:
        assert "-c constraints.txt" in line, line
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^COPY .*\bconstraints\.txt\b.* \./$", dockerfile, re.M)
    assert "pip wheel --constraint constraints.txt " in dockerfile
