"""The one module that touches gunicorn's internals (gunicorn pinned exactly in pyproject.toml and
constraints.txt): the gthread worker with dra-guard's connection handling, and the logger. When
moving the pin, run tests/http first: DrainingThreadWorker overrides gthread internals (handle,
finish_request, _DEFER, pending_conns, murder_keepalived, wait_for_and_dispatch_events, TConn
fields, the parser's unreader, gunicorn.sock.ssl_wrap_socket, gunicorn.http.get_parser).
What dra-guard keeps per connection is a ConnectionState of its own, never an attribute of
gthread's TConn. Timeouts (seconds) and why: docs/reliability.md."""

from __future__ import annotations

import errno
import io
import logging
import select
import ssl
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn import http, util
from gunicorn import sock as gsock
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.workers.gthread import _DEFER, ThreadWorker

from webhook import metrics
from webhook.serve.connections import ConnectionState, with_arrival
from webhook.serve.draining import DRAINING
from webhook.serve.sockets import (
    CLIENT_SOCKET_TIMEOUT,
    REQUEST_READ_LIMIT,
    accept_queue,
    gather,
    holds_a_request,
    json_error,
    ready,
    refusal,
    request_waiting,
    waited_in_kernel,
)

log = logging.getLogger("dra_guard.server")

