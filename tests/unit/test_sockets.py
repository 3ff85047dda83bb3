"""webhook/serve/sockets.py on real sockets: what a connection holds decides whether closing it
drops a request (dra_guard_requests_dropped_total must count requests, not clients that closed or
never spoke: counting those would fire the over-capacity alert on an idle server)."""

from __future__ import annotations

import json
import socket
import threading
import time
import types

import pytest
from prometheus_client import REGISTRY

from webhook import metrics  # noqa: F401 (registers the metrics)
from webhook.serve import worker
from webhook.serve.connections import ConnectionState
from webhook.serve.sockets import (
    MAX_HEAD_BYTES,
    REQUEST_BYTES,
    REQUEST_READ_LIMIT,
    gather,
    holds_a_request,
    peer_closed,
    refusal,
    request_complete,
)


@pytest.fixture
def pair():
    """A connected TCP pair (client, server side)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        server_side, _ = listener.accept()
    yield client, server_side
    client.close()
    server_side.close()


def settle() -> None:
    time.sleep(0.05)  # loopback delivery


def test_a_request_is_more_bytes_than_a_tls_alert(pair):
    client, server_side = pair
    assert not holds_a_request(server_side)  # silent
    client.sendall(b"\x16\x03\x01")  # 3 bytes of a TLS record
    settle()
    assert not holds_a_request(server_side)
    client.sendall(b"x" * REQUEST_BYTES)
    settle()
    assert holds_a_request(server_side)


def test_a_client_that_only_closed_holds_no_request(pair):
    client, server_side = pair
    client.close()  # FIN, no data
    settle()
    assert not holds_a_request(server_side)


def dropped() -> float:
    return REGISTRY.get_sample_value("dra_guard_requests_dropped_total") or 0.0


class Conn(types.SimpleNamespace):
    """A stand-in for gthread's TConn (SimpleNamespace takes no weak reference, TConn does)."""

    __hash__ = object.__hash__


def bare_worker(states: dict | None = None) -> worker.DrainingThreadWorker:
    """A DrainingThreadWorker without gunicorn's set-up; states: conn -> ConnectionState."""
    import weakref

    w = object.__new__(worker.DrainingThreadWorker)
    w._states = weakref.WeakKeyDictionary(states or {})
    w._arrivals = weakref.WeakKeyDictionary()
    return w


@pytest.mark.parametrize(("sent", "counted"), [(b"", 0), (b"\x16\x03\x01", 0), (b"POST / HTTP/1.1\r\n" * 4, 1)])
def test_an_old_connection_is_closed_and_counted_only_with_a_request(pair, sent, counted):
    client, server_side = pair
    if sent:
        client.sendall(sent)
    client.shutdown(socket.SHUT_WR)
    settle()
    from gunicorn.workers.gthread import TConn

    conn = TConn(None, server_side, ("127.0.0.1", 1), ("127.0.0.1", 2))
    fields = dict(vars(conn))
    w = bare_worker({conn: ConnectionState(queued_at=time.monotonic() - worker.DROP_AFTER[0] - 1)})
    before = dropped()
    assert w.handle(conn) is False
    assert server_side.fileno() == -1
    assert dropped() - before == counted
    # what the worker knows of the connection is its ConnectionState: gthread's TConn gets no field of ours
    assert set(vars(conn)) == set(fields)


# ------------------------------------------------------------------ a request gathered without blocking
HEAD = b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    "data, whole",
    [
        (HEAD, False),  # head not ended
        (HEAD + b"\r\n", True),  # no body
        (HEAD + b"Content-Length: 5\r\n\r\nabc", False),
        (HEAD + b"Content-Length: 5\r\n\r\nabcde", True),
        (HEAD + b"content-length:  5 \r\n\r\nabcdeGET / HTTP/1.1\r\n", True),  # a pipelined request after it
        (HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", True),  # conflicting: the parser refuses
        (HEAD + b"Content-Length: -1\r\n\r\n", True),
        (HEAD + b"Content-Length: 2000\r\n\r\n", True),  # over max_body: refused from the head, not read
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n", True),  # refused from the head (411), no body is read
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n-6\r\n", True),  # a sign once made a chunk scan loop (B1)
        (HEAD + b"x: " + b"y" * 70000 + b"\r\n", False),  # a head gunicorn would still read on (B3)
        (b"x" * (MAX_HEAD_BYTES + 1), True),  # a head too long: the parser refuses
    ],
)
def test_request_complete_follows_the_framing(data, whole):
    answer: list[bool] = []
    scan = threading.Thread(target=lambda: answer.append(request_complete(bytearray(data), 1024)), daemon=True)
    scan.start()
    scan.join(5)
    assert answer == [whole]  # and promptly


