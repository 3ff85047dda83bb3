"""The Dockerfile, checked without a Docker engine (none runs here): it parses into stages, every
base image is pinned by version, the final stage runs as a numeric non-root user without build
tools, and its entrypoint is the `dra-guard` console script the package installs."""

from __future__ import annotations

import fnmatch
import importlib
import json
import pathlib
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
    "MAINTAINER",
}
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3-dev|libc-dev|libffi-dev|rustc|cargo)\b")


@dataclass
class Stage:
    """One FROM ... stage: its base image, alias and instructions [(KEYWORD, argument text)]."""

    image: str
    alias: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def parse(text: str) -> list[Stage]:
    """Split a Dockerfile into stages (comments dropped, `\\` continuations joined); raises
    ValueError on an unknown instruction or an instruction before the first FROM."""
    logical, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        current += (" " if current else "") + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            logical.append(current)
            current = ""
    if current:
        raise ValueError("the Dockerfile ends inside a line continuation")
    stages: list[Stage] = []
    for line in logical:
        keyword, _, arg = line.partition(" ")
        keyword = keyword.upper()
        if keyword not in INSTRUCTIONS:
            raise ValueError(f"unknown instruction {keyword!r}: {line}")
        if keyword == "FROM":
            words = arg.split()
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(image=words[0], alias=alias))
        elif not stages and keyword == "ARG":
            continue  # global build arguments: read by global_args()
        elif not stages:
            raise ValueError(f"{keyword} before the first FROM")
        else:
            stages[-1].instructions.append((keyword, arg.strip()))
    return stages


def global_args(text: str) -> dict[str, str | None]:
    """The ARG lines before the first FROM: {name: default or None}."""
    args: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.upper().startswith("FROM "):
            break
        if line.upper().startswith("ARG "):
            name, eq, default = line[4:].strip().partition("=")
            args[name] = default if eq else None
    return args


def base_image(stage: Stage, args: dict[str, str | None]) -> str:
    """The stage's base with a build argument (`${NAME}` or `$NAME`) replaced by its default."""
    match = re.fullmatch(r"\$\{?(\w+)\}?", stage.image)
    if not match:
        return stage.image
    default = args.get(match.group(1))
    assert default, f"FROM {stage.image}: the build argument has no default"
    return default


def exec_form(arg: str) -> list[str]:
    value = json.loads(arg)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arg
    return value


def test_parses_into_a_build_stage_and_a_final_stage():
    stages = parse(DOCKERFILE.read_text())
    assert len(stages) >= 2
    assert stages[0].alias == "build"
    assert stages[-1].alias == ""
    copies = stages[-1].all("COPY")
    assert copies and all(c.startswith("--from=build ") for c in copies), copies


def test_every_base_image_is_pinned_by_version():
    """Each base is pinned by default; a build argument may replace it (tests/e2e/image.py passes
    bases made from Debian packages) but `docker build .` with no argument gets the pinned image."""
    text = DOCKERFILE.read_text()
    args = global_args(text)
    for stage in parse(text):
        image = base_image(stage, args)
        assert "$" not in image, image
        name, _, tag = image.partition("@")[0].partition(":")
        assert tag and tag != "latest", image
        assert re.fullmatch(r"3\.\d+\.\d+-slim-\w+", tag), f"{image}: pin an exact Python x.y.z slim tag"
        assert name in ("python", "docker.io/library/python"), image


def test_bases_are_build_arguments_the_final_stage_never_sees_the_pip_settings():
    text = DOCKERFILE.read_text()
    stages = parse(text)
    args = global_args(text)
    assert stages[0].image == "${BUILD_BASE}" and stages[-1].image == "${BASE}"
    assert args["BUILD_BASE"] == args["BASE"], "the same pinned Python by default in both stages"
    # PIP_CERT / PIP_INDEX_URL are declared in the build stage only: they never reach the final image.
    assert {a.partition("=")[0] for a in stages[0].all("ARG")} >= {"PIP_CERT", "PIP_INDEX_URL"}
    assert not stages[-1].all("ARG")


def test_final_stage_runs_as_numeric_non_root_user():
    final = parse(DOCKERFILE.read_text())[-1]
    users = final.all("USER")
    assert users, "the final stage has no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]
    gid = users[-1].partition(":")[2]
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_final_stage_has_no_build_tools():
    final = parse(DOCKERFILE.read_text())[-1]
    for keyword, arg in final.instructions:
        if keyword == "RUN":
            assert "apt-get install" not in arg and "apk add" not in arg, arg
            assert not BUILD_TOOLS.search(arg), arg
            assert "pip install" not in arg, f"the final stage copies a built virtualenv, it installs nothing: {arg}"


def test_entrypoint_is_the_console_script_serving_the_chart_config():
    final = parse(DOCKERFILE.read_text())[-1]
    entrypoint = exec_form(final.all("ENTRYPOINT")[-1])
    cmd = exec_form(final.all("CMD")[-1])
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["dra-guard"] and "dra-guard" in scripts
    module, _, function = scripts["dra-guard"].partition(":")
    path = REPO / pathlib.Path(*module.split("."))
    assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), module
    assert callable(getattr(importlib.import_module(module), function))
    assert cmd == ["serve", "--config", "/etc/dra-guard/config.yaml"]
    # the same file the chart mounts and passes
    deployment = (REPO / "charts" / "dra-guard" / "templates" / "deployment.yaml").read_text()
    assert "--config=/etc/dra-guard/config.yaml" in deployment and "mountPath: /etc/dra-guard/config.yaml" in deployment
    # the entry point is installed in this environment too (the project is pip-installed)
    assert shutil.which("dra-guard"), "the dra-guard console script is not on PATH"


def test_uid_matches_the_chart():
    uid = parse(DOCKERFILE.read_text())[-1].all("USER")[-1].split(":")[0]
    helpers = (REPO / "charts" / "dra-guard" / "templates" / "_helpers.tpl").read_text()
    assert f"runAsUser: {uid}" in helpers


def test_build_stage_gets_what_the_wheel_needs_and_dockerignore_keeps_it():
    build = parse(DOCKERFILE.read_text())[0]
    copied = " ".join(build.all("COPY"))
    for needed in ("pyproject.toml", "README.md", "webhook/", "certs/"):
        assert needed in copied, needed
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} == {"webhook", "certs"}
    ignored = [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for path in ("pyproject.toml", "README.md", "webhook/config/__init__.py", "certs/__init__.py"):
        assert not any(fnmatch.fnmatch(path, pat) or path.startswith(pat.rstrip("/") + "/") for pat in ignored), path
    for path in (".git", "tests", ".venv", "charts"):
        assert path in ignored, path
    run = " ".join(build.all("RUN"))
    assert "pip wheel" in run and "venv" in run
    # the venv's own pip: a base without pip (Debian's python3 + python3-venv) builds it too
    assert "python -m pip wheel" not in run and "python3 -m pip wheel" not in run


def test_run_lines_are_valid_shell():
    for stage in parse(DOCKERFILE.read_text()):
        for arg in stage.all("RUN"):
            shlex.split(arg)  # balanced quotes
