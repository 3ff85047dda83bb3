"""webhook/serve/front/kernel.py on real sockets: what a connection holds decides whether closing it
drops a request (dra_guard_requests_dropped_total must count requests, not clients that closed or
never spoke: counting those would fire the over-capacity alert on an idle server)."""

from __future__ import annotations

import socket
import time

import pytest

from webhook.serve.front.kernel import REQUEST_BYTES, holds_a_request, peer_closed


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
