"""API and network failures of the commands that talk to the API (`audit --cluster`, `drain-plan
NODE`, `drain NODE`, `serve`'s start-up, the chart's hooks `hook pre-delete` and `hook test`): one line on stderr naming the server and the cause, exit 2, never a
traceback, and nothing on stdout. Exit 1 means "would refuse" / "must wait" and never an outage:
`until dra-guard drain-plan NODE; do sleep 10; done` and CI jobs rely on it.

The failures are real: a closed local port, a kubeconfig whose CA is not the apiserver's, a token
the apiserver does not know, a ServiceAccount without permissions on the real apiserver, and a local TCP
server that accepts connections and never answers.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pathlib
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

import certs
from tests.serve import free_port

#: seconds each request may take in the timeout cases (audit/drain-plan --request-timeout, serve's
#: cluster.requestTimeoutSeconds)
TIMEOUT = 1
#: what `serve` may take before the test gives up on it (it would otherwise serve on, never ready)
SERVE_LIMIT = 30.0


class Endpoint:
    """A kubeconfig that fails in one way: its server URL and the cause the error must name."""

    def __init__(self, kubeconfig: pathlib.Path, server: str, cause: str) -> None:
        self.kubeconfig, self.server, self.cause = kubeconfig, server, cause


def variant(
    cp, user: str, path: pathlib.Path, *, server: str | None = None, ca: bytes | None = None, token: str | None = None
) -> pathlib.Path:
    """`user`'s kubeconfig with its server, CA or token replaced, written to `path`."""
    config = yaml.safe_load(cp.kubeconfig(user).read_text())
    cluster, creds = config["clusters"][0]["cluster"], config["users"][0]["user"]
    if server is not None:
        cluster["server"] = server
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    if token is not None:
        creds["token"] = token
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def silent_server():
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte: its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        for conn in held:
            conn.close()


#: a ServiceAccount no test binds anything to: User bob may gain rights from other tests of the session
NOBODY_NAMESPACE = "e2e-cli-errors"
NOBODY = f"system:serviceaccount:{NOBODY_NAMESPACE}:nobody"


def nobody_token(cp) -> str:
    """A token of ServiceAccount NOBODY (TokenRequest): authenticated, with no permissions."""
    cp.kubectl("admin", "create", "namespace", NOBODY_NAMESPACE, check=False)
    cp.kubectl("admin", "create", "serviceaccount", "nobody", "-n", NOBODY_NAMESPACE, check=False)
    return cp.kubectl("admin", "create", "token", "nobody", "-n", NOBODY_NAMESPACE, "--duration=1h").stdout.strip()


