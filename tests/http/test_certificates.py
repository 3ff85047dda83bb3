"""Serving certificates through the real `dra-guard serve`: SANs, reload without restart, rotation
of the serving certificate and of the CA under continuous load."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
import requests
from cryptography import x509

import certs
from tests.builders import binding, review, subject
from tests.scrape import metric
from tests.serve import free_port

pytestmark = pytest.mark.http

SERVICE, NAMESPACE = "dra-guard", "dra-guard"


class FilesServer:
    """dra-guard serve in files mode (--tls-cert-file/--tls-key-file) with a 1 s reload interval."""

    def __init__(self, workdir: pathlib.Path) -> None:
        self.dir = workdir / "tls"
        self.port = free_port()
        config = workdir / "config.yaml"
        config.write_text("certificates:\n  reloadIntervalSeconds: 1\n")
        self.log = open(workdir / "serve.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook.cli",
                "serve",
                "--no-cluster",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--config",
                str(config),
                "--tls-cert-file",
                str(self.dir / "tls.crt"),
                "--tls-key-file",
                str(self.dir / "tls.key"),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        """SIGINT to the process group: gunicorn's quick shutdown (SIGTERM drains the connections
        first, ~5 s a test here, and no test of this module is about stopping)."""
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(20)
        self.log.close()


def install(directory: pathlib.Path, ca: certs.KeyPair, serving: certs.KeyPair) -> None:
    """Write a pair the way a mounted Secret changes: each file replaced atomically."""
    certs.write_bundle(directory, ca=ca, serving=serving)


def serving_for(ca: certs.KeyPair) -> certs.KeyPair:
    return certs.generate_serving(ca, dns_names=certs.service_dns_names(SERVICE, NAMESPACE), ip_addresses=["127.0.0.1"])


def peer_certificate(port: int, cafile: pathlib.Path, hostname: str = f"{SERVICE}.{NAMESPACE}.svc") -> x509.Certificate:
    """Handshake as the kube-apiserver would: trust only the CA bundle, verify the Service DNS name."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with ctx.wrap_socket(sock, server_hostname=hostname) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


@pytest.fixture
def files_server(tmp_path):
    ca = certs.generate_ca()
    (tmp_path / "tls").mkdir()
    install(tmp_path / "tls", ca, serving_for(ca))
    server = FilesServer(tmp_path)
    deadline = time.monotonic() + 20
    while True:
        try:
            peer_certificate(server.port, tmp_path / "tls" / "ca.crt")
            break
        except OSError:
            if time.monotonic() > deadline or server.proc.poll() is not None:
                raise
            time.sleep(0.1)
    yield server, ca
    server.stop()


def test_generated_certificate_has_service_sans_and_handshakes(files_server, tmp_path):
    server, ca = files_server
    cert = peer_certificate(server.port, tmp_path / "tls" / "ca.crt", hostname=f"{SERVICE}.{NAMESPACE}.svc")
    dns, _ = certs.sans_of(cert)
    assert set(certs.service_dns_names(SERVICE, NAMESPACE)) <= dns
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku
    with pytest.raises(ssl.SSLCertVerificationError):
        peer_certificate(server.port, tmp_path / "tls" / "ca.crt", hostname="other.example.com")


def test_certificate_without_names_is_never_produced():
    with pytest.raises(certs.CertificateError):
        certs.generate_serving(certs.generate_ca(), dns_names=[], ip_addresses=[])


