"""A real Kubernetes node for the end-to-end tests: kubelet v1.37.2 + containerd 2.x + runc + CNI.

`Node(cp, workdir).start()` joins this machine to a ControlPlane (tests/e2e/cluster.py) as a real,
Ready node named after the host (its name resolves to 127.0.0.1 here). The kubelet serves on the
machine's own address (`node_address()`, the Node's InternalIP), as on a real node, so that the
apiserver's node proxy reaches it (it refuses loopback). Pods run for real from
locally built one-layer images (`PAUSE_IMAGE`, `DRIVER_IMAGE`, `APP_IMAGE`, imported with
``ctr -n k8s.io images import``; pods use ``imagePullPolicy: Never``); other images are pulled by
the kubelet from a registry on loopback over plain HTTP (`Node.trust_plain_http_registry`, containerd's
``config_path`` hosts.toml; tests/e2e/registry.py). The settings this machine
needs are in /work/shared/docs/real-node.md (cgroup v1 ``failCgroupV1: false``, containerd
``restrict_oom_score_adj = true``, a bridge without routes out, hostNetwork for driver pods).

Give the node a control plane of its own: a Ready node attracts every other test's pods.

One node per machine: the kubelet's paths are fixed (/var/lib/kubelet, ports 10250/10248, the
``kubepods`` cgroups, /var/run/cdi), so `start()` takes an exclusive file lock (`LOCK_FILE`,
waiting up to `lock_timeout` seconds for another node to stop) and first removes whatever a killed
run left behind (`cleanup()`). Host side effects and how they are undone by `stop()` / `cleanup()`:

* processes: kubelet and containerd get a parent-death signal; containers are killed through the
  ``kubepods`` cgroups, shims by their executable path (never by name);
* mounts under `MOUNT_ROOTS` (deepest first, lazily if busy); ``kubepods`` cgroup trees in every
  v1 controller; the bridge `BRIDGE` (10.244.77.0/24, no gateway, no masquerade, no routes out);
* the kubelet's sysctls (`SYSCTLS`): saved before the first start into the state folder, restored;
* folders the node created (recorded in ``OWNED_FILE``: /var/lib/kubelet, /var/lib/cni,
  /var/log/containers, /var/run/cdi, ... only when they did not exist before) are removed;
* iptables chains the kubelet creates (``KUBE-*``) are removed when none existed before.

`leftovers()` lists what of the node is still on the host (empty after a clean stop).

Command line: ``python -m tests.e2e.node down`` removes the leftovers of a killed run;
``python -m tests.e2e.node check`` lists them (exit 1 when there are any; 2 when a node is running).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import io
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from tests.e2e import binaries

if TYPE_CHECKING:
    from tests.e2e.cluster import ControlPlane

STATE_DIR = pathlib.Path("/var/lib/dra-guard-node")  # containerd root, configs, pod logs, owned-folder record
RUN_DIR = pathlib.Path("/run/dra-guard-node")  # containerd state, its socket, pod network namespaces
LOCK_FILE = pathlib.Path("/run/dra-guard-node.lock")
OWNED_FILE = STATE_DIR / "owned.json"
SYSCTL_FILE = STATE_DIR / "sysctls.json"
KUBELET_ROOT = pathlib.Path("/var/lib/kubelet")
CDI_DIR = pathlib.Path("/var/run/cdi")
CONTAINERD_SOCKET = RUN_DIR / "containerd.sock"
POD_LOGS = STATE_DIR / "pod-logs"
#: containerd's registry host configuration (config_path: <host[:port]>/hosts.toml, read on each pull)
REGISTRY_HOSTS = STATE_DIR / "certs.d"
BRIDGE = "draguard0"
POD_SUBNET = "10.244.77.0/24"
CNI_NETWORK = "dra-guard-node"
#: folders the node may create outside STATE_DIR/RUN_DIR; removed on clean-up only if it created them
HOST_DIRS = (
    KUBELET_ROOT,
    pathlib.Path("/var/lib/cni"),
    pathlib.Path("/var/log/containers"),
    pathlib.Path("/run/containerd"),
    CDI_DIR,
    pathlib.Path("/var/run/netns"),
    pathlib.Path("/run/nri"),
)
MOUNT_ROOTS = (KUBELET_ROOT, STATE_DIR, RUN_DIR, pathlib.Path("/run/containerd"), pathlib.Path("/var/run/netns"))
#: what the kubelet writes at start-up (setupKernelTunables) and containers may change
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"  # containerd 2.4.2's default sandbox image name
DRIVER_IMAGE = "localhost/dra-guard-test/dradriver:e2e"  # tests/dradriver, entrypoint /dradriver
APP_IMAGE = "localhost/dra-guard-test/app:e2e"  # the pause binary: prints DRA_GUARD_TEST_DEVICE, exits on SIGTERM
READY_TIMEOUT = 90.0


class NodeError(RuntimeError):
    """The node could not start (the message names the cause and the log tail) or clean up."""


def node_name() -> str:
    """The Node's name: this machine's host name (the kubelet's default), lower-cased."""
    return socket.gethostname().lower()


def node_address() -> str:
    """The IPv4 address the kubelet serves on and the Node's InternalIP: the first global address
    of the interface of the default route (the kubelet's own choice without ``--node-ip``; on the
    CI machine eth0's). The apiserver's node proxy (``nodes/NAME/proxy``: the kubelet's /metrics
    for `dra-guard drain`, logs, exec) dials it; it refuses loopback and link-local addresses.
    NodeError when there is no default route or its interface has no global IPv4 address."""
    routes = json.loads(
        subprocess.run(["ip", "-j", "-4", "route", "show", "default"], capture_output=True, text=True).stdout or "[]"
    )
    device = next((r.get("dev") for r in routes if r.get("dev")), None)
    if device is None:
        raise NodeError("no IPv4 default route: the kubelet needs a non-loopback address for the apiserver to reach it")
    links = json.loads(
        subprocess.run(
            ["ip", "-j", "-4", "addr", "show", "dev", device, "scope", "global"], capture_output=True, text=True
        ).stdout
        or "[]"
    )
    for link in links:
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and info.get("local"):
                return str(info["local"])
    raise NodeError(f"interface {device} of the default route has no global IPv4 address for the kubelet")


# ---------------------------------------------------------------------------------- host helpers


def _sysctl_path(key: str) -> pathlib.Path:
    return pathlib.Path("/proc/sys") / key.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    """The current values of SYSCTLS (key -> value as text)."""
    return {k: _sysctl_path(k).read_text().strip() for k in SYSCTLS if _sysctl_path(k).exists()}


def _mounts_under(roots: Sequence[pathlib.Path]) -> list[str]:
    """Mount points under any of `roots`, deepest first (from /proc/self/mountinfo)."""
    found = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(r) or point.startswith(f"{r}/") for r in roots):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def _umount(point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(point.encode(), 0) != 0:
        libc.umount2(point.encode(), 2)  # MNT_DETACH: lazily, when busy


def _kubepods_cgroups() -> list[pathlib.Path]:
    """Every ``kubepods`` cgroup folder (any controller, cgroup v1 and the unified tree), deepest first."""
    found: list[pathlib.Path] = []
    if CGROUP_ROOT.is_dir():
        for controller in CGROUP_ROOT.iterdir():
            top = controller / "kubepods"
            if top.is_dir():
                found += [pathlib.Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: -len(p.parts))


def _cgroup_pids(groups: Sequence[pathlib.Path]) -> set[int]:
    pids: set[int] = set()
    for group in groups:
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in (group / "cgroup.procs").read_text().split())
    return pids


