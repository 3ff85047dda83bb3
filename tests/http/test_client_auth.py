"""Only the apiserver is heard, as an option (issue 21, item 4): with server.clientCAFile the
admission port requires a client certificate signed by those CAs (the kube-apiserver presents one
when its AdmissionConfiguration gives a kubeconfig for the webhook). A forged review without one is
refused at the TLS layer: no HTTP answer at all. server.probePort serves the kubelet's probes and
Prometheus without a client certificate, and no admission review.
"""
from __future__ import annotations

import datetime
import ssl
import time

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import certs
from tests.builders import binding, review, subject
from tests.serve import DraGuardProcess, free_port

pytestmark = pytest.mark.http


def client_certificate(ca: certs.KeyPair, name: str = "kube-apiserver") -> certs.KeyPair:
    """A client certificate (clientAuth EKU) signed by `ca`, like the one an apiserver is given."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return certs.KeyPair(cert=cert, key=key)


def write_pair(folder, name, pair):
    (folder / f"{name}.crt").write_bytes(pair.cert_pem())
    (folder / f"{name}.key").write_bytes(pair.key_pem())
    return str(folder / f"{name}.crt"), str(folder / f"{name}.key")


@pytest.fixture(scope="module")
def verifying(tmp_path_factory):
    work = tmp_path_factory.mktemp("client-auth")
    client_ca = certs.generate_ca(common_name="apiserver-client-ca")
    (work / "client-ca.crt").write_bytes(client_ca.cert_pem())
    good = write_pair(work, "apiserver", client_certificate(client_ca))
    stranger = write_pair(work, "stranger", client_certificate(certs.generate_ca(common_name="other-ca")))
    probe_port = free_port()
    proc = DraGuardProcess(work, "--no-cluster", config=(
        f"server:\n  clientCAFile: {work / 'client-ca.crt'}\n  probePort: {probe_port}\n"))
    probe_url = f"https://127.0.0.1:{probe_port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.proc.poll() is None, proc.log()
        try:
            if proc.ca_file.exists() and requests.get(probe_url + "/readyz", verify=str(proc.ca_file), timeout=2).ok:
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.1)
    try:
        yield {"proc": proc, "good": good, "stranger": stranger, "probe_url": probe_url}
    finally:
        proc.stop()


BODY = review(binding("b", "missing-role", [subject("Group", "team-a")]))


def test_a_forged_review_without_a_client_certificate_is_refused_at_the_tls_layer(verifying):
    proc = verifying["proc"]
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        proc.session().post(proc.url + "/validate/rbac", json=BODY, timeout=10)
    # and at the socket level: the handshake (TLS 1.2) or the first read (TLS 1.3) fails with an alert
    ctx = ssl.create_default_context(cafile=str(proc.ca_file))
    import socket
    with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert tls.recv(100) == b""  # (never reached with an answer: raises or EOF)
                raise ConnectionResetError("closed without an answer")


def test_a_certificate_of_another_ca_is_refused(verifying):
    proc = verifying["proc"]
    s = proc.session()
    s.cert = verifying["stranger"]
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        s.post(proc.url + "/validate/rbac", json=BODY, timeout=10)


def test_the_apiserver_with_its_client_certificate_is_answered(verifying):
    proc = verifying["proc"]
    s = proc.session()
    s.cert = verifying["good"]
    out = s.post(proc.url + "/validate/rbac", json=BODY, timeout=10).json()
    assert out["response"]["uid"] == BODY["request"]["uid"] and out["response"]["allowed"] is True


def test_the_probe_port_serves_probes_and_metrics_but_no_review(verifying):
    proc, url = verifying["proc"], verifying["probe_url"]
    s = proc.session()
    assert s.get(url + "/healthz", timeout=10).json() == {"status": "ok"}
    assert s.get(url + "/readyz", timeout=10).json()["ready"] is True
    assert "dra_guard_admission_requests_total" in s.get(url + "/metrics", timeout=10).text
    for path in ("/validate/rbac", "/validate/evictions", "/mutate/daemonsets", "/validate/noop"):
        r = s.post(url + path, json=BODY, timeout=10)
        assert r.status_code == 403 and "probePort" in r.json()["error"], path
