"""HTTP/1.1 framing on the wire, the same for both engines: malformed and oversized bodies and heads
are answered with a JSON error (never an HTML page, never a second unsolicited answer), any
Transfer-Encoding before its body is read (the kube-apiserver always sends a Content-Length:
tests/e2e/test_webhook_request_framing.py), pipelined requests are all answered, and no framing can
spin the worker (finding B1: a chunk size of "-6")."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import time

import pytest

from tests.http.clients import (
    WEBHOOK_TIMEOUT,
    HonestClient,
    client_auth_server,
    cpu_seconds,
    exchange,
    tls_context,
    worker_pid,
)

pytestmark = pytest.mark.http

NEGATIVE_CHUNK = (
    b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\n"
)


def test_a_negative_chunk_size_does_not_spin_a_thread_forever(server):
    """Finding B1: request_complete parses a chunk size with int(x, 16), which takes a sign: a
    chunk-size line "-6" sends _chunked_body_complete back to the start of the same line
    (pos = eol + 2 + size + 2), an endless loop in the pool thread that called _gather (no read,
    no deadline check inside). 8 such requests (55 bytes each, sent once, the connections then
    closed) spin all 8 pool threads for good: every later eviction review goes unanswered
    (failurePolicy Ignore: allowed) until the worker restarts; the worker burns 100% CPU. That
    scanner is gone: both engines answer a chunked request 411 from its head."""
    ctx = tls_context(server)
    for _ in range(8):
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=5), server_hostname="localhost") as tls:
            tls.sendall(NEGATIVE_CHUNK)
            time.sleep(0.05)
    time.sleep(0.5)
    pid = worker_pid(server)
    cpu = cpu_seconds(pid)
    honest = HonestClient(server)
    try:
        honest.run(seconds=4, period=0.3)
        burned = cpu_seconds(pid) - cpu
    finally:
        os.kill(pid, signal.SIGKILL)  # its spinning threads would hold the fixture's stop for 20 s
    assert not honest.failures, (
        f"{len(honest.failures)} of {len(honest.failures) + honest.answered} eviction reviews "
        f"not answered within {WEBHOOK_TIMEOUT} s (worker CPU {burned:.1f} s in ~4 s): "
        f"{honest.failures[:3]}"
    )


def test_a_negative_chunk_size_on_the_probe_port_does_not_stop_reviews_from_the_apiserver(tmp_path):
    """Finding B1 without any certificate: with server.clientCAFile set, the probe port asks none,
    and _gather runs for its connections too (before the app refuses reviews there). 8 chunked
    requests with a chunk-size line "-6" sent there spin the 8 pool threads for good: the
    apiserver's reviews (with its client certificate) on the admission port go unanswered."""
    import ssl

    proc, probe_port, good = client_auth_server(tmp_path)
    try:
        deadline = time.monotonic() + 15
        while not (tmp_path / "tls" / "ca.crt").exists() or proc.proc.poll() is not None:
            assert time.monotonic() < deadline and proc.proc.poll() is None, proc.log()
            time.sleep(0.1)
        honest = HonestClient(proc)
        honest.ctx = ssl.create_default_context(cafile=str(proc.ca_file))
        honest.ctx.load_cert_chain(*good)
        while True:
            honest.failures.clear()
            honest.review("before")
            if not honest.failures:
                break
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.2)
        probe_ctx = ssl.create_default_context(cafile=str(proc.ca_file))  # no client certificate
        for _ in range(8):
            with probe_ctx.wrap_socket(
                socket.create_connection(("127.0.0.1", probe_port), timeout=5), server_hostname="localhost"
            ) as tls:
                tls.sendall(NEGATIVE_CHUNK)
                time.sleep(0.05)
        time.sleep(0.5)
        honest.run(seconds=4, period=0.3)
        assert not honest.failures, (
            f"{len(honest.failures)} of {len(honest.failures) + honest.answered} eviction "
            f"reviews not answered within {WEBHOOK_TIMEOUT} s: {honest.failures[:3]}"
        )
    finally:
        try:
            os.kill(worker_pid(proc), signal.SIGKILL)  # its spinning threads would hold stop() for 20 s
        except (AssertionError, OSError):
            pass
        proc.stop()


