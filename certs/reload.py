"""Serve the current certificate: an SSLContext that follows changes of the certificate files.

Mounted Secrets send no file events (the kubelet swaps a symlink), so the files' SHA-256 digest
is polled, at most once every `interval_seconds`, when a connection asks for the context. A
change builds a new SSLContext (TLS 1.2 minimum) and swaps it in: connections already open keep
their session, new handshakes get the new certificate; no restart, no dropped connection. A
broken or half-written pair of files is not loaded: the previous context keeps serving and the
error is logged (once per digest).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import pathlib
import ssl
import threading
import time
from collections.abc import Callable

from cryptography import x509

log = logging.getLogger("dra_guard.certs")


def _digest(*paths: pathlib.Path) -> str | None:
    h = hashlib.sha256()
    try:
        for path in paths:
            h.update(path.read_bytes())
            h.update(b"\0")
    except OSError:
        return None
    return h.hexdigest()


def server_context(
    cert_file: pathlib.Path, key_file: pathlib.Path, *, client_ca_file: pathlib.Path | None = None
) -> ssl.SSLContext:
    """A server SSLContext for the PEM pair, TLS 1.2 or newer. With client_ca_file (PEM CAs), a
    client must present a certificate those CAs signed, or the handshake fails (CERT_REQUIRED):
    the kube-apiserver presents one when its AdmissionConfiguration gives it a kubeconfig for the
    webhook. Raises ssl.SSLError / OSError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # no TLS 1.3 session tickets (OpenSSL sends 2 after each handshake): the kube-apiserver's Go
    # client keeps no session cache, so it never resumes, and making them is ~1/4 of the server's
    # CPU for a handshake, which matters when clients dial a connection per review under load
    context.num_tickets = 0
    context.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    if client_ca_file is not None:
        context.load_verify_locations(cafile=str(client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ReloadingContext:
    """The SSLContext for a certificate/key pair, reloaded when the files change.

    cert_file, key_file: PEM paths. interval_seconds: the longest time a change goes unnoticed.
    client_ca_file: PEM CAs whose client certificates context() requires (reloaded with the pair);
    open_context() never asks for one (the probe port).
    on_load(certificate): called after each successful (re)load with the leaf certificate
    (cryptography x509.Certificate), e.g. to set the expiry metric.
    """

    def __init__(
        self,
        cert_file: pathlib.Path,
        key_file: pathlib.Path,
        *,
        interval_seconds: float = 10.0,
        on_load: Callable[[x509.Certificate], None] | None = None,
        client_ca_file: pathlib.Path | None = None,
    ) -> None:
        self.cert_file = pathlib.Path(cert_file)
        self.key_file = pathlib.Path(key_file)
        self.client_ca_file = pathlib.Path(client_ca_file) if client_ca_file else None
        self._open_context: ssl.SSLContext | None = None  # no client certificate asked (probe port)
        self.interval = interval_seconds
        self._on_load = on_load
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._digest: str | None = None
        self._failed_digest: str | None = None
        self._checked = 0.0
        self.certificate: x509.Certificate | None = None
        self.error = ""

    def context(self) -> ssl.SSLContext:
        """The current SSLContext (checking the files if `interval_seconds` have passed).

        Raises ssl.SSLError when no certificate could ever be loaded.
        """
        now = time.monotonic()
        if self._context is None or now - self._checked >= self.interval:
            with self._lock:
                if self._context is None or now - self._checked >= self.interval:
                    self._checked = now
                    self._reload()
        if self._context is None:
            raise ssl.SSLError(f"no serving certificate loaded: {self.error}")
        return self._context

    def open_context(self) -> ssl.SSLContext:
        """Like context(), but never asking for a client certificate (same as context() without client_ca_file)."""
        context = self.context()
        return self._open_context or context

    def _reload(self) -> None:
        digest = _digest(self.cert_file, self.key_file, *([self.client_ca_file] if self.client_ca_file else []))
        if digest is None:
            self.error = f"cannot read {self.cert_file} / {self.key_file}"
            return
        if digest == self._digest or digest == self._failed_digest:
            return
        try:
            context = server_context(self.cert_file, self.key_file, client_ca_file=self.client_ca_file)
            open_context = server_context(self.cert_file, self.key_file) if self.client_ca_file else None
            cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._failed_digest = digest
            self.error = f"{self.cert_file}: {exc}"
            log.error("serving certificate not loaded; keeping the previous one", extra={"error": str(exc)})
            return
        first = self._context is None
        self._context, self._digest, self.certificate, self.error = context, digest, cert, ""
        self._open_context = open_context
        log.info(
            "serving certificate loaded" if first else "serving certificate reloaded",
            extra={
                "subject": cert.subject.rfc4514_string(),
                "notAfter": cert.not_valid_after_utc.isoformat(),
                "serial": format(cert.serial_number, "x"),
            },
        )
        if self._on_load is not None:
            self._on_load(cert)

    def status(self) -> tuple[bool, str]:
        """(True, "") when a certificate is loaded and valid now; else (False, why) — for /readyz."""
        try:
            self.context()
        except ssl.SSLError as exc:
            return False, str(exc)
        cert = self.certificate
        assert cert is not None
        now = datetime.datetime.now(datetime.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return False, f"serving certificate not valid now (valid until {cert.not_valid_after_utc.isoformat()})"
        return True, ""
