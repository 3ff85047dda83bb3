"""The front's listeners: one accept loop per listening socket, each connection wrapped in TLS
with the SSLContext of its listener at that moment (the webhook port: the serving certificate and
the optional client CA; server.probePort: no client certificate), the handshake bounded by
CLIENT_SOCKET_TIMEOUT.

A connection's wait in the kernel counts (Linux TCP_INFO, webhook.serve.front.kernel): one whose first
bytes (its ClientHello) waited in the accept queue past server.dropAfterSeconds is closed before
its handshake (its apiserver has given up: dra_guard_requests_dropped_total), one that has sent
nothing for SILENT_LIMIT s is closed uncounted. Nothing is accepted past the connection limit:
the table reclaims idle connections first (webhook.serve.front.capacity).

While the worker is overloaded (Front.overloaded: within OVERLOAD_HOLD s a review was shed
because it could not be judged in time, or the connection limit was reached with at least half
of the connections busy and more waiting in the accept queue), a new connection to the webhook port is accepted and reset at once (no TLS
handshake, dra_guard_connections_refused_total), at the connection limit too, and so is every other
one waiting in the accept queue, in batches of REFUSE_BATCH without a wake-up of the loop each: the connections it
holds get the overload answer in a few hundred microseconds, while a handshake costs about as much
CPU as judging a review, and an apiserver whose connections are all busy dials a new one per
review. Dialing on, the clients would take the CPU the reviews need (every connection busy, more
dials, more handshakes: the collapse bench/RESULTS.md measured). The listen backlog stays
gunicorn's 2,048: the loop takes connections off the queue fast enough to reset them, and a full
queue would drop SYNs instead, which a client sends again only after 1 s while its requests wait
for a connection (Go's transport queues them: seconds of latency for the reviews it does send).
The probe port (server.probePort) is never refused.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
from collections.abc import Callable, Sequence

from webhook import metrics
from webhook.serve.front.connection import CLIENT_SOCKET_TIMEOUT, Connection
from webhook.serve.front.kernel import accept_queue, holds_a_request, peer_closed, waited_in_kernel
from webhook.serve.front.shared import Front

log = logging.getLogger("dra_guard.server")

SILENT_LIMIT = 1.0  # seconds a new connection may wait in the kernel without a ClientHello
#: connections reset in one turn of the loop while overloaded: the accept queue is emptied without a
#: wake-up per connection, in steps short enough (~5 us each) for the loop's other work to go on
REFUSE_BATCH = 64
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a TCP reset
CLOSE_LINGER = 0.5  # seconds a closing TLS connection waits for the client's close_notify


class Listeners:
    """The accept loops of one worker over `sockets` (its own duplicates of gunicorn's listeners)."""

    def __init__(
        self,
        front: Front,
        sockets: Sequence[socket.socket],
        context_for: Callable[[int], ssl.SSLContext],
        probe_port: int = 0,
    ) -> None:
        self.front = front
        self.sockets = list(sockets)
        self.context_for = context_for
        self.probe_port = probe_port
        self._tasks: list[asyncio.Task[None]] = []

    def waiting(self) -> int:
        """Connections in the accept queues of every listener (dra_guard_accept_queue)."""
        return sum(accept_queue(s) for s in self.sockets if s.fileno() != -1)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            sock.setblocking(False)
            self._tasks.append(loop.create_task(self._accept(sock)))

    def stop(self) -> None:
        """Stop accepting (drain): the listeners are closed, queued connections get a reset."""
        for task in self._tasks:
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        host, port = listener.getsockname()[:2]
        table = self.front.table
        refusing = port != self.probe_port
        while True:
            if not (refusing and self.front.overloaded()):
                await table.room(self.waiting, self.front.saturated if refusing else None)
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE, ENFILE, ECONNABORTED: try again shortly
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if refusing and self.front.overloaded():
                if refuse_queued(listener, self.front.overloaded, first=sock) == REFUSE_BATCH:
                    await asyncio.sleep(0)  # more wait: the loop's other work first
                continue
            self.admit(sock, server=(host, port))

    def admit(self, sock: socket.socket, *, server: tuple[str, int]) -> None:
        """Start the TLS handshake of an accepted connection, or close it (see the module docstring)."""
        waited = waited_in_kernel(sock)
        if waited > self.front.drop_after or (waited > SILENT_LIMIT and not holds_a_request(sock)) or peer_closed(sock):
            # too old, silent, or its client already gone (it gave up while the connection waited
            # in the accept queue, as the apiserver's does at its timeout): no TLS handshake for it
            if waited > self.front.drop_after and holds_a_request(sock):
                metrics.DROPPED_REQUESTS.inc()
            sock.close()
            return
        conn = Connection(self.front, server=server)
        self.front.table.hold(conn)
        conn.handshake = asyncio.get_running_loop().create_task(self._handshake(conn, sock, self.context_for(server[1])))

    async def _handshake(self, conn: Connection, sock: socket.socket, context: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CLIENT_SOCKET_TIMEOUT):
                await _readable(sock)
            conn.hello()  # from here its reclaim order is a talking client's (capacity module)
            await loop.connect_accepted_socket(
                lambda: conn, sock, ssl=context, ssl_handshake_timeout=CLIENT_SOCKET_TIMEOUT, ssl_shutdown_timeout=CLOSE_LINGER
            )
        except asyncio.CancelledError:
            pass  # reclaimed at the connection limit, or the worker stops
        except (OSError, ssl.SSLError, EOFError) as exc:  # includes the handshake timeout
            log.debug("TLS handshake failed: %s", exc)
        finally:
            conn.handshake = None
            if conn.transport is None:
                if sock.fileno() != -1:
                    sock.close()
                self.front.table.release(conn)


async def _readable(sock: socket.socket) -> None:
    """Until `sock` has bytes to read (a new connection's ClientHello) or its peer closed it."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def refuse(sock: socket.socket) -> None:
    """Reset a just-accepted connection (no TLS handshake): its client sees ECONNRESET at once,
    not a wait (see the module docstring)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    sock.close()


def refuse_queued(listener: socket.socket, overloaded: Callable[[], bool], *, first: socket.socket | None = None) -> int:
    """Reset `first` (a connection just accepted from `listener`) and up to REFUSE_BATCH in all
    of those waiting in `listener`'s accept queue (non-blocking) while `overloaded()` holds; returns
    how many, counted in dra_guard_connections_refused_total. An overloaded worker is dialled faster than it
    judges (Go's transport dials for every review that finds no idle connection, and again for a
    review still waiting when an idle one comes back): one wake-up of the loop per reset would
    spend on refusing the CPU the reviews in hand need."""
    refused = 0
    if first is not None:
        refuse(first)
        refused = 1
    while refused < REFUSE_BATCH and overloaded():
        try:
            sock, _ = listener.accept()
        except OSError:  # an empty queue (EAGAIN); ECONNABORTED, EMFILE: the accept loop handles them
            break
        refuse(sock)
        refused += 1
    if refused:
        metrics.CONNECTIONS_REFUSED.inc(refused)
    return refused
