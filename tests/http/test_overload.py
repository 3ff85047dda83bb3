"""Overload on the wire: more reviews at once than a worker judges by their deadline. Every
connection it holds gets an answer with its own uid, judged or the overload answer (eviction: 429,
retry); the event-loop front gives the overload answer on the loop to a
review whose expected wait is past its deadline and, while it does, resets new connections before
their TLS handshake, so that the dials of a client whose connections are all busy cannot eat the
CPU the reviews need. A burst it can judge by the deadline is judged whole, however many
connections it comes on."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time

import pytest
from prometheus_client import REGISTRY

from tests.http.clients import LIMIT, answer, connect, rbac_review_bytes, review_bytes, review_seconds
from tests.http.inprocess import serving
from tests.scrape import metric
from tests.serve import DraGuardProcess
from webhook.config import from_mapping
from webhook.config.process import ServerConfig
from webhook.kube.state import ClusterState
from webhook.policies.decision import ALLOW
from webhook.serve import app as app_module
from webhook.serve.front.shared import OVERLOAD_HOLD

pytestmark = pytest.mark.http

#: kept-alive connections that each send one review at once, BURSTS times in the overload test
HELD = 120
BURSTS = 6
#: the overloaded server's eviction deadline is this share of the time a burst of HELD reviews takes
#: to judge at the pace measured first (about HELD review times: the threads share one GIL), so
#: that they cannot all be judged by it at any speed of the machine, while the loop reads the whole
#: burst (a fraction of each review's time) and the first reviews are judged well within it
TIGHT_SHARE = 0.5
#: a burst that must be judged whole takes at most this share of the default deadline at the
#: measured pace (the margin is the loop's own work on a burst of connections)
WHOLE_BURST_SHARE = 0.25
DEFAULT_DEADLINE = ServerConfig().review_deadline_seconds


def overload_answer(response: dict) -> bool:
    """Whether `response` is dra-guard's overload answer (the review was not judged: eviction 429,
    retried by its client; other paths 503, the policy's failure mode), never an allowed one."""
    return (
        response["allowed"] is False
        and response["status"]["code"] in (429, 503)
        and "did not judge this request" in response["status"]["message"]
    )


@pytest.fixture
def tight(tmp_path, server):
    """dra-guard serve --no-cluster whose eviction reviews must be answered within TIGHT_SHARE of
    HELD eviction reviews' time, measured first on `server` (idle, same machine, same moment).
    Yields (the server, its deadline in seconds)."""
    deadline = round(max(0.01, TIGHT_SHARE * HELD * review_seconds(server)), 3)
    server.stop()  # its CPU is not the tight server's
    proc = DraGuardProcess(
        tmp_path / "tight", "--no-cluster", config=f"policies:\n  eviction:\n    reviewDeadlineSeconds: {deadline}\n"
    )
    try:
        proc.wait("/readyz")
        yield proc, deadline
    finally:
        proc.stop()


def test_a_burst_of_rbac_reviews_the_worker_can_judge_in_time_is_judged_whole(server):
    """A burst of RBAC reviews at once on as many connections (as the kube-apiserver sends a burst
    of ClusterRoleBindings applied together: one connection per review in flight) with the default
    deadline, as many (at most HELD) as the worker judges in WHOLE_BURST_SHARE of it at the pace
    measured now: every one is judged; none is refused "overloaded" because many came at once (a
    refused RBAC write is not retried)."""
    burst = min(HELD, int(WHOLE_BURST_SHARE * DEFAULT_DEADLINE / review_seconds(server, rbac_review_bytes)))
    assert burst >= 16, f"a review takes {DEFAULT_DEADLINE * WHOLE_BURST_SHARE / burst:.3f} s here: too slow to test a burst"
    held = [connect(server, timeout=30) for _ in range(burst)]
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
    """HELD eviction reviews at once, BURSTS times, with a deadline of TIGHT_SHARE of their time:
    every held connection gets an answer with its own uid, judged (allowed: not a driver pod) or the
    overload answer, never allowed unjudged; some are judged and some get the overload answer; new
    connections are reset while the overload lasts (each one counted); OVERLOAD_HOLD after it, a
    new connection is served again."""
    server, deadline = tight
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
                    assert overload_answer(response) and response["status"]["code"] == 429, response
                    outcomes["overload answer"] += 1
    finally:
        for tls in held:
            tls.close()
    refused = metric(scraper.get(server.url + "/metrics").text, "dra_guard_connections_refused_total") - refused_before
    assert outcomes["judged"] + outcomes["overload answer"] == HELD * BURSTS, dict(outcomes)
    assert outcomes["judged"] > 0, (dict(outcomes), f"deadline {deadline} s")
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


