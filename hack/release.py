#!/usr/bin/env python3
"""Build dra-guard's release artifacts from a tag (docs/releasing.md is the checklist around it).

    .venv/bin/python hack/release.py v0.3.0                     # everything into dist/0.3.0/
    .venv/bin/python hack/release.py v0.3.0 --push REGISTRY     # ... then push the image and chart
    .venv/bin/python hack/release.py v0.3.0 --only wheel,chart  # some of the artifacts

What it builds, into --out (default dist/<version>/), from the sources of the tag (`git archive`,
so nothing uncommitted goes in; --worktree takes the work tree's files instead, for trying this
script before tagging):
  wheel     dra_guard-<v>-py3-none-any.whl and dra_guard-<v>.tar.gz (`python -m build`)
  chart     dra-guard-<v>.tgz (`helm package charts/dra-guard`)
  image     dra-guard-<v>.oci.tar, an OCI archive of the Dockerfile's image (buildah, with the
            Dockerfile's pinned bases; --local-bases builds it as the tests do, from Debian
            packages, where no registry is reachable: tests/e2e/image.py)
  krew      kubectl-dra_guard-<tag>-linux-amd64.tar.gz (a shiv zipapp and LICENSE) and
            dra-guard.yaml, plugins/dra-guard.yaml filled with its sha256
and SHA256SUMS over all of them.

Before building it checks that the tag, pyproject.toml, Chart.yaml (version and appVersion), the
Dockerfile's version label and CHANGELOG.md ("## [<v>] - <date>") name the same version, and
stops naming the file that differs. Nothing is pushed unless --push REGISTRY is given: then the
image goes to REGISTRY/dra-guard:<v> and the chart to oci://REGISTRY/charts (--plain-http for a
registry without TLS). The wheel and sdist are uploaded by hand (`twine upload`, docs/releasing.md).

Exit codes: 0 built (and pushed), 2 a check failed or a tool is missing (one line naming it),
1 a build step failed (its output above).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import pathlib
import re
import shutil
import string
import subprocess
import sys
import tarfile
import tempfile
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS = ("wheel", "chart", "image", "krew")
TAG = re.compile(r"^v(\d+\.\d+\.\d+)$")
DOWNLOAD_URL = "https://github.com/dra-guard/dra-guard/releases/download/{tag}"
# the krew archive's one platform: the compiled dependencies are the build machine's
KREW_PLATFORM = "linux-amd64"


class ReleaseError(Exception):
    """A check failed or a tool is missing; the message says which (exit 2)."""


def run(argv: list[str], *, cwd: pathlib.Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a build step, its output passed through; raises CalledProcessError (exit 1) on failure."""
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout


def tool(name: str, given: str | None = None) -> str:
    """The path of a tool (`given`, else found on PATH); ReleaseError when missing."""
    found = given or shutil.which(name)
    if not found:
        raise ReleaseError(f"{name} is not installed or not on PATH (needed for this step)")
    return found


def versions(src: pathlib.Path) -> dict[str, str]:
    """Every place that names the release's version, read from the source tree `src`:
    {"pyproject.toml": "0.3.0", "Chart.yaml version": ..., "Chart.yaml appVersion": ..., "Dockerfile": ...}."""
    import yaml

    chart = yaml.safe_load((src / "charts/dra-guard/Chart.yaml").read_text())
    label = re.search(r'org\.opencontainers\.image\.version="([^"]+)"', (src / "Dockerfile").read_text())
    return {
        "pyproject.toml": tomllib.loads((src / "pyproject.toml").read_text())["project"]["version"],
        "charts/dra-guard/Chart.yaml version": str(chart["version"]),
        "charts/dra-guard/Chart.yaml appVersion": str(chart["appVersion"]),
        "Dockerfile org.opencontainers.image.version": label.group(1) if label else "(no label)",
    }


def check_versions(src: pathlib.Path, version: str) -> None:
    """ReleaseError naming each file whose version is not `version`, or a CHANGELOG.md without a
    dated "## [<version>] - YYYY-MM-DD" section."""
    wrong = [f"{where} says {found}" for where, found in versions(src).items() if found != version]
    changelog = (src / "CHANGELOG.md").read_text() if (src / "CHANGELOG.md").exists() else ""
    if not re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M):
        wrong.append(f"CHANGELOG.md has no section '## [{version}] - YYYY-MM-DD'")
    if wrong:
        raise ReleaseError(f"the tag says {version}, but " + "; ".join(wrong))