def _pids_of(executables: Sequence[pathlib.Path]) -> list[int]:
    """Processes whose /proc/<pid>/exe is one of `executables` (never matched by name)."""
    wanted = {str(e) for e in executables}
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "exe") in wanted:
                    pids.append(int(entry.name))
    return pids


def _kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _iptables_chains() -> list[tuple[str, str]]:
    """(table, chain) of every KUBE-* chain in iptables, [] without iptables."""
    if shutil.which("iptables-save") is None:
        return []
    out = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    table, chains = "", []
    for line in out.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":KUBE-"):
            chains.append((table, line[1:].split()[0]))
    return chains


def _node_executables() -> list[pathlib.Path]:
    """Executable paths of the node's own processes (kubelet, containerd, shims) in the cache."""
    try:
        found = binaries.node_binaries(verbose=False)
    except binaries.BinariesError:
        return []
    return [found[n] for n in ("kubelet", "containerd", "containerd-shim-runc-v2") if found[n].exists()]


def leftovers(sysctls_before: Mapping[str, str] | None = None, absent_before: Sequence[str] = ()) -> list[str]:
    """What of a node is still on this host: processes, mounts, kubepods cgroups, the bridge, the
    state folders, the folders of `absent_before` (HOST_DIRS that did not exist before the start:
    `Node.absent_before`), KUBE-* iptables chains, and sysctls that differ from `sysctls_before`
    (or from the values saved before the first start). [] when the host is clean."""
    found = [f"process {pid} ({os.readlink(f'/proc/{pid}/exe')})" for pid in _pids_of(_node_executables())]
    found += [f"mount {m}" for m in _mounts_under(MOUNT_ROOTS)]
    found += [f"cgroup {g}" for g in _kubepods_cgroups()]
    if pathlib.Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"bridge {BRIDGE}")
    found += [f"folder {d}" for d in (STATE_DIR, RUN_DIR, *map(pathlib.Path, absent_before)) if d.exists()]
    if sysctls_before is None and SYSCTL_FILE.exists():
        sysctls_before = json.loads(SYSCTL_FILE.read_text())
    now = read_sysctls()
    found += [f"sysctl {k}={now.get(k)} (was {v})" for k, v in (sysctls_before or {}).items() if now.get(k) != v]
    if sysctls_before is not None:
        found += [f"iptables chain {t}/{c}" for t, c in _iptables_chains()]
    return found