def test_certs_generate_cli_writes_a_chain_with_the_service_names(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "certs",
            "generate",
            "--service",
            "svc",
            "--namespace",
            "ns",
            "--out",
            str(tmp_path / "o"),
            "--ip",
            "127.0.0.1",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    pair = certs.load_pair(tmp_path / "o" / "tls.crt", tmp_path / "o" / "tls.key")
    pair.cert.verify_directly_issued_by(x509.load_pem_x509_certificate((tmp_path / "o" / "ca.crt").read_bytes()))
    assert certs.sans_of(pair.cert) == ({"svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"}, {"127.0.0.1"})


def test_rotation_under_load_drops_nothing(files_server, tmp_path):
    """Keep-alive and new-connection clients run while the serving certificate, then the CA, rotate."""
    server, ca1 = files_server
    ca2 = certs.generate_ca(common_name="dra-guard-ca-2")
    trust = tmp_path / "trust.pem"
    trust.write_bytes(ca1.cert_pem() + ca2.cert_pem())  # the caBundle during a CA rotation holds both
    url = f"https://127.0.0.1:{server.port}/validate/rbac"
    body = review(binding("b", "r", [subject("Group", "g")]))
    errors: list[str] = []
    counts = {"keepalive": 0, "fresh": 0}
    stop = threading.Event()

    def keepalive() -> None:
        s = requests.Session()
        s.trust_env = False
        s.verify = str(trust)
        while not stop.is_set():
            try:
                r = s.post(url, json=body, timeout=5)
                if r.status_code != 200 or r.json()["response"]["uid"] != body["request"]["uid"]:
                    errors.append(f"keepalive: HTTP {r.status_code}")
                counts["keepalive"] += 1
            except Exception as exc:  # noqa: BLE001 - every failure counts
                errors.append(f"keepalive: {exc}")

    def fresh() -> None:
        while not stop.is_set():
            try:
                s = requests.Session()
                s.trust_env = False
                r = s.post(url, json=body, timeout=5, verify=str(trust), headers={"Connection": "close"})
                if r.status_code != 200:
                    errors.append(f"fresh: HTTP {r.status_code}")
                counts["fresh"] += 1
                s.close()
            except Exception as exc:  # noqa: BLE001
                errors.append(f"fresh: {exc}")

    threads = [threading.Thread(target=keepalive), threading.Thread(target=fresh)]
    for t in threads:
        t.start()
    try:
        first = peer_certificate(server.port, trust)
        time.sleep(1)
        install(server.dir, ca1, serving_for(ca1))  # serving certificate renewal, same CA
        time.sleep(2.5)
        second = peer_certificate(server.port, trust)
        install(server.dir, ca2, serving_for(ca2))  # CA rotation
        time.sleep(2.5)
        third = peer_certificate(server.port, trust)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert errors == [], errors[:5]
    assert counts["keepalive"] > 20 and counts["fresh"] > 5, counts
    assert first.serial_number != second.serial_number != third.serial_number
    second.verify_directly_issued_by(ca1.cert)
    third.verify_directly_issued_by(ca2.cert)
    assert server.proc.poll() is None  # no restart


def test_broken_files_keep_the_previous_certificate(files_server, tmp_path):
    server, _ = files_server
    before = peer_certificate(server.port, tmp_path / "tls" / "ca.crt")
    (server.dir / "tls.crt").write_text("not a certificate")
    time.sleep(1.5)
    after = peer_certificate(server.port, tmp_path / "tls" / "ca.crt")
    assert after.serial_number == before.serial_number
    ready = requests.get(f"https://127.0.0.1:{server.port}/readyz", verify=str(tmp_path / "tls" / "ca.crt"), timeout=5)
    assert ready.status_code == 200  # still serving a valid certificate


def test_expiry_metric(files_server, tmp_path):
    server, _ = files_server
    s = requests.Session()
    s.trust_env = False
    text = s.get(f"https://127.0.0.1:{server.port}/metrics", verify=str(tmp_path / "tls" / "ca.crt"), timeout=5).text
    assert metric(text, "dra_guard_certificate_expiry_timestamp_seconds", cert="serving") > time.time() + 300 * 86400


def test_certs_inspect_reads_a_file_and_a_running_server(files_server, tmp_path):
    server, _ = files_server
    by_file = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "certs", "inspect", "--cert-file", str(server.dir / "tls.crt")],
        capture_output=True,
        text=True,
    )
    by_url = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "certs", "inspect", "--url", f"127.0.0.1:{server.port}"],
        capture_output=True,
        text=True,
    )
    assert by_file.returncode == 0 and by_url.returncode == 0, by_file.stderr + by_url.stderr
    assert "dra-guard.dra-guard.svc" in by_file.stdout and "not due" in by_file.stdout
    assert by_file.stdout == by_url.stdout
