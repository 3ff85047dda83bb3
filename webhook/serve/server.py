"""`dra-guard serve`'s composition root: the Flask app under gunicorn, over TLS, with the cluster
caches, the certificate reconciler and the periodic audit wired in. gunicorn runs the event-loop
front (webhook.serve.front: FrontWorker, on gunicorn's public worker API, with this server's
FrontSettings); the master only forks, watches and restarts the workers.

gunicorn settings live here, in Python, derived from the validated Config and the command line;
nothing is read from the environment at import time. Each worker builds its own app, Kubernetes
client and caches after the fork (no preload), so no connection or thread crosses a fork.

Timeouts (seconds) and why (docs/reliability.md has the whole table and the tests):
  timeout 30           a worker that does not answer its heartbeat for 30 s is restarted; requests
                       themselves never wait on the network beyond cluster.requestTimeoutSeconds.
  graceful_timeout 20  on SIGTERM in-flight reviews complete, after server.shutdownDelaySeconds
                       of serving with /readyz off (FrontWorker.handle_exit).
  keep-alive 75        the kube-apiserver keeps connections to webhooks alive and reuses them
                       (webhook.serve.front.connection.KEEPALIVE).
  client sockets       2 s for a TLS handshake or an unread answer, 5 s per request: slow clients
                       cost a coroutine, never a thread.
In self certificate mode each worker also runs the certificate reconciler, and with a cluster the
periodic audit's scheduler, in daemon threads (the audit itself runs in a child process:
webhook.serve.audit_child). With a cluster, the eviction guard's shared records (Leases in
certificates.namespace, else $POD_NAMESPACE, else dra-guard: webhook.kube.records) are written
on the admission path, for driver pods leaving on the strength of a Ready peer only.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import functools
import logging
import os
import pathlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

import certs
from certs.reload import ReloadingContext
from webhook import logs, metrics
from webhook.config import Config
from webhook.kube.certapi import KubeCertApi
from webhook.kube.client import api_client
from webhook.kube.informer import watch_collector_pauses
from webhook.kube.records import KubeLeases, LeaseRecords
from webhook.kube.state import ClusterState
from webhook.serve import front
from webhook.serve.app import Readiness, create_app
from webhook.serve.draining import DRAINING, at_exit
from webhook.serve.lanes import gates

log = logging.getLogger("dra_guard.server")

GRACEFUL_TIMEOUT = 20  # seconds in-flight reviews get to complete after the drain delay (docstring above)


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
    return dataclasses.replace(config, certificates=dataclasses.replace(certs_cfg, namespace=namespace)).with_guard(namespace)


def identity(port: int) -> str:
    """This replica's name for Leases: $POD_NAME, else <hostname>-<port>."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{port}"


def self_managed_reconciler(config: Config, kubeconfig: str | None, *, identity: str) -> Any:
    """A certs.selfmanaged.Reconciler for `config` (namespace resolved) over the Kubernetes API."""
    from certs.selfmanaged import Reconciler

    client = api_client(kubeconfig, timeout_seconds=config.cluster.request_timeout_seconds)
    reconciler = Reconciler(KubeCertApi(client, config.certificates.namespace), config.certificates, identity=identity)
    reconciler.on_bundle = lambda bundle: metrics.CERT_EXPIRY.labels(cert="ca").set(
        bundle.ca.cert.not_valid_after_utc.timestamp()
    )
    reconciler.on_drift = webhook_drift_metrics
    return reconciler


def check_cluster(config: Config, kubeconfig: str | None) -> None:
    """Before gunicorn starts: can every cache of ClusterState start (ClusterState.check_access)?
    The client is closed again: no connection is inherited by the forked workers. Raises
    ClusterError naming the server and the cause (the CLI prints it in one line and exits 2)."""
    client = api_client(kubeconfig, timeout_seconds=config.cluster.request_timeout_seconds)
    try:
        ClusterState(client, config=config).check_access()
    finally:
        client.close()


def cache_sizes(state: ClusterState, max_age_seconds: float = 1.0) -> Callable[[], dict[str, int]]:
    """state.sizes(), computed at most once per max_age_seconds (one scrape reads every cache's
    gauge; counting namespaced RBAC keys is O(objects))."""
    memo: dict[str, Any] = {"at": float("-inf"), "sizes": {}}

    def read() -> dict[str, int]:
        now = time.monotonic()
        if now - memo["at"] > max_age_seconds:
            memo["sizes"], memo["at"] = state.sizes(), now
        sizes: dict[str, int] = memo["sizes"]
        return sizes

    return read