@pytest.mark.parametrize(
    "data, status",
    [
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 411),  # well-formed: refused all the same
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n-6\r\n", 411),
        (HEAD + b"transfer-encoding :  Chunked \r\nContent-Length: 3\r\n\r\nabc", 411),  # with a length too
        (HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501),  # twice (h11 refuses it too)
        (HEAD + b"Transfer-Encoding:\r\n\r\n", 501),
        (HEAD + b"Content-Length: 1025\r\n\r\n", 413),
        (HEAD + b"Content-Length: 1024\r\n\r\n", None),
        (HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", None),  # gunicorn's parser answers 400
        (HEAD, None),  # no head yet
    ],
)
def test_a_request_is_refused_from_its_head_as_the_event_loop_front_refuses_it(data, status):
    """No Transfer-Encoding reaches gunicorn's chunked parser: the gthread engine answers any of
    them from the head, like the front (webhook/serve/front/connection.py), and a Content-Length
    over server.maxRequestBytes before the body is read; each with a JSON error that closes."""
    refused = refusal(bytearray(data), 1024)
    assert (refused and refused.status) == status
    if refused is not None:
        head, _, body = refused.answer().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status) and b"Connection: close" in head
        assert b"Content-Type: application/json" in head and json.loads(body)["error"].startswith(refused.reason)


def test_gather_returns_at_once_for_a_trickled_request_and_times_out_from_its_first_byte(pair):
    client, server_side = pair
    buf = bytearray()
    client.sendall(HEAD + b"Content-Length: 10\r\n\r\n12345")
    time.sleep(0.05)
    started = time.monotonic()
    assert gather(server_side, buf, started, max_bytes=1 << 20) is None  # the rest is not there: no waiting
    assert time.monotonic() - started < 0.5 and buf.endswith(b"12345")
    client.sendall(b"67890")
    time.sleep(0.05)
    assert gather(server_side, buf, started, max_bytes=1 << 20) is True and buf.endswith(b"1234567890")
    client.sendall(HEAD)
    with pytest.raises(TimeoutError):  # REQUEST_READ_LIMIT counts from the first byte, across rounds
        gather(server_side, bytearray(), time.monotonic() - REQUEST_READ_LIMIT - 1, max_bytes=1 << 20)
    assert server_side.getblocking()  # left blocking for gunicorn's parser


def test_gather_tells_a_closed_connection_from_a_partial_request(pair):
    client, server_side = pair
    client.close()
    assert gather(server_side, bytearray(), time.monotonic(), max_bytes=1 << 20) is False
    buf = bytearray(b"partial")
    assert gather(server_side, buf, time.monotonic(), max_bytes=1 << 20) is True  # the parser answers it


# ------------------------------------------------------------------ reclaim at the connection limit
def reclaim_round(conns_pending, conns_kept, waiting, states=None):
    """One DrainingThreadWorker.murder_keepalived round at the connection limit with `waiting`
    connections in the accept queue; returns the connections it closed. states: conn -> its
    ConnectionState (the worker's, never a field of the connection); a fresh one for the others."""
    import collections
    import selectors

    closed = []
    for c in [*conns_pending, *conns_kept]:
        c.close = lambda c=c: closed.append(c)
    w = bare_worker({c: (states or {}).get(c, ConnectionState()) for c in [*conns_pending, *conns_kept]})
    w.pending_conns, w.keepalived_conns = collections.deque(conns_pending), collections.deque(conns_kept)
    w.poller, w.alive, w.cfg = selectors.DefaultSelector(), True, types.SimpleNamespace(keepalive=75)
    w.nr_conns = w.worker_connections = 10
    w._accept_queue = lambda: waiting
    w.murder_keepalived()
    return closed


