"""Sockets of dra-guard's server, apart from gunicorn (webhook.serve.worker adapts gunicorn's
worker around them): the TLS socket bounds against stalling and trickling clients, and what Linux's
TCP_INFO tells about a connection's wait in the kernel and a listener's accept queue, and what is
checked of a request's head before gunicorn parses it (request_complete, refusal).
Timeouts (seconds) and why: docs/reliability.md.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import select
import socket
import ssl
import struct
import termios
import time
from typing import Any

CLIENT_SOCKET_TIMEOUT = 2.0  # seconds a client may stall a handshake, a read or a write (webhook timeouts are 3 s)
REQUEST_READ_LIMIT = 5.0  # seconds from the first byte of a request to its last (trickling clients)
#: bytes waiting on a connection that are more than a TLS alert record (close_notify: 24 bytes in TLS 1.3,
#: 31 in TLS 1.2 with AES-GCM), i.e. a request, not a client closing its connection
REQUEST_BYTES = 32


# Linux struct tcp_info (linux/tcp.h): 8 one-byte fields, then 32-bit ones; byte offsets of two
_TCPI_UNACKED = 8 + 4 * 4  # on a listening socket: connections in its accept queue
_TCPI_LAST_DATA_RECV = 8 + 4 * 11  # ms since the connection last received data


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


_TCP_CLOSE_WAIT = 8  # tcpi_state (the first byte of struct tcp_info) of a connection its peer has closed


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


def request_waiting(sock: Any, timeout: float) -> bool:
    """Whether a request's bytes are there (decrypted in the TLS layer, or readable on the socket)
    within `timeout` seconds."""
    if sock.pending():
        return True
    return ready(sock, select.POLLIN, timeout)


def ready(sock: Any, events: int, timeout: float) -> bool:
    """Whether `sock` turns readable/writable (select.POLLIN/POLLOUT) within `timeout` seconds."""
    poller = select.poll()
    poller.register(sock.fileno(), events)
    return bool(poller.poll(timeout * 1000))


def holds_a_request(sock: Any) -> bool:
    """Whether bytes of a request are waiting on a connection: decrypted in its TLS layer, or more than
    REQUEST_BYTES in its receive buffer (FIONREAD). A client that only closed its connection (FIN, a
    TLS close_notify) or never sent anything holds none: closing such a connection drops no request."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        return bool(struct.unpack("i", buf)[0] >= REQUEST_BYTES)
    except (OSError, ValueError):
        return False


#: a request head longer than this is whole enough: gunicorn's parser refuses it from the bytes it is
#: given, without reading the socket (its largest head is 100 fields of 8 KiB, 800 KiB; below that it
#: would read on, blocking a thread)
MAX_HEAD_BYTES = 1024 * 1024


