"""Connections that only stall or idle must not keep honest reviews from an answer (issue 21; found
by an adversarial review, reproducers F1-F4). Each held a resource of the worker that honest
requests need: its pool threads (a partial TLS ClientHello held one for the whole 2 s handshake
bound) or its connection slots (connections idle after their handshake held them for the 75 s
keep-alive). For the eviction webhook (failurePolicy Ignore) a review left unanswered is an
eviction let through unjudged."""
from __future__ import annotations

import json
import socket
import ssl
import time

import pytest

from tests.builders import eviction_request
from tests.http.test_connections import LIMIT, read_response, server, tls_context  # noqa: F401 (fixture)

pytestmark = pytest.mark.http


def review_bytes(uid: str) -> bytes:
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {**eviction_request("gpu-driver-x"), "uid": uid}}).encode()
    return (b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def answer(tls: ssl.SSLSocket) -> dict:
    """Read one HTTP answer and return its JSON body."""
    return json.loads(read_response(tls)[1])


def connect(server, timeout: float = 5) -> ssl.SSLSocket:  # noqa: F811
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return tls_context(server).wrap_socket(raw, server_hostname="localhost")


def judged_within(tls: ssl.SSLSocket, uid: str) -> float:
    """Send one eviction review on `tls`; assert it was judged (a non-driver pod: allowed) and
    return the seconds it took."""
    started = time.monotonic()
    tls.sendall(review_bytes(uid))
    response = answer(tls)["response"]
    assert response["uid"] == uid and response["allowed"] is True, response
    return time.monotonic() - started


def test_partial_client_hellos_hold_no_thread(server):  # noqa: F811
    """24 connections that send the first 3 bytes of a TLS record and stop (3 rounds of the 8
    threads' 2 s handshake bound before): an eviction review on a connection kept alive from before
    and one on a new connection are judged at once. Before: both closed unanswered."""
    kept = connect(server)
    judged_within(kept, "before")
    stalled = []
    try:
        for _ in range(24):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"\x16\x03\x01")
            stalled.append(s)
        time.sleep(0.3)
        assert judged_within(kept, "kept-alive") < 1.0
        with connect(server) as new:
            assert judged_within(new, "new") < 1.0
    finally:
        for s in stalled:
            s.close()
        kept.close()


def metric(tls: ssl.SSLSocket, name: str) -> float:
    tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    text = read_response(tls)[1].decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_connections_idle_after_their_handshake_are_reclaimed_at_the_limit(server):  # noqa: F811
    """LIMIT - 1 connections that finish their TLS handshake and say nothing, next to one honest
    kept-alive connection: the worker is at its connection limit. A new connection is still
    judged within the webhook timeout: the worker closes idle connections that never sent a
    request to let it in. Before: every new connection waited in the accept queue for the 75 s
    keep-alive (none answered, /metrics unreachable)."""
    kept = connect(server)
    judged_within(kept, "before")
    idle = []
    try:
        for _ in range(LIMIT - 1):
            idle.append(connect(server))
        time.sleep(0.3)
        with connect(server, timeout=10) as new:
            assert judged_within(new, "new") < 3.0
        reclaimed = metric(kept, "dra_guard_idle_connections_reclaimed_total")
        assert 1 <= reclaimed <= 16 + 1  # one batch for the review's connection (+1: a scrape may need one)
        closed = sum(1 for s in idle if _closed_by_server(s))
        assert closed == reclaimed  # the idle ones, not the honest kept-alive connection
        # which still serves reviews (gthread answered it "Connection: close" with that many idle)
        assert judged_within(kept, "after") < 1.0
    finally:
        for s in idle:
            s.close()
        kept.close()


def _closed_by_server(tls: ssl.SSLSocket) -> bool:
    tls.settimeout(0.05)
    try:
        return tls.recv(1) == b""
    except (TimeoutError, ssl.SSLWantReadError):
        return False
    except (OSError, ssl.SSLError):
        return True
