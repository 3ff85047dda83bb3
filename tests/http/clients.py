"""Clients for the tests of the real `dra-guard serve`: raw TLS connections, one HTTP answer read
off a kept-alive connection, the apiserver-like honest client, slowloris tricklers, and the
worker's process facts (/proc). Plain functions: the fixtures are in conftest.py."""

from __future__ import annotations

import json
import os
import pathlib
import random
import select
import socket
import ssl
import threading
import time

import certs
from tests import builders
from tests.builders import eviction_request
from tests.serve import DraGuardProcess, client_certificate, free_port
from webhook.serve.front.capacity import KEEPALIVE_CONNECTIONS

THREADS = 8  # server.threads default
LIMIT = THREADS + KEEPALIVE_CONNECTIONS


def worker_pid(server) -> int:
    """The gunicorn worker: the only child of the master (workers: 1)."""
    master = server.proc.pid
    children = [
        int(c) for task in pathlib.Path(f"/proc/{master}/task").iterdir() for c in (task / "children").read_text().split()
    ]
    assert len(children) == 1, children
    return children[0]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def tls_context(server) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(server.ca_file))


def read_response(tls: ssl.SSLSocket) -> tuple[bytes, bytes]:
    """One HTTP answer from a kept-alive connection: (head, Content-Length body); fails the test
    when the server closes the connection before it is whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        chunk = tls.recv(65536)
        assert chunk, "connection closed in the body"
        body += chunk
    return head, body


def get_healthz(tls: ssl.SSLSocket) -> bytes:
    """GET /healthz on a kept-alive connection; the whole answer (head and Content-Length body)."""
    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head, body = read_response(tls)
    return head + b"\r\n\r\n" + body


def healthz_wait(server) -> float:
    """Seconds another client's /healthz took (asserted 200), 0.3 s after the connections under test opened."""
    time.sleep(0.3)
    started = time.monotonic()
    assert server.session().get(server.url + "/healthz", timeout=10).status_code == 200
    return time.monotonic() - started


def apiserver_post(path: str, request: dict, uid: str) -> bytes:
    """A whole POST of an AdmissionReview as the kube-apiserver writes it: kind, apiVersion, then
    `request` with `uid` first (what the front's overload answer reads from the body's head)."""
    # a dict keeps its first key's place when the key is set again: uid stays first
    body = json.dumps(
        {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {**request, "uid": uid}}
    ).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def review_bytes(uid: str) -> bytes:
    """An eviction review (not of a driver pod: judged allowed), as the kube-apiserver writes it."""
    return apiserver_post("/validate/evictions", eviction_request("gpu-driver-x"), uid)


def rbac_review_bytes(uid: str) -> bytes:
    """A ClusterRoleBinding create review as the kube-apiserver writes it: with --no-cluster its
    role is unknown, so it is judged allowed."""
    binding = builders.binding("b", "missing-role", [builders.subject("Group", "team-a")])
    return apiserver_post("/validate/rbac", builders.review(binding)["request"], uid)


def answer(tls: ssl.SSLSocket) -> dict:
    """Read one HTTP answer and return its JSON body."""
    return json.loads(read_response(tls)[1])


def connect(server, timeout: float = 5) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return tls_context(server).wrap_socket(raw, server_hostname="localhost")


