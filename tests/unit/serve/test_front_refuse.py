"""Resetting the accept queue of an overloaded worker (webhook.serve.front.listeners.refuse_queued):
real sockets on loopback, no server; tests/http/test_overload.py has the refusal on the wire."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import generate_latest

from tests.scrape import metric
from webhook.serve.front import listeners


@pytest.fixture
def listener():
    sock = socket.create_server(("127.0.0.1", 0), backlog=64)
    sock.setblocking(False)
    yield sock
    sock.close()


def dial(listener: socket.socket, count: int) -> list[socket.socket]:
    """`count` clients whose connections wait in `listener`'s accept queue (the kernel completes
    the TCP handshake before accept)."""
    return [socket.create_connection(listener.getsockname()[:2], timeout=2) for _ in range(count)]


def refused_total() -> float:
    return metric(generate_latest().decode(), "dra_guard_connections_refused_total", default=0.0)


def outcome(client: socket.socket) -> str:
    try:
        client.settimeout(0.2)
        return "data" if client.recv(1) else "closed"
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return "waiting"


def test_every_queued_connection_is_reset_and_counted_once(listener):
    clients = dial(listener, 5)
    before = refused_total()
    assert listeners.refuse_queued(listener, lambda: True) == 5
    assert [outcome(c) for c in clients] == ["reset"] * 5
    assert refused_total() - before == 5
    assert listeners.refuse_queued(listener, lambda: True) == 0  # an empty queue: no wait, nothing counted
    assert refused_total() - before == 5


def test_the_reset_stops_as_soon_as_the_overload_does_and_at_a_batch(listener, monkeypatch):
    clients = dial(listener, 6)
    answers = iter([True, True, False])
    assert listeners.refuse_queued(listener, lambda: next(answers)) == 2
    assert [outcome(c) for c in clients[:2]] == ["reset", "reset"]
    monkeypatch.setattr(listeners, "REFUSE_BATCH", 3)
    assert listeners.refuse_queued(listener, lambda: True) == 3  # the loop gets its turn after a batch
    assert outcome(clients[5]) == "waiting"  # still in the accept queue, for the next turn
    assert listeners.refuse_queued(listener, lambda: True) == 1
