"""`dra-guard serve`: the Flask app under gunicorn's threaded worker, over TLS.

gunicorn settings live here, in Python, derived from the validated Config and the command line;
nothing is read from the environment at import time. Each worker builds its own app, Kubernetes
client and caches after the fork (no preload), so no connection or thread crosses a fork.

Timeouts (seconds) and why (docs/reliability.md has the whole table and the tests):
  timeout 30           a worker that does not answer its heartbeat for 30 s is restarted; requests
                       themselves never wait on the network beyond cluster.requestTimeoutSeconds.
  graceful_timeout 20  on SIGTERM in-flight reviews complete, after server.shutdownDelaySeconds
                       of serving with /readyz off (DrainingThreadWorker).
  keepalive 75         the kube-apiserver keeps connections to webhooks alive and reuses them.
  client sockets       2 s per operation, 5 s per request: slow clients cannot hold the threads.
In self certificate mode each worker also runs the certificate reconciler, and with a cluster the
periodic audit, in daemon threads.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import pathlib
import socket
import ssl
import sys
import threading
import time
from typing import Any

from gunicorn import util
from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.workers.gthread import _DEFER, ThreadWorker

import certs
from certs.reload import ReloadingContext
from webhook import cluster as cluster_mod
from webhook import logs, metrics
from webhook.app import Readiness, create_app
from webhook.config import Config

log = logging.getLogger("dra_guard.server")


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """What `dra-guard serve` was asked to do (from the command line)."""

    config: Config
    host: str
    port: int
    cert_file: pathlib.Path
    key_file: pathlib.Path
    kubeconfig: str | None
    no_cluster: bool
    log_level: str = "info"


def resolve_namespace(config: Config) -> Config:
    """The config with certificates.namespace filled from $POD_NAMESPACE (else "dra-guard") when empty."""
    certs_cfg = config.certificates
    if certs_cfg.namespace:
        return config
    namespace = os.environ.get("POD_NAMESPACE") or "dra-guard"
    return dataclasses.replace(config, certificates=dataclasses.replace(certs_cfg, namespace=namespace))


def identity(port: int) -> str:
    """This replica's name for Leases: $POD_NAME, else <hostname>-<port>."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{port}"


def self_managed_reconciler(config: Config, kubeconfig: str | None, *, identity: str) -> Any:
    """A certs.selfmanaged.Reconciler for `config` (namespace resolved) over the Kubernetes API."""
    from certs.selfmanaged import Reconciler

    client = cluster_mod.api_client(kubeconfig, timeout_seconds=config.cluster.request_timeout_seconds)
    reconciler = Reconciler(cluster_mod.KubeCertApi(client, config.certificates.namespace), config.certificates,
                            identity=identity)
    reconciler.on_bundle = lambda bundle: metrics.CERT_EXPIRY.labels(cert="ca").set(bundle.ca.cert.not_valid_after_utc.timestamp())
    return reconciler


def run_reconciler(reconciler: Any, *, interval_seconds: float, stop: threading.Event) -> None:
    """Call reconciler.reconcile() every interval_seconds until `stop` is set; errors are logged and retried."""
    while not stop.wait(interval_seconds):
        try:
            reconciler.reconcile()
            metrics.CERT_RECONCILE.labels(result="ok").inc()
        except Exception:
            metrics.CERT_RECONCILE.labels(result="error").inc()
            log.exception("certificate reconcile failed; retrying next period")


def certificate_status(cert_file: pathlib.Path, key_file: pathlib.Path) -> tuple[bool, str]:
    """(True, "") when the serving certificate and key load and the certificate is within its validity."""
    import certs

    try:
        pair = certs.load_pair(cert_file, key_file)
    except certs.CertificateError as exc:
        return False, str(exc)
    now = datetime.datetime.now(datetime.timezone.utc)
    if not pair.cert.not_valid_before_utc <= now <= pair.cert.not_valid_after_utc:
        return False, f"{cert_file}: certificate is not valid now (valid {pair.cert.not_valid_before_utc} to {pair.cert.not_valid_after_utc})"
    return True, ""


_RELOADERS: dict[int, ReloadingContext] = {}
DRAINING = threading.Event()  # set in a worker on SIGTERM: /readyz fails while it keeps serving
SHUTDOWN_DELAY = [5.0]        # seconds; set from server.shutdownDelaySeconds before the workers fork
KEEPALIVE_CONNECTIONS = 250  # idle keep-alive connections per worker: far above what apiservers, probes and Prometheus hold
FIRST_BYTE_WAIT = 0.1  # seconds a new connection may hold a pool thread before its first byte (then: the poller)
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

    def handle(self, conn: Any) -> Any:
        """gthread's handle() (in a pool thread), with three changes:

        * a new connection waits at most FIRST_BYTE_WAIT seconds in this thread for its first byte
          (gthread: 5 s), then in the poller: eight connections that send nothing held every
          thread for 5 s each;
        * a connection with a pipelined request already decrypted in its TLS buffer goes back to
          the pool (gthread waited for the socket to turn readable, which it never does then);
        * a connection gthread is about to close is closed here: gthread closes it in its event
          loop with a graceful drain that waits up to 2 s for the client's FIN, and a client that
          never sends one (stalled, or gone after its own timeout) stalled every other connection
          of the worker meanwhile. The drain here waits at most CLOSE_LINGER seconds.
        """
        if not conn.initialized and not conn.data_ready and not conn.wait_for_data(FIRST_BYTE_WAIT):
            conn.first_byte_deferred = True  # read by finish_request, in the event loop
            return _DEFER
        result = super().handle(conn)
        if result is False and conn.sock.fileno() != -1:
            util.close_graceful(conn.sock, timeout=CLOSE_LINGER)
        elif result is True and isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
            # a pipelined request already decrypted inside the TLS layer: the socket will not turn
            # readable for it, so it goes straight back to the pool (finish_request)
            conn.tls_pending = True
        return result

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


