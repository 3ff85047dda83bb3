"""Overload on the wire: more reviews at once than a worker judges by their deadline. Every
connection it holds gets an answer with its own uid, judged or the overload answer (eviction: 429,
retry); the event-loop front gives the overload answer on the loop to a
review whose expected wait is past its deadline and, while it does, resets new connections before
their TLS handshake, so that the dials of a client whose connections are all busy cannot eat the
CPU the reviews need. A burst it can judge by the deadline is judged whole, however many
connections it comes on."""

from __future__ import annotations

import collections
import time

import pytest

from tests.http.clients import LIMIT, answer, connect, rbac_review_bytes, review_bytes
from tests.scrape import metric
from tests.serve import DraGuardProcess
from webhook.serve.front.shared import OVERLOAD_HOLD

pytestmark = pytest.mark.http

#: kept-alive connections that each send one eviction review at once, BURSTS times: far more than
#: the worker's 8 threads judge within TIGHT_DEADLINE
HELD = 120
BURSTS = 6
#: seconds: the eviction reviews' deadline (policies.eviction.reviewDeadlineSeconds) of the
#: overloaded server; a review takes ~1 ms here, so HELD reviews at once cannot all meet it
TIGHT_DEADLINE = 0.01


@pytest.fixture
def tight(tmp_path):
    """dra-guard serve --no-cluster whose eviction reviews must be answered within TIGHT_DEADLINE."""
    proc = DraGuardProcess(
        tmp_path, "--no-cluster", config=f"policies:\n  eviction:\n    reviewDeadlineSeconds: {TIGHT_DEADLINE}\n"
    )
    try:
        proc.wait("/readyz")
        yield proc
    finally:
        proc.stop()


def test_a_burst_of_rbac_reviews_the_worker_can_judge_in_time_is_judged_whole(server):
    """HELD RBAC reviews at once on HELD connections (as the kube-apiserver sends a burst of
    ClusterRoleBindings applied together: one connection per review in flight) with the default
    2.5 s deadline: ~HELD ms of work, so every one is judged; none is refused "overloaded" because
    many came at once (a refused RBAC write is not retried)."""
    held = [connect(server, timeout=30) for _ in range(HELD)]
    try:
        for burst in range(2):
            for i, tls in enumerate(held):
                tls.sendall(rbac_review_bytes(f"burst-{burst}-{i}"))
            for i, tls in enumerate(held):
                response = answer(tls)["response"]
                assert response["uid"] == f"burst-{burst}-{i}", response
                assert response["allowed"] is True, response  # its role is unknown here: allowed, with a warning
    finally:
        for tls in held:
            tls.close()


def test_an_overloaded_worker_answers_every_held_connection_and_the_front_resets_new_ones(tight):
    server = tight
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
                    # the overload answer (shed on the loop, or dropped in its lane at its deadline):
                    # the eviction is retried by its client, never allowed unjudged
                    assert response["status"]["code"] == 429, response
                    assert "did not judge this request" in response["status"]["message"], response
                    outcomes["overload answer"] += 1
    finally:
        for tls in held:
            tls.close()
    refused = metric(scraper.get(server.url + "/metrics").text, "dra_guard_connections_refused_total") - refused_before
    assert outcomes["judged"] + outcomes["overload answer"] == HELD * BURSTS, dict(outcomes)
    assert outcomes["judged"] > 0, dict(outcomes)
    # reviews that could not be judged by their deadline got the overload answer on the loop, and
    # new connections were reset without a handshake while it lasted
    assert outcomes["overload answer"] > 0, dict(outcomes)
    assert outcomes["new connection reset"] > 0 and refused == outcomes["new connection reset"], (dict(outcomes), refused)
    # OVERLOAD_HOLD after its last overload answer, the worker serves new connections again
    time.sleep(OVERLOAD_HOLD + 0.5)
    tls = connect(server)
    tls.sendall(review_bytes("after"))
    assert answer(tls)["response"]["uid"] == "after"
    tls.close()


def test_at_the_connection_limit_with_the_connections_busy_new_ones_are_reset_not_left_queued(server):
    """The worker holds its LIMIT connections, each with an RBAC review in flight (~LIMIT ms of
    work: far below their deadline, so none is shed): a client dialing more is answered with a
    reset at once, not left in the accept queue until a connection is reclaimed (1 s idle) while
    its requests wait (the apiserver's Go client then queues reviews behind the dial: answers after
    its timeout)."""
    scraper = server.session()
    refused_before = metric(scraper.get(server.url + "/metrics").text, "dra_guard_connections_refused_total")
    scraper.close()
    held = [connect(server, timeout=30) for _ in range(LIMIT)]
    outcomes: collections.Counter[str] = collections.Counter()
    try:
        for i, tls in enumerate(held):
            tls.sendall(rbac_review_bytes(f"held-{i}"))
        for _ in range(3):
            try:
                connect(server, timeout=5).close()
                outcomes["new connection handshaken"] += 1
            except OSError:
                outcomes["new connection reset"] += 1
        for i, tls in enumerate(held):
            response = answer(tls)["response"]
            assert response["uid"] == f"held-{i}", response
            assert response["allowed"] is True, response  # judged: its role is unknown here
    finally:
        for tls in held:
            tls.close()
    assert outcomes["new connection reset"] > 0, dict(outcomes)
    time.sleep(OVERLOAD_HOLD + 0.5)
    scraper = server.session()
    refused = metric(scraper.get(server.url + "/metrics").text, "dra_guard_connections_refused_total") - refused_before
    assert refused >= outcomes["new connection reset"], (refused, dict(outcomes))