def test_reclaim_takes_connections_without_a_tls_handshake_first_and_never_one_with_a_request(pair):
    """docs/reliability.md, A2 and O1: silent connections (no TLS handshake 0.25 s after connecting)
    go first whatever their idle time; a kept-alive connection whose next request has just arrived
    is never closed (a POST on a reused connection is not retried by Go's client)."""
    client, server_side = pair
    now = time.monotonic()
    quiet = socket.socket()
    silent = Conn(sock=quiet, initialized=False, timeout=now + worker.CLIENT_SOCKET_TIMEOUT)  # deferred just now
    fresh = Conn(sock=quiet, initialized=False, timeout=now + worker.CLIENT_SOCKET_TIMEOUT)
    client.sendall(b"x" * 100)  # a request's bytes waiting on the kept-alive connection
    time.sleep(0.05)
    busy = Conn(sock=server_side, initialized=True, timeout=now - 10 + 75)  # idle 10 s before
    idle = Conn(sock=quiet, initialized=True, timeout=now - 5 + 75)
    states = {silent: ConnectionState(connected_at=now - 0.5), fresh: ConnectionState(connected_at=now)}
    closed = reclaim_round([fresh, silent], [busy, idle], waiting=1, states=states)
    assert closed == [silent]
    closed = reclaim_round([fresh], [busy, idle], waiting=5, states=states)
    assert closed == [idle]  # busy holds a request; fresh is too young to be judged silent
    # a handshake under way (its ClientHello came, its next flight is slow) is a talking client: it
    # goes with the idle ones, not before them, and not while it has been idle under 1 s
    greeting = Conn(sock=quiet, initialized=False, timeout=now + worker.CLIENT_SOCKET_TIMEOUT)
    states[greeting] = ConnectionState(connected_at=now - 0.9, greeted=True)
    closed = reclaim_round([greeting, silent], [idle], waiting=1, states=states)
    assert closed == [silent]
    closed = reclaim_round([greeting], [idle], waiting=5, states=states)
    assert closed == [idle]
    # one that never sent a request goes before a longer-idle one that has served requests (the
    # honest client's), once idle 0.25 s: a served one waits RECLAIM_MIN_IDLE (1 s)
    unused = Conn(sock=quiet, initialized=True, timeout=now - 0.5 + 75)
    states = {unused: ConnectionState(no_request_yet=True)}
    just_served = Conn(sock=quiet, initialized=True, timeout=now - 0.5 + 75)
    closed = reclaim_round([], [idle, just_served, unused], waiting=1, states=states)
    assert closed == [unused]
    closed = reclaim_round([], [idle, just_served, unused], waiting=5, states=states)
    assert closed == [unused, idle]  # just_served: idle under 1 s
    quiet.close()


def test_a_client_that_gave_up_is_known_before_its_tls_handshake(pair):
    """The front skips the TLS handshake (~1 ms of CPU) of a connection whose client closed it
    while it waited in the accept queue (as the apiserver's client does at its timeout)."""
    client, server_side = pair
    client.sendall(b"\x16\x03\x01" + b"x" * 200)  # a ClientHello's worth of bytes
    settle()
    assert not peer_closed(server_side)
    client.close()
    settle()
    assert peer_closed(server_side)


def test_the_gthread_worker_gives_the_app_the_arrival_in_the_wsgi_environ(pair):
    """connections.with_arrival: the socket gunicorn puts in the environ -> the arrival its request
    was given (DrainingThreadWorker._handle); a socket without one leaves the key out (the app then
    counts from now, webhook.serve.lanes.arrived)."""
    import weakref

    from webhook.serve.connections import with_arrival
    from webhook.serve.lanes import ARRIVAL

    _, server_side = pair
    seen = []
    arrivals: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary({server_side: 12.5})
    app = with_arrival(lambda environ, start_response: seen.append(dict(environ)) or [b""], arrivals)
    app({"gunicorn.socket": server_side}, None)
    app({"gunicorn.socket": socket.socket()}, None)
    app({}, None)
    assert [env.get(ARRIVAL) for env in seen] == [12.5, None, None]
