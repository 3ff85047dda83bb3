"""HTTP/1.1 framing on the wire: malformed and oversized bodies and heads
are answered with a JSON error (never an HTML page, never a second unsolicited answer), any
Transfer-Encoding before its body is read (the kube-apiserver always sends a Content-Length:
tests/e2e/test_webhook_request_framing.py), pipelined requests are all answered, and no framing can
spin the worker (finding B1: a chunk size of "-6")."""

from __future__ import annotations

import json
import os
import re
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
    """A chunk-size line with a sign ("-6") once sent a chunk scanner back to the start of the same
    line for ever: 8 such requests (55 bytes each, sent once, the connections then closed) would
    spin every thread, every later eviction review unanswered (failurePolicy Ignore: allowed) and
    the worker at 100% CPU. A chunked request is answered 411 from its head: the worker stays idle."""
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
    """The negative chunk size without any certificate: with server.clientCAFile set, the probe port
    asks none, and its requests are framed like the admission port's (before the app refuses
    reviews there). 8 chunked requests with a chunk-size line "-6" sent there must leave the
    apiserver's reviews (with its client certificate) on the admission port answered."""
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


def test_a_malformed_rest_of_body_after_an_answer_closes_the_connection_without_a_second_answer(shared_server):
    """A malformed chunked body after a request to a route that does not read its body (here
    /healthz) must not get a second, unsolicited answer on the same connection: any
    Transfer-Encoding is answered 411 before the app, one answer, then the connection closed."""
    tls = tls_context(shared_server).wrap_socket(
        socket.create_connection(("127.0.0.1", shared_server.port), timeout=10), server_hostname="localhost"
    )
    with tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 411 ") and data.count(b"HTTP/1.1 ") == 1, data


