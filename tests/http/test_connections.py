"""Connections of the real `dra-guard serve` (gunicorn gthread over TLS) under abuse: the
per-worker connection limit holds however connections end, and closing a connection whose client
never closes its side does not stall the worker's other connections (webhook/server.py
DrainingThreadWorker; bench/RESULTS.md "Overload memory")."""
from __future__ import annotations

import os
import pathlib
import socket
import ssl
import time

import pytest

from tests.serve import DraGuardProcess
from webhook.serve.worker import KEEPALIVE_CONNECTIONS

pytestmark = pytest.mark.http

THREADS = 8  # server.threads default
LIMIT = THREADS + KEEPALIVE_CONNECTIONS


@pytest.fixture
def server(tmp_path):
    proc = DraGuardProcess(tmp_path, "--no-cluster")
    try:
        proc.wait("/readyz")
        yield proc
    finally:
        proc.stop()


def worker_pid(server) -> int:
    """The gunicorn worker: the only child of the master (workers: 1)."""
    master = server.proc.pid
    children = [int(c) for task in pathlib.Path(f"/proc/{master}/task").iterdir()
                for c in (task / "children").read_text().split()]
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


def test_connections_that_end_in_a_tls_eof_are_counted_once_and_the_limit_holds(server):
    """A client that goes away during the TLS handshake (what a load generator or an apiserver
    past its webhook timeout does) makes gthread close the socket itself; gunicorn 27 then counts
    the connection out twice, and after enough of them the worker accepts without limit."""
    for _ in range(300):
        socket.create_connection(("127.0.0.1", server.port), timeout=10).close()  # EOF instead of a ClientHello
    assert server.session().get(server.url + "/healthz", timeout=10).status_code == 200
    pid = worker_pid(server)
    time.sleep(0.5)
    idle = []
    try:
        for _ in range(LIMIT + 150):  # silent TCP connections: each one the worker accepts is an fd
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        deadline = time.monotonic() + 3
        most = 0
        while time.monotonic() < deadline:
            most = max(most, open_fds(pid))
            time.sleep(0.1)
        # the worker's own files (listener, logs, pipes) are about a dozen
        assert most <= LIMIT + 30, f"worker holds {most} fds with a limit of {LIMIT} connections"
        assert most >= LIMIT, most  # and it did accept up to the limit
    finally:
        for sock in idle:
            sock.close()
    # the connections over the limit waited in the backlog: once those close, it answers again
    assert server.session().get(server.url + "/healthz", timeout=10).status_code == 200


def test_a_client_that_never_closes_does_not_stall_the_other_connections(server):
    """Clients that stall half-way through a request are cut off after 2 s; gthread then closes
    their sockets in its event loop, waiting up to 2 s each for a FIN that never comes, during
    which no other connection of the worker is served. The close now happens off the event loop."""
    ctx = tls_context(server)
    kept = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=20), server_hostname="localhost")
    stalled = []
    try:
        assert get_healthz(kept).startswith(b"HTTP/1.1 200")
        for _ in range(4):
            tls = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=20),
                                  server_hostname="localhost")
            tls.sendall(b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\n")  # and never the rest, nor a FIN
            stalled.append(tls)
        time.sleep(2.6)  # the server cuts them off after 2 s and starts closing them
        started = time.monotonic()
        assert get_healthz(kept).startswith(b"HTTP/1.1 200")
        waited = time.monotonic() - started
        assert waited < 1.0, f"a kept-alive connection waited {waited:.2f} s behind closing ones"
    finally:
        for sock in [kept, *stalled]:
            sock.close()


def healthz_wait(server) -> float:
    """Seconds another client's /healthz took (asserted 200), 0.3 s after the connections under test opened."""
    time.sleep(0.3)
    started = time.monotonic()
    assert server.session().get(server.url + "/healthz", timeout=10).status_code == 200
    return time.monotonic() - started


def test_silent_connections_do_not_hold_the_worker_threads(server):
    """Connections that send nothing (not even a ClientHello): gthread waits for a first byte in a
    pool thread, 5 s each, so eight of them held every thread; they now wait in the poller."""
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(2 * THREADS)]
    try:
        waited = healthz_wait(server)
        assert waited < 1.0, f"/healthz waited {waited:.2f} s behind {len(silent)} silent connections"
    finally:
        for sock in silent:
            sock.close()