def webhook_drift_metrics(kind: str, name: str, differences: list[str], restored: bool) -> None:
    """certs.selfmanaged.Reconciler.on_drift: the drift gauge (differences seen this round) and
    the restores counter, by kind of configuration ("validating", "mutating")."""
    metrics.WEBHOOK_DRIFT.labels(kind=kind).set(len(differences))
    if restored:
        metrics.WEBHOOK_RESTORES.labels(kind=kind).inc()


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
    try:
        pair = certs.load_pair(cert_file, key_file)
    except certs.CertificateError as exc:
        return False, str(exc)
    now = datetime.datetime.now(datetime.UTC)
    if not pair.cert.not_valid_before_utc <= now <= pair.cert.not_valid_after_utc:
        return (
            False,
            f"{cert_file}: certificate is not valid now (valid {pair.cert.not_valid_before_utc} to {pair.cert.not_valid_after_utc})",
        )
    return True, ""


_RELOADERS: dict[int, ReloadingContext] = {}


def reloader(options: ServeOptions) -> ReloadingContext:
    """This process's ReloadingContext for the serving files (one per gunicorn worker, made after the fork)."""
    pid = os.getpid()
    found = _RELOADERS.get(pid)
    if found is None:
        share = options.config.certificates.renew_after_share

        def loaded(cert: Any) -> None:
            metrics.CERT_EXPIRY.labels(cert="serving").set(cert.not_valid_after_utc.timestamp())
            if certs.needs_renewal(cert, share=share):
                log.warning(
                    "serving certificate is inside its renewal window", extra={"notAfter": cert.not_valid_after_utc.isoformat()}
                )

        found = _RELOADERS[pid] = ReloadingContext(
            options.cert_file,
            options.key_file,
            on_load=loaded,
            interval_seconds=options.config.certificates.reload_interval_seconds,
            client_ca_file=pathlib.Path(options.config.server.client_ca_file) if options.config.server.client_ca_file else None,
        )
    return found


def front_settings(config: Config, context_for: Callable[[int], Any], *, graceful_timeout: float) -> front.FrontSettings:
    """The event-loop front's settings from `config`, with `context_for` (listener port -> the
    SSLContext of a connection accepted there) and gunicorn's graceful timeout (seconds)."""
    server = config.server
    return front.FrontSettings(
        context_for=context_for,
        gates=gates(config),
        threads=server.threads,
        max_connections=server.threads + front.KEEPALIVE_CONNECTIONS,
        max_request_bytes=server.max_request_bytes,
        drop_after_seconds=server.drop_after_seconds,
        shutdown_delay_seconds=float(server.shutdown_delay_seconds),
        graceful_timeout_seconds=graceful_timeout,
        probe_port=server.probe_port or 0,
    )


def front_worker(options: ServeOptions, *, graceful_timeout: float) -> type[front.FrontWorker]:
    """The event-loop front's worker class with this server's settings (the SSLContexts are made
    per connection in the worker, from the reloaded files)."""
    o = options
    probe_port = o.config.server.probe_port

    def context_for(port: int) -> Any:
        # server.probePort asks no client certificate (the kubelet's probes, Prometheus)
        return reloader(o).open_context() if probe_port and port == probe_port else reloader(o).context()

    settings = front_settings(o.config, context_for, graceful_timeout=graceful_timeout)
    return type("DraGuardFrontWorker", (front.FrontWorker,), {"settings": settings})


