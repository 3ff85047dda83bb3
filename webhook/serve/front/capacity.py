"""The front's connection cap and reclaim order, over its own connection objects (no socket here).

A worker holds at most `limit` connections (server.threads + KEEPALIVE_CONNECTIONS): each TLS
connection costs ~25 KiB, so a connection storm cannot grow the worker's memory without bound;
more wait in the kernel's accept queue. At the limit, with connections waiting there, idle ones
are closed to let them in, like nginx, in this order (dra_guard_idle_connections_reclaimed_total):

1. no ClientHello RECLAIM_HANDSHAKE_AGE s after connecting (a TLS client sends it at once);
2. a request started, or a TLS handshake, but no byte for RECLAIM_MIN_IDLE s (a trickling client;
   a handshake whose client answers slowly is a client that talks);
3. a TLS handshake done and no request yet, idle RECLAIM_HANDSHAKE_AGE s (the apiserver dials one
   connection per review of a burst and keeps the ones it did not need);
4. kept alive after an answer, idle RECLAIM_MIN_IDLE s (a busy client's may lag that much).

Longest idle first within each; never a connection whose request is being judged or answered,
nor one whose request already waits in the kernel unread (a busy loop reads it late: closing it
would drop a review the client has sent, which the apiserver does not send again).
A reclaimed connection counts against the limit until it is really closed, so the worker never
holds more sockets than the limit (plus its own files).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from webhook import metrics

KEEPALIVE_CONNECTIONS = 250  # idle keep-alive connections per worker: far above what apiservers, probes and Prometheus hold
RECLAIM_BATCH = 64  # idle connections closed at most per turn at the connection limit (nginx does the same)
RECLAIM_MIN_IDLE = 1.0  # seconds a connection must have been idle to be reclaimed (a busy client's may lag that much)
RECLAIM_HANDSHAKE_AGE = 0.25  # seconds after which one without a TLS handshake (or a request after it) goes first
AT_LIMIT_TURN = 0.05  # seconds between reclaim rounds while at the connection limit


class State(enum.Enum):
    """Where a connection is in its life (the reclaim order reads it)."""

    HANDSHAKE = "handshake"  # accepted, no ClientHello yet
    HELLO = "hello"  # its ClientHello arrived, TLS handshake not done
    NEW = "new"  # handshake done, no request yet
    READING = "reading"  # a request's bytes are arriving
    BUSY = "busy"  # its request is being judged or its answer written
    IDLE = "idle"  # kept alive after an answer


class Held(Protocol):
    """What the table needs of a connection (webhook.serve.front.connection.Connection)."""

    state: State
    since: float  # time.monotonic() when it entered its state, or of its last byte while READING
    closing: bool
    pending: int  # bytes of the request arriving (READING)

    def close_now(self) -> None:
        """Close at once (no answer, no TLS close_notify); the table hears of it by release()."""

    def resume(self) -> None:
        """Read again after a pause for the budget of incomplete requests."""

    def request_waiting(self) -> bool:
        """Whether bytes of a request wait in the kernel that the loop has not read yet."""


class ConnectionTable:
    """The connections one worker holds, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: set[Held] = set()
        self._freed = asyncio.Event()
        self.paused: set[Held] = set()  # reading paused: the budget of incomplete requests was spent

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Held]:
        return iter(list(self._held))

    def hold(self, conn: Held) -> None:
        self._held.add(conn)

    def release(self, conn: Held) -> None:
        """Forget a connection that is closed (idempotent)."""
        if conn in self._held:
            self._held.discard(conn)
            self._freed.set()
            self.resume_paused()

    def resume_paused(self) -> None:
        """Let the connections paused for the budget read again (each checks it anew)."""
        paused, self.paused = self.paused, set()
        for conn in paused:
            conn.resume()

    async def room(self, waiting: Callable[[], int], give_up: Callable[[int], bool] | None = None) -> None:
        """Return once the table holds fewer than `limit` connections, or once give_up(queued) is
        true. While full, each turn reclaims up to min(RECLAIM_BATCH, waiting()) idle ones (waiting:
        connections in the accept queues), asks give_up with what is still queued, then waits
        AT_LIMIT_TURN s or for one to be released."""
        while len(self._held) >= self.limit:
            queued = waiting()
            if queued:
                self.reclaim(min(RECLAIM_BATCH, queued))
            if len(self._held) < self.limit or (give_up is not None and give_up(queued)):
                return
            self._freed.clear()
            try:
                async with asyncio.timeout(AT_LIMIT_TURN):
                    await self._freed.wait()
            except TimeoutError:
                pass

    def reclaim(self, count: int, now: float | None = None) -> int:
        """Close up to `count` idle connections in the module's order; how many were closed."""
        now = time.monotonic() if now is None else now
        open_ = [c for c in self._held if not c.closing]

        def idle(state: State, seconds: float) -> list[Held]:
            return sorted(
                (c for c in open_ if c.state is state and c.since < now - seconds and not c.request_waiting()),
                key=lambda c: c.since,
            )

        chosen = (
            idle(State.HANDSHAKE, RECLAIM_HANDSHAKE_AGE)
            + sorted(idle(State.READING, RECLAIM_MIN_IDLE) + idle(State.HELLO, RECLAIM_MIN_IDLE), key=lambda c: c.since)
            + idle(State.NEW, RECLAIM_HANDSHAKE_AGE)
            + idle(State.IDLE, RECLAIM_MIN_IDLE)
        )[:count]
        for conn in chosen:
            conn.close_now()
        metrics.CONNECTIONS_RECLAIMED.inc(len(chosen))
        return len(chosen)

    def busy(self) -> int:
        """Connections whose request is queued for the app, judged or answered (State.BUSY)."""
        return sum(1 for c in self._held if c.state is State.BUSY)

    def incomplete_bytes(self) -> int:
        """Bytes of requests still arriving, over every connection (the budget of the whole worker)."""
        return sum(c.pending for c in self._held if c.state is State.READING)