def sources(tag: str, worktree: bool, dest: pathlib.Path) -> pathlib.Path:
    """The release's source tree in `dest`: the tag's files (`git archive`), or with `worktree`
    the work tree's tracked and new files (not the ignored ones: .venv, dist, caches)."""
    if worktree:
        files = run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).split("\0")
        for name in filter(None, files):
            if (REPO / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, dest / name)
        return dest
    if (
        subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}"], capture_output=True
        ).returncode
        != 0
    ):
        raise ReleaseError(f"no tag {tag} in {REPO} (create it first: docs/releasing.md; --worktree to try without one)")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", tag], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="tar")
    return dest


def build_wheel(src: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """The wheel and sdist (PEP 517 `build`, isolated); returns their paths."""
    try:
        import build  # noqa: F401  (only to say it is missing in one line)
    except ImportError:
        raise ReleaseError("the Python package 'build' is missing: pip install -e '.[release]'") from None
    run([sys.executable, "-m", "build", "--outdir", str(out), str(src)])
    return sorted(out.glob("dra_guard-*.whl")) + sorted(out.glob("dra_guard-*.tar.gz"))


def build_chart(src: pathlib.Path, out: pathlib.Path, helm: str) -> pathlib.Path:
    """`helm package` of charts/dra-guard; returns the .tgz."""
    run([helm, "package", str(src / "charts/dra-guard"), "--destination", str(out)])
    return next(out.glob("dra-guard-*.tgz"))


def build_image(src: pathlib.Path, out: pathlib.Path, version: str, local_bases: bool) -> pathlib.Path:
    """The image as an OCI archive dra-guard-<version>.oci.tar named localhost/dra-guard:<version>.
    VCS_REF stays empty: a release's `dra-guard --version` is the version alone."""
    archive = out / f"dra-guard-{version}.oci.tar"
    ref = f"localhost/dra-guard:{version}"
    if local_bases:
        # tests/e2e/image.py of the release's own sources: Debian bases, buildah, its cache
        lines = run([sys.executable, "-m", "tests.e2e.image"], cwd=src).split()
        built, built_ref = pathlib.Path(lines[0]), lines[1]
        run([tool("skopeo"), "copy", f"oci-archive:{built}:{built_ref}", f"oci-archive:{archive}:{ref}"])
    else:
        buildah = tool("buildah")
        run([buildah, "bud", "--isolation", "chroot", "-t", ref, str(src)])
        run([buildah, "push", ref, f"oci-archive:{archive}:{ref}"])
    return archive


def build_krew(src: pathlib.Path, out: pathlib.Path, tag: str, version: str, download_url: str) -> list[pathlib.Path]:
    """The krew archive (kubectl-dra_guard, a shiv zipapp of the sources and their dependencies,
    with LICENSE) and the manifest plugins/dra-guard.yaml filled with its URL and sha256."""
    shiv = tool(
        "shiv",
        str(pathlib.Path(sys.executable).with_name("shiv")) if pathlib.Path(sys.executable).with_name("shiv").exists() else None,
    )
    with tempfile.TemporaryDirectory(prefix="dra-guard-krew-") as tmp:
        staging = pathlib.Path(tmp)
        pyz = staging / "kubectl-dra_guard"
        # the user's python3.11 runs it; its first run unpacks it into ~/.shiv
        run(
            [
                shiv,
                "--output-file",
                str(pyz),
                "--entry-point",
                "webhook.cli.kubectl:plugin",
                "--python",
                "/usr/bin/env python3.11",
                "--reproducible",
                "--compressed",
                str(src),
            ]
        )
        shutil.copy(src / "LICENSE", staging / "LICENSE")
        archive = out / f"kubectl-dra_guard-{tag}-{KREW_PLATFORM}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for name in ("kubectl-dra_guard", "LICENSE"):
                tar.add(staging / name, arcname=name)
    manifest = out / "dra-guard.yaml"
    manifest.write_text(
        render_manifest(
            (src / "plugins/dra-guard.yaml").read_text(),
            tag=tag,
            version=version,
            download_url=download_url,
            sha256=sha256(archive),
        )
    )
    return [archive, manifest]


def render_manifest(template: str, *, tag: str, version: str, download_url: str, sha256: str) -> str:
    """plugins/dra-guard.yaml with its placeholders filled, its template comment replaced by one
    line saying where it came from. KeyError for a placeholder this function does not know."""
    body = string.Template(template).substitute(
        TAG=tag, VERSION=version, DOWNLOAD_URL=download_url.rstrip("/"), SHA256_LINUX_AMD64=sha256
    )
    lines = body.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return f"# krew manifest of dra-guard {tag}, rendered by hack/release.py from plugins/dra-guard.yaml\n" + "".join(lines)


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def push(registry: str, version: str, built: dict[str, list[pathlib.Path]], helm: str, plain_http: bool) -> None:
    """The image to REGISTRY/dra-guard:<version>, the chart to oci://REGISTRY/charts."""
    if "image" in built:
        digest = built["image"][0].with_suffix(".digest")
        run(
            [
                tool("skopeo"),
                "copy",
                "--digestfile",
                str(digest),
                *(["--dest-tls-verify=false"] if plain_http else []),
                f"oci-archive:{built['image'][0]}:localhost/dra-guard:{version}",
                f"docker://{registry}/dra-guard:{version}",
            ]
        )
        print(f"pushed {registry}/dra-guard:{version}@{digest.read_text().strip()}", file=sys.stderr)
    if "chart" in built:
        run([helm, "push", str(built["chart"][0]), f"oci://{registry}/charts", *(["--plain-http"] if plain_http else [])])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hack/release.py", description=__doc__.split("\n\n")[0], epilog="docs/releasing.md: the whole checklist."
    )
    parser.add_argument("tag", help="the release tag, vX.Y.Z (it must exist unless --worktree)")
    parser.add_argument("--out", type=pathlib.Path, help="output folder (default: dist/<version>)")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps among {', '.join(STEPS)} (default: all)")
    parser.add_argument(
        "--worktree",
        action="store_true",
        help="build from the work tree's files instead of the tag's (to try the release before tagging)",
    )
    parser.add_argument(
        "--local-bases",
        action="store_true",
        help="build the image from Debian packages like the tests (no registry needed for the bases)",
    )
    parser.add_argument(
        "--download-url", help=f"where the krew archive will be downloaded from (default: {DOWNLOAD_URL.format(tag='<tag>')})"
    )
    parser.add_argument("--helm", help="helm binary (default: helm on PATH)")
    parser.add_argument("--push", metavar="REGISTRY", help="push the image and the chart to REGISTRY (host[:port][/path])")
    parser.add_argument("--plain-http", action="store_true", help="the --push registry speaks HTTP, not HTTPS")
    args = parser.parse_args(argv)
    steps = [s for s in args.only.split(",") if s]
    if unknown := set(steps) - set(STEPS):
        parser.error(f"--only: unknown step(s) {', '.join(sorted(unknown))} (steps: {', '.join(STEPS)})")
    args.steps = steps
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    match = TAG.match(args.tag)
    if not match:
        print(f"hack/release.py: error: the tag must read vX.Y.Z, not {args.tag!r}", file=sys.stderr)
        return 2
    version = match.group(1)
    out = (args.out or REPO / "dist" / version).resolve()
    out.mkdir(parents=True, exist_ok=True)
    built: dict[str, list[pathlib.Path]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="dra-guard-release-") as tmp:
            src = sources(args.tag, args.worktree, pathlib.Path(tmp))
            check_versions(src, version)
            helm = tool("helm", args.helm) if "chart" in args.steps else ""
            if "wheel" in args.steps:
                built["wheel"] = build_wheel(src, out)
            if "chart" in args.steps:
                built["chart"] = [build_chart(src, out, helm)]
            if "image" in args.steps:
                built["image"] = [build_image(src, out, version, args.local_bases)]
            if "krew" in args.steps:
                built["krew"] = build_krew(src, out, args.tag, version, args.download_url or DOWNLOAD_URL.format(tag=args.tag))
        files = [p for paths in built.values() for p in paths]
        (out / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in files))
        if args.push:
            push(args.push, version, built, helm or tool("helm", args.helm), args.plain_http)
    except ReleaseError as exc:
        print(f"hack/release.py: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print((exc.stdout or "")[-4000:], end="", file=sys.stderr)
        print(f"hack/release.py: error: {' '.join(map(str, exc.cmd))} exited {exc.returncode}", file=sys.stderr)
        return 1
    for path in files:
        print(path)
    return 0


if __name__ == "__main__":
    os.umask(0o022)  # archives readable by everyone, whatever the caller's umask
    sys.exit(main())