def test_pipelined_requests_over_tls_are_all_answered(shared_server):
    """Two requests in one write, the first exactly 8,192 bytes: the second arrives decrypted in the
    same read as the first, with nothing more to come on the socket, and is answered at once (not
    left until the 75 s keep-alive closes the connection)."""
    base = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n"
    first = base.replace(b"X-Pad: ", b"X-Pad: " + b"a" * (8192 - len(base)))
    assert len(first) == 8192
    tls = tls_context(shared_server).wrap_socket(
        socket.create_connection(("127.0.0.1", shared_server.port), timeout=5), server_hostname="localhost"
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


def test_malformed_body_gets_400_json(shared_server):
    rv = shared_server.session().post(
        shared_server.url + "/validate/rbac", data=b"{", headers={"Content-Type": "application/json"}
    )
    assert rv.status_code == 400 and "error" in rv.json()


def test_a_chunked_body_is_refused_from_its_head_with_a_json_error(shared_server):
    """411 before any of the body is read, malformed (a chunk size "zz") or not: a chunked body cannot
    be checked against server.maxRequestBytes before it is read (the kube-apiserver always sends a
    Content-Length)."""
    for body in (b"zz\r\n", b"", b"3\r\nabc\r\n0\r\n\r\n"):
        answer = exchange(
            shared_server,
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
def test_requests_refused_before_the_app_get_json_not_html(shared_server, raw, status):
    """Protocol errors the front answers before the app sees the request (its limits are gunicorn's
    defaults: a request line of 8190 bytes, 100 header fields): JSON like every other error."""
    import json as _json

    ctx = ssl.create_default_context(cafile=str(shared_server.ca_file))
    with ctx.wrap_socket(
        socket.create_connection(("127.0.0.1", shared_server.port), timeout=10), server_hostname="localhost"
    ) as tls:
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
def test_framing_that_cannot_be_checked_before_the_body_is_refused_with_json(shared_server, head, status):
    """Answered from the request head, with a JSON error, without reading a body."""
    answer = exchange(shared_server, head)
    head_line, _, body = answer.partition(b"\r\n\r\n")
    assert head_line.startswith(b"HTTP/1.1 %d " % status), head_line
    assert b"content-type: application/json" in head_line.lower() and json.loads(body)["error"]


def test_a_request_trickled_past_the_read_limit_gets_408_json(shared_server):
    """A request whose bytes take longer than 5 s from its first is answered 408 with a JSON error
    and the connection closed; the client timeout is one warning line, counted."""
    logged = shared_server.log_file.stat().st_size  # the module's server: only this test's lines count
    with tls_context(shared_server).wrap_socket(
        socket.create_connection(("127.0.0.1", shared_server.port), timeout=10), server_hostname="localhost"
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
    assert b'"client timed out' in shared_server.log_file.read_bytes()[logged:]


def until_closed(server, raw: bytes) -> bytes:
    """Send `raw` on a new TLS connection and read until the server closes it (TimeoutError: it
    did not within 10 s)."""
    with tls_context(server).wrap_socket(
        socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost"
    ) as tls:
        tls.sendall(raw)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    return data


def test_framing_the_parser_refuses_gets_a_json_error_and_the_connection_closed(shared_server):
    """Requests llhttp (the front's parser since h11) refuses, or the front refuses from their head:
    each one answer with a JSON error, then the connection closed (no second request read after it).
    Obsolete line folding, a bare LF and a repeated Content-Length were accepted by h11: refused
    now (request smuggling vectors; Go's net/http, the kube-apiserver's client, never sends them)."""
    cases = {
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n": 400,  # obsolete line folding
        b"GET /healthz HTTP/1.1\nHost: x\n\n": 400,  # bare LF
        b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}": 400,
        b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Length: -2\r\n\r\n{}": 400,
        b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Length: 2x\r\n\r\n{}": 400,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A : a\r\n\r\n": 400,  # whitespace before the colon
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n": 400,  # NUL in a value
        b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}": 400,
        b"GET /healthz HTTP/1.1\r\n\r\n": 400,  # no Host
        b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n": 505,
        b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n": 501,  # unknown method
        b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n": 501,
        b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n{}": 400,
    }
    for raw, status in cases.items():
        data = until_closed(shared_server, raw + b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status), (raw, data)
        assert b"content-type: application/json" in head.lower() and json.loads(body)["error"], (raw, data)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        assert b"connection: close" in head.lower() and len(body) == length, (raw, data)  # nothing after it


def test_pipelined_requests_are_answered_in_order_before_a_malformed_one_is_refused(shared_server):
    """Three requests in one write, the third malformed: llhttp reads all three at once; the two
    whole ones are answered one after the other, in order, then the third gets its 400, then close."""
    data = until_closed(
        shared_server,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nX : y\r\n\r\n",
    )
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", data)
    assert statuses == [b"200", b"200", b"400"] and b'"ready"' in data, data
    assert data.index(b'"ready"') < data.index(b"Bad Request"), data


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /readyz HTTP/1.0\r\n\r\n",
        b"GET /readyz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",  # closed as h11 did
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",  # not offered: answered
    ],
)
def test_requests_that_close_the_connection_are_answered_with_connection_close(shared_server, raw):
    """One answer with `Connection: close` and a right Content-Length, then the connection closed:
    a second request sent after it is not answered."""
    data = until_closed(shared_server, raw + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head.lower(), data
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    assert length == len(body) and json.loads(body)["ready"] is True, data


def test_an_answer_to_head_has_no_body_and_the_connection_serves_the_next_request(shared_server):
    """HEAD: the GET's headers (its Content-Length) and no body; the connection stays open and the
    next request on it is answered."""
    data = until_closed(
        shared_server, b"HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    first, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in first.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    assert first.startswith(b"HTTP/1.1 200 ") and rest.startswith(b"HTTP/1.1 200 "), data
    assert rest.partition(b"\r\n\r\n")[2] and len(rest.partition(b"\r\n\r\n")[2]) == length, data
