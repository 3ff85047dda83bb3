"""A new connection's age counts the time it waited in the kernel before the worker saw it (issue 21).

When a worker is busy (or at its connection limit), new connections wait in the listening socket's
accept queue: the TLS ClientHello is there, but the worker does not know until it accepts it.
dra-guard reads how long a connection has waited (Linux TCP_INFO): one whose ClientHello is older
than `server.dropAfterSeconds` is closed before its TLS handshake (its apiserver has given up). A
review's own deadline (`server.reviewDeadlineSeconds`) counts from the review's bytes, sent after the
handshake: the apiserver's client hands a new connection to whichever request waits when the dial
completes, so dating the review from the ClientHello refused fresh reviews as late.

The worker is stopped (SIGSTOP) while the clients connect: only the kernel holds their ClientHellos.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import threading
import time

import pytest

from tests.builders import eviction_request
from tests.http.test_connections import server, tls_context, worker_pid  # noqa: F401 (fixture)
from webhook.serve.sockets import accept_queue

pytestmark = pytest.mark.http


def eviction_review(uid: str) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {**eviction_request("gpu-driver-x"), "uid": uid}}).encode()


def post_eviction(server, uid: str, answers: dict[str, object]) -> None:  # noqa: F811
    """POST one eviction review on a new connection; answers[uid] = the AdmissionReview answer, or
    the error that ended the connection."""
    body = eviction_review(uid)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=15) as raw:
            with tls_context(server).wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
                data = b""
                while chunk := tls.recv(65536):
                    data += chunk
        answers[uid] = json.loads(data.split(b"\r\n\r\n", 1)[1])
    except (OSError, ssl.SSLError, ValueError, IndexError) as exc:
        answers[uid] = exc


def metric(scraper, server, name: str) -> float:  # noqa: F811
    """One metric's value, read over `scraper`'s kept-alive connection: a scrape on a connection
    of its own would end with an EOF, and one arriving just before SIGSTOP would wait out the
    stop in the worker's queue and be counted as dropped too."""
    text = scraper.get(server.url + "/metrics").text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_the_wait_in_the_accept_queue_counts_toward_the_drop_not_toward_the_next_review(server):  # noqa: F811
    judged = {}
    post_eviction(server, "judged-at-once", judged)
    assert judged["judged-at-once"]["response"]["allowed"] is True  # not a driver pod: judged, allowed

    scraper = server.session()
    dropped_before = metric(scraper, server, "dra_guard_requests_dropped_total")
    pid = worker_pid(server)
    answers: dict[str, object] = {}
    os.kill(pid, signal.SIGSTOP)
    silent = []
    try:
        old = threading.Thread(target=post_eviction, args=(server, "waited-3.4s", answers))
        old.start()
        # connections as old that hold no request: closed, never counted as dropped requests
        silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        for _ in range(3):
            socket.create_connection(("127.0.0.1", server.port)).close()
        time.sleep(0.8)
        late = threading.Thread(target=post_eviction, args=(server, "waited-2.6s", answers))
        late.start()
        time.sleep(2.6)
    finally:
        os.kill(pid, signal.SIGCONT)
    old.join(20)
    late.join(20)
    for sock in silent:
        sock.close()

    # a ClientHello 2.6 s old is not dropped, and its review, sent after the handshake, is judged
    answer = answers["waited-2.6s"]
    assert isinstance(answer, dict), answer
    response = answer["response"]
    assert response["uid"] == "waited-2.6s" and response["allowed"] is True, response
    # past server.dropAfterSeconds (3 s): its apiserver has given up; closed before the TLS handshake;
    # the six connections without a request are closed too, but not counted
    assert isinstance(answers["waited-3.4s"], Exception), answers["waited-3.4s"]
    assert metric(scraper, server, "dra_guard_requests_dropped_total") == dropped_before + 1
    # both reviews were answered well within their deadline, counted from their own bytes
    answered = metric(scraper, server, 'dra_guard_review_age_seconds_count{policy="eviction"}')
    within = metric(scraper, server, 'dra_guard_review_age_seconds_bucket{le="0.5",policy="eviction"}')
    assert (answered, within) == (2, 2)
    scraper.close()


def test_accept_queue_counts_connections_the_listener_has_not_accepted():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        assert accept_queue(listener) == 0
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        try:
            deadline = time.monotonic() + 5
            while accept_queue(listener) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert accept_queue(listener) == 3
            listener.accept()[0].close()
            assert accept_queue(listener) == 2
        finally:
            for client in clients:
                client.close()

