"""Run the real `dra-guard serve` (gunicorn over TLS) as a subprocess for tests."""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import requests


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DraGuardProcess:
    """`dra-guard serve --self-signed DIR` on 127.0.0.1:PORT with extra arguments; stop() ends it.

    url: https://127.0.0.1:PORT; ca_file: the development CA to verify it with; log_file: its stderr.
    """

    def __init__(self, workdir: pathlib.Path, *args: str, config: str | None = None, env: dict[str, str] | None = None,
                 port: int | None = None, ca_file: pathlib.Path | None = None) -> None:
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
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})

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
