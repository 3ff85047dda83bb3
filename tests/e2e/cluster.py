"""A real Kubernetes control plane on loopback for the end-to-end tests.

`ControlPlane` runs etcd, kube-apiserver and, on request, kube-controller-manager and
kube-scheduler (Kubernetes v1.37.2, etcd v3.7.0, built by tests/e2e/binaries.py) as child
processes bound to 127.0.0.1 only. There is no kubelet: Pods are scheduled (bound to a Node)
but never run. Users authenticate with static bearer tokens (``--token-auth-file``), and
RBAC is the only authorizer, so tests can check what each user may do.

Users (random tokens per run, see `USERS`):

* ``admin`` -- group ``system:masters`` (cluster-admin);
* ``alice`` -- group ``team-a``; ``bob`` -- group ``team-b`` (no permissions until a test binds some);
* ``dra-guard`` -- group ``dra-guard``, the webhook's own identity (no permissions of its own);
* ``system:kube-controller-manager`` and ``system:kube-scheduler`` -- the controllers; they are put
  in ``system:masters`` to keep the set-up simple.

Files under the work folder::

    etcd/                  etcd data (kept across restart_apiserver())
    pki/                   ca.crt, ca.key, tls.crt, tls.key (apiserver), sa.key, sa.pub,
                           apiserver-kubelet-client.crt/.key (the apiserver's client certificate
                           for a real node's kubelet, tests/e2e/node.py)
    kubeconfigs/<user>.kubeconfig   ':' in a user name becomes '-' (KUBECONFIG splits on ':')
    logs/<component>.log   stdout+stderr of each process
    tokens.csv, audit-policy.yaml, audit.log (with audit_log=True)
    kubectl-cache/, helm/, flexvolume/   caches and a folder the controller-manager insists on

Command line (stays in the foreground until Ctrl-C or SIGTERM, then stops everything)::

    python -m tests.e2e.cluster up --dir /tmp/k8s [--controllers] [--audit-log] [--clean]
"""

from __future__ import annotations

import argparse
import atexit
import base64
import collections
import ctypes
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import requests
import urllib3
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

import certs
from tests.e2e import binaries
from tests.serve import client_certificate, free_port

#: user name -> groups, written to tokens.csv. Order is the order of the file.
USERS: Mapping[str, tuple[str, ...]] = {
    "admin": ("system:masters",),
    "alice": ("team-a",),
    "bob": ("team-b",),
    "dra-guard": ("dra-guard",),
    "system:kube-controller-manager": ("system:masters",),
    "system:kube-scheduler": ("system:masters",),
}

READY_TIMEOUT = 60.0  # seconds to wait for each component to become ready
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL in stop()
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

#: The audit policy used with audit_log=True: every request at level Metadata (who, what, when,
#: response code; no bodies). RequestReceived is omitted so each request is one line
#: (ResponseComplete), plus a ResponseStarted line for long-running requests (watches).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


