#!/usr/bin/env python3
"""Regenerate the wrapper Go module that builds the real control-plane binaries.

k8s.io/kubernetes requires its ~33 staging modules (k8s.io/api, k8s.io/apiserver, ...) at
v0.0.0 and replaces them with ./staging/... in its own go.mod. A dependency's replace lines are
ignored by Go, so this module must replace each staging module with the published
v0.<minor>.<patch> that matches v1.<minor>.<patch>. The list is read from the pinned
kubernetes go.mod (never hand-written), following ../../../shared/docs/real-apiserver.md.

Usage: python3 tests/k8sbin/generate.py [--kubernetes v1.37.2]
Writes tests/k8sbin/go.mod and go.sum (commit both). Needs `go` and the Go module proxy.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
MODULE = "dra-guard.local/k8sbin"
TOOLS = [
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-scheduler",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes/cmd/kubelet",
]


def go(*args: str) -> str:
    """Run `go ARGS` in the wrapper module's folder; return stdout, raise on failure."""
    proc = subprocess.run(["go", *args], cwd=HERE, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"go {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubernetes", default="v1.37.2", help="k8s.io/kubernetes version to pin")
    args = parser.parse_args()
    version = args.kubernetes
    m = re.fullmatch(r"v1\.(\d+)\.(\d+)", version)
    if not m:
        sys.exit(f"--kubernetes must look like v1.37.2, got {version!r}")
    staging_version = f"v0.{m.group(1)}.{m.group(2)}"

    info = json.loads(go("mod", "download", "-json", f"k8s.io/kubernetes@{version}"))
    gomod = pathlib.Path(info["GoMod"]).read_text()
    staging = re.findall(r"^\s*(k8s\.io/[\w.\-/]+)\s+=>\s+\./staging/", gomod, re.M)
    if not staging:
        sys.exit("no staging replace lines found in the kubernetes go.mod")
    etcd = re.search(r"^\s*go\.etcd\.io/etcd/server/v3\s+(v\S+)", gomod, re.M)
    if not etcd:
        sys.exit("kubernetes go.mod does not name go.etcd.io/etcd/server/v3")
    godebug = re.search(r"^godebug\s+(.+)$", gomod, re.M)
    go_line = re.search(r"^go\s+(\S+)$", gomod, re.M)

    for name in ("go.mod", "go.sum"):
        (HERE / name).unlink(missing_ok=True)
    go("mod", "init", MODULE)
    go("mod", "edit", f"-go={go_line.group(1) if go_line else '1.26'}")
    if godebug:
        go("mod", "edit", f"-godebug={godebug.group(1).strip()}")
    for mod in staging:
        go("mod", "edit", f"-replace={mod}={mod}@{staging_version}")
    go("get", f"k8s.io/kubernetes@{version}", f"go.etcd.io/etcd/server/v3@{etcd.group(1)}")
    go("get", "-tool", *[f"{t}@{version}" for t in TOOLS], f"go.etcd.io/etcd/server/v3@{etcd.group(1)}")
    go("mod", "tidy")
    print(f"pinned kubernetes {version} (staging {staging_version}, {len(staging)} modules), etcd {etcd.group(1)}")


if __name__ == "__main__":
    main()