def test_at_the_connection_limit_with_the_connections_busy_new_ones_are_reset_not_left_queued(tmp_path, held):
    """The worker holds its LIMIT connections, each with an RBAC review being judged (the real
    front in this process, every judgment held until the test releases it, so that they are busy
    at any speed of the machine; the deadline far away, so that none is shed): a client dialing
    more is answered with a reset at once, not left in the accept queue until a connection is
    reclaimed (1 s idle) while its requests wait (the apiserver's Go client then queues reviews
    behind the dial: answers after its timeout). Once released, every held connection is answered
    with its own uid, judged (allowed)."""
    running, release, _ = held
    config = from_mapping({"server": {"reviewDeadlineSeconds": 29}})
    app = app_module.create_app(config=config, cluster=ClusterState(None))
    refused_before = REGISTRY.get_sample_value("dra_guard_connections_refused_total") or 0.0
    outcomes: collections.Counter[str] = collections.Counter()
    with serving(app, config, tmp_path) as served:
        held_connections = [connect(served, timeout=30) for _ in range(LIMIT)]
        try:
            for i, tls in enumerate(held_connections):
                tls.sendall(rbac_review_bytes(f"held-{i}"))
            assert running.wait(10)
            for _ in range(3):
                try:
                    connect(served, timeout=5).close()
                    outcomes["new connection handshaken"] += 1
                except OSError:
                    outcomes["new connection reset"] += 1
            release.set()
            for i, tls in enumerate(held_connections):
                response = answer(tls)["response"]
                assert response == {"uid": f"held-{i}", "allowed": True}, response
        finally:
            for tls in held_connections:
                tls.close()
    assert outcomes == {"new connection reset": 3}, dict(outcomes)
    refused = (REGISTRY.get_sample_value("dra_guard_connections_refused_total") or 0.0) - refused_before
    assert refused >= 3, refused


def test_heavy_rbac_reviews_never_hold_the_threads_kept_for_evictions(tmp_path, monkeypatch):
    """Evictions have a lane of their own (server.threads threads): with every thread of the RBAC
    and DaemonSet lane held by an RBAC judgment and more RBAC reviews queued behind them, an
    eviction is judged at once, by the eviction guard, while they are still held; the RBAC reviews
    queued are not refused (their deadline is far: a burst that can be judged in time is taken
    whole) and each is answered by its own judgment once released. The real front in this process,
    the RBAC judgments held until the test releases them (a busy lane at any speed of the machine)."""
    threads, queued = 2, 2
    holding, release = threading.Semaphore(0), threading.Event()

    def held_rbac(request, facts, config):
        holding.release()
        release.wait(30)
        return ALLOW

    monkeypatch.setattr(
        app_module,
        "POLICIES",
        tuple(dataclasses.replace(p, review=held_rbac) if p.name == "rbac" else p for p in app_module.POLICIES),
    )
    config = from_mapping({"server": {"threads": threads, "reviewDeadlineSeconds": 29}})
    app = app_module.create_app(config=config, cluster=ClusterState(None))
    with serving(app, config, tmp_path) as served:
        rbac = [connect(served, timeout=30) for _ in range(threads + queued)]
        try:
            for i, tls in enumerate(rbac):
                tls.sendall(rbac_review_bytes(f"rbac-{i}"))
            for _ in range(threads):  # every thread of the lane holds a judgment
                assert holding.acquire(timeout=10)
            with contextlib.closing(connect(served, timeout=10)) as tls:
                tls.sendall(review_bytes("eviction-1"))
                eviction = answer(tls)["response"]
            assert not release.is_set()
            # judged by the eviction guard (not a driver pod: allowed), not the overload answer
            assert eviction == {"uid": "eviction-1", "allowed": True}, eviction
            release.set()
            answers = [answer(tls)["response"] for tls in rbac]
        finally:
            release.set()
            for tls in rbac:
                tls.close()
    assert answers == [{"uid": f"rbac-{i}", "allowed": True} for i in range(threads + queued)], answers
