"""Overload on the wire: more reviews at once than a worker judges. Every connection it holds
gets an answer with its own uid, judged or the overload answer (eviction: 429, retry); the
event-loop front gives the overload answer on the loop and, while it does, resets new connections
before their TLS handshake, so that the dials of a client whose connections are all busy cannot
eat the CPU the reviews need."""

from __future__ import annotations

import collections
import time

import pytest

from tests.http.clients import LIMIT, answer, connect, review_bytes
from tests.scrape import metric
from webhook.serve.front.connection import OVERLOAD_HOLD

pytestmark = pytest.mark.http

#: kept-alive connections that each send one eviction review at once, BURSTS times: far more than
#: the 8 threads and the 32 reviews a lane of the front queues (MAX_QUEUED_PER_THREAD x threads)
HELD = 120
BURSTS = 6


def test_an_overloaded_worker_answers_every_held_connection_and_the_front_resets_new_ones(server):
    assert HELD < LIMIT  # every one of them is held, none reclaimed
    held = [connect(server, timeout=30) for _ in range(HELD)]
    scraper = server.session()
    refused_before = metric(scraper.get(server.url + "/metrics").text, "dra_guard_connections_refused_total")
    outcomes: collections.Counter[str] = collections.Counter()
    try:
        for burst in range(BURSTS):
            for i, tls in enumerate(held):
                tls.sendall(review_bytes(f"burst-{burst}-{i}"))
            # a new connection while the worker has the burst to answer
            try:
                connect(server).close()
                outcomes["new connection handshaken"] += 1
            except OSError:  # ConnectionResetError, or ssl.SSLError from a reset in the handshake
                outcomes["new connection reset"] += 1
            for i, tls in enumerate(held):
                response = answer(tls)["response"]
                assert response["uid"] == f"burst-{burst}-{i}", response
                if response["allowed"] is True:
                    outcomes["judged"] += 1  # not a driver pod: allowed
                else:
                    # the overload answer: the eviction is retried by its client, never allowed unjudged
                    assert response["status"]["code"] == 429 and "overloaded" in response["status"]["message"], response
                    outcomes["overload answer"] += 1
    finally:
        for tls in held:
            tls.close()
    refused = metric(scraper.get(server.url + "/metrics").text, "dra_guard_connections_refused_total") - refused_before
    assert outcomes["judged"] + outcomes["overload answer"] == HELD * BURSTS, dict(outcomes)
    assert outcomes["judged"] > 0, dict(outcomes)
    # the lane's queue filled: reviews past it got the overload answer on the loop, and new
    # connections were reset without a handshake while it lasted
    assert outcomes["overload answer"] > 0, dict(outcomes)
    assert outcomes["new connection reset"] > 0 and refused == outcomes["new connection reset"], (dict(outcomes), refused)
    # OVERLOAD_HOLD after its last overload answer, the worker serves new connections again
    time.sleep(OVERLOAD_HOLD + 0.5)
    tls = connect(server)
    tls.sendall(review_bytes("after"))
    assert answer(tls)["response"]["uid"] == "after"
    tls.close()