def test_silent_connections_are_dropped_after_the_client_timeout(tmp_path):
    """More silent connections than the limit: each is dropped after 2 s without a first byte
    (not kept for the 75 s keep-alive), so the ones queued behind them get their turn.

    The client behind them waits in the accept queue for several seconds; server.dropAfterSeconds
    is raised so that it is not dropped for that wait (test_kernel_wait.py: with the default 3 s,
    a review whose apiserver has given up is closed unanswered)."""
    server = DraGuardProcess(tmp_path, "--no-cluster", config="server:\n  dropAfterSeconds: 30\n")
    try:
        server.wait("/readyz")
        _silent_connections_are_dropped(server)
    finally:
        server.stop()


def _silent_connections_are_dropped(server) -> None:
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(LIMIT + 50)]
    try:
        started = time.monotonic()
        assert server.session().get(server.url + "/healthz", timeout=20).status_code == 200
        waited = time.monotonic() - started
        assert waited < 8, f"/healthz waited {waited:.2f} s behind {len(silent)} silent connections"
        first = silent[0]
        first.settimeout(5)
        assert first.recv(1) == b""  # closed by the server, long before the keep-alive timeout
    finally:
        for sock in silent:
            sock.close()


def test_a_malformed_rest_of_body_after_an_answer_closes_the_connection_without_a_second_answer(server):
    """A route that does not read the body (here /healthz) answers; gunicorn then drains the body,
    finds it malformed and used to send a second, unsolicited answer on the same connection."""
    tls = tls_context(server).wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10),
                                          server_hostname="localhost")
    with tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200") and data.count(b"HTTP/1.1 ") == 1, data


def test_pipelined_requests_over_tls_are_all_answered(server):
    """Two requests in one write, the first exactly 8,192 bytes (gunicorn's read size): the second
    is then decrypted but unread inside the TLS layer, the socket never turns readable, and
    gthread left it unanswered until the 75 s keep-alive closed the connection."""
    base = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n"
    first = base.replace(b"X-Pad: ", b"X-Pad: " + b"a" * (8192 - len(base)))
    assert len(first) == 8192
    tls = tls_context(server).wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=5),
                                          server_hostname="localhost")
    with tls:
        tls.sendall(first + b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        try:
            while chunk := tls.recv(65536):
                data += chunk
        except TimeoutError:
            pass
    assert data.count(b"HTTP/1.1 200") == 2 and b'"ready"' in data, data


def test_connections_idle_after_their_tls_handshake_do_not_hold_the_worker_threads(server):
    """The kube-apiserver's webhook client (Go's http.Transport) dials a new connection for every
    review of a burst that finds no idle one; a review whose connection is slow to come takes one
    freed meanwhile, and the new connection, its TLS handshake done, waits idle in the client's
    pool for a later review. gthread waited for its first request in a pool thread for the 2 s
    socket timeout: in a burst of 200 through the apiserver, 8 such connections at a time held
    every thread and the reviews behind them got the 3 s webhook timeout. A connection without a
    request after its handshake now waits in the poller, kept alive for a later request."""
    ctx = tls_context(server)
    idle = [ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost")
            for _ in range(2 * THREADS)]  # each returns once the handshake is done, and sends nothing
    try:
        waited = healthz_wait(server)
        assert waited < 1.0, f"/healthz waited {waited:.2f} s behind {len(idle)} connections idle after their handshake"
        time.sleep(2.5)  # past the 2 s socket timeout: still kept alive, like a connection after an answer
        assert get_healthz(idle[0]).startswith(b"HTTP/1.1 200")
    finally:
        for sock in idle:
            sock.close()


def handshakes(server) -> float:
    """dra_guard_tls_handshakes_total, read over a connection of its own (counted too)."""
    text = server.session().get(server.url + "/metrics").text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("dra_guard_tls_handshakes_total ")))


def test_every_new_connection_is_counted_as_a_tls_handshake_and_kept_alive_requests_are_not(server):
    """dra_guard_tls_handshakes_total tells operators how many reviews pay for a new connection
    (a client that dials instead of reusing its connections costs the worker a handshake each)."""
    start = handshakes(server)
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        with tls_context(server).wrap_socket(raw, server_hostname="localhost") as tls:
            for _ in range(5):  # one connection, five requests
                assert get_healthz(tls).startswith(b"HTTP/1.1 200")
    after_one = handshakes(server)
    assert after_one - start == 2  # the connection above and the scrape's own
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            with tls_context(server).wrap_socket(raw, server_hostname="localhost") as tls:
                assert get_healthz(tls).startswith(b"HTTP/1.1 200")
    assert handshakes(server) - after_one == 4
