"""Build or reuse the dra-guard container image from the project's Dockerfile, without a registry.

No registry is reachable here (Docker Hub included), so the Dockerfile's two bases (its build
arguments BUILD_BASE and BASE, see the Dockerfile) are made locally from Debian 12 packages with
mmdebstrap, imported into buildah's own storage, and the Dockerfile is built by buildah (daemonless,
``--isolation chroot``). The result is written as an OCI archive (``oci-archive`` layout) named
``localhost/dra-guard:<source hash>``; tests/e2e/test_node_chart_in_cluster.py pushes it as is to a
registry on loopback (tests/e2e/registry.py) from which the real node pulls it by digest.

Caches, under ``$DRA_GUARD_CACHE`` or ``~/.cache/dra-guard`` (tests.e2e.binaries.cache_root):
- ``image/base-<kind>-<key>.tar``: a base's root filesystem (tarball from mmdebstrap), keyed by
  the suite, mirrors and package list (BASES below). Delete it to take Debian's newer packages.
- ``image/dra-guard-<key>.oci.tar``: the built image, keyed by the hash of every file that goes into
  it (the Dockerfile, pyproject.toml, README.md, constraints.txt, webhook/, certs/) and of the bases' keys. Older
  archives are removed when a new one is written.
- ``buildah/``: buildah's image storage (overlay driver); the run root is /run/dra-guard-buildah.

Measured here (2 cores): cold 84 s (both bases made in parallel, then the Dockerfile: ~35 s of it,
its build stage pip-installs from PyPI); after a source change with the bases cached 35 s (125 s
with other test runs on the machine); warm (archive cached) well under a second.

Needs root on Linux and the Debian packages buildah, mmdebstrap and umoci (tests/e2e/hostdeps.py's
list, installed by tests/run; ``ensure_host_packages`` installs them too when root, otherwise
ImageError says what to install).
The build stage's pip uses the host's CA bundle (``$PIP_CERT`` or /etc/ssl/certs/ca-certificates.crt,
mounted read-only) so a TLS-intercepting egress proxy trusted by the host is trusted there too,
and ``$PIP_INDEX_URL`` when set.

Usage: ``python -m tests.e2e.image`` builds or reuses the image and prints its archive and name.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tests.e2e.binaries import cache_root

REPO = pathlib.Path(__file__).resolve().parents[2]
IMAGE_NAME = "localhost/dra-guard"
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# The Dockerfile's two bases: the build stage needs the venv module (python3-venv brings ensurepip
# and pip's wheel); the final stage gets python3 alone, so it has no pip and no ensurepip.
BASES = {
    "build": ("python3", "python3-venv"),
    "runtime": ("python3",),
}
# Documentation, manual pages and translations are left out of both bases (dpkg path-exclude).
EXCLUDED_PATHS = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
# What goes into the image (the Dockerfile's COPY lines; .dockerignore keeps the rest out).
SOURCES = ("Dockerfile", "pyproject.toml", "README.md", "constraints.txt", "webhook", "certs")


class ImageError(RuntimeError):
    """The image could not be built (a missing host tool, not root, a failed step); the message
    says what is missing or which command failed, with its output's tail."""


@dataclass(frozen=True)
class Image:
    """A built dra-guard image: `ref` (``localhost/dra-guard:<tag>``, its name in the archive),
    `archive` (the OCI archive) and `key` (the source hash the tag is made from)."""

    ref: str
    archive: pathlib.Path
    key: str

    @property
    def repository(self) -> str:
        return self.ref.rpartition(":")[0]

    @property
    def tag(self) -> str:
        return self.ref.rpartition(":")[2]


def ensure_host_packages() -> None:
    """Make sure the build can run: Linux, root, and the Debian packages of tests.e2e.hostdeps
    (buildah, mmdebstrap, umoci; installed with apt-get when root). Raises ImageError naming what is
    missing otherwise."""
    from tests.e2e import hostdeps

    if sys.platform != "linux":
        raise ImageError(f"building the dra-guard image needs Linux (this is {sys.platform})")
    if os.geteuid() != 0:
        raise ImageError(
            "building the dra-guard image needs root (buildah and mmdebstrap run as root here); run the tests as root"
        )
    try:
        hostdeps.ensure()
    except RuntimeError as exc:
        raise ImageError(str(exc)) from exc


