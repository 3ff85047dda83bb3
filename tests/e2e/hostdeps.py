"""Debian packages the end-to-end tests need on the host, installed by the project's own set-up.

The real node (tests/e2e/node.py) runs Debian's ``runc`` and the CNI plugins of
``containernetworking-plugins`` (bridge, host-local, loopback under /usr/lib/cni); the dra-guard
image (tests/e2e/image.py) is built with ``buildah`` from bases ``mmdebstrap`` makes, and checked
with ``umoci``; the image and the chart are pushed to ``docker-registry`` on loopback (image with
``skopeo``) and installed from it (tests/e2e/registry.py); everything else is built from Go modules (tests/e2e/binaries.py). `PACKAGES` is the one list: add a package there
(with the reason) and both ``tests/run`` and the README pick it up.

``python -m tests.e2e.hostdeps`` installs what is missing with ``apt-get install -y
--no-install-recommends`` when running as root on a system with apt-get; otherwise it exits 1 with
a message naming the packages to install (never silently). ``--check`` only reports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

#: Debian package -> (a file it installs that the tests use, why it is needed).
PACKAGES: Mapping[str, tuple[str, str]] = {
    "runc": ("/usr/sbin/runc", "the OCI runtime containerd's runc shim calls (Debian 12: 1.1.5)"),
    "containernetworking-plugins": ("/usr/lib/cni/bridge", "CNI bridge, host-local and loopback for pod networks"),
    # the dra-guard image (tests/e2e/image.py): no registry is reachable, so its bases are made here
    "buildah": ("/usr/bin/buildah", "builds the dra-guard image from the Dockerfile, daemonless (Debian 12: 1.28)"),
    "mmdebstrap": ("/usr/bin/mmdebstrap", "makes the image's two bases from Debian 12 packages"),
    "umoci": ("/usr/bin/umoci", "unpacks the built image to check its files and user (tests/e2e/test_image.py)"),
    # the image and the chart are pushed to a registry on loopback and installed from it (tests/e2e/registry.py)
    "docker-registry": (
        "/usr/bin/docker-registry",
        "the reference OCI distribution registry, run on 127.0.0.1 by the tests (Debian 12: 2.8.2)",
    ),
    "skopeo": ("/usr/bin/skopeo", "copies the built image's OCI archive to that registry as is (its digest kept)"),
}


def missing(packages: Mapping[str, tuple[str, str]] | None = None) -> list[str]:
    """The packages (default PACKAGES) whose marker file is absent: Debian package names, in order."""
    return [name for name, (marker, _) in (PACKAGES if packages is None else packages).items() if not os.path.exists(marker)]


def ensure(*, install: bool = True) -> list[str]:
    """Install the missing packages (as root, with apt-get); return what was installed.

    Raises RuntimeError naming the packages when they are missing and cannot be installed here
    (not root, no apt-get, apt-get failed, or install=False).
    """
    todo = missing()
    if not todo:
        return []
    why = "; ".join(f"{p}: {PACKAGES[p][1]}" for p in todo)
    if not install:
        raise RuntimeError(f"missing Debian packages for the real node and image: {' '.join(todo)} ({why})")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            f"the real node and image need these Debian packages: {' '.join(todo)} ({why}); run as root on "
            f"Debian/Ubuntu, or install them yourself: apt-get install -y --no-install-recommends "
            f"{' '.join(todo)}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *todo]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, text=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    still = missing()
    if proc.returncode != 0 or still:
        raise RuntimeError(f"{' '.join(cmd)} failed (still missing: {' '.join(still)}):\n{proc.stderr[-2000:]}")
    return todo


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tests.e2e.hostdeps``; 0 when every package is present."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.hostdeps", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only report missing packages (exit 1), install nothing")
    args = parser.parse_args(argv)
    try:
        done = ensure(install=not args.check)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if done:
        print(f"installed: {' '.join(done)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