def test_a_malformed_rest_of_body_after_an_answer_closes_the_connection_without_a_second_answer(server):
    """A route that does not read the body (here /healthz) answered; gunicorn then drained the body,
    found it malformed and sent a second, unsolicited answer on the same connection. Any
    Transfer-Encoding is now answered 411 before the app: one answer, then the connection closed."""
    tls = tls_context(server).wrap_socket(
        socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost"
    )
    with tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 411 ") and data.count(b"HTTP/1.1 ") == 1, data


def test_pipelined_requests_over_tls_are_all_answered(server):
    """Two requests in one write, the first exactly 8,192 bytes (gunicorn's read size): the second
    is then decrypted but unread inside the TLS layer, the socket never turns readable, and
    gthread left it unanswered until the 75 s keep-alive closed the connection."""
    base = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n"
    first = base.replace(b"X-Pad: ", b"X-Pad: " + b"a" * (8192 - len(base)))
    assert len(first) == 8192
    tls = tls_context(server).wrap_socket(
        socket.create_connection(("127.0.0.1", server.port), timeout=5), server_hostname="localhost"
    )
    with tls:
        tls.sendall(first + b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        try:
            while chunk := tls.recv(65536):
                data += chunk
        except TimeoutError:
            pass
    assert data.count(b"HTTP/1.1 200") == 2 and b'"ready"' in data, data


def test_malformed_body_gets_400_json_through_gunicorn(server):
    rv = server.session().post(server.url + "/validate/rbac", data=b"{", headers={"Content-Type": "application/json"})
    assert rv.status_code == 400 and "error" in rv.json()


def test_a_chunked_body_is_refused_from_its_head_with_a_json_error(server):
    """411 before any of the body is read, malformed (a chunk size "zz") or not: a chunked body cannot
    be checked against server.maxRequestBytes before it is read, and a framing parser of our own in
    front of gunicorn's (gthread parses with blocking reads) is where finding B1 looped forever."""
    for body in (b"zz\r\n", b"", b"3\r\nabc\r\n0\r\n\r\n"):
        answer = exchange(
            server,
            b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + body,
        )
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 411 ") and b"content-type: application/json" in head.lower(), answer
        assert "Content-Length" in json.loads(payload)["error"]


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),  # request line over 8190 bytes
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(120)) + b"\r\n", 431),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400),
    ],
)
def test_requests_gunicorn_refuses_itself_get_json_not_html(server, raw, status):
    """Protocol errors gunicorn answers before the app sees the request: JSON like every other error."""
    import json as _json

    ctx = ssl.create_default_context(cafile=str(server.ca_file))
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost") as tls:
        tls.sendall(raw)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    assert b"content-type: application/json" in head.lower() and b"<html" not in body
    assert _json.loads(body)["error"]


@pytest.mark.parametrize(
    "head, status",
    [
        (
            b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999\r\n\r\n",
            413,
        ),  # over server.maxRequestBytes: refused before it is read
        (
            b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10\r\nContent-Length: 11\r\n\r\n",
            400,
        ),  # conflicting framing
        (b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 70000 + b"\r\n\r\n", 431),  # a head over 64 KiB
    ],
)
def test_framing_that_cannot_be_checked_before_the_body_is_refused_with_json(server, head, status):
    """Answered from the request head, with a JSON error, without reading a body."""
    answer = exchange(server, head)
    head_line, _, body = answer.partition(b"\r\n\r\n")
    assert head_line.startswith(b"HTTP/1.1 %d " % status), head_line
    assert b"content-type: application/json" in head_line.lower() and json.loads(body)["error"]


def test_a_request_trickled_past_the_read_limit_gets_408_json(server):
    """A request whose bytes take longer than 5 s from its first is answered 408 with a JSON error
    and the connection closed; the client timeout is one warning line, counted."""
    with tls_context(server).wrap_socket(
        socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost"
    ) as tls:
        started = time.monotonic()
        tls.sendall(b"POST /validate/evictions HTTP/1.1\r\n")
        data = b""
        try:
            while time.monotonic() - started < 8:
                tls.sendall(b"X")
                time.sleep(0.5)
        except OSError:
            pass
        try:
            while chunk := tls.recv(65536):
                data += chunk
        except OSError:
            pass
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"].startswith("Request Timeout")
    assert '"client timed out' in server.log()