class ControlPlaneError(RuntimeError):
    """A component did not start, did not become ready, or exited; the message has its log tail."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl exited non-zero with check=True; str() includes its stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr:\n{self.stderr}"


#: Tolerations that let a Pod be scheduled onto a fake Node whatever taints the apiserver
#: (TaintNodesByCondition adds node.kubernetes.io/not-ready:NoSchedule to new Nodes) or the node
#: lifecycle controller (unreachable, once the grace period without kubelet heartbeats is over) put on it.
TOLERATE_ALL: list[dict[str, str]] = [{"operator": "Exists"}]


def fake_node(
    name: str, *, labels: Mapping[str, str] | None = None, cpu: str = "4", memory: str = "16Gi", pods: str = "110"
) -> dict[str, Any]:
    """A Node manifest for a node without kubelet: capacity/allocatable so the scheduler can bind
    Pods to it (cpu in cores, memory as a Kubernetes quantity, pods = max Pod count).

    Create it with POST /api/v1/nodes (status is kept on create). Nothing ever runs there: bound
    Pods stay Pending, so delete them with gracePeriodSeconds=0 and give them TOLERATE_ALL.
    """
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "FakeNode",
                    "message": "no kubelet",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        },
    }


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGKILL the child when the thread that started it dies.

    This is the last line of defence against orphans when the Python process is killed with
    SIGKILL (atexit and finalizers do not run then). SIGKILL, not SIGTERM: all components get
    the signal at once, and a kube-apiserver whose etcd is already gone hangs in its graceful
    shutdown for minutes (measured). Killing etcd loses nothing a process exit would not
    (--unsafe-no-fsync only matters for a machine crash). Harmless no-op where prctl is missing.
    Start ControlPlane from a thread that outlives it (normally the main thread).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _tail(path: pathlib.Path, lines: int = 50) -> str:
    try:
        with path.open("r", errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines))
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def _file_name(user: str) -> str:
    return user.replace(":", "-").replace("/", "-")


@dataclass
class _Proc:
    """One child process: its command line, log file and Popen handle (None when stopped)."""

    name: str
    argv: list[str]
    log_path: pathlib.Path
    popen: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.log_path.open("ab")
        self.log.write(f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
        self.log.flush()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; idempotent."""
        proc, self.popen = self.popen, None
        if proc is not None:
            if proc.poll() is None:
                self._signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self._signal_group(proc, signal.SIGKILL)
                    proc.wait()
        if self.log is not None:
            self.log.close()
            self.log = None

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # start_new_session=True: the group id is the child's pid
        except ProcessLookupError:
            pass


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager and kube-scheduler) on 127.0.0.1.

    Args:
        workdir: folder for data, certificates, kubeconfigs and logs (created if missing). It must
            not hold a previous cluster's etcd data (ControlPlaneError otherwise).
        controllers: also run kube-controller-manager and kube-scheduler (garbage collection,
            namespace deletion, default ServiceAccounts, ResourceClaims from templates, scheduling).
        audit_log: write an audit log (JSON lines, level Metadata for every request) to
            `audit_log_path`; see `audit_events()`.
        bin_dir: folder with kube-apiserver, kube-controller-manager, kube-scheduler and etcd;
            default `binaries.build_control_plane()` (builds them on the first run, ~12 min).
        tools_dir: folder with kubectl and helm; default `binaries.client_tools_dir()`.
        in_cluster: for a real node's pods that call the apiserver (tests/e2e/test_node_chart_in_cluster.py):
            ServiceAccount tokens mounted in pods, webhooks reached through their Service's endpoints.

    After `start()`: `url` (``https://127.0.0.1:PORT``), `ca_file`, `kubeconfig(user)`,
    `token(user)`, `kubectl(user, ...)`. `stop()` ends every process; it runs at interpreter
    exit too (atexit) and is safe after a failed `start()`. Use as a context manager::

        with ControlPlane(tmp, controllers=True) as cp:
            cp.kubectl("admin", "get", "nodes")

    Raises binaries.BinariesError (binaries missing and not buildable) or ControlPlaneError
    (a component failed or was not ready within READY_TIMEOUT seconds) from `start()`.
    """

    def __init__(
        self,
        workdir: pathlib.Path,
        *,
        controllers: bool = False,
        audit_log: bool = False,
        bin_dir: pathlib.Path | None = None,
        tools_dir: pathlib.Path | None = None,
        in_cluster: bool = False,
    ) -> None:
        self.workdir = pathlib.Path(workdir).resolve()
        #: for pods of a real node that talk to the apiserver (the chart installed for real): the
        #: ServiceAccount admission plugin on (pods get a token volume) and webhooks reached through
        #: their Service's endpoints (--enable-aggregator-routing), since no kube-proxy serves ClusterIPs
        self.in_cluster = in_cluster
        self.controllers = controllers
        self.audit_log = audit_log
        self._bin_dir = bin_dir
        self._tools_dir = tools_dir
        self.pki_dir = self.workdir / "pki"
        self.logs_dir = self.workdir / "logs"
        self.kubeconfigs_dir = self.workdir / "kubeconfigs"
        self.etcd_dir = self.workdir / "etcd"
        self.ready_timeout = READY_TIMEOUT  # per component; bench/envelope.py raises it for 300,000 objects
        self.ca_file = self.pki_dir / "ca.crt"
        self.audit_log_path: pathlib.Path | None = self.workdir / "audit.log" if audit_log else None
        self.url = ""
        self.etcd_url = ""
        self.apiserver_port = 0
        #: ``https://127.0.0.1:PORT`` of kube-scheduler (controllers=True, after start()); its /metrics
        #: needs no token, its certificate is self-signed (verify=False)
        self.scheduler_url = ""
        #: ``https://127.0.0.1:PORT`` of kube-controller-manager (controllers=True, after start()); the
        #: same as scheduler_url for /metrics
        self.controller_manager_url = ""
        self._tokens: dict[str, str] = {}
        self._procs: dict[str, _Proc] = {}
        self._started = False

    # ------------------------------------------------------------------ public API

    @property
    def bin_dir(self) -> pathlib.Path:
        """Folder with the control-plane binaries (resolved, and built if needed, on first use)."""
        if self._bin_dir is None:
            self._bin_dir = binaries.build_control_plane()
        return self._bin_dir

    @property
    def tools_dir(self) -> pathlib.Path:
        """Folder with the real kubectl and helm (never /usr/bin/kubectl)."""
        if self._tools_dir is None:
            self._tools_dir = binaries.client_tools_dir()
        return self._tools_dir

    @property
    def users(self) -> list[str]:
        """The user names that have a token and a kubeconfig."""
        return list(USERS)

    def start(self) -> ControlPlane:
        """Start etcd, kube-apiserver and (controllers=True) the controllers; wait until ready.

        Returns self. On any failure everything started so far is stopped before the error
        propagates. Calling start() on a running control plane raises ControlPlaneError.
        """
        if self._started:
            raise ControlPlaneError("control plane already started")
        self._started = True
        atexit.register(self.stop)
        try:
            self._prepare()
            self._start_etcd()
            self._start_apiserver()
            if self.controllers:
                self._start_controllers()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process: controllers, then kube-apiserver, then etcd (SIGTERM, SIGKILL after 10 s).

        Idempotent; safe when start() failed halfway or never ran. Data stays in workdir.
        """
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self._procs.get(name)
            if proc is not None:
                proc.stop()
        self._started = False
        atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again (same port, flags, certificates and etcd data).

        Returns when /readyz answers ok again; raises ControlPlaneError otherwise. etcd and the
        controllers keep running (the controllers reconnect by themselves).
        """
        proc = self._procs.get("kube-apiserver")
        if proc is None or not self._started:
            raise ControlPlaneError("restart_apiserver() needs a started control plane")
        proc.stop()
        proc.start()
        self._wait_apiserver_ready()

    def token(self, user: str) -> str:
        """The bearer token of `user` (one of USERS). Raises KeyError for an unknown user."""
        try:
            return self._tokens[user]
        except KeyError:
            raise KeyError(f"unknown user {user!r}; known: {', '.join(USERS)}") from None

    def kubeconfig(self, user: str) -> pathlib.Path:
        """Path of `user`'s kubeconfig (CA embedded, token auth). Raises KeyError for an unknown user."""
        self.token(user)
        return self.kubeconfigs_dir / f"{_file_name(user)}.kubeconfig"

    def env(self, user: str = "admin") -> dict[str, str]:
        """os.environ plus KUBECONFIG of `user`, the real kubectl/helm first on PATH, and helm's
        cache/config folders under workdir (so runs do not share state)."""
        helm = self.workdir / "helm"
        return dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig(user)),
            PATH=f"{self.tools_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            HELM_CACHE_HOME=str(helm / "cache"),
            HELM_CONFIG_HOME=str(helm / "config"),
            HELM_DATA_HOME=str(helm / "data"),
        )

    def kubectl(
        self, user: str, *args: str, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl as `user`; return the CompletedProcess (text stdout/stderr captured).

        `input` is fed to stdin (e.g. a manifest for ``apply -f -``). With check=True a non-zero
        exit raises KubectlError, whose message includes stderr. `timeout` is in seconds (default
        none; subprocess.TimeoutExpired when exceeded). Mind kubectl's client-side throttling
        (about 5 requests/s for per-object GETs): deleting 200 objects by name, or with the
        default ``--wait=true``, took 38-76 s here, while ``delete -l LABEL --wait=false`` or
        ``delete -f FILE --wait=false`` took under a second.
        """
        argv = [
            str(self.tools_dir / "kubectl"),
            "--kubeconfig",
            str(self.kubeconfig(user)),
            "--cache-dir",
            str(self.workdir / "kubectl-cache"),
            *args,
        ]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=self.env(user))
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def session(self, user: str = "admin") -> requests.Session:
        """A requests.Session that authenticates as `user` and verifies the apiserver's CA.

        Paths are not prefixed: ``cp.session("alice").get(cp.url + "/api/v1/namespaces")``.
        The session ignores the environment (trust_env=False): otherwise REQUESTS_CA_BUNDLE would
        silently replace the CA, and proxy variables could route loopback traffic.
        """
        sess = _session()
        sess.headers["Authorization"] = f"Bearer {self.token(user)}"
        sess.verify = str(self.ca_file)
        return sess

    def audit_events(self, user: str | None = None, *, stage: str | None = "ResponseComplete") -> list[dict[str, Any]]:
        """Parsed audit events (newest last), optionally only those of `user` and of `stage`.

        stage=None returns every stage. Raises ControlPlaneError when audit_log was not enabled.
        Events are written synchronously (``--audit-log-mode=blocking``), but the ResponseComplete
        event may land just after the client got its response: poll briefly rather than reading once.
        """
        if self.audit_log_path is None:
            raise ControlPlaneError("ControlPlane was created with audit_log=False")
        events = []
        with self.audit_log_path.open() as fh:
            for line in fh:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line being written right now
                if user is not None and event.get("user", {}).get("username") != user:
                    continue
                if stage is not None and event.get("stage") != stage:
                    continue
                events.append(event)
        return events

    def log_path(self, component: str) -> pathlib.Path:
        """The log file of `component` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)."""
        return self.logs_dir / f"{component}.log"

    def check_alive(self) -> None:
        """Raise ControlPlaneError (with the log tail) if a started process has exited."""
        for name, proc in self._procs.items():
            if proc.popen is not None and proc.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {proc.popen.returncode}; last lines of {proc.log_path}:\n{_tail(proc.log_path)}"
                )

    # ------------------------------------------------------------------ start-up steps

    def _prepare(self) -> None:
        if self.etcd_dir.exists() and any(self.etcd_dir.iterdir()):
            raise ControlPlaneError(
                f"{self.workdir} already holds a cluster's etcd data; use an empty folder "
                f"(or `python -m tests.e2e.cluster up --clean --dir {self.workdir}`)"
            )
        missing = [str(self.bin_dir / n) for n in binaries.CONTROL_PLANE if not (self.bin_dir / n).exists()]
        missing += [str(self.tools_dir / n) for n in ("kubectl",) if not (self.tools_dir / n).exists()]
        if missing:
            raise ControlPlaneError(f"missing binaries: {', '.join(missing)}")
        for folder in (self.pki_dir, self.logs_dir, self.kubeconfigs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.etcd_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

        ca = certs.generate_ca(common_name="dra-guard-e2e-ca")
        serving = certs.generate_serving(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        certs.write_bundle(self.pki_dir, ca=ca, serving=serving)
        kubelet_client = _kubelet_client_cert(ca)
        self._write(self.pki_dir / "apiserver-kubelet-client.crt", kubelet_client.cert_pem())
        self._write(self.pki_dir / "apiserver-kubelet-client.key", kubelet_client.key_pem(), private=True)
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._write(
            self.pki_dir / "sa.key",
            sa_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
            ),
            private=True,
        )
        self._write(
            self.pki_dir / "sa.pub",
            sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        )

        self._tokens = {user: secrets.token_hex(24) for user in USERS}
        lines = [f'{self._tokens[u]},{u},{uuid.uuid4()},"{",".join(g)}"' for u, g in USERS.items()]
        self._write(self.workdir / "tokens.csv", ("\n".join(lines) + "\n").encode(), private=True)
        if self.audit_log_path is not None:
            self._write(self.workdir / "audit-policy.yaml", yaml.safe_dump(AUDIT_POLICY).encode())

        self.apiserver_port = free_port()
        self.url = f"https://127.0.0.1:{self.apiserver_port}"
        ca_data = base64.b64encode(self.ca_file.read_bytes()).decode()
        for user in USERS:
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "preferences": {},
                "clusters": [{"name": "e2e", "cluster": {"server": self.url, "certificate-authority-data": ca_data}}],
                "users": [{"name": user, "user": {"token": self._tokens[user]}}],
                "contexts": [{"name": user, "context": {"cluster": "e2e", "user": user, "namespace": "default"}}],
                "current-context": user,
            }
            self._write(self.kubeconfig(user), yaml.safe_dump(config, sort_keys=False).encode(), private=True)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.etcd_dir}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--listen-metrics-urls=",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: _session().get(f"{self.etcd_url}/health", timeout=2).json().get("health") == "true")

    def _start_apiserver(self) -> None:
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.pki_dir}",
            f"--tls-cert-file={self.pki_dir / 'tls.crt'}",
            f"--tls-private-key-file={self.pki_dir / 'tls.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self.pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki_dir / 'sa.key'}",
            # kubeadm's defaults: the Node authorizer and NodeRestriction (what a kubelet identity may
            # do), client certificates signed by the cluster CA (what the controller manager signs
            # for approved CSRs): node identities and CSRs are then real paths here too
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--client-ca-file={self.ca_file}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            *(() if self.in_cluster else ("--disable-admission-plugins=ServiceAccount",)),
            # kube-apiserver's service resolver (cmd/kube-apiserver/app/server.go buildServiceResolver)
            # is used for admission webhooks too: with this flag it picks one of the Service's
            # EndpointSlice addresses instead of the ClusterIP (which nothing routes without kube-proxy)
            *(("--enable-aggregator-routing=true",) if self.in_cluster else ()),
            "--allow-privileged=true",
            # kubeadm's defaults for reaching a kubelet (node proxy, logs, exec): a client certificate
            # of the cluster CA (the kubelet's authentication.x509.clientCAFile; group system:masters,
            # so its SubjectAccessReviews allow it), and the Node's InternalIP before its Hostname.
            # The default order (Hostname first) dials this machine's host name, which resolves to
            # 127.0.0.1 here, and the node proxy refuses loopback ("address not allowed").
            f"--kubelet-client-certificate={self.pki_dir / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={self.pki_dir / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
            # Required with --advertise-address=127.0.0.1: otherwise the apiserver exits with "cannot
            # use public IP 127.0.0.1 with endpoint reconciler: ... may not be in the loopback range".
            # (Without --advertise-address it would advertise the host's first non-loopback address.)
            # The `kubernetes` Service then has no endpoints; nothing here needs them.
            "--endpoint-reconciler-type=none",
            # Without it, SIGTERM with the controllers' watches open left the apiserver waiting
            # until our SIGKILL 10 s later (restart_apiserver() took 12 s instead of 3 s).
            "--shutdown-watch-termination-grace-period=1s",
        ]
        if self.audit_log_path is not None:
            argv += [
                f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log_path}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--audit-log-maxsize=0",
            ]
        self._spawn("kube-apiserver", argv)
        self._wait_apiserver_ready()

    def _start_controllers(self) -> None:
        kcm_port, sched_port = free_port(), free_port()
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig('system:kube-controller-manager')}",
                f"--service-account-private-key-file={self.pki_dir / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                # kubeadm's defaults: every controller with its own ServiceAccount, CSRs signed with the cluster CA
                "--controllers=*,bootstrapsigner,tokencleaner",
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={self.ca_file}",
                f"--cluster-signing-key-file={self.pki_dir / 'ca.key'}",
                "--leader-elect=false",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.pki_dir / 'kcm'}",
                "--kube-api-qps=75",
                "--kube-api-burst=150",
                # default /usr/libexec/kubernetes/kubelet-plugins/volume/exec/, which it would create on the host
                f"--flex-volume-plugin-dir={self.workdir / 'flexvolume'}",
                # /metrics without a token, like the scheduler's (the chart's DRA queries are checked on it)
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig('system:kube-scheduler')}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                f"--cert-dir={self.pki_dir / 'scheduler'}",
                # the source page recommends 75/150 for both kube-controller-manager and kube-scheduler with DRA
                "--kube-api-qps=75",
                "--kube-api-burst=150",
                # /metrics without a token, for bench/scale.py (the default list is /healthz,/readyz,/livez)
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            ],
        )
        self.scheduler_url = f"https://127.0.0.1:{sched_port}"
        self.controller_manager_url = f"https://127.0.0.1:{kcm_port}"
        # Both serve /healthz without authentication (--authorization-always-allow-paths default)
        # over a self-signed certificate they make themselves, hence verify=False.
        for name, port in (("kube-controller-manager", kcm_port), ("kube-scheduler", sched_port)):
            url = f"https://127.0.0.1:{port}/healthz"
            self._wait(name, lambda url=url: _get_insecure(url) == "ok")

    # ------------------------------------------------------------------ helpers

    def _spawn(self, name: str, argv: list[str]) -> None:
        proc = _Proc(name=name, argv=argv, log_path=self.log_path(name))
        self._procs[name] = proc
        proc.start()

    def _wait_apiserver_ready(self) -> None:
        sess = self.session("admin")
        self._wait("kube-apiserver", lambda: sess.get(f"{self.url}/readyz", timeout=5).text == "ok")

    def _wait(self, name: str, probe: Any, timeout: float | None = None) -> None:
        """Call probe() every 0.2 s until it returns True; raise ControlPlaneError with the log tail
        if the process exits or `timeout` seconds (default: self.ready_timeout) pass."""
        timeout = self.ready_timeout if timeout is None else timeout
        proc = self._procs[name]
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while True:
            if not proc.alive():
                code = proc.popen.returncode if proc.popen is not None else None
                raise ControlPlaneError(
                    f"{name} exited with code {code} during start-up; last 50 lines of {proc.log_path}:\n{_tail(proc.log_path)}"
                )
            try:
                if probe():
                    return
                last_error = "probe answered not ready"
            except (requests.RequestException, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} not ready after {timeout:.0f} s ({last_error}); last 50 lines of "
                    f"{proc.log_path}:\n{_tail(proc.log_path)}"
                )
            time.sleep(0.2)

    @staticmethod
    def _write(path: pathlib.Path, data: bytes, *, private: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


def _kubelet_client_cert(ca: certs.KeyPair) -> certs.KeyPair:
    """The apiserver's client certificate for kubelets, as kubeadm's ``apiserver-kubelet-client``:
    signed by `ca`, clientAuth, CN kube-apiserver-kubelet-client in group system:masters."""
    return client_certificate(ca, "kube-apiserver-kubelet-client", groups=("system:masters",), days=30)


def _session() -> requests.Session:
    """A requests.Session that ignores environment variables (CA bundle, proxies, netrc)."""
    sess = requests.Session()
    sess.trust_env = False
    return sess


def _get_insecure(url: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        with _session() as sess:
            return sess.get(url, timeout=2, verify=False).text


# ---------------------------------------------------------------------- command line

_OWN_ENTRIES = (
    "etcd",
    "pki",
    "kubeconfigs",
    "logs",
    "helm",
    "kubectl-cache",
    "flexvolume",
    "tokens.csv",
    "audit-policy.yaml",
    "audit.log",
)


def _clean(workdir: pathlib.Path) -> None:
    """Remove only the entries a ControlPlane creates in `workdir` (never anything else)."""
    for name in _OWN_ENTRIES:
        path = workdir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tests.e2e.cluster``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.cluster",
        description="Run a real Kubernetes control plane (etcd + kube-apiserver, optionally "
        "kube-controller-manager + kube-scheduler) on 127.0.0.1 for manual testing. "
        "Binaries are built on first use (see tests/e2e/README.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="start a control plane and keep it running until Ctrl-C or SIGTERM",
        description="Start etcd and kube-apiserver (and the controllers with --controllers) bound to "
        "127.0.0.1, print the URL and one kubeconfig per user (admin, alice, bob, dra-guard, "
        "...), then stay in the foreground. Ctrl-C or SIGTERM stops every process "
        "(the data stays in DIR). Exit code 1 if start-up fails or a component dies.",
    )
    up.add_argument(
        "--dir",
        required=True,
        type=pathlib.Path,
        help="work folder for etcd data, certificates, kubeconfigs and logs (must not hold a previous cluster unless --clean)",
    )
    up.add_argument("--controllers", action="store_true", help="also run kube-controller-manager and kube-scheduler")
    up.add_argument("--audit-log", action="store_true", help="write an audit log (JSON lines, level Metadata) to DIR/audit.log")
    up.add_argument(
        "--clean", action="store_true", help="first delete what a previous run left in DIR (only the harness's own files)"
    )
    args = parser.parse_args(argv)

    if args.clean:
        _clean(args.dir.resolve())
    cp = ControlPlane(args.dir, controllers=args.controllers, audit_log=args.audit_log)
    stop_requested = threading.Event()
    running = False

    def on_signal(signum: int, _frame: object) -> None:
        if not running:
            raise KeyboardInterrupt  # still starting: abort start(), which stops what it began
        stop_requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    try:
        try:
            cp.start()
        except (ControlPlaneError, binaries.BinariesError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted during start-up", file=sys.stderr)
            return 130
        running = True
        print(f"control plane ready in {time.monotonic() - started:.1f} s", flush=True)
        print(f"URL:        {cp.url}")
        print(f"CA:         {cp.ca_file}")
        print(f"kubectl:    {cp.tools_dir / 'kubectl'}   (not /usr/bin/kubectl)")
        print(f"admin:      export KUBECONFIG={cp.kubeconfig('admin')}")
        print("kubeconfigs:")
        for user in cp.users:
            print(f"  {user:32} {cp.kubeconfig(user)}")
        print(f"logs:       {cp.logs_dir}")
        if cp.audit_log_path:
            print(f"audit log:  {cp.audit_log_path}")
        print("Ctrl-C or SIGTERM stops it.", flush=True)
        while not stop_requested.wait(1.0):
            try:
                cp.check_alive()
            except ControlPlaneError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
        print("stopping ...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let stop() finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cp.stop()
        if running:
            print("stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