def _run(argv: list[str], *, timeout: float = 900, cwd: pathlib.Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(argv)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def base_key(kind: str) -> str:
    """The cache key of a base: a hash of the suite, mirrors, packages and excluded paths."""
    return _digest(
        [
            SUITE.encode(),
            *(m.encode() for m in MIRRORS),
            *(p.encode() for p in BASES[kind]),
            *(x.encode() for x in EXCLUDED_PATHS),
        ]
    )


def source_files() -> list[pathlib.Path]:
    """Every file that goes into the image, sorted (SOURCES, without caches or compiled files)."""
    files: list[pathlib.Path] = []
    for name in SOURCES:
        path = REPO / name
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files += [p for p in found if "__pycache__" not in p.parts and p.suffix != ".pyc" and ".egg-info" not in str(p)]
    return sorted(files)


def image_key() -> str:
    """The built image's cache key and tag: a hash of the source files (paths and contents) and the bases' keys."""
    parts = [base_key(kind).encode() for kind in sorted(BASES)]
    for path in source_files():
        parts += [str(path.relative_to(REPO)).encode(), path.read_bytes()]
    return _digest(parts)


def _buildah(*args: str, timeout: float = 900) -> str:
    root = cache_root() / "buildah"
    return _run(
        ["buildah", "--root", str(root / "storage"), "--runroot", "/run/dra-guard-buildah", "--storage-driver", "overlay", *args],
        timeout=timeout,
    )


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    folder = cache_root() / "image"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _base_rootfs(kind: str) -> pathlib.Path:
    """The base's root filesystem tarball, made by mmdebstrap when not cached."""
    out = cache_root() / "image" / f"base-{kind}-{base_key(kind)}.tar"
    if out.exists():
        return out
    partial = out.with_name(out.stem + ".partial.tar")
    argv = [
        "mmdebstrap",
        "--variant=essential",
        "--format=tar",
        "--include=" + ",".join(BASES[kind]),
        *(f"--dpkgopt=path-exclude={x}" for x in EXCLUDED_PATHS),
        SUITE,
        str(partial),
        *MIRRORS,
    ]
    _run(argv, timeout=1200)
    partial.replace(out)
    return out


def _base_image(kind: str, rootfs: pathlib.Path) -> str:
    """The base in buildah's storage, named localhost/dra-guard-base:<kind>-<key> (imported when absent)."""
    ref = f"localhost/dra-guard-base:{kind}-{base_key(kind)}"
    try:
        _buildah("inspect", "--type", "image", ref, timeout=60)
        return ref
    except ImageError:
        pass
    with tempfile.TemporaryDirectory(prefix="dra-guard-base-") as tmp:
        try:
            os.link(rootfs, pathlib.Path(tmp) / "rootfs.tar")
        except OSError:  # another file system
            shutil.copy(rootfs, pathlib.Path(tmp) / "rootfs.tar")
        (pathlib.Path(tmp) / "Containerfile").write_text("FROM scratch\nADD rootfs.tar /\n")
        _buildah("bud", "--isolation", "chroot", "-f", str(pathlib.Path(tmp) / "Containerfile"), "-t", ref, tmp)
    return ref


def _pip_args() -> list[str]:
    bundle = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    args: list[str] = []
    if pathlib.Path(bundle).is_file():
        args += ["-v", f"{bundle}:/run/pip-ca.crt:ro", "--build-arg", "PIP_CERT=/run/pip-ca.crt"]
    if os.environ.get("PIP_INDEX_URL"):
        args += ["--build-arg", f"PIP_INDEX_URL={os.environ['PIP_INDEX_URL']}"]
    return args


def build(*, verbose: bool = True) -> Image:
    """Build the image from the Dockerfile (or reuse the cached archive) and return it.

    Raises ImageError when the host cannot build (see ensure_host_packages) or a step fails.
    """
    key = image_key()
    folder = cache_root() / "image"
    archive = folder / f"dra-guard-{key}.oci.tar"
    image = Image(ref=f"{IMAGE_NAME}:{key}", archive=archive, key=key)
    if archive.exists():
        return image
    ensure_host_packages()
    with _lock():
        if archive.exists():
            return image
        started = time.monotonic()
        if verbose:
            print(
                f"building the dra-guard image {image.ref} (first time for these sources; bases cached in {folder})",
                file=sys.stderr,
            )
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            rootfs = dict(zip(BASES, pool.map(_base_rootfs, BASES), strict=True))
        bases = {kind: _base_image(kind, rootfs[kind]) for kind in BASES}
        _buildah(
            "bud",
            "--isolation",
            "chroot",
            "--build-arg",
            f"BUILD_BASE={bases['build']}",
            "--build-arg",
            f"BASE={bases['runtime']}",
            *_pip_args(),
            "-t",
            image.ref,
            str(REPO),
            timeout=1800,
        )
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        _buildah("push", image.ref, f"oci-archive:{partial}:{image.ref}")
        partial.replace(archive)
        _buildah("rmi", image.ref, timeout=120)
        for old in folder.glob("dra-guard-*.oci.tar"):
            if old != archive:
                old.unlink(missing_ok=True)
        if verbose:
            print(f"built {image.ref} in {time.monotonic() - started:.0f} s: {archive}", file=sys.stderr)
    return image


def unpack(image: Image, dest: pathlib.Path) -> tuple[pathlib.Path, dict[str, object]]:
    """Unpack the image's OCI archive with umoci into `dest` (a runtime bundle); return (rootfs path,
    the image's OCI config: {"User": ..., "Entrypoint": [...], "Cmd": [...], "Env": [...], ...})."""
    layout = dest / "layout"
    layout.mkdir(parents=True)
    with tarfile.open(image.archive) as tar:
        tar.extractall(layout, filter="tar")
    _run(["umoci", "unpack", "--image", f"{layout}:{image.ref}", str(dest / "bundle")], timeout=300)
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"].partition(":")[2]
    manifest = json.loads((layout / "blobs" / "sha256" / manifest_digest).read_text())
    config = json.loads((layout / "blobs" / "sha256" / manifest["config"]["digest"].partition(":")[2]).read_text())
    return dest / "bundle" / "rootfs", dict(config["config"])


def main() -> int:
    """Entry point of ``python -m tests.e2e.image``: build or reuse the image, print archive and name."""
    try:
        image = build()
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(image.archive)
    print(image.ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
