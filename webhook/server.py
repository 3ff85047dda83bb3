"""`dra-guard serve`: the Flask app under gunicorn's threaded worker, over TLS.

gunicorn settings live here, in Python, derived from the validated Config and the command line;
nothing is read from the environment at import time. Each worker builds its own app, Kubernetes
client and caches after the fork (no preload), so no connection or thread crosses a fork.

Timeouts (seconds) and why:
  timeout 30           a worker that does not answer its heartbeat for 30 s is restarted; requests
                       themselves never wait on the network (caches only).
  graceful_timeout 20  on SIGTERM in-flight reviews complete (the apiserver waits at most 30 s).
  keepalive 75         the kube-apiserver keeps connections to webhooks alive and reuses them.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import pathlib
import ssl
from typing import Any

from gunicorn.app.base import BaseApplication

from webhook import cluster as cluster_mod
from webhook import logs
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


def _ssl_context(conf: Any, default_factory: Any) -> ssl.SSLContext:
    context: ssl.SSLContext = default_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # TLS 1.0/1.1 are refused
    return context


class DraGuardServer(BaseApplication):  # type: ignore[misc]
    """gunicorn application running dra-guard's Flask app with the settings of ServeOptions."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        settings = {
            "bind": [f"[{o.host}]:{o.port}" if ":" in o.host else f"{o.host}:{o.port}"],
            "worker_class": "gthread",
            "workers": o.config.server.workers,
            "threads": o.config.server.threads,
            "certfile": str(o.cert_file),
            "keyfile": str(o.key_file),
            "ssl_context": _ssl_context,
            "timeout": 30,
            "graceful_timeout": 20,
            "keepalive": 75,
            "limit_request_line": 8190,
            "limit_request_fields": 100,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": o.log_level,
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
        client = None if o.no_cluster else cluster_mod.api_client(o.kubeconfig, timeout_seconds=o.config.cluster.request_timeout_seconds)
        state = cluster_mod.ClusterState(client, config=o.config)
        state.start()
        readiness = Readiness(cluster=state, certificate=lambda: certificate_status(o.cert_file, o.key_file))
        log.info("worker ready to serve", extra={"port": o.port, "cluster": not o.no_cluster})
        return create_app(config=o.config, cluster=state, readiness=readiness)


def run(options: ServeOptions) -> None:
    """Run gunicorn in the foreground until SIGTERM/SIGINT."""
    DraGuardServer(options).run()
