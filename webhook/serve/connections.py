"""What the gthread engine (webhook.serve.worker) keeps per connection, apart from gunicorn's own
objects, and how it hands a request's arrival time to the app: the WSGI environ key
webhook.serve.lanes.ARRIVAL, as the event-loop front does."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from webhook.serve.lanes import ARRIVAL


@dataclasses.dataclass(slots=True)
class ConnectionState:
    """What DrainingThreadWorker keeps about one gthread connection (TConn) between its turns in the
    pool and the poller. Times are time.monotonic() seconds."""

    #: its TCP handshake, its wait in the kernel's accept queue counted (murder_keepalived's reclaim order)
    connected_at: float | None = None
    #: when it was last queued for a pool thread (a new one: its wait in the kernel counted); handle's drop
    queued_at: float = dataclasses.field(default_factory=time.monotonic)
    #: when the request being read arrived: the WSGI environ's ARRIVAL (the review's deadline)
    arrival: float = 0.0
    #: after this, its TLS handshake has failed (CLIENT_SOCKET_TIMEOUT from its first byte)
    handshake_deadline: float = 0.0
    #: its TLS handshake has started (its ClientHello came): a client that talks, not a silent one
    greeted: bool = False
    #: handed back to the poller to wait for more bytes (finish_request caps its wait)
    deferred: bool = False
    #: its TLS handshake is done and it has sent no request yet (reclaimed first at the limit)
    no_request_yet: bool = False
    #: a pipelined request is already decrypted in its TLS layer: straight back to the pool
    tls_pending: bool = False
    #: the bytes of the request being gathered (sockets.gather), its first byte's time, the rounds so far
    gathered: bytearray = dataclasses.field(default_factory=bytearray)
    gather_started: float | None = None
    gather_rounds: int = 0


def with_arrival(app: Callable[..., Iterable[bytes]], arrivals: weakref.WeakKeyDictionary[Any, float]) -> Callable[..., Any]:
    """The WSGI app `app` with environ[ARRIVAL] (time.monotonic() of the request's arrival, for
    webhook.serve.lanes.arrived) set from `arrivals`: the client socket gunicorn puts in the environ
    ("gunicorn.socket") -> when the request being served on it arrived (DrainingThreadWorker._handle).
    A socket without one (none known) leaves the key out: the app then counts from now."""

    def app_with_arrival(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        sock = environ.get("gunicorn.socket")
        arrival = arrivals.get(sock) if sock is not None else None
        if arrival is not None:
            environ[ARRIVAL] = arrival
        return app(environ, start_response)

    return app_with_arrival
