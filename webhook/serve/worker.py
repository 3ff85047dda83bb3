"""The one module that touches gunicorn's internals (gunicorn >=27,<28, pinned in pyproject.toml):
the gthread worker with dra-guard's connection handling, the logger, and the TLS socket bounds.

When moving the gunicorn pin, run tests/http/test_connections.py first: DrainingThreadWorker
overrides gthread internals (handle, finish_request, _keepalive_after, _DEFER, pending_conns, and
TConn.init/is_http2/parser for the handshake it runs itself).
Timeouts (seconds) and why: docs/reliability.md.
"""
from __future__ import annotations

import errno
import json
import logging
import select
import ssl
import sys
import threading
import time
from typing import Any

from gunicorn import util
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.workers.gthread import _DEFER, ThreadWorker

from webhook import metrics
from webhook.serve.lanes import set_arrival

log = logging.getLogger("dra_guard.server")

DRAINING = threading.Event()  # set in a worker on SIGTERM: /readyz fails while it keeps serving
SHUTDOWN_DELAY = [5.0]        # seconds; set from server.shutdownDelaySeconds before the workers fork
DROP_AFTER = [3.0]            # seconds; set from server.dropAfterSeconds: older queued requests are dropped
KEEPALIVE_CONNECTIONS = 250  # idle keep-alive connections per worker: far above what apiservers, probes and Prometheus hold
FIRST_BYTE_WAIT = 0.1  # seconds a new connection may hold a pool thread before its first byte (then: the poller)
REQUEST_AFTER_HANDSHAKE_WAIT = 0.01  # seconds a thread waits for a request after a TLS handshake (then: the poller)
CLOSE_LINGER = 0.5  # seconds a closing connection waits for the client's FIN (RFC 9112 9.6) before it is dropped
CLIENT_SOCKET_TIMEOUT = 2.0  # seconds a client may stall a handshake, a read or a write (webhook timeouts are 3 s)
REQUEST_READ_LIMIT = 5.0     # seconds from the first byte of a request to its last (trickling clients)


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's util.write_error, with a JSON body ({"error": "<reason>: <detail>"}, like the
    app's own errors) instead of an HTML page. gunicorn answers a few protocol errors before the
    app sees the request (a request line over 8190 bytes: 414, more than 100 headers: 431, a
    malformed header: 400, a crash outside the app: 500; a failed TLS handshake, e.g. plain HTTP
    to this port, cannot be answered and the connection is just closed); installed in each worker
    by DrainingThreadWorker.init_process. sock: the client socket; never raises on a gone client
    (gunicorn's caller logs that at debug)."""
    body = json.dumps({"error": f"{reason}: {mesg}" if mesg else reason}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    util.write_nonblock(sock, head + body)


class DrainingThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, draining on SIGTERM: /readyz fails at once, requests are served
    for server.shutdownDelaySeconds more (the time it takes the apiserver and kube-proxy to stop
    sending here), then gthread's graceful stop finishes in-flight reviews."""

    def init_process(self) -> None:
        """Answer gunicorn's own protocol errors in JSON (write_json_error), then run the worker."""
        util.write_error = write_json_error
        super().init_process()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if DRAINING.is_set():
            return
        DRAINING.set()
        log.info("SIGTERM: readiness off, draining", extra={"delaySeconds": SHUTDOWN_DELAY[0]})
        timer = threading.Timer(SHUTDOWN_DELAY[0], lambda: setattr(self, "alive", False))
        timer.daemon = True
        timer.start()

    def enqueue_req(self, conn: Any) -> None:
        """gthread's enqueue_req(), noting when the request was queued (conn.queued_at, monotonic):
        its age decides whether it is still worth serving (handle) and its review's deadline
        (webhook.serve.lanes.arrived)."""
        conn.queued_at = time.monotonic()
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        """Drop a request queued longer than DROP_AFTER[0] seconds (its apiserver has given up on
        it: serving it would only delay the ones still waited for), then serve it (_handle)."""
        queued_at = conn.__dict__.get("queued_at")
        if queued_at is not None and time.monotonic() - queued_at > DROP_AFTER[0]:
            metrics.DROPPED_REQUESTS.inc()
            conn.sock.close()
            return False
        set_arrival(queued_at)
        try:
            return self._handle(conn)
        finally:
            set_arrival(None)

    def _handle(self, conn: Any) -> Any:
        """gthread's handle() (in a pool thread), with four changes:

        * a new connection waits at most FIRST_BYTE_WAIT seconds in this thread for its first byte
          (gthread: 5 s), then in the poller: eight connections that send nothing held every
          thread for 5 s each;
        * after its TLS handshake, a new connection waits at most REQUEST_AFTER_HANDSHAKE_WAIT
          seconds here for its request, then in the poller as a kept-alive connection: the
          apiserver leaves connections it dialed for a burst idle in its pool, and gthread waited
          for their request in the thread until the 2 s socket timeout (docs/reliability.md);
        * a connection with a pipelined request already decrypted in its TLS buffer goes back to
          the pool (gthread waited for the socket to turn readable, which it never does then);
        * a connection gthread is about to close is closed here: gthread closes it in its event
          loop with a graceful drain that waits up to 2 s for the client's FIN, and a client that
          never sends one (stalled, or gone after its own timeout) stalled every other connection
          of the worker meanwhile. The drain here waits at most CLOSE_LINGER seconds.
        """
        if not conn.initialized:
            if not conn.data_ready and not conn.wait_for_data(FIRST_BYTE_WAIT):
                conn.first_byte_deferred = True  # read by finish_request, in the event loop
                return _DEFER
            if self.cfg.is_ssl:
                if not self._handshake(conn):
                    return False
                if not conn.is_http2 and not _request_waiting(conn.sock, REQUEST_AFTER_HANDSHAKE_WAIT):
                    # handshake done, no request: a client's pooled connection (the apiserver dials
                    # one per review of a burst and keeps those it did not need): kept alive in the
                    # poller, like a connection after an answer, not in this thread
                    return True
        result = super().handle(conn)
        if result is False and conn.sock.fileno() != -1:
            util.close_graceful(conn.sock, timeout=CLOSE_LINGER)
        elif result is True and isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
            # a pipelined request already decrypted inside the TLS layer: the socket will not turn
            # readable for it, so it goes straight back to the pool (finish_request)
            conn.tls_pending = True
        return result

    def _handshake(self, conn: Any) -> bool:
        """gthread's conn.init() (the TLS handshake, bounded by CLIENT_SOCKET_TIMEOUT) with its error
        handling: a failed or abandoned handshake closes the connection (False); a timeout is the
        "client timed out" warning (ServerLogger.exception)."""
        try:
            conn.sock.setblocking(True)
            conn.init()
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
        """gthread's finish_request(), except for a connection already closed (by handle() above,
        or by gthread itself on a TLS EOF): gthread would count it out twice (its close raises on
        the closed socket and its error path decrements again), and a worker whose count drifts
        below the truth accepts past worker_connections without bound (6,971 sockets in bench/)."""
        if conn.sock.fileno() == -1:
            self.nr_conns -= 1
            return
        if conn.__dict__.pop("tls_pending", False) and self.alive:
            self.enqueue_req(conn)
            return
        deferred = conn.__dict__.pop("first_byte_deferred", False)
        super().finish_request(conn, fs)
        if deferred and self.pending_conns and self.pending_conns[-1] is conn:
            # a connection without a first byte waits CLIENT_SOCKET_TIMEOUT in the poller, not the
            # 75 s keep-alive: silent connections must not hold the worker's connection slots.
            # Every pending connection gets the same delay, so the queue stays in time order.
            conn.timeout = min(conn.timeout, time.monotonic() + CLIENT_SOCKET_TIMEOUT)

    def _keepalive_after(self, conn: Any, keepalive: bool) -> bool:
        """gthread's check whether a connection can serve another request after an answer: it
        drains a body the app did not read. A malformed rest of the body made gthread send a
        second, unsolicited error answer on the connection; it now just ends the connection."""
        try:
            return bool(super()._keepalive_after(conn, keepalive))
        except Exception:  # gunicorn's parser errors (bad chunk size, too many trailers, ...)
            return False


def _request_waiting(sock: Any, timeout: float) -> bool:
    """Whether a request's bytes are there (decrypted in the TLS layer, or readable on the socket)
    within `timeout` seconds."""
    if sock.pending():
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(timeout * 1000))


class ServerLogger(GunicornLogger):
    """gunicorn's logger with two changes, both about work and noise per connection:

    * no access-log work while the access log is off: gunicorn builds every request's access-log
      atoms (a dict of ~20 fields) whenever a logconfig is given, as ours is (JSON lines), then
      drops the line because gunicorn.access logs nothing below WARNING: about 5% of a worker's
      CPU per review (py-spy, bench/RESULTS.md). An access logger set to INFO still gets its lines.
    * a client that times out (CLIENT_SOCKET_TIMEOUT per operation, REQUEST_READ_LIMIT per
      request) is one warning line ("client timed out") and dra_guard_client_timeouts_total,
      not gunicorn's "Socket error processing request." with a traceback at ERROR: the bound is
      working as designed (docs/reliability.md). In bench/ under overload there were hundreds.
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
        self._started = None
        return super().send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._started = None
        super().sendall(data, flags)


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

