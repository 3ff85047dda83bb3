"""Findings of the second adversarial review of 2026-12-01 (of the request-gathering fix:
sockets.request_complete, worker._gather), kept as regression tests; each failed before its fix:
B1 a chunk size with a sign looped the framing scan forever (strict hex now), B2 waiting in the
thread for each trickled byte (a request waits in a thread once, in its first round only), B3/B3b
heads and trailer sections declared whole at 64 KiB that gunicorn reads on to 800 KiB (1 MiB now)."""
from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests.http.test_attack_findings import WEBHOOK_TIMEOUT, HonestClient, client_auth_server, honest_under_tricklers
from tests.http.test_connections import server, tls_context, worker_pid  # noqa: F401 (fixture)

pytestmark = pytest.mark.http

NEGATIVE_CHUNK = (b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n-6\r\n")


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_negative_chunk_size_does_not_spin_a_thread_forever(server):  # noqa: F811
    """Finding B1: request_complete parses a chunk size with int(x, 16), which takes a sign: a
    chunk-size line "-6" sends _chunked_body_complete back to the start of the same line
    (pos = eol + 2 + size + 2), an endless loop in the pool thread that called _gather (no read,
    no deadline check inside). 8 such requests (55 bytes each, sent once, the connections then
    closed) spin all 8 pool threads for good: every later eviction review goes unanswered
    (failurePolicy Ignore: allowed) until the worker restarts; the worker burns 100% CPU."""
    ctx = tls_context(server)
    for _ in range(8):
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=5),
                             server_hostname="localhost") as tls:
            tls.sendall(NEGATIVE_CHUNK)
            time.sleep(0.05)
    time.sleep(0.5)
    pid = worker_pid(server)
    cpu = _cpu_seconds(pid)
    honest = HonestClient(server)
    try:
        honest.run(seconds=4, period=0.3)
        burned = _cpu_seconds(pid) - cpu
    finally:
        os.kill(pid, signal.SIGKILL)  # its spinning threads would hold the fixture's stop for 20 s
    assert not honest.failures, f"{len(honest.failures)} of {len(honest.failures) + honest.answered} eviction reviews " \
                                f"not answered within {WEBHOOK_TIMEOUT} s (worker CPU {burned:.1f} s in ~4 s): " \
                                f"{honest.failures[:3]}"


def test_fast_trickling_clients_do_not_hold_the_pool_threads(server):  # noqa: F811
    """Finding B2 (slowloris A1 again, faster): sockets.gather keeps reading in the pool thread for as
    long as the next bytes come within GATHER_STEP_WAIT (10 ms), up to REQUEST_READ_LIMIT (5 s).
    16 TLS connections that each send their request one byte every 5 ms (200 bytes/s each, TCP_NODELAY)
    and dial again when cut off after 5 s hold the worker's 8 pool threads nearly all the time: an
    honest client sending an eviction review every 0.3 s over 8 s gets reviews unanswered within
    the 3 s webhook timeout (failurePolicy Ignore: allowed)."""
    honest_under_tricklers(HonestClient(server), tls_context(server), server.port,
                           b"POST /validate/evictions HTTP/1.1\r\n", every=0.005)


def test_a_head_over_64_kib_is_not_read_by_the_parser_in_a_pool_thread(server):  # noqa: F811
    """Finding B3 (desync of request_complete and gunicorn's parser): request_complete calls a head
    with no blank line yet "whole" once it is over MAX_HEAD_BYTES (64 KiB), for "the parser to
    refuse"; but gunicorn's parser reads a head up to limit_request_fields x (limit_request_field_size
    + 2) = 100 x 8192 bytes (max_buffer_headers, ~800 KiB), with blocking reads in the pool thread.
    16 TLS connections that each send a request line and 9 valid header lines of 7,900 bytes (~71 KB,
    no blank line) at once, then one more byte every 1.5 s, and dial again when cut off after the 5 s
    request read limit, hold the worker's 8 pool threads again (A1): an honest client sending an
    eviction review every 0.3 s gets reviews unanswered within the 3 s webhook timeout."""
    head = b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-Pad-%d: %s\r\n" % (i, b"a" * 7900) for i in range(9)) + b"X-Last: "
    honest_under_tricklers(HonestClient(server), tls_context(server), server.port, head)


def test_a_trailer_section_over_64_kib_is_not_read_by_the_parser_in_a_pool_thread(server):  # noqa: F811
    """Finding B3b (B3 in a chunked body's trailers): _chunked_body_complete calls the body "whole"
    once a trailer line after the last chunk ("0") is over MAX_HEAD_BYTES without its CRLF; gunicorn's ChunkedReader reads trailers up to max_buffer_headers (~800 KiB), blocking, when
    the app reads the body: in the large lane, and in the overload answer of every other chunked
    review (shed() reads the body to find its uid). 16 connections sending a chunked eviction review
    "0" + one trailer line of 66,000 bytes (no CRLF), then a byte every 1.5 s, hold the 8 pool threads."""
    head = (b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-Pad: ") + b"a" * 66000
    honest_under_tricklers(HonestClient(server), tls_context(server), server.port, head)


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
            with probe_ctx.wrap_socket(socket.create_connection(("127.0.0.1", probe_port), timeout=5),
                                       server_hostname="localhost") as tls:
                tls.sendall(NEGATIVE_CHUNK)
                time.sleep(0.05)
        time.sleep(0.5)
        honest.run(seconds=4, period=0.3)
        assert not honest.failures, f"{len(honest.failures)} of {len(honest.failures) + honest.answered} eviction " \
                                    f"reviews not answered within {WEBHOOK_TIMEOUT} s: {honest.failures[:3]}"
    finally:
        try:
            from tests.http.test_connections import worker_pid as _wp
            os.kill(_wp(proc), signal.SIGKILL)  # its spinning threads would hold stop() for 20 s
        except (AssertionError, OSError):
            pass
        proc.stop()