SHUTDOWN_DELAY = [5.0]  # seconds; set from server.shutdownDelaySeconds before the workers fork
DROP_AFTER = [3.0]  # seconds; set from server.dropAfterSeconds: older queued requests are dropped
MAX_REQUEST_BYTES = [8 << 20]  # bytes; set from server.maxRequestBytes: a larger Content-Length is answered 413
KEEPALIVE_CONNECTIONS = 250  # idle keep-alive connections per worker: far above what apiservers, probes and Prometheus hold
FIRST_BYTE_WAIT = 0.01  # seconds a new connection may hold a pool thread before its first byte (then: the poller)
HANDSHAKE_STEP_WAIT = 0.01  # seconds a thread waits for the client's next TLS handshake bytes (then: the poller)
REQUEST_AFTER_HANDSHAKE_WAIT = 0.01  # seconds a thread waits for a request after a TLS handshake (then: the poller)
CLOSE_LINGER = 0.5  # seconds a closing connection waits for the client's FIN (RFC 9112 9.6) before it is dropped
GATHER_SMALL = 64 * 1024  # bytes of an incomplete request any connection may keep while it waits in the poller
GATHER_BUDGET_SHARE = 4  # incomplete requests above GATHER_SMALL kept in the poller: this many maxRequestBytes in all
RECLAIM_BATCH = 64  # idle connections closed at most per event-loop turn at the connection limit (nginx does the same)
RECLAIM_MIN_IDLE = 1.0  # seconds a connection must have been idle to be reclaimed (a busy client's may lag that much)
RECLAIM_HANDSHAKE_AGE = 0.25  # seconds since its TCP handshake after which one without a TLS handshake is reclaimed first
SILENT_LIMIT = 1.0  # seconds a new connection may stay without a ClientHello before the worker takes it up
AT_LIMIT_TURN = 0.05  # seconds between event-loop turns (reclaim rounds) while at the connection limit


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's util.write_error with a JSON body ({"error": "<reason>: <detail>"}, sockets.json_error)
    instead of an HTML page, for the protocol errors gunicorn answers before the app (request line
    over 8190 bytes: 414, over 100 headers: 431, a malformed header: 400, a crash outside the app:
    500). sock: the client socket; never raises on a gone client. Installed by
    DrainingThreadWorker.init_process in place of util.write_error: gunicorn has no public extension
    point for these answers (no setting or server hook; Worker.handle_error calls util.write_error
    directly; benoitc/gunicorn#993, closed without one), and copying handle_error's table of
    exceptions would track gthread's internals even more closely than this one assignment."""
    util.write_nonblock(sock, json_error(status_int, reason, mesg))


class DrainingThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, draining on SIGTERM: /readyz fails at once, requests are served
    for server.shutdownDelaySeconds more (the time it takes the apiserver and kube-proxy to stop
    sending here), then gthread's graceful stop finishes in-flight reviews."""

    wsgi: Callable[..., Iterable[bytes]]  # the app, set by base.Worker.load_wsgi

    def init_process(self) -> None:
        """Answer gunicorn's own protocol errors in JSON (write_json_error), then run the worker."""
        util.write_error = write_json_error
        # per connection and per socket, dropped with them: no attribute is added to gthread's TConn
        self._states: weakref.WeakKeyDictionary[Any, ConnectionState] = weakref.WeakKeyDictionary()
        self._arrivals: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        # gthread answers "Connection: close" on an active connection once max_keepalived are kept
        # alive: idle connections (an attacker's too) then cost an honest client its connection.
        # The limit stays worker_connections, enforced by murder_keepalived's reclaim of idle ones.
        self.max_keepalived = self.worker_connections
        self._kept_incomplete = 0  # bytes of incomplete requests waiting in the poller (murder_keepalived)
        metrics.ACCEPT_QUEUE.set_function(self._accept_queue)
        super().init_process()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if DRAINING.is_set():
            return
        DRAINING.set()
        log.info("SIGTERM: readiness off, draining", extra={"delaySeconds": SHUTDOWN_DELAY[0]})
        timer = threading.Timer(SHUTDOWN_DELAY[0], self._stop)
        timer.daemon = True
        timer.start()

    def _stop(self) -> None:
        """gthread's graceful stop: no new connection, in-flight requests finished (graceful_timeout)."""
        self.alive = False

    def load_wsgi(self) -> None:
        """gunicorn's load of the app (base.Worker), wrapped to give each request its arrival time
        as the WSGI environ key ARRIVAL (webhook.serve.lanes.arrived), as the event-loop front does."""
        super().load_wsgi()
        self.wsgi = with_arrival(self.wsgi, self._arrivals)

    def _state(self, conn: Any) -> ConnectionState:
        """The ConnectionState of a gthread TConn, made on its first use."""
        state = self._states.get(conn)
        if state is None:
            state = self._states[conn] = ConnectionState()
        return state

    def enqueue_req(self, conn: Any) -> None:
        """gthread's enqueue_req(), noting when the request arrived (ConnectionState.queued_at) for
        handle's drop and the review's deadline. A new connection's age counts its wait in the kernel's
        accept queue (waited_in_kernel; its review's deadline counts from the review's own bytes,
        _handle); a kept-alive one counts from now: the poller wakes as its bytes arrive."""
        state = self._state(conn)
        waited = 0.0 if conn.initialized else waited_in_kernel(conn.sock)
        state.queued_at = time.monotonic() - waited
        if state.connected_at is None:
            state.connected_at = state.queued_at
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        """Drop a request queued longer than DROP_AFTER[0] seconds (its apiserver has given up on
        it: serving it would only delay the ones still waited for), then serve it (_handle). A
        connection that holds no request (never sent one, or only closed) is closed uncounted."""
        state = self._state(conn)
        age = time.monotonic() - state.queued_at
        if age > DROP_AFTER[0] or (age > SILENT_LIMIT and not conn.initialized and not holds_a_request(conn.sock)):
            # too old to be waited for, or a new connection that has sent no ClientHello for
            # SILENT_LIMIT seconds since its TCP handshake (a TLS client sends it at once)
            if age > DROP_AFTER[0] and holds_a_request(conn.sock):
                metrics.DROPPED_REQUESTS.inc()
            conn.sock.close()
            return False
        state.arrival = state.queued_at
        return self._handle(conn, state)

    def _handle(self, conn: Any, state: ConnectionState) -> Any:
        """gthread's handle() (in a pool thread), where a slow or silent client holds no thread; each
        change and what it fixed is a row of docs/reliability.md ("Settings"):

        * a new connection waits FIRST_BYTE_WAIT seconds here for its first byte, then in the poller;
        * the TLS handshake waits HANDSHAKE_STEP_WAIT seconds here per client flight (_handshake);
        * after it, the request REQUEST_AFTER_HANDSHAKE_WAIT seconds, then the connection is kept
          alive in the poller (the apiserver leaves connections it dialed for a burst idle);
        * the request itself is gathered without blocking (_gather) before gunicorn parses it, and
          one the event-loop front refuses from its head is refused here the same way (sockets.refusal);
        * a pipelined request already decrypted in the TLS buffer goes straight back to the pool;
        * a connection gthread is about to close is closed here, waiting CLOSE_LINGER seconds at most
          for the client's FIN (gthread's drain in its event loop stalled every other connection).
        """
        if not conn.initialized:
            if not conn.data_ready and not conn.wait_for_data(FIRST_BYTE_WAIT):
                state.deferred = True  # read by finish_request, in the event loop
                return _DEFER
            if self.cfg.is_ssl:
                done = self._handshake(conn, state)
                if done is None:  # the client's next handshake bytes are not there: wait in the poller
                    state.deferred = True
                    return _DEFER
                if not done:
                    return False
                if not conn.is_http2 and not request_waiting(conn.sock, REQUEST_AFTER_HANDSHAKE_WAIT):
                    # handshake done, no request: a client's pooled connection (the apiserver dials
                    # one per review of a burst and keeps those it did not need): kept alive in the
                    # poller, like a connection after an answer, not in this thread
                    state.no_request_yet = True  # reclaimed first at the connection limit
                    return True
                # the review's own clock starts with its bytes, not with the connection's ClientHello:
                # a client (Go's http.Transport, the apiserver's) hands a new connection to whichever
                # request waits when the dial completes, often a later one than the dial was for.
                # Dating it from the ClientHello refused fresh reviews as late (42 RBAC 503s at 500/s).
                state.arrival = time.monotonic() - waited_in_kernel(conn.sock)
        state.no_request_yet = False
        if not conn.is_http2:
            whole = self._gather(conn, state)
            if whole is None:  # the rest of the request is not there: wait for it in the poller
                state.deferred = True
                return _DEFER
            if not whole:
                conn.sock.close()
                return False
        self._arrivals[conn.sock] = state.arrival  # the environ's ARRIVAL (with_arrival)
        result = super().handle(conn)
        if result is False and conn.sock.fileno() != -1:
            util.close_graceful(conn.sock, timeout=CLOSE_LINGER)
        elif result is True and isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
            # a pipelined request already decrypted inside the TLS layer: the socket will not turn
            # readable for it, so it goes straight back to the pool (finish_request)
            state.tls_pending = True
        return result

    def _gather(self, conn: Any, state: ConnectionState) -> bool | None:
        """Read the request without waiting for a slow client here (sockets.gather): True once it is
        whole (handed to gunicorn's parser, which then reads no socket for it); None when the rest has
        not come (deferred to the poller, called again on more bytes); False when the connection is
        done: the client closed; or its request was answered from its head (sockets.refusal: any
        Transfer-Encoding 411/501, a Content-Length over maxRequestBytes 413), or took over
        REQUEST_READ_LIMIT s since its first byte (408), each with a JSON error; or its incomplete
        request would pass the budget (GATHER_BUDGET_SHARE x maxRequestBytes). gthread's blocking
        reads would let 16 clients that send a byte every 1.5 s hold all 8 threads, and evictions
        time out (docs/reliability.md, slow clients)."""
        buf = state.gathered
        if state.gather_started is None:
            state.gather_started = time.monotonic()
        unreader = conn.parser.unreader
        if unreader.buf.getvalue():  # read ahead by gunicorn (a pipelined request)
            buf[:0] = unreader.buf.getvalue()
            unreader.buf = io.BytesIO()
        state.gather_rounds += 1
        try:
            whole = gather(
                conn.sock, buf, state.gather_started, max_bytes=MAX_REQUEST_BYTES[0], first_round=state.gather_rounds == 1
            )
        except TimeoutError:
            self.log.exception("request not gathered in time")  # ServerLogger: "client timed out", counted
            self._refuse(conn, json_error(408, "Request Timeout", f"request not received within {REQUEST_READ_LIMIT:g} s"))
            return False
        if whole is None:
            if len(buf) > GATHER_SMALL and self._kept_incomplete + len(buf) > GATHER_BUDGET_SHARE * MAX_REQUEST_BYTES[0]:
                self.log.warning("incomplete request of %d bytes closed: the worker's budget for them is full", len(buf))
                return False
            return None
        refused = refusal(buf, MAX_REQUEST_BYTES[0]) if whole else None
        if refused is not None:
            self._refuse(conn, refused.answer())
            whole = False
        elif whole and buf:
            unreader.unread(bytes(buf))
        if state.gather_rounds > 1:
            state.arrival = state.gather_started  # a request gathered over several rounds arrived with its first byte
        state.gathered, state.gather_started, state.gather_rounds = bytearray(), None, 0
        return whole

    def _refuse(self, conn: Any, answer: bytes) -> None:
        """Send a protocol error's answer (a few hundred bytes, without waiting for a client that does
        not read) and close the connection, waiting CLOSE_LINGER s at most for the client's FIN: a
        close with its unread bytes still queued would reset the connection and lose the answer."""
        try:
            util.write_nonblock(conn.sock, answer)
        except OSError:
            pass
        util.close_graceful(conn.sock, timeout=CLOSE_LINGER)

    def _handshake(self, conn: Any, state: ConnectionState) -> bool | None:
        """gthread's conn.init() (wrap the socket, run the TLS handshake, make the HTTP parser),
        without a stalled client holding the thread: True when done; None when the client's next
        bytes are not there within HANDSHAKE_STEP_WAIT seconds (the caller defers the connection to
        the poller and is called again when they come); False when the handshake failed or took
        over CLIENT_SOCKET_TIMEOUT from its first byte (connection closed; a timeout is the "client
        timed out" warning, ServerLogger.exception)."""
        try:
            if not isinstance(conn.sock, ssl.SSLSocket):
                state.handshake_deadline = time.monotonic() + CLIENT_SOCKET_TIMEOUT
                # called once its first bytes are there: a client that talks, not a silent one, for
                # murder_keepalived's reclaim order (its next flight may be slow: a loaded client)
                state.greeted = True
                conn.sock = gsock.ssl_wrap_socket(conn.sock, self.cfg)
            conn.sock.setblocking(False)
            while True:
                if time.monotonic() > state.handshake_deadline:
                    raise TimeoutError(f"TLS handshake not done within {CLIENT_SOCKET_TIMEOUT:g} s")
                try:
                    conn.sock.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    if not ready(conn.sock, select.POLLIN, HANDSHAKE_STEP_WAIT):
                        return None
                except ssl.SSLWantWriteError:
                    if not ready(conn.sock, select.POLLOUT, CLIENT_SOCKET_TIMEOUT):
                        raise TimeoutError("the client does not read the TLS handshake") from None
            conn.initialized = True
            conn.sock.setblocking(True)  # DeadlineSSLSocket: blocking with the per-operation bound
            if gsock.is_http2_negotiated(conn.sock):
                conn.is_http2 = True
                conn.parser = http.get_parser(self.cfg, conn.sock, conn.client, http2_connection=True)
                conn.parser.initiate_connection()
            else:
                conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
            metrics.TLS_HANDSHAKES.inc()
            return True
        except ssl.SSLError as exc:
            self.log.debug("TLS handshake failed: %s", exc)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.exception("Socket error processing request.")
        except Exception:
            self.log.exception("Error in the TLS handshake.")
        conn.sock.close()
        return False

    def finish_request(self, conn: Any, fs: Any) -> None:
        """gthread's finish_request(), except for a connection already closed (by handle(), or by
        gthread on a TLS EOF): gthread counted it out twice, and a worker whose count drifts low
        accepts past worker_connections without bound (6,971 sockets in bench/)."""
        if conn.sock.fileno() == -1:
            self.nr_conns -= 1
            return
        state = self._state(conn)
        tls_pending, deferred, state.tls_pending, state.deferred = state.tls_pending, state.deferred, False, False
        if tls_pending and self.alive:
            self.enqueue_req(conn)
            return
        super().finish_request(conn, fs)
        if deferred and self.pending_conns and self.pending_conns[-1] is conn:
            # a connection without a first byte waits CLIENT_SOCKET_TIMEOUT in the poller, not the
            # 75 s keep-alive: silent connections must not hold the worker's connection slots.
            # Every pending connection gets the same delay, so the queue stays in time order.
            conn.timeout = min(conn.timeout, time.monotonic() + CLIENT_SOCKET_TIMEOUT)

    def murder_keepalived(self, force: bool = False) -> None:
        """gthread's close of expired kept-alive connections (each event-loop turn), then, at the
        connection limit with connections in the accept queue, the close of up to RECLAIM_BATCH idle
        ones, like nginx (order below; dra_guard_idle_connections_reclaimed_total). gthread stopped
        accepting instead: 257 connections idle after their handshake locked new ones out for 75 s."""
        super().murder_keepalived(force)
        states = [self._state(c) for c in self.pending_conns]
        self._kept_incomplete = sum(len(state.gathered) for state in states)
        if force or not self.alive or self.nr_conns < self.worker_connections:
            return
        waiting = min(RECLAIM_BATCH, self._accept_queue())
        if not waiting:
            return
        now = time.monotonic()
        # first: no ClientHello RECLAIM_HANDSHAKE_AGE after connecting (a TLS client sends it at once),
        # longest idle first; then pending ones idle RECLAIM_MIN_IDLE, a handshake under way included
        # (they wait CLIENT_SOCKET_TIMEOUT at most)
        connected = {
            c: now if state.connected_at is None else state.connected_at
            for c, state in zip(self.pending_conns, states, strict=True)
            if not c.initialized and not state.greeted
        }
        silent = sorted((c for c, at in connected.items() if at < now - RECLAIM_HANDSHAKE_AGE), key=connected.__getitem__)
        pending = [
            c for c in self.pending_conns if c.timeout - CLIENT_SOCKET_TIMEOUT < now - RECLAIM_MIN_IDLE and c not in silent
        ]
        # kept alive: never one holding a request; never-used ones idle 0.25 s before used ones idle 1 s
        kept = [
            c
            for c in self.keepalived_conns
            if not holds_a_request(c.sock)
            and c.timeout - self.cfg.keepalive
            < now - (RECLAIM_HANDSHAKE_AGE if self._state(c).no_request_yet else RECLAIM_MIN_IDLE)
        ]
        kept.sort(key=lambda c: not self._state(c).no_request_yet)  # stable: longest idle first in each
        chosen = [(self.pending_conns, c) for c in silent + pending] + [(self.keepalived_conns, c) for c in kept]
        for queue, conn in chosen[:waiting]:
            queue.remove(conn)
            try:
                self.poller.unregister(conn.sock)
            except (OSError, KeyError, ValueError):
                pass
            self.nr_conns -= 1
            conn.close()
        metrics.CONNECTIONS_RECLAIMED.inc(len(chosen[:waiting]))

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        """gthread's event-loop wait, AT_LIMIT_TURN s at most at the connection limit: reclaim runs each
        turn, and with only silent connections held gthread turned once a second."""
        if self.nr_conns >= self.worker_connections:
            timeout = min(timeout, AT_LIMIT_TURN)
        super().wait_for_and_dispatch_events(timeout)

    def _accept_queue(self) -> int:
        """Connections waiting in the accept queues of this worker's listening sockets."""
        return sum(accept_queue(listener) for listener in self.sockets)


class ServerLogger(GunicornLogger):
    """gunicorn's logger with two changes, both about work and noise per connection:

    * no access-log work while the access log is off: gunicorn builds every request's access-log
      atoms (a dict of ~20 fields) whenever a logconfig is given, as ours is (JSON lines), then
      drops the line because gunicorn.access logs nothing below WARNING: about 5% of a worker's
      CPU per review (py-spy, bench/RESULTS.md). An access logger set to INFO still gets its lines.
    * a client that times out (CLIENT_SOCKET_TIMEOUT per operation, REQUEST_READ_LIMIT per request)
      is one warning line ("client timed out") and dra_guard_client_timeouts_total, not gunicorn's
      "Socket error processing request." with a traceback at ERROR: the bound works as designed.
    """

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        """Log the request (gunicorn's format) only when gunicorn.access logs INFO."""
        if self.access_log.isEnabledFor(logging.INFO):
            super().access(resp, req, environ, request_time)

    def exception(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """gunicorn's exception(), except for a client timeout (see the class docstring)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, TimeoutError):
            metrics.CLIENT_TIMEOUTS.inc()
            self.error_log.warning("client timed out, connection closed: %s", exc)
            return
        super().exception(msg, *args, **kwargs)