def json_error(status: int, reason: str, detail: str) -> bytes:
    """A whole HTTP/1.1 answer with the JSON body {"error": "<reason>: <detail>"} (just "<reason>"
    when detail is empty) that closes the connection: every protocol error of the gthread engine."""
    body = json.dumps({"error": f"{reason}: {detail}" if detail else reason}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A request answered from its head alone, before gunicorn parses it (the answers of the
    event-loop front, webhook.serve.front.connection): status, reason and detail of json_error."""

    status: int
    reason: str
    detail: str

    def answer(self) -> bytes:
        return json_error(self.status, self.reason, self.detail)


def _framing(data: bytes | bytearray) -> tuple[int, set[bytes], list[bytes]] | None:
    """(where the head ends, its Content-Length values, its transfer codings, lower case) of the
    request at the start of `data`; None while the head is not complete."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    for line in bytes(data[:end]).lower().split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip() == b"content-length":
            lengths.add(value.strip())
        elif colon and name.strip() == b"transfer-encoding":
            codings.extend(coding.strip() for coding in value.split(b","))
    return end, lengths, codings


def request_complete(data: bytes | bytearray, max_body: int) -> bool:
    """Whether `data` (what a client sent on a connection, from the start of a request) holds a
    whole HTTP/1.1 request: its head and the Content-Length bytes of its body (RFC 9112 6.3); a
    pipelined request after it may follow. True too for what is answered from the head alone
    (refusal: any Transfer-Encoding, a body over max_body bytes) and for what gunicorn's parser
    refuses from the bytes it has (a head over MAX_HEAD_BYTES, conflicting or malformed lengths).
    False while more bytes are needed."""
    framing = _framing(data)
    if framing is None:
        return len(data) > MAX_HEAD_BYTES
    end, lengths, codings = framing
    if codings or len(lengths) != 1:
        return True  # refused from the head, gunicorn refuses conflicting lengths, or no body
    (length,) = lengths
    if not length.isdigit():
        return True
    return int(length) > max_body or len(data) - (end + 4) >= int(length)


def refusal(data: bytes | bytearray, max_body: int) -> Refusal | None:
    """The answer to the request at the start of `data` (its whole head) from the head alone, as
    the event-loop front gives it; None: gunicorn parses the request. A body with any
    Transfer-Encoding is refused before it is read: chunked 411 (the kube-apiserver always sends a
    Content-Length: tests/e2e/test_webhook_request_framing.py), any other coding 501 (RFC 9112 6.1);
    a Content-Length over max_body (server.maxRequestBytes) 413."""
    framing = _framing(data)
    if framing is None:
        return None
    _, lengths, codings = framing
    if codings == [b"chunked"]:
        return Refusal(411, "Length Required", "send the body with a Content-Length (no Transfer-Encoding)")
    if codings:
        return Refusal(501, "Not Implemented", "no transfer coding is supported: send the body with a Content-Length")
    if len(lengths) == 1 and (length := next(iter(lengths))).isdigit() and int(length) > max_body:
        return Refusal(413, "Content Too Large", f"body is larger than server.maxRequestBytes ({max_body} bytes)")
    return None


GATHER_STEP_WAIT = 0.01  # seconds a thread waits for more of an incomplete request (then: the poller)


def gather(sock: Any, buf: bytearray, started: float, *, max_bytes: int, first_round: bool = True) -> bool | None:
    """Read what the client has sent into `buf` without blocking on a slow client: True once `buf`
    holds a whole request (request_complete) or max_bytes + MAX_HEAD_BYTES, or the client closed
    after sending part of one (the parser answers what came); None when the rest has not come
    (waited for GATHER_STEP_WAIT seconds once if first_round: a request's first call); False when
    the client closed with nothing sent.
    started: time.monotonic() of the request's first byte. Raises TimeoutError once
    REQUEST_READ_LIMIT seconds have passed since then. The socket is left blocking."""
    sock.setblocking(False)
    try:
        while not request_complete(buf, max_bytes) and len(buf) <= max_bytes + MAX_HEAD_BYTES:
            try:
                chunk = sock.recv(256 * 1024)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                if time.monotonic() - started > REQUEST_READ_LIMIT:
                    raise TimeoutError(f"request not received within {REQUEST_READ_LIMIT:g} s") from None
                # wait for the rest in this thread once, in a request's first round only: an honest
                # client's request comes at once; one that trickles, even a byte every 5 ms, waits in
                # the poller (waiting per byte would let 16 such clients hold every thread)
                if first_round and ready(sock, select.POLLIN, GATHER_STEP_WAIT):
                    first_round = False
                    continue
                return None
            except TimeoutError:
                raise  # DeadlineSSLSocket's own REQUEST_READ_LIMIT
            except OSError:
                return False  # reset, or the TLS layer failed
            if not chunk:
                return bool(buf)
            buf += chunk
        return True
    finally:
        if sock.fileno() != -1:
            sock.setblocking(True)


class DeadlineSSLSocket(ssl.SSLSocket):
    """An SSLSocket that gives each request REQUEST_READ_LIMIT seconds to arrive in full.

    The per-operation timeout alone lets a client that sends one byte every second hold a worker
    thread forever. The clock starts at the first read after a response was sent (gthread hands a
    keep-alive connection to a thread only once the next request's bytes are there)."""

    _started: float | None = None

    def _check(self) -> None:
        now = time.monotonic()
        if self._started is None:
            self._started = now
        elif now - self._started > REQUEST_READ_LIMIT:
            raise TimeoutError(f"request not received within {REQUEST_READ_LIMIT:g} s")

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self._check()
        return super().recv(buflen, flags)

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        self._check()
        return super().recv_into(buffer, nbytes, flags) if nbytes is not None else super().recv_into(buffer, flags=flags)

    def setblocking(self, flag: bool) -> None:
        # gthread makes kept-alive sockets blocking again before each request: keep the bound
        if flag:
            self.settimeout(CLIENT_SOCKET_TIMEOUT)
        else:
            super().setblocking(False)

    def send(self, data: Any, flags: int = 0) -> int:
        self._answered(data)
        return super().send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._answered(data)
        super().sendall(data, flags)

    def _answered(self, data: Any) -> None:
        # an answer starts the next request's clock; an interim "100 Continue" (gunicorn sends it for
        # Expect: 100-continue once the head is parsed) does not: it gave a trickled body 5 s more
        if not bytes(data[:10]).startswith(b"HTTP/1.1 1"):
            self._started = None


class TimeoutWrapping:
    """What gunicorn's ssl_context hook returns: wraps each accepted socket with the current
    SSLContext after giving it a timeout, so a client that stalls its TLS handshake (bounded as a
    whole by CPython), its request or its reading of the answer frees the worker thread after
    CLIENT_SOCKET_TIMEOUT seconds instead of holding it forever (gthread sockets are otherwise fully
    blocking); DeadlineSSLSocket bounds a trickled request."""

    def __init__(self, context: Any, timeout: float, *, probe_port: int = 0, open_context: Any = None) -> None:
        self.context = context
        self.timeout = timeout
        self.probe_port = probe_port
        self.open_context = open_context

    def wrap_socket(self, sock: Any, **kwargs: Any) -> Any:
        """Wrap an accepted socket; one accepted on the probe port (server.probePort) gets
        open_context, which asks no client certificate (the kubelet's probes, Prometheus)."""
        sock.settimeout(self.timeout)
        context = self.context
        if self.probe_port and self.open_context is not None and sock.getsockname()[1] == self.probe_port:
            context = self.open_context
        context.sslsocket_class = DeadlineSSLSocket
        return context.wrap_socket(sock, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)
