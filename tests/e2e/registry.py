"""A real OCI registry on loopback: Debian's ``docker-registry`` (the reference distribution registry,
github.com/distribution/distribution) for the tests that push the dra-guard image and chart and
install them from there, as a user installs a release.

`Registry(workdir).start()` writes a config file (storage under `workdir`, ``http.addr`` a free port
on 127.0.0.1, plain HTTP, no auth, the access log on) and starts ``docker-registry serve`` as a child
process, like the other real components of tests/e2e; `stop()` ends it (also at interpreter exit).
Everything it stores is under `workdir`: nothing outside it is written or left.

Pushes: `push_image()` copies the image's OCI archive (tests/e2e/image.py) with ``skopeo copy``,
byte for byte (the manifest digest in the registry is the archive's), and returns that digest; the
chart is pushed by ``helm push`` (tests/e2e/test_node_chart_in_cluster.py). `requests()` reads the access
log: who fetched what (method, path, status, user agent), to prove a node pulled from here.

Needs the Debian packages docker-registry and skopeo (tests/e2e/hostdeps.py's list, installed by
tests/run); RegistryError otherwise, naming what is missing.
"""

from __future__ import annotations

import atexit
import pathlib
import re
import subprocess
import time
from dataclasses import dataclass

import requests
import yaml

from tests.e2e.cluster import _Proc, _tail
from tests.serve import free_port

START_TIMEOUT = 30.0
# The access log's combined format: 127.0.0.1 - - [date] "GET /v2/... HTTP/1.1" 200 1234 "" "agent"
_ACCESS = re.compile(
    r'^\S+ - \S+ \[[^\]]+\] "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[0-9.]+" (?P<status>\d{3}) \S+ '
    r'"[^"]*" "(?P<agent>[^"]*)"'
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


class RegistryError(RuntimeError):
    """The registry could not start or a push failed; the message says why, with the log or output tail."""


@dataclass(frozen=True)
class Request:
    """One line of the registry's access log."""

    method: str
    path: str
    status: int
    agent: str


class Registry:
    """``docker-registry serve`` on 127.0.0.1:`port`, its storage and log under `workdir`.

    After `start()`: `host` (``127.0.0.1:PORT``, the name images and charts are pushed under),
    `log_path`. Raises RegistryError from start() when the binary is missing or it does not answer
    ``GET /v2/`` within START_TIMEOUT seconds.
    """

    def __init__(self, workdir: pathlib.Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.log_path = workdir / "registry.log"
        self._proc: _Proc | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def start(self) -> Registry:
        from tests.e2e import hostdeps

        if hostdeps.missing({k: hostdeps.PACKAGES[k] for k in ("docker-registry", "skopeo")}):
            try:
                hostdeps.ensure()
            except RuntimeError as exc:
                raise RegistryError(str(exc)) from exc
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = self.workdir / "config.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "version": 0.1,
                    "log": {"level": "info", "accesslog": {"disabled": False}},
                    "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}, "delete": {"enabled": True}},
                    # plain HTTP on loopback only: nothing outside this machine can reach it
                    "http": {"addr": self.host},
                }
            )
        )
        self._proc = _Proc(name="registry", argv=["docker-registry", "serve", str(config)], log_path=self.log_path)
        self._proc.start()
        atexit.register(self.stop)
        deadline = time.monotonic() + START_TIMEOUT
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not self._proc.alive():
                raise RegistryError(f"docker-registry exited during start-up:\n{self._tail()}")
            try:
                if requests.get(f"{self.url}/v2/", timeout=2).status_code == 200:
                    return self
                last = "not 200"
            except requests.RequestException as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        self.stop()
        raise RegistryError(f"docker-registry did not answer GET /v2/ in {START_TIMEOUT:.0f} s ({last}):\n{self._tail()}")

    def stop(self) -> None:
        """End the registry (idempotent)."""
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        atexit.unregister(self.stop)

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def push_image(self, archive: pathlib.Path, repository: str, tag: str) -> str:
        """Copy the OCI archive `archive` (one image) to `<host>/<repository>:<tag>` with skopeo, as
        is (no conversion, so the digest is the archive's manifest digest); return that digest
        (``sha256:<64 hex>``). Raises RegistryError with skopeo's output when the copy fails."""
        digest_file = self.workdir / f"{repository.replace('/', '_')}-{tag}.digest"
        argv = [
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            "--digestfile",
            str(digest_file),
            f"oci-archive:{archive}",
            f"docker://{self.host}/{repository}:{tag}",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RegistryError(f"{' '.join(argv)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return digest_file.read_text().strip()

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The registry's own answer (header Docker-Content-Digest of ``HEAD /v2/<repository>/manifests/
        <reference>``) for a tag or digest; None when it has no such manifest."""
        resp = requests.head(
            f"{self.url}/v2/{repository}/manifests/{reference}", headers={"Accept": ", ".join(MANIFEST_TYPES)}, timeout=10
        )
        return resp.headers.get("Docker-Content-Digest") if resp.status_code == 200 else None

    def requests(self) -> list[Request]:
        """Every request in the access log so far, oldest first."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        found = []
        for line in text.splitlines():
            m = _ACCESS.match(line)
            if m:
                found.append(Request(m["method"], m["path"], int(m["status"]), m["agent"]))
        return found

    def _tail(self, lines: int = 30) -> str:
        return _tail(self.log_path, lines)