@pytest.fixture(scope="module")
def endpoints(control_plane, tmp_path_factory, silent_server):
    """kind -> Endpoint: refused, tls, 401, 403, timeout."""
    cp = control_plane
    folder = tmp_path_factory.mktemp("kubeconfigs")
    closed = f"https://127.0.0.1:{free_port()}"  # free now, and nothing here listens on it
    return {
        "refused": Endpoint(variant(cp, "admin", folder / "refused", server=closed), closed, "connection refused"),
        "tls": Endpoint(
            variant(cp, "admin", folder / "tls", ca=certs.generate_ca(common_name="not-the-cluster-ca").cert_pem()),
            cp.url,
            "TLS verification failed",
        ),
        "401": Endpoint(
            variant(cp, "admin", folder / "401", token="not-a-token-the-apiserver-knows"), cp.url, "401 Unauthorized"
        ),
        "403": Endpoint(
            variant(cp, "admin", folder / "403", token=nobody_token(cp)), cp.url, f'403 Forbidden (User "{NOBODY}" cannot '
        ),
        "timeout": Endpoint(
            variant(cp, "admin", folder / "timeout", server=silent_server), silent_server, f"no answer within {TIMEOUT} s"
        ),
    }


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """Serving certificate files for `serve` (--tls-cert-file, --tls-key-file): no --self-signed
    line on stderr, so the error is the only line."""
    folder = tmp_path_factory.mktemp("tls")
    ca = certs.generate_ca()
    certs.write_bundle(folder, ca=ca, serving=certs.generate_serving(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"]))
    return folder


def run(argv: list[str], *, limit: float) -> subprocess.CompletedProcess[str]:
    """Run `python -m webhook.cli ARGV` in a process group of its own; after `limit` seconds the
    group is killed (gunicorn's workers with it) and the test fails."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"dra-guard {argv[0]} still ran after {limit} s; stderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def command(
    name: str, endpoint: Endpoint, tmp_path: pathlib.Path, serving: pathlib.Path, *, short: bool, wait: bool = True
) -> list[str]:
    """The argv of command `name` against `endpoint`; short: each request may take TIMEOUT seconds;
    wait False: `serve` does not retry a transient failure (cluster.startupWaitSeconds 0)."""
    kubeconfig = ["--kubeconfig", str(endpoint.kubeconfig)]
    timeout = ["--request-timeout", str(TIMEOUT)] if short else []
    if name == "audit":
        return ["audit", "--cluster", *kubeconfig, *timeout]
    if name in ("drain-plan", "drain"):
        return [name, "node-a", *kubeconfig, *timeout]
    if name == "hook-pre-delete":  # no retries: the first failure is the answer
        return ["hook", "pre-delete", "--webhook-configuration", "dra-guard", "--retry-seconds", "0", *kubeconfig, *timeout]
    if name == "hook-test":
        return [
            "hook",
            "test",
            "--slice-writer-role",
            "dra-guard-test-slice-writer",
            "--binding-name",
            "dra-guard-helm-test",
            *kubeconfig,
            *timeout,
        ]
    config = tmp_path / "config.yaml"
    cluster = {"requestTimeoutSeconds": TIMEOUT} if short else {}
    if not wait:
        cluster["startupWaitSeconds"] = 0
    config.write_text(yaml.safe_dump({"cluster": cluster}))
    return [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--config",
        str(config),
        "--tls-cert-file",
        str(serving / "tls.crt"),
        "--tls-key-file",
        str(serving / "tls.key"),
        *kubeconfig,
    ]


def assert_one_line(result: subprocess.CompletedProcess[str], endpoint: Endpoint) -> str:
    """Exit 2, stdout empty, stderr one line naming the server and the cause (besides audit's line
    naming the configuration it judges with, once it has one); the line."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "", result.stdout
    lines = [line for line in result.stderr.splitlines() if not line.startswith("dra-guard: config: ")]
    assert len(lines) == 1, result.stderr
    [line] = lines
    assert line.startswith("dra-guard: error: cannot "), line
    assert f" from {endpoint.server}: " in line and endpoint.cause in line, line
    return line


#: failures that may pass in a moment (an apiserver restarting): `serve` retries them at start-up
#: for cluster.startupWaitSeconds (60 s by default; 0 here), the others end it at once
TRANSIENT = {"refused", "timeout"}


@pytest.mark.parametrize("name", ["audit", "drain-plan", "drain", "serve", "hook-pre-delete", "hook-test"])
@pytest.mark.parametrize("kind", ["refused", "tls", "401", "403", "timeout"])
def test_an_api_failure_is_one_line_naming_the_server_and_the_cause_with_exit_2(kind, name, endpoints, serving, tmp_path):
    endpoint = endpoints[kind]
    started = time.monotonic()
    result = run(
        command(name, endpoint, tmp_path, serving, short=kind == "timeout", wait=kind not in TRANSIENT),
        limit=SERVE_LIMIT if name == "serve" else 60.0,
    )
    line = assert_one_line(result, endpoint)
    if kind == "timeout":  # the first request's timeout, not a default's
        assert time.monotonic() - started < TIMEOUT + 8, line


def test_audit_names_the_list_the_user_may_not_make_and_the_way_around_the_installed_config(endpoints, tmp_path):
    nobody = endpoints["403"]  # a user without permissions
    # the installed release's configuration is read first; the line says how to do without it
    line = assert_one_line(run(["audit", "--cluster", "--kubeconfig", str(nobody.kubeconfig)], limit=60), nobody)
    assert line.startswith("dra-guard: error: cannot list configmaps"), line
    assert line.endswith("; pass --config FILE or --no-installed-config"), line
    line = assert_one_line(
        run(["audit", "--cluster", "--kubeconfig", str(nobody.kubeconfig), "--no-installed-config"], limit=60), nobody
    )
    # the first list the user may not make: named, with its reason
    found = re.match(
        rf"dra-guard: error: cannot list (\w+) from {re.escape(nobody.server)}: 403 Forbidden "
        rf'\(User "{re.escape(NOBODY)}" cannot list resource "(\w+)"',
        line,
    )
    assert found and found.group(1) == found.group(2), line


def test_drain_plan_of_a_node_that_does_not_exist_is_exit_2(control_plane, tmp_path):
    cp = control_plane
    result = run(["drain-plan", "no-such-node", "--kubeconfig", str(cp.kubeconfig("admin"))], limit=60)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.splitlines() == [f"dra-guard: error: node no-such-node not found in {cp.url}"]


def test_serve_waits_for_an_api_that_comes_up_within_startup_wait_seconds(control_plane, serving, tmp_path):
    """An apiserver restarting while dra-guard starts (connection refused): `serve` says so in one
    line per try on stderr and serves once the API answers, instead of exiting 2 into a pod's
    crash-loop back-off (minutes down). The API here is a TCP relay to the real apiserver that
    starts listening only after serve's first failed try."""
    cp = control_plane
    api = socket.socket()
    api.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    api_port = free_port()
    kubeconfig = variant(cp, "admin", tmp_path / "later", server=f"https://127.0.0.1:{api_port}")
    argv = command("serve", Endpoint(kubeconfig, "", ""), tmp_path, serving, short=False)
    port = int(argv[argv.index("--port") + 1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", *argv], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 20
        while not any("not usable yet" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.1)
        assert "connection refused" in lines[0] and "cluster.startupWaitSeconds" in lines[0], lines
        api.bind(("127.0.0.1", api_port))
        api.listen(64)
        upstream = urllib.parse.urlsplit(cp.url)
        threading.Thread(target=relay, args=(api, (upstream.hostname, upstream.port), stop), daemon=True).start()
        context = ssl.create_default_context(cafile=str(serving / "ca.crt"))
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "".join(lines)
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
    finally:
        stop.set()
        api.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def relay(listener: socket.socket, upstream: tuple[str, int], stop: threading.Event) -> None:
    """Accept on `listener` and copy bytes both ways to `upstream` until `stop` is set."""

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except OSError:
            return
        server = socket.create_connection(upstream)
        threading.Thread(target=pipe, args=(client, server), daemon=True).start()
        threading.Thread(target=pipe, args=(server, client), daemon=True).start()