def cleanup() -> list[str]:
    """Remove what a node left on this host (idempotent; the caller holds the lock or knows no
    node runs). Kills the kubelet, containers (via kubepods cgroups), containerd and shims;
    unmounts; removes kubepods cgroups, the bridge, CNI state, owned folders and KUBE-* chains;
    restores saved sysctls. Returns what it did (one line each)."""
    done: list[str] = []
    exes = _node_executables()
    kubelet = [e for e in exes if e.name == "kubelet"]
    _kill_all(_pids_of(kubelet))
    for _ in range(50):  # containers first, so that nothing writes while we unmount
        pids = _cgroup_pids(_kubepods_cgroups())
        if not pids:
            break
        _kill_all(sorted(pids))
        done.append(f"killed {len(pids)} container processes")
        time.sleep(0.1)
    procs = _pids_of(exes)
    if procs:
        _kill_all(procs)
        done.append(f"killed {len(procs)} node processes (kubelet/containerd/shims)")
        deadline = time.monotonic() + 5
        while _pids_of(exes) and time.monotonic() < deadline:
            time.sleep(0.1)
    for point in _mounts_under(MOUNT_ROOTS):
        _umount(point)
        done.append(f"unmounted {point}")
    for group in _kubepods_cgroups():
        for _ in range(20):
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the last processes exit
                _kill_all(sorted(_cgroup_pids([group])))
                time.sleep(0.1)
        done.append(f"removed cgroup {group}")
    if pathlib.Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        done.append(f"deleted bridge {BRIDGE}")
    cni = pathlib.Path("/var/lib/cni")
    for stale in [cni / "networks" / CNI_NETWORK, *(cni / "results").glob(f"{CNI_NETWORK}-*")]:
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.exists():
            stale.unlink()
    owned = json.loads(OWNED_FILE.read_text()) if OWNED_FILE.exists() else {}
    if owned.get("iptables_clean"):
        chains = _iptables_chains()
        for table, chain in chains:  # flush every KUBE-* chain first, then delete references and chains
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
        for table, chain in chains:
            rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True).stdout
            for rule in rules.splitlines():
                if rule.startswith("-A ") and f"-j {chain}" in rule:
                    subprocess.run(["iptables", "-t", table, "-D", *rule[3:].split()], capture_output=True)
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)
        if chains:
            done.append(f"removed iptables chains {', '.join(c for _, c in chains)}")
    for folder in owned.get("dirs", []):
        if pathlib.Path(folder).exists():
            shutil.rmtree(folder, ignore_errors=True)
            done.append(f"removed {folder}")
    if SYSCTL_FILE.exists():
        for key, value in json.loads(SYSCTL_FILE.read_text()).items():
            with contextlib.suppress(OSError):
                if _sysctl_path(key).read_text().strip() != value:
                    _sysctl_path(key).write_text(value)
                    done.append(f"restored {key}={value}")
    for folder in (RUN_DIR, STATE_DIR):
        shutil.rmtree(folder, ignore_errors=True)
    return done