def review_seconds(server, make=review_bytes, count: int = 21) -> float:
    """The median seconds one review takes on this machine now, from send to whole answer, on one
    kept-alive connection of an idle `server` (after one review that warms it up): what a test that
    loads the server scales its deadline or its burst by, so that it asserts behaviour, not speed.
    make(uid): the review's bytes (review_bytes, rbac_review_bytes)."""
    tls = connect(server, timeout=30)
    try:
        tls.sendall(make("warm-up"))
        answer(tls)
        times = []
        for i in range(count):
            started = time.monotonic()
            tls.sendall(make(f"measure-{i}"))
            assert answer(tls)["response"]["uid"] == f"measure-{i}"
            times.append(time.monotonic() - started)
    finally:
        tls.close()
    return sorted(times)[count // 2]


def judged_within(tls: ssl.SSLSocket, uid: str) -> float:
    """Send one eviction review on `tls`; assert it was judged (a non-driver pod: allowed) and
    return the seconds it took."""
    started = time.monotonic()
    tls.sendall(review_bytes(uid))
    response = answer(tls)["response"]
    assert response["uid"] == uid and response["allowed"] is True, response
    return time.monotonic() - started


WEBHOOK_TIMEOUT = 3.0  # the eviction webhook's timeoutSeconds; failurePolicy Ignore


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle connection turned readable (the server closed it). poll, not select: the
    flood below holds thousands of descriptors, past select()'s 1024."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def trickle(ctx: ssl.SSLContext, port: int, first_line: bytes, stop: threading.Event, every: float = 1.5) -> None:
    """One slowloris client (A1): `first_line` (a request line, or more), then one byte every `every`
    seconds (1.5: under a 2 s bound per read, were there one; TCP_NODELAY, so each is a packet); dials again
    when cut off, until `stop`."""
    time.sleep(random.uniform(0, 2.5))
    while not stop.is_set():
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(first_line)
                for _ in range(int(10 / every)):
                    if stop.wait(every):
                        return
                    tls.sendall(b"a")
        except OSError:
            pass


def honest_under_tricklers(honest: HonestClient, ctx: ssl.SSLContext, port: int, first_line: bytes, every: float = 1.5) -> None:
    """16 tricklers (trickle) on `port` while `honest` sends an eviction review every 0.3 s for 10 s;
    asserts every review was answered within the webhook timeout."""
    stop = threading.Event()
    attackers = [threading.Thread(target=trickle, args=(ctx, port, first_line, stop, every), daemon=True) for _ in range(16)]
    for t in attackers:
        t.start()
    try:
        honest.run(seconds=10, period=0.3)
    finally:
        stop.set()
        for t in attackers:
            t.join(3)
    assert not honest.failures, (
        f"{len(honest.failures)} of {len(honest.failures) + honest.answered} eviction reviews "
        f"not answered within {WEBHOOK_TIMEOUT} s: {honest.failures}"
    )


class HonestClient:
    """What the apiserver's webhook client does: reuse its idle kept-alive connection, else dial a
    new one; every review has WEBHOOK_TIMEOUT seconds in all (dial, TLS handshake, answer).
    failures: (seconds since start, reused or new, what went wrong) of each review that got no
    answer in time: for the eviction webhook each one is an eviction let through unjudged."""

    def __init__(self, server) -> None:
        self.server = server
        self.ctx = tls_context(server)
        self.conn: ssl.SSLSocket | None = None
        self.answered = 0
        self.failures: list[tuple[float, str, str]] = []
        self.t0 = time.monotonic()

    def review(self, uid: str) -> None:
        started = time.monotonic()
        if self.conn is not None and closed_by_peer(self.conn):
            self.conn.close()  # closed by the server while idle: Go's readLoop sees it and dials anew
            self.conn = None
        kind = "reused" if self.conn is not None else "new"
        try:
            if self.conn is None:
                raw = socket.create_connection(("127.0.0.1", self.server.port), timeout=WEBHOOK_TIMEOUT)
                self.conn = self.ctx.wrap_socket(raw, server_hostname="localhost")
            self.conn.settimeout(max(0.01, WEBHOOK_TIMEOUT - (time.monotonic() - started)))
            self.conn.sendall(review_bytes(uid))
            head, body = read_response(self.conn)
            assert json.loads(body)["response"]["uid"] == uid
            if b"connection: close" in head.lower():
                self.conn.close()
                self.conn = None
            self.answered += 1
        except (OSError, AssertionError) as exc:
            self.failures.append((round(started - self.t0, 2), kind, f"{type(exc).__name__}: {exc}"[:100]))
            if self.conn is not None:
                self.conn.close()
            self.conn = None

    def run(self, seconds: float, period: float) -> None:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            self.review(f"honest-{i}")
            i += 1
            time.sleep(period)
        if self.conn is not None:
            self.conn.close()


def client_auth_server(tmp_path):
    """dra-guard with server.clientCAFile (a test CA) and server.probePort: (the DraGuardProcess, the
    probe port, the (cert, key) files of a client certificate as the apiserver's)."""
    client_ca = certs.generate_ca(common_name="apiserver-client-ca")
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem())
    good = write_pair(tmp_path, "apiserver", client_certificate(client_ca))
    probe_port = free_port()
    proc = DraGuardProcess(
        tmp_path, "--no-cluster", config=(f"server:\n  clientCAFile: {tmp_path / 'client-ca.crt'}\n  probePort: {probe_port}\n")
    )
    return proc, probe_port, good


def write_pair(folder, name, pair):
    (folder / f"{name}.crt").write_bytes(pair.cert_pem())
    (folder / f"{name}.key").write_bytes(pair.key_pem())
    return str(folder / f"{name}.crt"), str(folder / f"{name}.key")


def exchange(server, payload: bytes, *, read=True) -> bytes:
    ctx = ssl.create_default_context(cafile=str(server.ca_file))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(payload)
            data = b""
            while read and b"\r\n\r\n" not in data:
                data += tls.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
            )
            while len(body) < length:
                body += tls.recv(65536)
            return head + b"\r\n\r\n" + body


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int, field: str) -> int:
    import pathlib

    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")
