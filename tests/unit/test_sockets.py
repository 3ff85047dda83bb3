"""webhook/serve/sockets.py on real sockets: what a connection holds decides whether closing it
drops a request (dra_guard_requests_dropped_total must count requests, not clients that closed or
never spoke: an adversarial review fired the over-capacity alert on an idle server that way)."""
from __future__ import annotations

import socket
import time
import types

import pytest
from prometheus_client import REGISTRY

from webhook import metrics  # noqa: F401 (registers the metrics)
from webhook.serve import worker
from webhook.serve.sockets import REQUEST_BYTES, holds_a_request


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


@pytest.mark.parametrize(("sent", "counted"), [(b"", 0), (b"\x16\x03\x01", 0), (b"POST / HTTP/1.1\r\n" * 4, 1)])
def test_an_old_connection_is_closed_and_counted_only_with_a_request(pair, sent, counted):
    client, server_side = pair
    if sent:
        client.sendall(sent)
    client.shutdown(socket.SHUT_WR)
    settle()
    conn = types.SimpleNamespace(sock=server_side, queued_at=time.monotonic() - worker.DROP_AFTER[0] - 1)
    before = dropped()
    assert worker.DrainingThreadWorker.handle(None, conn) is False  # type: ignore[arg-type]
    assert server_side.fileno() == -1
    assert dropped() - before == counted