@contextlib.contextmanager
def machine_lock(timeout: float) -> Iterator[None]:
    """Hold the one-node-per-machine lock (flock on LOCK_FILE); NodeError after `timeout` seconds."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                    raise NodeError(
                        f"another real node runs on this machine (lock {LOCK_FILE} held by pid "
                        f"{holder or '?'}) for more than {timeout:.0f} s"
                    ) from None
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


# ---------------------------------------------------------------------------------- images


def oci_archive(binary: pathlib.Path, *, image: str, entrypoint: str) -> bytes:
    """A one-layer OCI image archive (oci-layout tar) holding `binary` at `entrypoint`, tagged
    `image` (annotation io.containerd.image.name) for linux/amd64, as ``ctr images import`` reads."""

    def tar_bytes(members: Mapping[str, tuple[bytes, int]]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, (data, mode) in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), mode, 0
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    layer = tar_bytes({entrypoint.lstrip("/"): (binary.read_bytes(), 0o755)})
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_desc = blob(layer, "application/vnd.oci.image.layer.v1.tar")
    config = blob(
        json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Entrypoint": [entrypoint], "Env": ["PATH=/"]},
                "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
            }
        ).encode(),
        "application/vnd.oci.image.config.v1+json",
    )
    manifest = blob(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config,
                "layers": [layer_desc],
            }
        ).encode(),
        "application/vnd.oci.image.manifest.v1+json",
    )
    manifest["annotations"] = {"io.containerd.image.name": image, "org.opencontainers.image.ref.name": image.rsplit(":", 1)[1]}
    manifest["platform"] = {"architecture": "amd64", "os": "linux"}
    files = {
        "oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644),
        "index.json": (json.dumps({"schemaVersion": 2, "manifests": [manifest]}).encode(), 0o644),
    }
    files.update({f"blobs/sha256/{d.split(':', 1)[1]}": (data, 0o644) for d, data in blobs.items()})
    return tar_bytes(files)


# ---------------------------------------------------------------------------------- the node


class Node:
    """A real kubelet + containerd joined to `cp` (a started ControlPlane with controllers).

    Args:
        cp: the control plane to join; give the node one of its own (other tests' pods land on a Ready node).
        workdir: folder for the kubelet's kubeconfig and config, containerd's config and both logs.
        bins: name -> path of kubelet, containerd, containerd-shim-runc-v2, ctr, dradriver, pause
            (default binaries.node_binaries(), which builds what is missing).
        lock_timeout: seconds to wait for another node on this machine to stop.

    After `start()`: `name` (the Node's name), `kubelet_log`, `containerd_log`, `container_log()`,
    `ctr()`. `stop()` removes everything (see the module docstring); it is idempotent and runs at
    interpreter exit too. Raises NodeError (with the log tail) or binaries.BinariesError from start().
    """

    def __init__(
        self,
        cp: ControlPlane,
        workdir: pathlib.Path,
        *,
        bins: Mapping[str, pathlib.Path] | None = None,
        lock_timeout: float = 900.0,
    ) -> None:
        self.cp = cp
        self.workdir = pathlib.Path(workdir).resolve()
        self.bins = dict(bins) if bins is not None else binaries.node_binaries()
        self.lock_timeout = lock_timeout
        self.name = node_name()
        #: the kubelet's serving address and the Node's InternalIP (node_address(), set by start())
        self.address = ""
        self.kubelet_log = self.workdir / "logs" / "kubelet.log"
        self.containerd_log = self.workdir / "logs" / "containerd.log"
        #: SYSCTLS as they were before start() (what stop() restores and leftovers() compares with)
        self.sysctls_before: dict[str, str] = {}
        #: HOST_DIRS that did not exist before start() (stop() removes them again)
        self.absent_before: list[str] = []
        #: leftovers() as stop() found them after its clean-up, before releasing the machine lock
        self.left_after_stop: list[str] = []
        self._lock: contextlib.ExitStack | None = None
        self._procs: dict[str, Any] = {}

    # ------------------------------------------------------------------ public API

    def start(self) -> Node:
        """Take the machine lock, clean leftovers, start containerd, import the images, start the
        kubelet and wait until the Node is Ready (~4 s here). Returns self; on failure stops what
        it started and raises NodeError."""
        from tests.e2e import hostdeps

        if os.geteuid() != 0 or sys.platform != "linux":
            raise NodeError("the real node needs root on Linux (kubelet, containerd, mounts, cgroups); run the tests as root")
        try:
            hostdeps.ensure(install=False)
        except RuntimeError as exc:
            raise NodeError(f"{exc}; run `python -m tests.e2e.hostdeps` (tests/run does)") from None
        import atexit

        self._lock = contextlib.ExitStack()
        self._lock.enter_context(machine_lock(self.lock_timeout))
        atexit.register(self.stop)
        try:
            cleanup()
            self.address = node_address()
            self._prepare_host()
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the kubelet (SIGTERM, 10 s), kill containers, containerd and shims, then remove
        mounts, cgroups, bridge, folders and restore the sysctls (cleanup()); record what is still
        left in `left_after_stop` (checked under the lock); release the lock. Idempotent."""
        import atexit

        if self._lock is None:
            return
        for name in ("kubelet", "containerd"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                proc.stop()
        try:
            cleanup()
            # checked while the lock is held: afterwards another run's node may already be starting
            self.left_after_stop = leftovers(self.sysctls_before, self.absent_before)
        finally:
            self._lock.close()
            self._lock = None
            atexit.unregister(self.stop)

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the real ``ctr`` against this node's containerd in namespace k8s.io."""
        return subprocess.run(
            [str(self.bins["ctr"]), "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
        )

    def trust_plain_http_registry(self, host: str) -> pathlib.Path:
        """Let the kubelet's pulls (containerd's CRI) reach the registry `host` (``127.0.0.1:PORT``) over
        plain HTTP: a hosts.toml under REGISTRY_HOSTS, the way containerd's docs/hosts.md documents
        (no restart needed: it is read on each pull). Without it containerd 2.4 still reaches a
        loopback registry, but only after trying HTTPS first (it logs "host will try HTTPS first");
        any other host would fail. Returns the file written."""
        folder = REGISTRY_HOSTS / host
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "hosts.toml"
        path.write_text(f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n')
        return path

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """Everything every instance of `container` in pod namespace/pod wrote (the kubelet's CRI
        log files under POD_LOGS, all restarts and pod UIDs of that name, oldest first); '' if none."""
        text = []
        for pod_dir in sorted(POD_LOGS.glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime):
            for log in sorted((pod_dir / container).glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0):
                with contextlib.suppress(OSError):
                    text.append(log.read_text(errors="replace"))
        return "".join(text)

    def kubelet_log_text(self) -> str:
        """The kubelet's log so far."""
        return self.kubelet_log.read_text(errors="replace") if self.kubelet_log.exists() else ""

    def check_alive(self) -> None:
        """Raise NodeError (with the log tail) if the kubelet or containerd has exited."""
        for name, proc in self._procs.items():
            if not proc.alive():
                raise NodeError(f"{name} exited; last lines of {proc.log_path}:\n{_tail(proc.log_path)}")

    # ------------------------------------------------------------------ start-up steps

    def _prepare_host(self) -> None:
        self.sysctls_before = read_sysctls()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        SYSCTL_FILE.write_text(json.dumps(self.sysctls_before))
        self.absent_before = [str(d) for d in HOST_DIRS if not d.exists()]
        OWNED_FILE.write_text(json.dumps({"dirs": self.absent_before, "iptables_clean": not _iptables_chains()}))
        for folder in (self.workdir / "logs", POD_LOGS, STATE_DIR / "net.d", CDI_DIR):
            folder.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / "net.d" / "10-dra-guard-node.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": CNI_NETWORK,
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": False,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET}]],
                                "dataDir": str(STATE_DIR / "cni-ipam"),
                            },
                        }
                    ],
                }
            )
        )

    def _containerd_config(self) -> str:
        cri_runtime = '[plugins."io.containerd.cri.v1.runtime"]'
        return f"""version = 3
root = "{STATE_DIR / "containerd"}"
state = "{RUN_DIR / "containerd"}"
[grpc]
  address = "{CONTAINERD_SOCKET}"
[plugins."io.containerd.nri.v1.nri"]
  disable = true  # else it creates /run/nri for a socket nothing here uses
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{REGISTRY_HOSTS}"
{cri_runtime}
  # no CAP_SYS_RESOURCE on this machine: runc cannot lower oom_score_adj (real-node.md, setting 2)
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{CDI_DIR}"]
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{STATE_DIR / "net.d"}"
"""

    def _start_containerd(self) -> None:
        config = self.workdir / "containerd.toml"
        config.write_text(self._containerd_config())
        env = {"PATH": f"{self.bins['containerd'].parent}{os.pathsep}{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}
        self._spawn("containerd", [str(self.bins["containerd"]), "--config", str(config)], env)
        self._wait("containerd", lambda: self.ctr("version", check=False).returncode == 0, 30)

    def _import_images(self) -> None:
        for image, binary, entrypoint in (
            (PAUSE_IMAGE, "pause", "/pause"),
            (APP_IMAGE, "pause", "/app"),
            (DRIVER_IMAGE, "dradriver", "/dradriver"),
        ):
            archive = self.workdir / f"{image.rsplit('/', 1)[1].replace(':', '-')}.oci.tar"
            archive.write_bytes(oci_archive(self.bins[binary], image=image, entrypoint=entrypoint))
            out = self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive), check=False)
            if out.returncode != 0:
                raise NodeError(f"ctr images import {archive} failed: {out.stderr}")

    def _kubelet_config(self) -> dict[str, Any]:
        endpoint = f"unix://{CONTAINERD_SOCKET}"
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this host has cgroup v1 only (real-node.md, setting 1)
            "cgroupDriver": "cgroupfs",
            # the machine's own address, as on a real node: the apiserver's node proxy (the drain's
            # gauge, kubectl logs) refuses loopback. Reaching it needs a client the kubelet
            # authenticates (cluster CA certificate or token) and authorizes (SubjectAccessReview).
            "address": self.address,
            "healthzBindAddress": "127.0.0.1",
            "readOnlyPort": 0,
            "failSwapOn": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,  # never collect imported images
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "podLogsDir": str(POD_LOGS),
            "volumePluginDir": str(STATE_DIR / "volume-plugins"),
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cp.ca_file)},  # the apiserver's kubelet client certificate
            },
            "authorization": {"mode": "Webhook"},
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
        }

    def _start_kubelet(self) -> None:
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config()))
        kubeconfig = self.cp.kubeconfig("admin")  # the simplest identity (real-node.md, "Risks")
        self._spawn(
            "kubelet",
            [
                str(self.bins["kubelet"]),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.address}",
                "--v=2",
            ],
            {},
        )
        sess = self.cp.session("admin")

        def ready() -> bool:
            resp = sess.get(f"{self.cp.url}/api/v1/nodes/{self.name}", timeout=5)
            if resp.status_code != 200:
                return False
            conditions = resp.json().get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        self._wait("kubelet", ready, READY_TIMEOUT)

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        from tests.e2e.cluster import _Proc

        proc = _Proc(name=name, argv=argv, log_path=self.workdir / "logs" / f"{name}.log")
        old = dict(os.environ)
        os.environ.update(env)
        try:
            proc.start()
        finally:
            os.environ.clear()
            os.environ.update(old)
        self._procs[name] = proc

    def _wait(self, name: str, probe: Any, timeout: float) -> None:
        proc = self._procs[name]
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not proc.alive():
                raise NodeError(f"{name} exited during start-up; last lines of {proc.log_path}:\n{_tail(proc.log_path)}")
            try:
                if probe():
                    return
                last = "not ready"
            except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not yet"
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.2)
        raise NodeError(
            f"{name} not ready after {timeout:.0f} s ({last}); last lines of {proc.log_path}:\n{_tail(proc.log_path)}"
        )


