"""Run the real `dra-guard serve` (gunicorn over TLS) as a subprocess for tests."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import certs

#: ports this process has handed out: never handed out twice (two servers of one test, etcd's pair)
_HANDED_OUT: set[int] = set()


def _ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """Linux's range of ports for outgoing connections (inclusive); 32768-60999 where unreadable."""
    try:
        low, high = (int(part) for part in pathlib.Path(path).read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _worker_slice(first: int, end: int) -> tuple[int, int]:
    """The part of the ports [first, end) for this pytest-xdist worker (PYTEST_XDIST_WORKER gwN of
    PYTEST_XDIST_WORKER_COUNT, set by xdist in each worker); all of them outside xdist."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return first, end
    span = (end - first) // count
    index = int(worker[2:]) % count
    return first + index * span, first + (index + 1) * span


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for a server the test is about to start.

    Chosen at random *below* the kernel's ephemeral range (and below Kubernetes' NodePort range,
    30000-32767): a port the kernel picks for bind(0)
    lies inside that range, where every outgoing connection of a busy test (a flood of hundreds)
    also takes its local port, so it could be taken between this call and the server's bind.
    Each candidate is checked by binding it (without SO_REUSEADDR, so ports in TIME_WAIT are
    skipped), and none is handed out twice by one process. In a pytest-xdist worker (tests/run runs
    the suite in two), only the worker's own slice of that range: two workers never hand out the
    same port. Raises RuntimeError when 200 tries fail.
    """
    low, _ = _ephemeral_range()
    first, end = (10000, min(low, 30000)) if low > 11000 else (1024, low)  # 30000-32767: NodePorts
    first, end = _worker_slice(first, end)
    for _ in range(200):
        port = random.randrange(first, end)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {first}-{end - 1} after 200 tries")


class DraGuardProcess:
    """`dra-guard serve --self-signed DIR` on 127.0.0.1:PORT with extra arguments; stop() ends it.

    url: https://127.0.0.1:PORT; ca_file: the development CA to verify it with; log_file: its stderr.
    """

    def __init__(
        self,
        workdir: pathlib.Path,
        *args: str,
        config: str | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        ca_file: pathlib.Path | None = None,
    ) -> None:
        """args: extra `serve` arguments. ca_file: given when the server is not run with --self-signed
        (e.g. certificates.mode self): the CA bundle to verify it with; --self-signed is then left out."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca_file = ca_file or workdir / "tls" / "ca.crt"
        self.log_file = workdir / "dra-guard.log"
        tls = [] if ca_file else ["--self-signed", str(workdir / "tls")]
        cmd = [sys.executable, "-m", "webhook.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *tls, *args]
        if config is not None:
            cfg = workdir / "config.yaml"
            cfg.write_text(config)
            cmd += ["--config", str(cfg)]
        self._log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )

    def session(self) -> requests.Session:
        """A requests Session that verifies the server against the development CA."""
        s = requests.Session()
        s.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would override verify (requests#3829)
        s.verify = str(self.ca_file)
        return s

    def wait(self, path: str = "/healthz", timeout: float = 30.0) -> None:
        """Wait until GET path answers 200; raise with the log when the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dra-guard exited with {self.proc.returncode}:\n{self.log()}")
            if self.ca_file.exists():
                try:
                    if requests.get(self.url + path, verify=str(self.ca_file), timeout=2).status_code == 200:
                        return
                except requests.RequestException:
                    pass
            time.sleep(0.1)
        log = self.log()
        self.stop()  # never leave a server behind when a test gives up on it
        raise TimeoutError(f"dra-guard did not answer {path} within {timeout} s:\n{log}")

    def log(self) -> str:
        """What the server wrote so far (last 8 KiB)."""
        return self.log_file.read_bytes()[-8192:].decode(errors="replace")

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Stop the process group: SIGINT (gunicorn's quick shutdown, the default for tests) or
        SIGTERM (graceful: drain), SIGKILL after 20 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._log.close()


def client_certificate(
    ca: certs.KeyPair, name: str = "kube-apiserver", *, groups: tuple[str, ...] = (), days: int = 1
) -> certs.KeyPair:
    """A client certificate (clientAuth EKU) signed by `ca`, like the one an apiserver is given:
    CN `name`, an O per group in `groups` (Kubernetes reads them as the user's groups), valid
    `days` days (and 5 minutes before now)."""
    import datetime

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name(
        [*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups), x509.NameAttribute(NameOID.COMMON_NAME, name)]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return certs.KeyPair(cert=cert, key=key)
