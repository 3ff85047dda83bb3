"""What Linux tells the front about a connection before it reads it: how long its bytes have
waited in the kernel, whether its peer already closed it, whether it holds a request, and how many
connections a listener has not accepted yet (TCP_INFO, FIONREAD). Everything here is 0, False or
unknown where the kernel cannot say (not Linux, not TCP): the front then counts from now."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from typing import Any

#: bytes waiting on a connection that are more than a TLS alert record (close_notify: 24 bytes in TLS 1.3,
#: 31 in TLS 1.2 with AES-GCM), i.e. a request, not a client closing its connection
REQUEST_BYTES = 32


# Linux struct tcp_info (linux/tcp.h): 8 one-byte fields, then 32-bit ones; byte offsets of two
_TCPI_UNACKED = 8 + 4 * 4  # on a listening socket: connections in its accept queue
_TCPI_LAST_DATA_RECV = 8 + 4 * 11  # ms since the connection last received data
_TCP_CLOSE_WAIT = 8  # tcpi_state (the first byte of struct tcp_info) of a connection its peer has closed


def _tcp_info_u32(sock: Any, offset: int) -> int | None:
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, offset + 4)
        return int(struct.unpack_from("I", raw, offset)[0])
    except (OSError, AttributeError, struct.error):
        return None


def waited_in_kernel(sock: Any) -> float:
    """Seconds since a connected socket last received data (Linux TCP_INFO tcpi_last_data_recv, ms;
    for a connection that has sent nothing yet: since its TCP handshake): how long its request has
    waited in the kernel (the listen socket's accept queue, the socket's buffer) before the worker
    looked at it. 0.0 where unknown (not Linux, not TCP)."""
    value = _tcp_info_u32(sock, _TCPI_LAST_DATA_RECV)
    return value / 1000 if value is not None else 0.0


def peer_closed(sock: Any) -> bool:
    """Whether the peer of a connected socket has already closed its side (Linux TCP_INFO state
    CLOSE_WAIT): a client that gave up while its connection waited in the accept queue. False
    where unknown."""
    try:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == _TCP_CLOSE_WAIT)
    except (OSError, AttributeError, IndexError):
        return False


def accept_queue(listener: Any) -> int:
    """Connections a listening socket holds that its worker has not accepted yet (Linux TCP_INFO
    tcpi_unacked of a socket in LISTEN state); 0 where unknown."""
    return _tcp_info_u32(listener, _TCPI_UNACKED) or 0


def holds_a_request(sock: Any) -> bool:
    """Whether bytes of a request are waiting on a connection not yet wrapped in TLS: more than
    REQUEST_BYTES in its receive buffer (FIONREAD). A client that only closed its connection (FIN,
    a TLS close_notify) or never sent anything holds none: closing such a connection drops no request."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        return bool(struct.unpack("i", buf)[0] >= REQUEST_BYTES)
    except (OSError, ValueError):
        return False