class DraGuardServer(BaseApplication):
    """gunicorn application running dra-guard's Flask app with the settings of ServeOptions."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        probe_port = o.config.server.probe_port
        binds = [f"[{o.host}]:{port}" if ":" in o.host else f"{o.host}:{port}" for port in (o.port, probe_port) if port]
        settings = {
            "bind": binds,
            "worker_class": front_worker(o, graceful_timeout=GRACEFUL_TIMEOUT),
            "workers": o.config.server.workers,
            # gunicorn checks at start-up that the TLS files exist (naming a missing one) and logs its
            # listeners as https://; the front loads them itself, per connection (reloader)
            "certfile": str(o.cert_file),
            "keyfile": str(o.key_file),
            "timeout": 30,
            "graceful_timeout": GRACEFUL_TIMEOUT,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": o.log_level,
            # gunicorn's own lines (start, workers, errors) as JSON too, like dra-guard's
            "logconfig_dict": {
                "version": 1,
                "disable_existing_loggers": False,
                "formatters": {"json": {"()": "webhook.logs.JsonFormatter"}},
                "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
                "root": {"level": "WARNING", "handlers": ["json"]},
                "loggers": {
                    "gunicorn.error": {"level": o.log_level.upper(), "handlers": ["json"], "propagate": False},
                    # no access log: one line per review at 1,000 reviews/s is noise; findings are logged
                    "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
                },
            },
            "proc_name": "dra-guard",
            # no gunicornc control socket: it would live in $HOME (read-only in the chart's pod) and
            # two servers on one machine would fight over it
            "control_socket_disable": True,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        o = self.options
        logs.setup(o.log_level)
        client = None if o.no_cluster else api_client(o.kubeconfig, timeout_seconds=o.config.cluster.request_timeout_seconds)
        watch_collector_pauses()
        state = ClusterState(client, config=o.config)
        state.start()
        sizes = cache_sizes(state)
        for cache in state.sizes():  # read at each scrape
            metrics.CACHE_OBJECTS.labels(cache=cache).set_function(functools.partial(lambda c: sizes()[c], cache))
        watch_exceptions(o.config)
        if client is not None and o.config.audit.interval_seconds > 0:
            from webhook.serve.periodic import PeriodicAudit

            periodic = PeriodicAudit(
                client,
                resolve_namespace(o.config),
                identity=f"{identity(o.port)}-{os.getpid()}",
                kubeconfig=o.kubeconfig,
                synced=state.synced,
                log_level=o.log_level,
            )
            # stops when the worker drains (SIGTERM); once drained it gives the audit Lease up for the next replica
            threading.Thread(target=periodic.loop, name="periodic-audit", daemon=True, kwargs={"stop": DRAINING}).start()
            at_exit(periodic.release)
        if o.config.certificates.mode == "self" and not o.no_cluster:
            reconciler = self_managed_reconciler(o.config, o.kubeconfig, identity=identity(o.port))
            threading.Thread(
                target=run_reconciler,
                name="cert-reconciler",
                daemon=True,
                kwargs={
                    "reconciler": reconciler,
                    "interval_seconds": o.config.certificates.check_interval_seconds,
                    "stop": threading.Event(),
                },
            ).start()
        readiness = Readiness(cluster=state, certificate=lambda: reloader(o).status(), draining=DRAINING.is_set)
        records = None
        if client is not None:
            # the shared records of driver pods leaving on the strength of a peer (webhook.kube.records)
            namespace = resolve_namespace(o.config).certificates.namespace
            records = LeaseRecords(
                KubeLeases(client, namespace),
                state.claims,
                namespace=namespace,
                timeout_seconds=o.config.cluster.request_timeout_seconds,
            ).own
        log.info("worker ready to serve", extra={"port": o.port, "cluster": not o.no_cluster})
        return create_app(config=o.config, cluster=state, readiness=readiness, records=records)


def watch_exceptions(config: Config) -> None:
    """Publish dra_guard_exceptions{state} (counted at each scrape: an exception expires while the
    server runs) and log each exception that has already expired, once per worker start."""

    def count(live: bool) -> int:
        now = datetime.datetime.now(datetime.UTC)
        return sum(1 for e in config.exceptions if e.live(now) == live)

    metrics.EXCEPTIONS.labels(state="active").set_function(functools.partial(count, True))
    metrics.EXCEPTIONS.labels(state="expired").set_function(functools.partial(count, False))
    now = datetime.datetime.now(datetime.UTC)
    for e in config.exceptions:
        if not e.live(now):
            log.warning(
                "exception expired",
                extra={"exception": e.ref, "owner": e.owner, "expires": e.expires.isoformat(), "reason": e.reason},
            )


#: glibc mallopt() parameter M_ARENA_MAX (malloc.h)
M_ARENA_MAX = -8
#: malloc arenas per process: the informers and the request threads otherwise each get an arena of
#: their own (up to 8 per core), and the freed pages of a relist stay spread over all of them
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process and the workers it forks (what
    MALLOC_ARENA_MAX=<arenas> in the environment does), before any thread starts. At the
    scalability envelope it saves ~11 MiB of worker RSS when ready and ~16 MiB at the relist's
    peak (bench/RESULTS.md). Whether glibc took it; False where libc is not glibc
    (musl, macOS) or has no mallopt. An explicit MALLOC_ARENA_MAX in the environment wins."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))


def run(options: ServeOptions) -> None:
    """Run gunicorn in the foreground until SIGTERM/SIGINT (malloc arenas capped first:
    limit_malloc_arenas)."""
    limit_malloc_arenas()
    DraGuardServer(options).run()