class ServerLogger(GunicornLogger):  # type: ignore[misc]
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
            raise socket.timeout(f"request not received within {REQUEST_READ_LIMIT:g} s")

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


class _TimeoutWrapping:
    """What gunicorn's ssl_context hook returns: wraps each accepted socket with the current
    SSLContext after giving it a timeout, so a client that stalls its TLS handshake (bounded as a
    whole by CPython), its request or its reading of the answer frees the worker thread after
    CLIENT_SOCKET_TIMEOUT seconds instead of holding it forever (gthread sockets are otherwise fully
    blocking); DeadlineSSLSocket bounds a trickled request."""

    def __init__(self, context: Any, timeout: float) -> None:
        self.context = context
        self.timeout = timeout

    def wrap_socket(self, sock: Any, **kwargs: Any) -> Any:
        sock.settimeout(self.timeout)
        self.context.sslsocket_class = DeadlineSSLSocket
        return self.context.wrap_socket(sock, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)


def reloader(options: ServeOptions) -> ReloadingContext:
    """This process's ReloadingContext for the serving files (one per gunicorn worker, made after the fork)."""
    pid = os.getpid()
    found = _RELOADERS.get(pid)
    if found is None:
        share = options.config.certificates.renew_after_share

        def loaded(cert: Any) -> None:
            metrics.CERT_EXPIRY.labels(cert="serving").set(cert.not_valid_after_utc.timestamp())
            if certs.needs_renewal(cert, share=share):
                log.warning("serving certificate is inside its renewal window",
                            extra={"notAfter": cert.not_valid_after_utc.isoformat()})

        found = _RELOADERS[pid] = ReloadingContext(options.cert_file, options.key_file, on_load=loaded,
                                                    interval_seconds=options.config.certificates.reload_interval_seconds)
    return found


class DraGuardServer(BaseApplication):  # type: ignore[misc]
    """gunicorn application running dra-guard's Flask app with the settings of ServeOptions."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        settings = {
            "bind": [f"[{o.host}]:{o.port}" if ":" in o.host else f"{o.host}:{o.port}"],
            "worker_class": "webhook.server.DrainingThreadWorker",
            "workers": o.config.server.workers,
            "threads": o.config.server.threads,
            "certfile": str(o.cert_file),
            "keyfile": str(o.key_file),
            # every new connection asks for the context: the reloader hands out the current one and
            # swaps in a new one when the files' digest changes (TLS 1.2+, no restart)
            "ssl_context": lambda conf, default_factory: _TimeoutWrapping(reloader(o).context(), CLIENT_SOCKET_TIMEOUT),
            "timeout": 30,
            "graceful_timeout": 20,
            "keepalive": 75,
            # connections per worker: its threads plus KEEPALIVE_CONNECTIONS kept alive between
            # requests; more wait in the kernel's backlog, so a connection storm cannot grow the
            # worker's memory without bound (each TLS connection costs ~25 KiB; bench/RESULTS.md)
            "worker_connections": o.config.server.threads + KEEPALIVE_CONNECTIONS,
            "limit_request_line": 8190,
            "limit_request_fields": 100,
            "accesslog": None,
            "logger_class": "webhook.server.ServerLogger",
            "errorlog": "-",
            "loglevel": o.log_level,
            # gunicorn's own lines (start, workers, errors) as JSON too, like dra-guard's
            "logconfig_dict": {
                "version": 1, "disable_existing_loggers": False,
                "formatters": {"json": {"()": "webhook.logs.JsonFormatter"}},
                "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
                "root": {"level": "WARNING", "handlers": ["json"]},
                "loggers": {"gunicorn.error": {"level": o.log_level.upper(), "handlers": ["json"], "propagate": False},
                            # no access log: one line per review at 1,000 reviews/s is noise; findings are logged
                            "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False}},
            },
            "proc_name": "dra-guard",
            # no gunicornc control socket: it would live in $HOME (read-only in the chart's pod) and
            # two servers on one machine would fight over it
            "control_socket_disable": True,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)
        SHUTDOWN_DELAY[0] = float(o.config.server.shutdown_delay_seconds)

    def load(self) -> Any:
        o = self.options
        logs.setup(o.log_level)
        client = None if o.no_cluster else cluster_mod.api_client(o.kubeconfig, timeout_seconds=o.config.cluster.request_timeout_seconds)
        state = cluster_mod.ClusterState(client, config=o.config)
        state.start()
        if client is not None and o.config.audit.interval_seconds > 0:
            from webhook.periodic import PeriodicAudit

            periodic = PeriodicAudit(client, resolve_namespace(o.config), identity=f"{identity(o.port)}-{os.getpid()}")
            threading.Thread(target=periodic.loop, name="periodic-audit", daemon=True,
                             kwargs={"stop": threading.Event()}).start()
        if o.config.certificates.mode == "self" and not o.no_cluster:
            reconciler = self_managed_reconciler(o.config, o.kubeconfig, identity=identity(o.port))
            threading.Thread(target=run_reconciler, name="cert-reconciler", daemon=True, kwargs={
                "reconciler": reconciler, "interval_seconds": o.config.certificates.check_interval_seconds,
                "stop": threading.Event()}).start()
        readiness = Readiness(cluster=state, certificate=lambda: reloader(o).status(), draining=DRAINING.is_set)
        log.info("worker ready to serve", extra={"port": o.port, "cluster": not o.no_cluster})
        return create_app(config=o.config, cluster=state, readiness=readiness)


def run(options: ServeOptions) -> None:
    """Run gunicorn in the foreground until SIGTERM/SIGINT."""
    DraGuardServer(options).run()