def _tail(path: pathlib.Path, lines: int = 40) -> str:
    from tests.e2e.cluster import _tail as tail

    return tail(path, lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tests.e2e.node``: ``down`` cleans leftovers, ``check`` lists them."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.node",
        description="The real node of the end-to-end tests (kubelet + containerd). `down` removes what a killed "
        "run left on this machine (processes, mounts, kubepods cgroups, the bridge, folders, "
        "sysctls); `check` lists it (exit 1 when something is left, 2 when a node runs now). Needs root.",
    )
    parser.add_argument("command", choices=("down", "check"))
    parser.add_argument(
        "--lock-timeout", type=float, default=10.0, help="seconds to wait for a running node to stop (default 10)"
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: needs root", file=sys.stderr)
        return 1
    if args.command == "check":
        try:
            with machine_lock(0):
                pass
        except NodeError as exc:  # a node is running now: what it holds is not a leftover
            print(f"a node is running: {exc}")
            return 2
        left = leftovers()
        print("\n".join(left) if left else "nothing of the node is left on this machine")
        return 1 if left else 0
    try:
        with machine_lock(args.lock_timeout):
            for line in cleanup():
                print(line)
    except NodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    left = leftovers()
    if left:
        print("still left:\n" + "\n".join(left), file=sys.stderr)
        return 1
    print("clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
